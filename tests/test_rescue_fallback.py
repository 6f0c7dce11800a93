"""The unique-claim fallback (#388 upstream): a batched rescue refused with
SQLSTATE 23505 goes row by row; the superseded duplicate is cancelled, the
innocent rows are rescued, the newer duplicate keeps its claim, and a row
that cannot even be cancelled is skipped with an error naming the holder."""

from __future__ import annotations

import logging

import asyncpg
import pytest
import trio
from conftest import in_thread
from test_rescue import (
    HEARTBEAT_ERROR,
    assert_error_entry,
    db_now,
    insert_running,
    insert_waiting,
    job_snapshot,
    make_context,
    rescue_counts,
)

from awa_trio.config import MaintenanceConfig
from awa_trio.engines.canonical import rescue, rescue_callbacks, rescue_deadlines, rescue_heartbeats
from awa_trio.hooks import Hooks, JobCancelled, JobRescued
from awa_trio.maintenance.rescue import RescueResult

# Bits in awa's order: scheduled=0, available=1, running=2, completed=3,
# retryable=4, failed=5, cancelled=6, waiting_external=7.
SCHEDULED, AVAILABLE, RETRYABLE, CANCELLED = 1 << 0, 1 << 1, 1 << 4, 1 << 6
# Without `running`: claiming the job releases its claim, so a newer
# duplicate can take it while the first one runs.
MASK_WITHOUT_RUNNING = SCHEDULED | AVAILABLE | RETRYABLE
MASK_ALSO_CANCELLED = MASK_WITHOUT_RUNNING | CANCELLED

KIND = "sync_account"
QUEUE = "uq"

CLAIM_BY_HAND_SQL = """
    UPDATE awa.jobs
    SET state = 'running', attempt = attempt + 1, run_lease = run_lease + 1,
        attempted_at = now() - interval '10 minutes',
        heartbeat_at = now() - interval '10 minutes',
        deadline_at = now() + interval '5 minutes'
    WHERE id = $1 AND state = 'available'
"""
CLAIMS_SQL = "SELECT unique_key, job_id FROM awa.job_unique_claims ORDER BY job_id"


async def claims(db) -> list[tuple[bytes, int]]:
    return [tuple(record) for record in await db.fetch(CLAIMS_SQL)]


async def insert_unique(awa_client, account: int, mask: int) -> int:
    """Through awa-pg, exactly as an application would."""
    job = await in_thread(
        awa_client.insert, {"account": account}, kind=KIND, queue=QUEUE,
        unique_opts={"by_args": True, "by_queue": True, "states": mask},
    )
    return job.id


async def superseded_pair(db, awa_client, account: int, mask: int) -> tuple[int, int]:
    """A: claimed (stale heartbeat), its claim released; B: a newer duplicate
    now holding the claim."""
    first = await insert_unique(awa_client, account, mask)
    assert await db.execute(CLAIM_BY_HAND_SQL, first) == "UPDATE 1"
    newer = await insert_unique(awa_client, account, mask)
    return first, newer


async def test_superseded_duplicate_is_cancelled_and_the_innocent_job_rescued(
    db, awa_client, caplog, meter_provider, metric_reader
):
    a, b = await superseded_pair(db, awa_client, 42, MASK_WITHOUT_RUNNING)
    c = (await in_thread(awa_client.insert, {"account": 7}, kind=KIND, queue=QUEUE)).id
    assert await db.execute(CLAIM_BY_HAND_SQL, c) == "UPDATE 1"
    [(key, holder)] = await claims(db)
    assert holder == b
    before_b = await job_snapshot(db, b)
    before_a = await job_snapshot(db, a)

    hooks = Hooks()
    seen: list = []
    hooks.on_event(KIND, seen.append)
    signalled: list[int] = []
    hooks.in_flight.register(a, before_a["run_lease"], lambda: signalled.append(a))
    hooks.in_flight.register(c, 1, lambda: signalled.append(c))
    ctx = await make_context(db, MaintenanceConfig(heartbeat_staleness=60),
                             meter_provider=meter_provider, hooks=hooks)

    async with trio.open_nursery() as nursery:
        await nursery.start(hooks.run, ctx.config)
        start = await db_now(db)
        with caplog.at_level(logging.WARNING, logger="awa_trio"):
            result = await rescue_heartbeats.run_once(ctx)
        end = await db_now(db)
        with trio.fail_after(5):
            while len(seen) < 2:
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()

    after_a = await job_snapshot(db, a)
    assert after_a["table_name"] == "jobs_hot"
    assert after_a["state"] == "cancelled"
    assert start <= after_a["finalized_at"] <= end
    assert after_a["heartbeat_at"] is None and after_a["deadline_at"] is None
    assert_error_entry(
        after_a["errors"][-1],
        error="rescued as duplicate: heartbeat stale and unique claim held by a newer job",
        attempt=1, before=start, after=end,
    )
    after_c = await job_snapshot(db, c)
    assert after_c["state"] == "retryable" and after_c["table_name"] == "scheduled_jobs"
    assert_error_entry(after_c["errors"][-1], error=HEARTBEAT_ERROR, attempt=1,
                       before=start, after=end)
    assert await job_snapshot(db, b) == before_b
    assert await claims(db) == [(key, b)]

    assert result.row_by_row
    assert [job.id for job in result.rescued] == [c]
    assert [job.id for job in result.duplicates_cancelled] == [a]
    assert result.skipped == []
    assert rescue_counts(metric_reader) == {"heartbeat": 1, "heartbeat_duplicate_cancelled": 1}
    assert sorted(signalled) == sorted([a, c])
    assert {(type(event), event.job.id) for event in seen} == {(JobCancelled, a), (JobRescued, c)}
    cancelled_event = next(event for event in seen if isinstance(event, JobCancelled))
    assert cancelled_event.reason == after_a["errors"][-1]["error"]

    messages = [record.getMessage() for record in caplog.records]
    assert any("rescue_stale_heartbeats" in m and "retrying row by row" in m for m in messages)
    assert any(f"job {a} conflicts with the unique claim held by job {b}" in m for m in messages)


async def test_row_that_cannot_even_be_cancelled_is_skipped_and_named(
    db, awa_client, caplog, meter_provider, metric_reader
):
    """Its mask claims `cancelled` too, so both moves conflict: it stays as it
    is, the error names it and the holder, and the other rows are rescued."""
    a, b = await superseded_pair(db, awa_client, 43, MASK_ALSO_CANCELLED)
    now = await db_now(db)
    innocent = [await insert_running(db, now) for _ in range(2)]
    before_a = await job_snapshot(db, a)
    before_b = await job_snapshot(db, b)
    ctx = await make_context(db, MaintenanceConfig(heartbeat_staleness=60),
                             meter_provider=meter_provider)

    with caplog.at_level(logging.WARNING, logger="awa_trio"):
        result = await rescue_heartbeats.run_once(ctx)

    assert await job_snapshot(db, a) == before_a
    assert await job_snapshot(db, b) == before_b
    for job_id in innocent:
        assert (await job_snapshot(db, job_id))["state"] == "retryable"
    assert result.skipped == [a]
    assert sorted(job.id for job in result.rescued) == sorted(innocent)
    assert result.duplicates_cancelled == []
    assert rescue_counts(metric_reader) == {"heartbeat": 2}
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1
    assert f"cannot rescue or cancel job {a}" in errors[0]
    assert f"held by job {b}" in errors[0]
    assert errors[0].startswith("rescue_stale_heartbeats:")

    # It keeps being skipped (and logged) on later passes; nothing else is stuck.
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="awa_trio"):
        again = await rescue_heartbeats.run_once(ctx)
    assert again.skipped == [a] and again.rescued == []


# The same fallback in the deadline and callback branches, arranged with plain
# SQL through awa's own insert function (unique key chosen by hand).
INSERT_UNIQUE_SQL = """
    SELECT id FROM awa.insert_job_compat(
        'sync_account', 'uq', '{"account": 1}'::jsonb,
        p_unique_key => '\\xdeadbeef'::bytea, p_unique_states => $1::bit(8))
"""
DEADLINE_CLAIM_SQL = """
    UPDATE awa.jobs
    SET state = 'running', attempt = 1, run_lease = 1, attempted_at = now(),
        heartbeat_at = now(), deadline_at = now() - interval '1 second'
    WHERE id = $1
"""
CALLBACK_WAIT_SQL = """
    UPDATE awa.jobs
    SET state = 'waiting_external', attempt = 1, run_lease = 1, attempted_at = now(),
        callback_id = gen_random_uuid(), callback_timeout_at = now() - interval '1 second'
    WHERE id = $1
"""


@pytest.mark.parametrize(
    ("branch", "park_sql", "duplicate_error", "metric_kind", "from_state"),
    [
        (rescue_deadlines, DEADLINE_CLAIM_SQL,
         "rescued as duplicate: deadline expired and unique claim held by a newer job",
         "deadline", "running"),
        (rescue_callbacks, CALLBACK_WAIT_SQL,
         "rescued as duplicate: callback timed out and unique claim held by a newer job",
         "callback_timeout", "waiting_external"),
    ],
    ids=["deadline", "callback"],
)
async def test_other_rescues_cancel_superseded_duplicates_too(
    db, meter_provider, metric_reader, branch, park_sql, duplicate_error, metric_kind, from_state
):
    mask = asyncpg.BitString("11001000")  # scheduled, available, retryable
    a = await db.fetchval(INSERT_UNIQUE_SQL, mask)
    assert await db.execute(park_sql, a) == "UPDATE 1"
    b = await db.fetchval(INSERT_UNIQUE_SQL, mask)
    assert (await job_snapshot(db, a))["state"] == from_state
    before_b = await job_snapshot(db, b)
    ctx = await make_context(db, meter_provider=meter_provider)

    result = await branch.run_once(ctx)

    after_a = await job_snapshot(db, a)
    assert after_a["state"] == "cancelled"
    assert after_a["errors"][-1]["error"] == duplicate_error
    assert after_a["callback_id"] is None
    assert await job_snapshot(db, b) == before_b
    assert await claims(db) == [(b"\xde\xad\xbe\xef", b)]
    assert result.row_by_row and [job.id for job in result.duplicates_cancelled] == [a]
    assert rescue_counts(metric_reader) == {f"{metric_kind}_duplicate_cancelled": 1}


async def test_per_row_rescue_rechecks_the_predicate(db, awa_client):
    """The fallback's candidates are not locked; each row's predicate is
    checked again in its own statement, so a row whose heartbeat is fresh by
    then is left alone."""
    a, _b = await superseded_pair(db, awa_client, 44, MASK_WITHOUT_RUNNING)
    now = await db_now(db)
    recovered = await insert_running(db, now)
    ctx = await make_context(db)
    candidates = await db.fetch(*rescue_heartbeats.CANDIDATES_SQL.bind(staleness=60.0, limit=500))
    assert {record["id"] for record in candidates} == {a, recovered}
    # The worker heartbeats between the candidate query and the per-row rescue.
    await db.execute("UPDATE awa.jobs_hot SET heartbeat_at = now() WHERE id = $1", recovered)
    assert await db.fetchrow(*rescue_heartbeats.RESCUE_ONE_SQL.bind(
        staleness=60.0, error=rescue_heartbeats.RESCUE_ERROR, job_id=recovered)) is None

    result = await rescue_heartbeats.run_once(ctx)
    assert [job.id for job in result.duplicates_cancelled] == [a]
    assert result.rescued == []
    assert (await job_snapshot(db, recovered))["state"] == "running"


COMPLETE_BY_HAND_SQL = """
    UPDATE awa.jobs_hot
    SET state = 'completed', finalized_at = now(), heartbeat_at = NULL, deadline_at = NULL
    WHERE id = $1 AND state = 'running'
"""


@pytest.mark.parametrize(
    "sweep",
    [rescue_heartbeats.SWEEP, rescue_deadlines.SWEEP, rescue_callbacks.SWEEP],
    ids=["heartbeat", "deadline", "callback"],
)
async def test_duplicate_cancellation_leaves_a_job_that_finished_meanwhile_alone(
    db, awa_client, sweep, caplog
):
    """Between the failed per-row rescue and the cancellation the worker may
    finish the job: the cancel is guarded by the state the sweep found, so a
    completed job stays completed and is not reported as cancelled."""
    finished, newer = await superseded_pair(db, awa_client, 45, MASK_WITHOUT_RUNNING)
    assert await db.execute(COMPLETE_BY_HAND_SQL, finished) == "UPDATE 1"
    now = await db_now(db)
    # Control: a job still in the sweep's state is cancelled by the same call.
    if sweep.from_state == "waiting_external":
        still_parked = await insert_waiting(db, now)
    else:
        still_parked = await insert_running(db, now)
    before = {job_id: await job_snapshot(db, job_id) for job_id in (finished, newer)}
    ctx = await make_context(db)
    result = RescueResult()

    with caplog.at_level(logging.INFO, logger="awa_trio"):
        await rescue.cancel_duplicate(ctx, sweep, finished, result)
        await rescue.cancel_duplicate(ctx, sweep, still_parked, result)

    assert await job_snapshot(db, finished) == before[finished]
    assert await job_snapshot(db, newer) == before[newer]
    assert await claims(db) == [(before[newer]["unique_key"], newer)]
    assert [job.id for job in result.duplicates_cancelled] == [still_parked]
    assert (await job_snapshot(db, still_parked))["state"] == "cancelled"
    assert result.skipped == []
    messages = [record.getMessage() for record in caplog.records]
    assert any(f"job {finished} left '{sweep.from_state}' before it could be cancelled" in m
               for m in messages)
    assert not any(f"cancelled job {finished} " in m for m in messages)
    # The statement itself, as the fallback runs it: no row for a finished job.
    assert await db.fetchrow(
        *rescue.CANCEL_DUPLICATE_SQL.bind(
            job_id=finished, state=sweep.from_state, error=sweep.duplicate_error)
    ) is None
