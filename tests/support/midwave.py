"""SIGKILL of the leader mid-wave, for a test and a bench: a burst of
scheduled jobs comes due at once while awa-pg workers consume them; the
leader is killed shortly after promotion begins and a follower takes over.
Either awa_trio processes or awa-pg 0.6.1 runtimes lead."""

from __future__ import annotations

import dataclasses
import datetime
import gc

import trio

from support.chaos import (
    ManagedProcess,
    awa_pg_candidate,
    awa_pg_consumer,
    awa_trio_candidate,
    done_counts,
    job_outcomes,
    lock_owner,
    wait_for_new_holder,
)
from support.helpers import leader_lock_holders

KIND = "wave_job"
QUEUE = "wave"

SCHEDULED_LEFT_SQL = "SELECT count(*) FROM awa.scheduled_jobs WHERE kind = $1"
MAKE_DUE_SQL = """
    WITH due AS (SELECT clock_timestamp() + make_interval(secs => $2) AS at),
         moved AS (UPDATE awa.scheduled_jobs SET run_at = (SELECT at FROM due) WHERE kind = $1 RETURNING 1)
    SELECT (SELECT at FROM due) FROM moved LIMIT 1
"""
COMPLETED_SQL = "SELECT count(*) FROM awa.jobs WHERE kind = $1 AND state = 'completed'"


@dataclasses.dataclass
class WaveResult:
    leaders: str
    jobs: int
    promoted_at_kill: int  # rows out of awa.scheduled_jobs when the leader died
    takeover: float  # SIGKILL to a new lock holder
    promotion: float  # due time to no row left in awa.scheduled_jobs
    completion: float  # due time to every job completed
    outcomes: dict[tuple[str, int], int]
    handler_runs: dict[int, int]  # job id -> DONE lines
    job_ids: list[int]
    unexpected_exits: list[str]

    @property
    def exactly_once(self) -> bool:
        return (self.outcomes == {("completed", 1): self.jobs}
                and set(self.handler_runs) == set(self.job_ids)
                and all(runs == 1 for runs in self.handler_runs.values()))


def leader_candidates(leaders: str, database_url: str) -> list[ManagedProcess]:
    """Two candidates on default settings: awa_trio processes, or awa-pg
    runtimes (upstream's leader, a 10 s election interval)."""
    if leaders == "awa_trio":
        return [awa_trio_candidate(f"awa_trio {n}", database_url, "--log-level", "WARNING", with_cron=False)
                for n in (1, 2)]
    return [awa_pg_candidate(f"awa-pg {n}", database_url, election_interval_ms=10_000, with_cron=False)
            for n in (1, 2)]


async def run_wave(admin, client, database_url: str, *, leaders: str, jobs: int, kill_after: float,
                   consumers: int = 2, slots: int = 16, due_in: float = 1.0,
                   timeout: float = 180.0) -> WaveResult:
    """One wave: start the leader, then a follower and the consumers; insert
    ``jobs`` due together; SIGKILL the leader ``kill_after`` seconds after
    the first rows leave awa.scheduled_jobs; wait for every job to complete."""
    first, second = leader_candidates(leaders, database_url)
    workers = [awa_pg_consumer(f"consumer {n}", database_url, KIND, QUEUE, max_workers=slots)
               for n in range(consumers)]
    everyone = [first, second, *workers]
    async with trio.open_nursery() as nursery:
        try:
            await first.start(nursery)
            with trio.fail_after(60):
                while (owner := await lock_owner(admin, [first])) is None or owner[1] is None:
                    await trio.sleep(0.05)
            await first.wait_ready()
            for process in (second, *workers):
                await process.start(nursery)
            for process in (second, *workers):
                await process.wait_ready(timeout=60)
            await trio.sleep(1.0)  # the follower's first election try is behind it

            # Inserted an hour ahead, then all moved to one due time in one
            # statement: the wave comes due together however long the insert took.
            later = datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=1)
            inserted = await trio.to_thread.run_sync(
                lambda: client.insert_many_copy([{"n": n} for n in range(jobs)], kind=KIND, queue=QUEUE,
                                                run_at=later))
            job_ids = [job.id for job in inserted]
            del inserted
            gc.collect()
            due_at = await admin.fetchval(MAKE_DUE_SQL, KIND, due_in)

            with trio.fail_after(timeout):
                while await admin.fetchval(SCHEDULED_LEFT_SQL, KIND) == jobs:
                    await trio.sleep(0.005)
                await trio.sleep(kill_after)
                old_holders = set(await leader_lock_holders(admin))
                promoted_at_kill = jobs - await admin.fetchval(SCHEDULED_LEFT_SQL, KIND)
                first.kill()
                killed_at = trio.current_time()
                took, _ = await wait_for_new_holder(admin, old_holders, timeout=timeout)
                promotion = None
                while await admin.fetchval(COMPLETED_SQL, KIND) < jobs:
                    if promotion is None and not await admin.fetchval(SCHEDULED_LEFT_SQL, KIND):
                        promotion = (datetime.datetime.now(datetime.UTC) - due_at).total_seconds()
                    await trio.sleep(0.02)
                completion = (datetime.datetime.now(datetime.UTC) - due_at).total_seconds()
                promotion = completion if promotion is None else promotion
                # Handlers print DONE before the runtime records completion; give stragglers a moment.
                while len(done_counts(workers)) < jobs:
                    await trio.sleep(0.05)
            await trio.sleep(1.0)  # a late duplicate would show up now
            outcomes = await job_outcomes(admin, KIND)
            return WaveResult(leaders, jobs, promoted_at_kill, took - killed_at, promotion, completion, outcomes,
                              done_counts(workers), job_ids,
                              [exit for process in everyone for exit in process.unexpected_exits])
        finally:
            for process in everyone:
                await process.stop()
            nursery.cancel_scope.cancel()
