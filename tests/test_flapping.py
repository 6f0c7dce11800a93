"""Flapping leadership: three awa_trio processes and one awa-pg 0.6.1 runtime
(upstream's leader inside it) on one database. Every few seconds the current
holder's lock backend is terminated or the leading process is SIGKILLed and
started again, while a per-second cron schedule fires and scheduled jobs
keep coming due for an awa-pg worker that never leads.

The system must never show two granted locks for the key, never enqueue one
cron fire twice, make at least 95 % of the fires a continuously led cluster
would, and promote every due job exactly once. The two-minute version with
figures is bench/bench_chaos.py."""

from __future__ import annotations

import logging
import random

import trio
from support.chaos import (
    CRON_NAME,
    LockTimeline,
    UpstreamActivity,
    awa_pg_candidate,
    awa_pg_consumer,
    awa_trio_candidate,
    done_counts,
    duplicate_fires,
    fire_coverage,
    flap,
    job_outcomes,
    produce_scheduled,
    start_cluster,
    stop_members,
    summarise,
    wait_until_every_job_completed,
)

from awa_trio.db import open_database

KIND = "flap_job"
QUEUE = "flap"
CHAOS_SECONDS = 24.0

log = logging.getLogger(__name__)


async def test_flapping_leadership_keeps_one_leader_cron_exact_and_every_job_promoted_once(
        database_url, awa_client):
    # Evaluated every 250 ms, a takeover that straddles a second boundary still
    # fires that second (coalesce keeps only the latest due fire).
    members = [awa_trio_candidate(f"awa_trio {n}", database_url, "--cron-eval-interval", "0.25")
               for n in (1, 2, 3)]
    members.append(awa_pg_candidate("awa-pg candidate", database_url))
    consumer = awa_pg_consumer("awa-pg consumer", database_url, KIND, QUEUE)
    inserted: list[int] = []
    rng = random.Random(20261201)
    async with open_database(database_url, pool_size=3, application_name="test admin") as admin:
        timeline = LockTimeline(admin, hz=20)
        upstream = UpstreamActivity(admin)
        async with trio.open_nursery() as nursery:
            await start_cluster(admin, members, consumer, nursery, first_leader_within=30)
            async with trio.open_nursery() as load:
                load.start_soon(timeline.run)
                load.start_soon(upstream.run)
                load.start_soon(produce_scheduled, awa_client, KIND, QUEUE, inserted)
                await trio.sleep(2.0)  # the schedule is registered and firing
                chaos_began_at = trio.current_time()
                since = await admin.fetchval("SELECT clock_timestamp()")
                events = await flap(admin, members, nursery, seconds=CHAOS_SECONDS, period=(1.5, 3.0),
                                    rng=rng)
                until = await admin.fetchval("SELECT clock_timestamp()")
                await trio.sleep(2.0)  # the last second's fire is in
                load.cancel_scope.cancel()
            # The last jobs come due and complete under whoever leads now.
            with trio.fail_after(20):
                await wait_until_every_job_completed(admin, consumer, KIND, inserted, poll=0.1)
            unexpected = await stop_members([*members, consumer])
            nursery.cancel_scope.cancel()

        duplicates = await duplicate_fires(admin)
        made, expected = await fire_coverage(admin, since, until)
        outcomes = await job_outcomes(admin, KIND)

    leaderless = timeline.leaderless_episodes(since=chaos_began_at)
    log.info("chaos events: %s", [(e.action, e.victim, round(e.recovery, 3)) for e in events])
    log.info("leaderless episodes (20 Hz): %s; recovery per event: %s", summarise(leaderless),
             summarise([e.recovery for e in events]))
    log.info("cron %s: %d of %d per-second fires (%.1f %%); %d lock samples", CRON_NAME, made, expected,
             100 * made / expected, len(timeline.samples))
    log.info("awa-pg maintenance statements seen with the lock %s, without it %s", upstream.with_lock,
             upstream.without_lock)

    assert len(events) >= 6, "the leader was deposed every few seconds"
    assert {e.action for e in events} == {"terminate", "sigkill"}
    assert unexpected == [], "a process exited on its own"
    troubled = [line for member in members if not member.is_upstream for line in member.lines
                if "Traceback" in line or "crashed" in line or "giving up leadership" in line]
    assert troubled == [], "an awa_trio process crashed or gave up"
    assert len(timeline.samples) >= 200  # the sampler ran throughout (fewer than 20 Hz on a loaded machine)
    assert timeline.doubles == [], "two granted locks for the key at one instant"
    assert duplicates == [], "a cron fire was enqueued twice"
    assert made >= 0.95 * expected
    runs = done_counts([consumer])
    assert len(inserted) >= 200
    assert outcomes == {("completed", 1): len(inserted)}, "every due job promoted and run once, at attempt 1"
    assert set(runs) == set(inserted) and max(runs.values()) == 1
