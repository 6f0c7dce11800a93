"""The three rescue branches on the canonical engine: exact rows before and
after one pass, batch limits, row locks, unique claims and metrics.

Jobs are written with plain SQL into awa's real tables (schema installed by
awa-pg 0.6.1), so every column a rescue may touch has a known value.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta

import asyncpg
import pytest
import trio
from support.contexts import make_context as make_test_context
from support.helpers import metric_points

from awa_trio.config import MaintenanceConfig
from awa_trio.context import MaintenanceContext
from awa_trio.engines.canonical import rescue_callbacks, rescue_deadlines, rescue_heartbeats
from awa_trio.jobs import JobRow

STALENESS = 60.0
HEARTBEAT_ERROR = "heartbeat stale: worker presumed dead"
DEADLINE_ERROR = "hard deadline exceeded"
CALLBACK_ERROR = "callback timed out"
CALLBACK_COLUMNS = (
    "callback_id", "callback_timeout_at", "callback_filter",
    "callback_on_complete", "callback_on_fail", "callback_transform",
)  # fmt: skip

# -- helpers shared with the other rescue/hook test modules --------------------


async def make_context(db, config=None, **options) -> MaintenanceContext:
    return await make_test_context(
        db, config or MaintenanceConfig(heartbeat_staleness=STALENESS), **options
    )


async def db_now(db) -> datetime:
    return await db.fetchval("SELECT now()")


async def insert_job(db, *, table: str = "awa.jobs_hot", **columns) -> int:
    """One row with exactly these columns (and test defaults); returns its id."""
    values = {
        "kind": "rescue_test",
        "queue": "rescue",
        "args": {"n": 1},
        "state": "running",
        "attempt": 1,
        "max_attempts": 25,
        "run_lease": 1,
    }
    values.update(columns)
    names = ", ".join(values)
    placeholders = ", ".join(f"${i}" for i in range(1, len(values) + 1))
    return await db.fetchval(
        f"INSERT INTO {table} ({names}) VALUES ({placeholders}) RETURNING id", *values.values()
    )


async def insert_running(db, now: datetime, **columns) -> int:
    """A claimed job as awa-pg's dispatcher leaves it (attempt 1, lease 1)."""
    values = {
        "attempted_at": now - timedelta(minutes=10),
        "heartbeat_at": now - timedelta(minutes=10),
        "deadline_at": now + timedelta(minutes=5),
        "run_at": now - timedelta(minutes=11),
    }
    values.update(columns)
    return await insert_job(db, **values)


JOB_SNAPSHOT_SQL = """
    SELECT 'jobs_hot' AS table_name, * FROM awa.jobs_hot WHERE id = $1
    UNION ALL
    SELECT 'scheduled_jobs', * FROM awa.scheduled_jobs WHERE id = $1
"""


async def job_snapshot(db, job_id: int) -> dict | None:
    """Every column of a job plus the table it lives in."""
    record = await db.fetchrow(JOB_SNAPSHOT_SQL, job_id)
    return None if record is None else dict(record)


def assert_error_entry(entry: dict, *, error: str, attempt: int, before: datetime, after: datetime):
    assert set(entry) == {"error", "attempt", "at"}
    assert entry["error"] == error
    assert entry["attempt"] == attempt
    assert before <= datetime.fromisoformat(entry["at"]) <= after


def rescue_counts(reader) -> dict[str, int]:
    return {
        attributes["awa.rescue.kind"]: point.value
        for attributes, point in metric_points(reader, "awa.maintenance.rescues")
    }


def assert_retryable_rescue(
    before: dict, after: dict, *, error: str, start: datetime, end: datetime
) -> None:
    """A heartbeat/deadline rescue: only these columns change, and the row
    moved to scheduled_jobs."""
    assert after["table_name"] == "scheduled_jobs"
    assert after["state"] == "retryable"
    assert start <= after["finalized_at"] <= end
    assert after["heartbeat_at"] is None
    assert after["deadline_at"] is None
    for column in CALLBACK_COLUMNS:
        assert after[column] is None, column
    assert after["errors"][:-1] == before["errors"]
    assert_error_entry(after["errors"][-1], error=error, attempt=before["attempt"],
                       before=start, after=end)
    changed = {"table_name", "state", "finalized_at", "heartbeat_at", "deadline_at", "errors",
               *CALLBACK_COLUMNS}
    assert {k: v for k, v in after.items() if k not in changed} == {
        k: v for k, v in before.items() if k not in changed
    }


# -- rescue_stale_heartbeats ---------------------------------------------------


async def test_stale_heartbeat_becomes_retryable_and_fresh_rows_are_untouched(db):
    ctx = await make_context(db)
    now = await db_now(db)
    earlier_error = {"error": "boom", "attempt": 1, "at": "2024-01-01T00:00:00+00:00"}
    stale = await insert_running(
        db, now,
        attempt=2, max_attempts=2, run_lease=2,
        errors=[earlier_error],
        callback_id=uuid.uuid4(),
        callback_timeout_at=now + timedelta(minutes=1),
        callback_filter="$.ok", callback_on_complete="true", callback_on_fail="false",
        callback_transform="$", progress={"percent": 40}, metadata={"m": 1}, tags=["t"],
    )
    fresh = await insert_running(db, now, heartbeat_at=now - timedelta(seconds=STALENESS / 2))
    # Only running rows are rescued, whatever their heartbeat says.
    completed = await insert_job(db, state="completed", heartbeat_at=now - timedelta(hours=1),
                                 finalized_at=now - timedelta(hours=1))
    available = await insert_job(db, state="available", attempt=0, run_lease=0)
    waiting = await insert_job(db, state="waiting_external",
                               heartbeat_at=now - timedelta(hours=1),
                               callback_id=uuid.uuid4(),
                               callback_timeout_at=now + timedelta(minutes=5))
    untouched = [fresh, completed, available, waiting]
    before = {job_id: await job_snapshot(db, job_id) for job_id in [stale, *untouched]}

    start = await db_now(db)
    result = await rescue_heartbeats.run_once(ctx)
    end = await db_now(db)

    after = await job_snapshot(db, stale)
    assert_retryable_rescue(before[stale], after, error=HEARTBEAT_ERROR, start=start, end=end)
    # max_attempts is not consulted: attempt 2 of 2 is retried anyway (as upstream).
    assert after["attempt"] == 2
    assert after["run_at"] == before[stale]["run_at"]
    for job_id in untouched:
        assert await job_snapshot(db, job_id) == before[job_id]

    assert [job.id for job in result.rescued] == [stale]
    rescued: JobRow = result.rescued[0]
    assert rescued.state == "retryable" and rescued.run_lease == 2
    assert rescued.errors == after["errors"]
    assert rescued.last_error == HEARTBEAT_ERROR
    assert result.duplicates_cancelled == [] and result.skipped == [] and not result.row_by_row

    # Nothing left to do: a second pass rescues nothing.
    assert (await rescue_heartbeats.run_once(ctx)).rescued == []


BATCH = 50


async def one_batch_per_tick(db) -> MaintenanceContext:
    """A tick whose budget is spent after its first batch."""
    return await make_context(db, rescue_batch_size=BATCH, drain_time_budget="0.001ms")


async def test_with_its_budget_spent_a_heartbeat_rescue_takes_one_batch_per_tick(db):
    ctx = await one_batch_per_tick(db)
    await db.execute(
        """
        INSERT INTO awa.jobs_hot (kind, queue, args, state, attempt, run_lease,
                                  attempted_at, heartbeat_at)
        SELECT 'bulk', 'rescue', jsonb_build_object('n', g), 'running', 1, 1,
               now() - interval '1 hour', now() - interval '1 hour'
        FROM generate_series(1, $1) AS g
        """,
        BATCH + 1,
    )
    count_sql = "SELECT count(*) FROM awa.jobs WHERE kind = 'bulk' AND state = $1"

    first = await rescue_heartbeats.run_once(ctx)
    assert (len(first.rescued), first.batches, first.drained) == (BATCH, 1, False)
    assert await db.fetchval(count_sql, "running") == 1
    assert await db.fetchval(count_sql, "retryable") == BATCH

    second = await rescue_heartbeats.run_once(ctx)
    assert (len(second.rescued), second.drained) == (1, True)
    assert await db.fetchval(count_sql, "running") == 0
    assert await db.fetchval(count_sql, "retryable") == BATCH + 1


async def test_heartbeat_rescue_skips_rows_locked_by_others(db):
    """A row another transaction holds (a worker finishing it) is left for a
    later pass instead of blocking this one."""
    ctx = await make_context(db)
    now = await db_now(db)
    locked = await insert_running(db, now)
    free = await insert_running(db, now)
    async with db.transaction() as conn:
        await conn.execute("SELECT id FROM awa.jobs_hot WHERE id = $1 FOR UPDATE", locked)
        with trio.fail_after(10):
            result = await rescue_heartbeats.run_once(ctx)
    assert [job.id for job in result.rescued] == [free]
    assert (await job_snapshot(db, locked))["state"] == "running"
    assert [job.id for job in (await rescue_heartbeats.run_once(ctx)).rescued] == [locked]


async def test_rescued_unique_job_keeps_its_own_claim(db):
    """Default unique mask (scheduled, available, running, completed,
    retryable): the claim moves with the row from jobs_hot to
    scheduled_jobs and stays this job's."""
    ctx = await make_context(db)
    now = await db_now(db)
    key = b"\x01" * 16
    job_id = await insert_running(db, now, unique_key=key,
                                  unique_states=asyncpg.BitString("11111000"))
    claims_sql = "SELECT unique_key, job_id FROM awa.job_unique_claims"
    assert [tuple(r) for r in await db.fetch(claims_sql)] == [(key, job_id)]

    result = await rescue_heartbeats.run_once(ctx)

    assert [job.id for job in result.rescued] == [job_id]
    assert [tuple(r) for r in await db.fetch(claims_sql)] == [(key, job_id)]


# -- rescue_expired_deadlines --------------------------------------------------


async def test_expired_deadline_becomes_retryable_and_others_are_untouched(db):
    ctx = await make_context(db)
    now = await db_now(db)
    fresh_heartbeat = now - timedelta(seconds=1)
    expired = await insert_running(
        db, now, heartbeat_at=fresh_heartbeat, deadline_at=now - timedelta(seconds=1),
        callback_id=uuid.uuid4(), callback_timeout_at=now + timedelta(minutes=1),
        errors=[{"error": "earlier", "attempt": 1, "at": "2024-01-01T00:00:00+00:00"}],
        attempt=3, run_lease=7,
    )
    future = await insert_running(db, now, heartbeat_at=fresh_heartbeat,
                                  deadline_at=now + timedelta(minutes=1))
    no_deadline = await insert_running(db, now, heartbeat_at=fresh_heartbeat, deadline_at=None)
    waiting = await insert_job(db, state="waiting_external", deadline_at=now - timedelta(hours=1),
                               callback_id=uuid.uuid4(),
                               callback_timeout_at=now + timedelta(minutes=5))
    untouched = [future, no_deadline, waiting]
    before = {job_id: await job_snapshot(db, job_id) for job_id in [expired, *untouched]}

    start = await db_now(db)
    result = await rescue_deadlines.run_once(ctx)
    end = await db_now(db)

    after = await job_snapshot(db, expired)
    assert_retryable_rescue(before[expired], after, error=DEADLINE_ERROR, start=start, end=end)
    assert after["run_at"] == before[expired]["run_at"]
    assert after["run_lease"] == 7 and after["attempt"] == 3
    for job_id in untouched:
        assert await job_snapshot(db, job_id) == before[job_id]
    assert [job.id for job in result.rescued] == [expired]
    # The heartbeat branch has nothing to do with these rows.
    assert (await rescue_heartbeats.run_once(ctx)).rescued == []


async def test_with_its_budget_spent_a_deadline_rescue_takes_one_batch_per_tick(db):
    ctx = await one_batch_per_tick(db)
    await db.execute(
        """
        INSERT INTO awa.jobs_hot (kind, queue, args, state, attempt, run_lease,
                                  attempted_at, heartbeat_at, deadline_at)
        SELECT 'bulk', 'rescue', jsonb_build_object('n', g), 'running', 1, 1,
               now(), now(), now() - interval '1 second'
        FROM generate_series(1, $1) AS g
        """,
        BATCH + 1,
    )
    assert len((await rescue_deadlines.run_once(ctx)).rescued) == BATCH
    assert len((await rescue_deadlines.run_once(ctx)).rescued) == 1
    assert len((await rescue_deadlines.run_once(ctx)).rescued) == 0


# -- rescue_expired_callbacks --------------------------------------------------


async def insert_waiting(db, now: datetime, **columns) -> int:
    """A job parked on an external callback, as awa-pg leaves it."""
    values = {
        "state": "waiting_external",
        "attempted_at": now - timedelta(minutes=2),
        "run_at": now - timedelta(minutes=3),
        "heartbeat_at": None,
        "deadline_at": None,
        "callback_id": uuid.uuid4(),
        "callback_timeout_at": now - timedelta(seconds=1),
        "callback_filter": "$.status",
        "callback_on_complete": "true",
        "callback_on_fail": "false",
        "callback_transform": "$",
    }
    values.update(columns)
    return await insert_job(db, **values)


async def test_expired_callbacks_retry_with_backoff_or_fail_on_last_attempt(db):
    ctx = await make_context(db)
    now = await db_now(db)
    retried = await insert_waiting(db, now, attempt=1, max_attempts=3)
    exhausted = await insert_waiting(db, now, attempt=3, max_attempts=3,
                                     errors=[{"error": "e1", "attempt": 1, "at": "x"}])
    future = await insert_waiting(db, now, callback_timeout_at=now + timedelta(minutes=1))
    running = await insert_running(db, now, heartbeat_at=now, callback_id=uuid.uuid4(),
                                   callback_timeout_at=now - timedelta(minutes=1))
    untouched = [future, running]
    before = {job_id: await job_snapshot(db, job_id) for job_id in [retried, exhausted, *untouched]}

    start = await db_now(db)
    result = await rescue_callbacks.run_once(ctx)
    end = await db_now(db)

    changed = {"table_name", "state", "finalized_at", "errors", "run_at", *CALLBACK_COLUMNS}

    after_retried = await job_snapshot(db, retried)
    assert after_retried["table_name"] == "scheduled_jobs"
    assert after_retried["state"] == "retryable"
    # awa.backoff_duration(1, 3) = 2 s plus up to 25 % jitter.
    assert start + timedelta(seconds=2) <= after_retried["run_at"] <= end + timedelta(seconds=2.5)
    assert start <= after_retried["finalized_at"] <= end
    assert_error_entry(after_retried["errors"][-1], error=CALLBACK_ERROR, attempt=1,
                       before=start, after=end)
    assert len(after_retried["errors"]) == 1

    after_exhausted = await job_snapshot(db, exhausted)
    assert after_exhausted["table_name"] == "jobs_hot"
    assert after_exhausted["state"] == "failed"
    assert after_exhausted["run_at"] == before[exhausted]["run_at"]
    assert start <= after_exhausted["finalized_at"] <= end
    assert after_exhausted["errors"][0] == {"error": "e1", "attempt": 1, "at": "x"}
    assert_error_entry(after_exhausted["errors"][-1], error=CALLBACK_ERROR, attempt=3,
                       before=start, after=end)

    for job_id, after in ((retried, after_retried), (exhausted, after_exhausted)):
        for column in CALLBACK_COLUMNS:
            assert after[column] is None, column
        assert {k: v for k, v in after.items() if k not in changed} == {
            k: v for k, v in before[job_id].items() if k not in changed
        }
    for job_id in untouched:
        assert await job_snapshot(db, job_id) == before[job_id]

    assert sorted((job.id, job.state) for job in result.rescued) == sorted(
        [(retried, "retryable"), (exhausted, "failed")]
    )


async def test_with_its_budget_spent_a_callback_rescue_takes_one_batch_per_tick(db):
    ctx = await one_batch_per_tick(db)
    await db.execute(
        """
        INSERT INTO awa.jobs_hot (kind, queue, args, state, attempt, run_lease,
                                  callback_id, callback_timeout_at)
        SELECT 'bulk', 'rescue', jsonb_build_object('n', g), 'waiting_external', 1, 1,
               gen_random_uuid(), now() - interval '1 second'
        FROM generate_series(1, $1) AS g
        """,
        BATCH + 1,
    )
    assert len((await rescue_callbacks.run_once(ctx)).rescued) == BATCH
    assert len((await rescue_callbacks.run_once(ctx)).rescued) == 1
    assert len((await rescue_callbacks.run_once(ctx)).rescued) == 0


@pytest.mark.parametrize(
    ("branch", "arrange", "from_state"),
    [
        (rescue_deadlines,
         lambda db, now: insert_running(db, now, heartbeat_at=now,
                                        deadline_at=now - timedelta(seconds=1)),
         "running"),
        (rescue_callbacks, lambda db, now: insert_waiting(db, now), "waiting_external"),
    ],
    ids=["deadline", "callback"],
)
async def test_deadline_and_callback_rescues_skip_rows_locked_by_others(
    db, branch, arrange, from_state
):
    """As for heartbeats: a row another transaction holds (a worker finishing
    it, a callback arriving) is left for a later pass instead of blocking
    this one."""
    ctx = await make_context(db)
    now = await db_now(db)
    locked = await arrange(db, now)
    free = await arrange(db, now)
    async with db.transaction() as conn:
        await conn.execute("SELECT id FROM awa.jobs_hot WHERE id = $1 FOR UPDATE", locked)
        with trio.fail_after(10):
            result = await branch.run_once(ctx)
    assert [job.id for job in result.rescued] == [free]
    assert (await job_snapshot(db, locked))["state"] == from_state
    assert [job.id for job in (await branch.run_once(ctx)).rescued] == [locked]


# -- metrics -------------------------------------------------------------------


async def test_rescues_are_counted_by_kind(db, meter_provider, metric_reader):
    ctx = await make_context(db, meter_provider=meter_provider)
    now = await db_now(db)
    for _ in range(3):
        await insert_running(db, now)
    for _ in range(2):
        await insert_running(db, now, heartbeat_at=now, deadline_at=now - timedelta(seconds=1))
    await insert_waiting(db, now)

    await rescue_heartbeats.run_once(ctx)
    await rescue_deadlines.run_once(ctx)
    await rescue_callbacks.run_once(ctx)
    # Empty passes add nothing.
    await rescue_heartbeats.run_once(ctx)

    assert rescue_counts(metric_reader) == {"heartbeat": 3, "deadline": 2, "callback_timeout": 1}
