"""Flapping leadership for two minutes: three awa_trio processes and one
awa-pg 0.6.1 runtime (upstream's leader inside it, election every 500 ms) on
one canonical database. Every 2-4 s the current holder's lock backend is
terminated (pg_terminate_backend) or the leading process is SIGKILLed and
started again at once. Meanwhile a per-second cron schedule (registered by
every candidate) fires, and a job due 0.5 s ahead is inserted every 50 ms
for an awa-pg worker that never leads (a no-op handler).

pg_locks is sampled at 20 Hz for the leader key. Printed: the chaos events,
time without any lock holder (per episode seen by the sampler, and from each
event to the next holder, polled every 5 ms), per-second cron fires against a
continuously led cluster, duplicate fires, how the scheduled jobs ended, and
how many maintenance statements the awa-pg runtime ran while it did not hold
the lock (upstream keeps leading after its lock backend dies until its 30 s
check fails).

    python bench/bench_chaos.py [--server postgresql://postgres@localhost:5432]
        [--seconds 120] [--period 2 4] [--seed N]
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import statistics
import sys
from pathlib import Path

import _common
import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

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
    missing_fires,
    produce_scheduled,
    start_cluster,
    stop_members,
    wait_until_every_job_completed,
)

from awa_trio.db import open_database

KIND = "flap_job"
QUEUE = "flap"


def seconds_row(label: str, values: list[float]) -> str:
    if not values:
        return f"| {label} | 0 | | | |"
    return (f"| {label} | {len(values)} | {statistics.median(values):.3f} s | {_common.nearest_rank(values, 0.95):.3f} s "
            f"| {max(values):.3f} s |")


async def run(server: str, seconds: float, period: tuple[float, float], seed: int) -> None:
    import awa

    dsn = await _common.in_trio(_common.create_database, server, _common.scratch_name("awa_trio_chaos"))
    client = awa.Client(dsn)
    members = [awa_trio_candidate(f"awa_trio {n}", dsn, "--log-level", "WARNING") for n in (1, 2, 3)]
    members.append(awa_pg_candidate("awa-pg", dsn))
    consumer = awa_pg_consumer("consumer", dsn, KIND, QUEUE, max_workers=8)
    inserted: list[int] = []
    try:
        async with open_database(dsn, pool_size=3, application_name="bench admin") as admin:
            timeline, upstream = LockTimeline(admin, hz=20), UpstreamActivity(admin)
            async with trio.open_nursery() as nursery:
                await start_cluster(admin, members, consumer, nursery, first_leader_within=60)
                async with trio.open_nursery() as load:
                    load.start_soon(timeline.run)
                    load.start_soon(upstream.run)
                    load.start_soon(produce_scheduled, client, KIND, QUEUE, inserted)
                    await trio.sleep(3.0)
                    began = trio.current_time()
                    since = await admin.fetchval("SELECT clock_timestamp()")
                    events = await flap(admin, members, nursery, seconds=seconds, period=period,
                                        rng=random.Random(seed))
                    until = await admin.fetchval("SELECT clock_timestamp()")
                    await trio.sleep(2.0)
                    load.cancel_scope.cancel()
                with trio.move_on_after(60):
                    await wait_until_every_job_completed(admin, consumer, KIND, inserted, poll=0.2)
                unexpected = await stop_members([*members, consumer])
                nursery.cancel_scope.cancel()
            duplicates = await duplicate_fires(admin)
            made, expected = await fire_coverage(admin, since, until)
            missing = await missing_fires(admin, since, until)
            outcomes = await job_outcomes(admin, KIND)
    finally:
        del client
        gc.collect()
        await _common.in_trio(_common.drop_database, server, dsn)

    runs = done_counts([consumer])
    leaderless = timeline.leaderless_episodes(since=began)
    chaos_span = events[-1].at + events[-1].recovery - began if events else seconds
    by_kind: dict[tuple[str, str], int] = {}
    for event in events:
        key = (event.action, "awa-pg" if event.victim.startswith("awa-pg") else "awa_trio")
        by_kind[key] = by_kind.get(key, 0) + 1

    print(f"flapping for {seconds:.0f} s, an event every {period[0]:g}-{period[1]:g} s (seed {seed}); "
          f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    print("events: " + ", ".join(f"{n} {action} of {who}" for (action, who), n in sorted(by_kind.items())))
    successors: dict[str, int] = {}
    for event in events:
        successor = "awa-pg" if event.successor.startswith("awa-pg") else event.successor.split(" ")[0]
        successors[successor] = successors.get(successor, 0) + 1
    print("the lock went to: " + ", ".join(f"{who} {n} times" for who, n in sorted(successors.items())))
    print()
    print("| time without a leader | episodes | median | p95 | longest |")
    print("| --- | --- | --- | --- | --- |")
    print(seconds_row("sampler (20 Hz pg_locks)", leaderless))
    print(seconds_row("event to next holder (5 ms poll)", [e.recovery for e in events]))
    print(f"\nleaderless in all: {sum(leaderless):.2f} s of {chaos_span:.0f} s "
          f"({100 * sum(leaderless) / chaos_span:.2f} %); lock samples {len(timeline.samples)}, "
          f"with two holders {len(timeline.doubles)}")
    print(f"cron {CRON_NAME} (every second): {made} of {expected} fires ({100 * made / expected:.1f} %), "
          f"duplicate fires {len(duplicates)}")
    print(f"scheduled jobs: {len(inserted)} inserted; outcomes {dict(sorted(outcomes.items()))}; "
          f"run by the handler once {sum(1 for n in runs.values() if n == 1)}, "
          f"more than once {sum(1 for n in runs.values() if n > 1)}, never {len(set(inserted) - set(runs))}")
    print(f"awa-pg maintenance statements seen (20 Hz, a lower bound): holding the lock {upstream.with_lock}, "
          f"without it {upstream.without_lock}")
    print(f"processes that exited on their own: {unexpected or 'none'}")
    if missing:
        # Server time of each missed fire, as seconds into the chaos, beside the events.
        print("missed fires at (s into the run): "
              + ", ".join(f"{(at - since).total_seconds():.1f}" for at in missing))
        print("events at (s into the run): " + ", ".join(
            f"{event.at - began:.2f} {event.action} {event.victim} ({event.recovery:.3f} s, to {event.successor})"
            for event in events))
    for duplicate in duplicates[:10]:
        print("duplicate:", dict(duplicate))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--server", default=_common.env_server())
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--period", type=float, nargs=2, default=(2.0, 4.0), metavar=("MIN", "MAX"))
    parser.add_argument("--seed", type=int, default=9)
    args = parser.parse_args()
    trio.run(run, args.server, args.seconds, tuple(args.period), args.seed)


if __name__ == "__main__":
    main()
