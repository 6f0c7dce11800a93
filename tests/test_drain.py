"""Draining branches (cleanup, the three rescues, priority aging) on real
PostgreSQL: a backlog of many batches goes in one tick with a budget and
across ticks without one, cancellation leaves whole batches, side effects
keep up, and a live awa-pg worker never waits on a drain for longer than
one batch."""

from __future__ import annotations

import dataclasses
import math
from contextlib import asynccontextmanager
from datetime import timedelta

import pytest
import trio
from conftest import in_thread
from support.awa_pg import awa_pg_worker
from support.contexts import make_context
from test_rescue import (
    CALLBACK_ERROR,
    DEADLINE_ERROR,
    HEARTBEAT_ERROR,
    db_now,
    insert_running,
    job_snapshot,
)
from test_rescue_fallback import CLAIM_BY_HAND_SQL, MASK_WITHOUT_RUNNING, insert_unique

from awa_trio.config import MaintenanceConfig
from awa_trio.engines.canonical import (
    cleanup,
    priority_aging,
    rescue_callbacks,
    rescue_deadlines,
    rescue_heartbeats,
)
from awa_trio.hooks import FollowUpJob, Hooks, JobRescued
from awa_trio.leadership import LOCK_KEY
from awa_trio.maintenance.drain import PAUSE_RATIO, BatchOutcome, DrainBudget, drain, tick_budget

BATCH = 50
#: More than ten batches, and not a multiple of the batch size.
BACKLOG = 12 * BATCH + 20
GENEROUS = "60s"
#: Spent as soon as a batch has run (no round trip takes a microsecond): every
#: tick takes exactly one batch per step, however fast the server answers.
TINY = "0.001ms"

# -- arranging backlogs in bulk ------------------------------------------------

INSERT_EXPIRED_SQL = """
    INSERT INTO awa.jobs_hot (kind, queue, state, attempt, finalized_at)
    SELECT 'drain_probe', $1, $2::awa.job_state, 1, now() - make_interval(hours => $3)
    FROM generate_series(1, $4)
    RETURNING id
"""
INSERT_STALE_SQL = """
    INSERT INTO awa.jobs_hot (kind, queue, args, state, attempt, run_lease, run_at,
                              attempted_at, heartbeat_at, deadline_at)
    SELECT 'drain_probe', 'rescue', jsonb_build_object('n', g), 'running', 1, 1,
           now() - interval '2 hours', now() - interval '1 hour',
           now() - interval '1 hour' + make_interval(secs => g), {deadline}
    FROM generate_series(1, $1) AS g
    RETURNING id
"""
INSERT_EXPIRED_CALLBACKS_SQL = """
    INSERT INTO awa.jobs_hot (kind, queue, args, state, attempt, max_attempts, run_lease,
                              callback_id, callback_timeout_at)
    SELECT 'drain_probe', 'rescue', jsonb_build_object('n', g), 'waiting_external',
           1, 3, 1, gen_random_uuid(), now() - interval '1 minute'
    FROM generate_series(1, $1) AS g
    RETURNING id
"""
INSERT_WAITING_SQL = """
    INSERT INTO awa.jobs_hot (kind, queue, priority, run_at)
    SELECT 'drain_probe', 'aging', $1, now() - make_interval(secs => $2)
    FROM generate_series(1, $3)
    RETURNING id
"""


async def ids(db, sql: str, *args) -> set[int]:
    return {row["id"] for row in await db.fetch(sql, *args)}


async def jobs_hot_ids(db) -> set[int]:
    return await ids(db, "SELECT id FROM awa.jobs_hot")


async def rescued_ids(db, error: str) -> set[int]:
    """Jobs whose last error entry is this rescue's, in either table."""
    return await ids(
        db,
        "SELECT id FROM awa.jobs WHERE errors[array_length(errors, 1)] ->> 'error' = $1",
        error,
    )


async def priorities(db) -> dict[int, int]:
    rows = await db.fetch(
        "SELECT priority, count(*) AS n FROM awa.jobs_hot WHERE queue = 'aging' GROUP BY 1")
    return {row["priority"]: row["n"] for row in rows}


# -- the loop and its budget ---------------------------------------------------


def test_the_budget_is_the_setting_capped_at_half_the_interval():
    config = MaintenanceConfig(drain_time_budget="10s")
    assert tick_budget(config, 60) == 10
    assert tick_budget(config, 4) == 2


async def test_drain_repeats_full_batches_until_a_short_one_or_the_budget(autojump_clock):
    sizes = iter([3, 3, 3, 1, 3])

    async def batch():
        await trio.sleep(1)
        return BatchOutcome.of(next(sizes), 3)

    started = trio.current_time()
    outcome = await drain(batch, budget=DrainBudget(100))
    assert (outcome.batches, outcome.rows, outcome.drained) == (4, 10, True)
    assert outcome.longest_batch == pytest.approx(1)
    # Four batches of 1 s, a rest of half a batch after each of the three full ones.
    assert trio.current_time() - started == pytest.approx(4 + 3 * PAUSE_RATIO)

    sizes = iter([3] * 10)
    outcome = await drain(batch, budget=DrainBudget(1 + PAUSE_RATIO + 1.1))
    # The third batch starts within the budget and runs past it.
    assert (outcome.batches, outcome.rows, outcome.drained) == (3, 9, False)


# -- backlogs of many batches --------------------------------------------------


@pytest.mark.parametrize(("budget", "ticks"), [(GENEROUS, 1), (TINY, math.ceil(BACKLOG / BATCH))])
async def test_cleanup_drains_a_backlog_of_many_batches(db, budget, ticks):
    ctx = await make_context(db, cleanup_batch_size=BATCH, drain_time_budget=budget)
    expired = await ids(db, INSERT_EXPIRED_SQL, "default", "completed", 25, BACKLOG - 30)
    expired |= await ids(db, INSERT_EXPIRED_SQL, "default", "cancelled", 73, 30)
    kept = await ids(db, INSERT_EXPIRED_SQL, "default", "completed", 23, 40)
    kept |= await ids(db, INSERT_EXPIRED_SQL, "default", "failed", 71, 5)

    results = [await cleanup.run_once(ctx) for _ in range(ticks)]

    assert await jobs_hot_ids(db) == kept
    assert sum(result.jobs_deleted for result in results) == BACKLOG
    assert results[-1].unfinished_steps == []
    if ticks > 1:
        assert [result.jobs_deleted for result in results] == [BATCH] * (ticks - 1) + [20]
        assert all(r.unfinished_steps == ["finished jobs (global pass)"] for r in results[:-1])
    else:
        assert results[0].batches >= BACKLOG // BATCH


RESCUES = {
    "heartbeat": (rescue_heartbeats, INSERT_STALE_SQL.format(deadline="NULL"), HEARTBEAT_ERROR),
    "deadline": (
        rescue_deadlines,
        INSERT_STALE_SQL.format(deadline="now() - interval '1 second'"),
        DEADLINE_ERROR,
    ),
    "callback": (rescue_callbacks, INSERT_EXPIRED_CALLBACKS_SQL, CALLBACK_ERROR),
}


@pytest.mark.parametrize("kind", sorted(RESCUES))
@pytest.mark.parametrize(("budget", "ticks"), [(GENEROUS, 1), (TINY, math.ceil(BACKLOG / BATCH))])
async def test_each_rescue_drains_a_backlog_of_many_batches(db, kind, budget, ticks):
    branch, insert_sql, error = RESCUES[kind]
    ctx = await make_context(
        db, heartbeat_staleness="90s", rescue_batch_size=BATCH, drain_time_budget=budget)
    backlog = await ids(db, insert_sql, BACKLOG)
    now = await db_now(db)
    # Healthy: a fresh heartbeat, a deadline and callback timeout still ahead.
    healthy = await insert_running(
        db, now, heartbeat_at=now, deadline_at=now + timedelta(minutes=5),
        callback_timeout_at=now + timedelta(minutes=5))
    before = await job_snapshot(db, healthy)

    results = [await branch.run_once(ctx) for _ in range(ticks)]

    assert await rescued_ids(db, error) == backlog
    assert {job.id for result in results for job in result.rescued} == backlog
    assert [result.drained for result in results] == [False] * (ticks - 1) + [True]
    if ticks > 1:
        assert [len(r.rescued) for r in results] == [BATCH] * (ticks - 1) + [20]
    else:
        assert results[0].batches == BACKLOG // BATCH + 1
    assert await job_snapshot(db, healthy) == before
    # Heartbeat and deadline rescues leave no running row behind; the
    # callback rescue no waiting one.
    left = await db.fetchval(
        "SELECT count(*) FROM awa.jobs_hot WHERE state IN ('running', 'waiting_external')")
    assert left == 1


async def test_priority_aging_raises_every_eligible_job_exactly_one_level_per_tick(db):
    ctx = await make_context(
        db, priority_aging_interval="60s", priority_aging_batch_size=BATCH,
        drain_time_budget=GENEROUS)
    await db.fetch(INSERT_WAITING_SQL, 4, 600, BACKLOG)
    await db.fetch(INSERT_WAITING_SQL, 3, 600, 300)
    await db.fetch(INSERT_WAITING_SQL, 2, 600, 200)
    fresh = await ids(db, INSERT_WAITING_SQL, 4, 10, 70)

    first = await priority_aging.run_once(ctx)
    # Every eligible job, not the first 1000; none twice.
    assert (first.aged, first.drained) == (BACKLOG + 500, True)
    assert first.aged_by_level == {2: 200, 3: 300, 4: BACKLOG}
    assert await priorities(db) == {1: 200, 2: 300, 3: BACKLOG, 4: 70}
    originals = await db.fetch(
        "SELECT (metadata->>'_awa_original_priority')::int AS original, priority, count(*) AS n"
        " FROM awa.jobs_hot WHERE queue = 'aging' GROUP BY 1, 2 ORDER BY 1, 2")
    assert [tuple(row) for row in originals] == [
        (2, 1, 200), (3, 2, 300), (4, 3, BACKLOG), (None, 4, 70)]

    second = await priority_aging.run_once(ctx)
    assert second.aged == BACKLOG + 300
    assert await priorities(db) == {1: 500, 2: BACKLOG, 4: 70}
    third = await priority_aging.run_once(ctx)
    assert third.aged == BACKLOG
    assert await priorities(db) == {1: 500 + BACKLOG, 4: 70}
    assert await ids(db, "SELECT id FROM awa.jobs_hot WHERE priority = 4") == fresh


async def test_priority_aging_with_a_tiny_budget_ages_one_batch_per_level_per_tick(db):
    ctx = await make_context(
        db, priority_aging_batch_size=BATCH, drain_time_budget=TINY)
    await db.fetch(INSERT_WAITING_SQL, 4, 600, BACKLOG)
    await db.fetch(INSERT_WAITING_SQL, 3, 600, 300)
    await db.fetch(INSERT_WAITING_SQL, 2, 600, 200)

    first = await priority_aging.run_once(ctx)
    assert (first.aged, first.batches, first.drained) == (3 * BATCH, 3, False)
    # A job aged from 3 to 2 this tick was not aged again by level 2's batch.
    assert await priorities(db) == {1: BATCH, 2: 200, 3: 300, 4: BACKLOG - BATCH}

    ticks = 1
    while not (await priority_aging.run_once(ctx)).drained:
        ticks += 1
        assert ticks < 100
    assert await priorities(db) == {1: 500 + BACKLOG}


# -- cancellation --------------------------------------------------------------


class CancelDuringStatement:
    """A database that cancels ``scope`` a few ms into its ``nth`` statement
    (leadership lost while a batch runs on the server)."""

    def __init__(self, db, nursery: trio.Nursery, scope: trio.CancelScope, nth: int, delay: float):
        self._db = db
        self._nursery = nursery
        self._scope = scope
        self._nth = nth
        self._delay = delay
        self.statements = 0

    def __getattr__(self, name):
        return getattr(self._db, name)

    async def _call(self, method, *args, target=None):
        self.statements += 1
        if self.statements == self._nth:
            self._nursery.start_soon(self._cancel_later)
        return await getattr(target or self._db, method)(*args)

    @asynccontextmanager
    async def transaction(self, **options):
        """Statements inside a transaction count too (a canonical rescue
        batch runs with its cancel notices in one)."""
        async with self._db.transaction(**options) as conn:
            yield _CountedConnection(self, conn)

    async def _cancel_later(self):
        await trio.sleep(self._delay)
        self._scope.cancel(reason="advisory lock lost")

    async def fetch(self, *args):
        return await self._call("fetch", *args)

    async def fetchrow(self, *args):
        return await self._call("fetchrow", *args)

    async def fetchone(self, *args):
        return await self._call("fetchone", *args)

    async def execute(self, *args):
        return await self._call("execute", *args)


class _CountedConnection:
    def __init__(self, counter: CancelDuringStatement, conn):
        self._counter = counter
        self._conn = conn

    def __getattr__(self, name):
        return getattr(self._conn, name)

    async def fetch(self, *args):
        return await self._counter._call("fetch", *args, target=self._conn)

    async def fetchrow(self, *args):
        return await self._counter._call("fetchrow", *args, target=self._conn)

    async def fetchval(self, *args):
        return await self._counter._call("fetchval", *args, target=self._conn)

    async def execute(self, *args):
        return await self._counter._call("execute", *args, target=self._conn)


async def run_cancelled(ctx, body, nth: int, delay: float):
    async with trio.open_nursery() as nursery:
        with trio.CancelScope() as scope:
            cancelling = CancelDuringStatement(ctx.db, nursery, scope, nth, delay)
            await body(dataclasses.replace(ctx, services=dataclasses.replace(ctx.services, db=cancelling)))
        assert scope.cancelled_caught


@pytest.mark.parametrize("delay", [0.0, 0.002, 0.01])
async def test_a_cancelled_cleanup_drain_leaves_whole_batches(db, delay):
    ctx = await make_context(db, cleanup_batch_size=BATCH, drain_time_budget=GENEROUS)
    total = 40 * BATCH
    expired = await ids(db, INSERT_EXPIRED_SQL, "default", "completed", 25, total)

    await run_cancelled(ctx, cleanup.run_once, nth=5, delay=delay)

    left = await jobs_hot_ids(db)
    assert left <= expired
    # Four batches done for sure, and every batch entirely or not at all.
    deleted = len(expired) - len(left)
    assert deleted >= 4 * BATCH and deleted % BATCH == 0 and left
    # The next tick picks up where the cancelled one stopped.
    assert (await cleanup.run_once(ctx)).jobs_deleted == len(left)
    assert await jobs_hot_ids(db) == set()


@pytest.mark.parametrize("delay", [0.0, 0.002, 0.01])
async def test_a_cancelled_rescue_drain_leaves_whole_batches(db, delay):
    ctx = await make_context(
        db, heartbeat_staleness="90s", rescue_batch_size=BATCH, drain_time_budget=GENEROUS)
    total = 20 * BATCH
    backlog = await ids(db, INSERT_STALE_SQL.format(deadline="NULL"), total)
    before = {row["id"]: dict(row) for row in await db.fetch("SELECT * FROM awa.jobs_hot")}

    # Two statements a batch (the rescue, its cancel notices): the 3rd batch's rescue.
    await run_cancelled(ctx, rescue_heartbeats.run_once, nth=5, delay=delay)

    rescued = await rescued_ids(db, HEARTBEAT_ERROR)
    assert len(rescued) >= 2 * BATCH and len(rescued) % BATCH == 0 and len(rescued) < total
    # Rescued rows moved whole (retryable, in scheduled_jobs); the others untouched.
    assert await ids(db, "SELECT id FROM awa.scheduled_jobs WHERE state = 'retryable'") == rescued
    for row in await db.fetch("SELECT * FROM awa.jobs_hot"):
        assert dict(row) == before[row["id"]]
    assert await jobs_hot_ids(db) == backlog - rescued


@pytest.mark.parametrize("delay", [0.0, 0.002, 0.01])
async def test_a_cancelled_aging_drain_leaves_whole_batches(db, delay):
    ctx = await make_context(db, priority_aging_batch_size=BATCH, drain_time_budget=GENEROUS)
    await db.fetch(INSERT_WAITING_SQL, 4, 600, 20 * BATCH)

    # Levels 2 and 3 are empty: statements 1 and 2; level 4 from statement 3.
    await run_cancelled(ctx, priority_aging.run_once, nth=5, delay=delay)

    rows = await db.fetch(
        "SELECT priority, metadata ? '_awa_original_priority' AS stamped, count(*) AS n"
        " FROM awa.jobs_hot GROUP BY 1, 2 ORDER BY 1")
    counts = {(row["priority"], row["stamped"]): row["n"] for row in rows}
    aged = counts.get((3, True), 0)
    assert aged >= 2 * BATCH and aged % BATCH == 0 and aged < 20 * BATCH
    assert counts == {(3, True): aged, (4, False): 20 * BATCH - aged}


# -- rescue side effects with a backlog ----------------------------------------


async def test_a_drained_rescue_keeps_every_side_effect_within_its_bounds(db):
    hooks = Hooks()
    signalled: list[int] = []
    delivered: list[int] = []
    release = trio.Event()

    @hooks.on_event("drain_probe")
    async def slow_handler(event):
        assert isinstance(event, JobRescued)
        await release.wait()
        delivered.append(event.job.id)

    hooks.on_rescued_enqueue(
        "drain_probe", lambda job, reason: FollowUpJob("audit", {"job_id": job.id}, queue="audit"))
    config = MaintenanceConfig(
        heartbeat_staleness="90s", rescue_batch_size=BATCH, drain_time_budget=GENEROUS,
        hook_queue_size=100, hook_concurrency=4)
    ctx = await make_context(db, config, hooks=hooks)
    backlog = await ids(db, INSERT_STALE_SQL.format(deadline="NULL"), BACKLOG)
    for job_id in backlog:
        hooks.in_flight.register(job_id, 1, lambda job_id=job_id: signalled.append(job_id))

    async with trio.open_nursery() as nursery:
        await nursery.start(hooks.run, config)
        result = await rescue_heartbeats.run_once(ctx)
        release.set()
        with trio.fail_after(10):
            while len(delivered) < BACKLOG - result.events_dropped:
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()

    assert {job.id for job in result.rescued} == backlog
    # In-flight cancellation and follow-ups for every rescued job, across batches.
    assert sorted(signalled) == sorted(backlog) and result.cancelled_in_flight == BACKLOG
    assert result.follow_ups_inserted == BACKLOG and result.follow_up_failures == 0
    follow_ups = await db.fetch("SELECT args->>'job_id' AS job_id FROM awa.jobs WHERE kind = 'audit'")
    assert sorted(int(row["job_id"]) for row in follow_ups) == sorted(backlog)
    # Events: at most hook_queue_size waiting (plus what the handlers hold); the rest dropped.
    assert 0 < result.events_dropped <= BACKLOG - config.hook_queue_size
    assert len(delivered) == BACKLOG - result.events_dropped


async def test_the_unique_claim_fallback_works_per_batch_and_the_drain_goes_on(db, awa_client):
    ctx = await make_context(
        db, heartbeat_staleness="90s", rescue_batch_size=BATCH, drain_time_budget=GENEROUS)
    # Oldest heartbeats first: 60 plain stale jobs, then the superseded
    # duplicate (in the second batch), then 59 more.
    await db.fetch(INSERT_STALE_SQL.format(deadline="NULL"), 60)
    superseded = await insert_unique(awa_client, 42, MASK_WITHOUT_RUNNING)
    assert await db.execute(CLAIM_BY_HAND_SQL, superseded) == "UPDATE 1"
    newer = await insert_unique(awa_client, 42, MASK_WITHOUT_RUNNING)
    await db.execute(
        "UPDATE awa.jobs_hot SET heartbeat_at = now() - interval '1 hour' + interval '65 seconds'"
        " WHERE id = $1", superseded)
    await db.execute(
        "UPDATE awa.jobs_hot SET heartbeat_at = heartbeat_at + interval '120 seconds'"
        " WHERE kind = 'drain_probe' AND (args->>'n')::int > 60")
    await db.fetch(
        INSERT_STALE_SQL.format(deadline="NULL").replace("make_interval(secs => g)",
                                                        "make_interval(secs => 200 + g)"), 59)

    result = await rescue_heartbeats.run_once(ctx)

    assert result.row_by_row and result.drained
    assert [job.id for job in result.duplicates_cancelled] == [superseded]
    assert len(result.rescued) == 119
    # Batch 1 (50), batch 2 row by row (49 + the duplicate), batch 3 (20).
    assert result.batches == 3
    assert (await job_snapshot(db, superseded))["state"] == "cancelled"
    assert (await job_snapshot(db, newer))["state"] == "available"
    assert await db.fetchval("SELECT count(*) FROM awa.jobs_hot WHERE state = 'running'") == 0


# -- a live worker beside a cleanup drain --------------------------------------

# Backends waiting on a lock that a cleanup statement holds.
WAITS_ON_CLEANUP_SQL = """
    SELECT waiting.pid, waiting.query_start, waiting.query
    FROM pg_stat_activity AS waiting
    WHERE waiting.datname = current_database()
      AND waiting.wait_event_type = 'Lock'
      AND EXISTS (
          SELECT 1
          FROM pg_stat_activity AS holder
          WHERE holder.pid = ANY(pg_blocking_pids(waiting.pid))
            AND holder.query LIKE '%WITH picked AS%'
      )
"""
# Any ungranted lock in this database, whoever holds it.
UNGRANTED_LOCKS_SQL = """
    SELECT count(*) FROM pg_locks
    WHERE NOT granted
      AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
"""


async def test_a_worker_keeps_completing_jobs_while_cleanup_drains(db, database_url, awa_client):
    expired_rows = 150_000
    ctx = await make_context(db, cleanup_batch_size=5000, drain_time_budget=GENEROUS)
    await db.execute(
        """
        INSERT INTO awa.jobs_hot (kind, queue, args, state, attempt, finalized_at)
        SELECT 'old_work', 'live', jsonb_build_object('n', g), 'completed', 1,
               now() - interval '2 days'
        FROM generate_series(1, $1) AS g
        """,
        expired_rows,
    )
    await db.execute("VACUUM ANALYZE awa.jobs_hot")
    inserted: list[int] = []
    waits: dict[tuple[int, object], list[float]] = {}
    ungranted_samples: list[int] = []
    draining = trio.Event()
    drained = trio.Event()
    completed_during_drain = 0

    async def produce():
        while not drained.is_set():
            jobs = await in_thread(
                awa_client.insert_many_copy, [{"n": n} for n in range(10)],
                kind="live_work", queue="live")
            inserted.extend(job.id for job in jobs)
            await trio.sleep(0.05)

    async def sample():
        while not drained.is_set():
            now = trio.current_time()
            for row in await db.fetch(WAITS_ON_CLEANUP_SQL):
                waits.setdefault((row["pid"], row["query_start"]), []).append(now)
            ungranted_samples.append(await db.fetchval(UNGRANTED_LOCKS_SQL))
            await trio.sleep(0.01)

    # This test is the leader: the awa-pg runtime must not run its own cleanup.
    async with db.transaction() as lock_conn:
        await lock_conn.execute("SELECT pg_advisory_xact_lock($1)", LOCK_KEY)
        async with awa_pg_worker(database_url, "live_work:live") as worker:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(produce)
                await worker.wait_for_line("DONE", timeout=30)
                nursery.start_soon(sample)
                done_before = sum(line.startswith("DONE") for line in worker.lines)
                draining.set()
                with trio.fail_after(120):
                    result = await cleanup.run_once(ctx)
                completed_during_drain = (
                    sum(line.startswith("DONE") for line in worker.lines) - done_before)
                drained.set()
            # The worker prints DONE from its handler, before its runtime
            # commits the completion: wait for the rows as well.
            with trio.fail_after(30):
                while sum(line.startswith("DONE") for line in worker.lines) < len(inserted) or await db.fetchval(
                    "SELECT count(*) FROM awa.jobs_hot WHERE state::text <> 'completed'"
                ):
                    await trio.sleep(0.1)

    assert result.jobs_deleted == expired_rows and result.unfinished_steps == []
    assert result.batches >= expired_rows // 5000
    assert completed_during_drain > 0
    # Only the worker's own (recent) jobs are left, all completed.
    left = await db.fetch("SELECT id, state FROM awa.jobs_hot")
    assert {row["id"] for row in left} == set(inserted)
    assert {row["state"] for row in left} == {"completed"}
    # No worker statement waited on a cleanup lock longer than one batch
    # (plus one sampling period on each side).
    longest_wait = max((seen[-1] - seen[0] for seen in waits.values()), default=0.0)
    assert longest_wait <= result.longest_batch + 0.05, (waits, result.longest_batch)
    assert len(ungranted_samples) > 10
