"""promote_scheduled on the canonical engine, with jobs made by awa-pg 0.6.1."""

import dataclasses
import datetime as dt
import logging

import asyncpg
import pytest
import trio
from conftest import in_thread
from support.awa_pg import awa_pg_worker
from support.helpers import metric_points

from awa_trio import MaintenanceConfig, MaintenanceService
from awa_trio.db import UniqueViolation
from awa_trio.engines.canonical import promote
from awa_trio.hooks import Hooks, JobCancelled
from awa_trio.sql import Statement

UTC = dt.UTC
RETRY_HISTORY_SQL = """
    UPDATE awa.scheduled_jobs
    SET state = 'retryable',
        attempt = 2,
        run_lease = 2,
        attempted_at = now() - interval '5 minutes',
        finalized_at = now() - interval '4 minutes',
        errors = ARRAY['{"error": "boom", "attempt": 1}'::jsonb, '{"error": "bang", "attempt": 2}'::jsonb],
        progress = '{"done": 40}',
        heartbeat_at = now() - interval '4 minutes',
        deadline_at = now() + interval '1 hour',
        callback_id = gen_random_uuid(),
        callback_timeout_at = now() + interval '1 hour',
        callback_filter = 'f', callback_on_complete = 'c',
        callback_on_fail = 'x', callback_transform = 't'
    WHERE id = $1
"""
COLUMNS_KEPT = (
    "id", "kind", "queue", "args", "priority", "attempt", "max_attempts", "attempted_at",
    "finalized_at", "created_at", "errors", "metadata", "tags", "unique_key", "unique_states",
    "run_lease", "progress",
)
COLUMNS_CLEARED = (
    "heartbeat_at", "deadline_at", "callback_id", "callback_timeout_at", "callback_filter",
    "callback_on_complete", "callback_on_fail", "callback_transform",
)


async def row(db, table, job_id):
    record = await db.fetchrow(f"SELECT * FROM awa.{table} WHERE id = $1", job_id)
    return dict(record) if record else None


async def insert(awa_client, run_at, **kwargs):
    job = await in_thread(
        awa_client.insert, {"n": 1}, kind="report", queue="reports", run_at=run_at,
        priority=3, max_attempts=7, tags=["t"], metadata={"m": 1}, **kwargs,
    )
    return job.id


async def test_running_leader_promotes_due_rows_exactly(database_url, db, awa_client, meter_provider, metric_reader):
    now = dt.datetime.now(UTC)
    past, future = now - dt.timedelta(minutes=1), now + dt.timedelta(hours=1)
    scheduled_due = await insert(awa_client, past)
    scheduled_later = await insert(awa_client, future)
    retryable_due = await insert(awa_client, past)
    retryable_later = await insert(awa_client, future)
    for job_id in (retryable_due, retryable_later):
        await db.execute(RETRY_HISTORY_SQL, job_id)
    before = {job_id: await row(db, "scheduled_jobs", job_id)
              for job_id in (scheduled_due, scheduled_later, retryable_due, retryable_later)}
    assert before[scheduled_due]["state"] == "scheduled"
    assert before[retryable_due]["state"] == "retryable"

    service = MaintenanceService(
        database_url,
        MaintenanceConfig(promote_interval=0.05, leader_election_interval=0.2),
        meter_provider=meter_provider,
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        await service.wait_until_leader()
        db_now_before = await db.fetchval("SELECT now()")
        with trio.fail_after(5):
            while await db.fetchval("SELECT count(*) FROM awa.scheduled_jobs") > 2:
                await trio.sleep(0.02)
        db_now_after = await db.fetchval("SELECT now()")
        await trio.sleep(0.2)  # more ticks must not touch what is not due
        nursery.cancel_scope.cancel()

    for job_id in (scheduled_due, retryable_due):
        promoted = await row(db, "jobs_hot", job_id)
        assert await row(db, "scheduled_jobs", job_id) is None
        assert promoted["state"] == "available"
        assert db_now_before - dt.timedelta(seconds=1) <= promoted["run_at"] <= db_now_after
        for column in COLUMNS_KEPT:
            assert promoted[column] == before[job_id][column], column
        for column in COLUMNS_CLEARED:
            assert promoted[column] is None, column
    for job_id in (scheduled_later, retryable_later):
        assert await row(db, "scheduled_jobs", job_id) == before[job_id]
        assert await row(db, "jobs_hot", job_id) is None

    states = {attrs["awa.job.state"] for attrs, _ in metric_points(metric_reader, "awa.maintenance.promote_batches")}
    assert states == {"scheduled", "retryable"}
    sizes = metric_points(metric_reader, "awa.maintenance.promote_batch_size")
    assert sum(point.sum for _, point in sizes) == 2
    durations = metric_points(metric_reader, "awa.maintenance.promote_duration")
    assert {attrs["awa.job.state"] for attrs, _ in durations} == {"scheduled", "retryable"}
    batches = sum(point.value for _, point in metric_points(metric_reader, "awa.maintenance.promote_batches"))
    assert sum(point.count for _, point in durations) == batches
    assert all(point.min >= 0 and point.max < 5 for _, point in durations)


async def test_job_failed_by_an_awa_pg_worker_is_promoted_and_run_again(database_url, db, awa_client):
    """A real retryable row: an awa-pg worker fails attempt 1, awa_trio
    promotes it when its backoff elapses, a worker completes attempt 2."""
    service = MaintenanceService(
        database_url, MaintenanceConfig(promote_interval=0.05, leader_election_interval=0.2)
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        await service.wait_until_leader()
        async with awa_pg_worker(database_url, "flaky:q", behaviour="fail") as failing:
            job = await in_thread(awa_client.insert, {"x": 1}, kind="flaky", queue="q")
            await failing.wait_for_line("START")
            with trio.fail_after(10):
                while (await db.fetchval("SELECT state FROM awa.jobs WHERE id = $1", job.id)) != "retryable":
                    await trio.sleep(0.02)
            failing.terminate()
            await failing.wait_for_line("STOPPED")
        retry = await row(db, "scheduled_jobs", job.id)
        if retry is not None:  # not due yet: awa-pg's backoff is about 2 s
            assert retry["attempt"] == 1 and len(retry["errors"]) == 1
        async with awa_pg_worker(database_url, "flaky:q", behaviour="complete") as worker:
            line = await worker.wait_for_line(f"DONE {job.id} ")
            assert line.split()[2] == "2"
            with trio.fail_after(5):  # awa-pg flushes completions in batches
                while (await row(db, "jobs_hot", job.id))["state"] != "completed":
                    await trio.sleep(0.02)
        final = await row(db, "jobs_hot", job.id)
        assert final["state"] == "completed" and final["attempt"] == 2
        nursery.cancel_scope.cancel()


async def insert_due_rows(db, count, state="scheduled"):
    await db.execute(
        "INSERT INTO awa.scheduled_jobs (kind, queue, state, run_at) "
        "SELECT 'bulk', 'q' || (g % 3), $2::awa.job_state, now() - g * interval '1 ms' "
        "FROM generate_series(1, $1) AS g",
        count, state,
    )


async def counts(db):
    return (
        await db.fetchval("SELECT count(*) FROM awa.scheduled_jobs"),
        await db.fetchval("SELECT count(*) FROM awa.jobs_hot WHERE state = 'available'"),
    )


async def test_batches_stop_at_the_first_short_one_and_cap_per_tick(maintenance_ctx, db, monkeypatch):
    monkeypatch.setattr(promote, "PROMOTE_BATCH_SIZE", 10)
    monkeypatch.setattr(promote, "PROMOTE_MAX_BATCHES_PER_TICK", 3)
    await insert_due_rows(db, 35)
    await insert_due_rows(db, 4, "retryable")

    first = await promote.run_once(maintenance_ctx)
    assert first.promoted == {"scheduled": 30, "retryable": 4}
    assert first.batches == 3 + 1
    assert first.queues == {"q0", "q1", "q2"}
    assert await counts(db) == (5, 34)

    second = await promote.run_once(maintenance_ctx)
    assert second.promoted == {"scheduled": 5, "retryable": 0}
    assert second.batches == 1 + 1
    assert await counts(db) == (0, 39)


async def test_exactly_full_batches_need_one_empty_batch_to_stop(maintenance_ctx, db, monkeypatch):
    monkeypatch.setattr(promote, "PROMOTE_BATCH_SIZE", 10)
    await insert_due_rows(db, 20)
    result = await promote.run_once(maintenance_ctx)
    assert result.promoted["scheduled"] == 20
    assert result.batches == 3 + 1  # 10, 10, 0 scheduled; 0 retryable


async def test_promotion_honours_cancellation_between_batches(maintenance_ctx, db, monkeypatch):
    monkeypatch.setattr(promote, "PROMOTE_BATCH_SIZE", 10)
    await insert_due_rows(db, 25)
    metrics = maintenance_ctx.metrics
    with trio.CancelScope() as scope:
        original = metrics.record_promotion_batch

        def cancel_after_first_batch(*args):
            original(*args)
            scope.cancel()

        monkeypatch.setattr(metrics, "record_promotion_batch", cancel_after_first_batch)
        await promote.run_once(maintenance_ctx)
    assert scope.cancelled_caught
    assert await counts(db) == (15, 10), "the first batch committed, nothing after it ran"


async def test_state_literal_lets_the_planner_use_the_partial_index(db):
    async with db.transaction() as conn:
        await conn.execute("SET LOCAL enable_seqscan = off")
        plan = "\n".join(
            r[0] for r in await conn.fetch("EXPLAIN " + promote.PROMOTE_DUE_SQL["retryable"].render(), 4096)
        )
    assert "idx_awa_scheduled_jobs_run_at_retryable" in plan
    assert "state = 'retryable'::awa.job_state" in promote.PROMOTE_DUE_SQL["retryable"].render()


async def test_one_state_failing_does_not_block_the_other(maintenance_ctx, db, caplog, monkeypatch):
    await insert_due_rows(db, 3, "retryable")
    await insert_due_rows(db, 2, "scheduled")  # due, so its (broken) batch runs
    broken = dict(promote.PROMOTE_DUE_SQL, scheduled=Statement("SELECT queue FROM awa.no_such_table LIMIT :limit"))
    monkeypatch.setattr(promote, "PROMOTE_DUE_SQL", broken)
    result = await promote.run_once(maintenance_ctx)
    assert result.promoted.get("retryable") == 3
    assert "promote_scheduled: failed to promote scheduled jobs" in caplog.text
    assert dataclasses.asdict(result)["promoted"]["retryable"] == 3


# Unique-claim conflicts at promotion. A job whose unique_states claim
# `available` but not the state it waits in cannot become available while
# another job holds its claim: the trigger refuses the whole batch (23505).
INSERT_UNIQUE_SQL = """
    SELECT id FROM awa.insert_job_compat(
        'sync_account', 'uq', '{"account": 1}'::jsonb,
        p_state => $1::awa.job_state, p_run_at => $2::timestamptz,
        p_unique_key => '\\xc0ffee'::bytea, p_unique_states => $3::bit(8))
"""
CLAIMS_SQL = "SELECT unique_key, job_id FROM awa.job_unique_claims ORDER BY job_id"


async def superseded_due_job(db, waiting_state, mask="01000000"):
    """A due job waiting in ``waiting_state`` (which its mask does not claim)
    and a duplicate holding the claim as ``available``."""
    past = dt.datetime.now(UTC) - dt.timedelta(minutes=1)
    due = await db.fetchval(INSERT_UNIQUE_SQL, "scheduled", past, asyncpg.BitString(mask))
    if waiting_state == "retryable":
        await db.execute(
            "UPDATE awa.scheduled_jobs SET state = 'retryable', attempt = 1 WHERE id = $1", due)
    holder = await db.fetchval(INSERT_UNIQUE_SQL, "available", None, asyncpg.BitString(mask))
    assert await db.fetch(CLAIMS_SQL) == [(b"\xc0\xff\xee", holder)]
    return due, holder


@pytest.mark.parametrize("waiting_state", ["scheduled", "retryable"])
async def test_a_due_duplicate_is_cancelled_and_the_rest_promoted(
    maintenance_ctx, db, caplog, waiting_state
):
    innocent_before = 2
    await insert_due_rows(db, innocent_before, waiting_state)
    due, holder = await superseded_due_job(db, waiting_state)
    await insert_due_rows(db, 1, waiting_state)  # due after the duplicate
    holder_before = await row(db, "jobs_hot", holder)
    with pytest.raises(UniqueViolation):  # what wedges upstream's promotion every tick
        await db.fetch(*promote.PROMOTE_DUE_SQL[waiting_state].bind(limit=4096))

    with caplog.at_level(logging.WARNING, logger="awa_trio"):
        result = await promote.run_once(maintenance_ctx)

    assert result.promoted[waiting_state] == innocent_before + 1
    assert [job.id for job in result.duplicates_cancelled] == [due]
    cancelled = await row(db, "jobs_hot", due)
    assert await row(db, "scheduled_jobs", due) is None
    assert cancelled["state"] == "cancelled" and cancelled["finalized_at"] is not None
    assert cancelled["errors"][-1]["error"] == promote.DUPLICATE_ERROR
    assert await row(db, "jobs_hot", holder) == holder_before
    assert await db.fetch(CLAIMS_SQL) == [(b"\xc0\xff\xee", holder)]
    assert await db.fetchval("SELECT count(*) FROM awa.scheduled_jobs") == 0
    assert f"{waiting_state} job {due} came due while job {holder} holds its unique claim" in caplog.text
    assert "promoting row by row" in caplog.text
    # The next tick is an ordinary batch again.
    assert (await promote.run_once(maintenance_ctx)).duplicates_cancelled == []


async def test_a_due_job_that_cannot_even_be_cancelled_is_left_and_logged(maintenance_ctx, db, caplog):
    due, holder = await superseded_due_job(db, "scheduled", mask="01000010")  # available, cancelled
    await insert_due_rows(db, 3)
    with caplog.at_level(logging.ERROR, logger="awa_trio"):
        result = await promote.run_once(maintenance_ctx)
    assert result.promoted["scheduled"] == 3 and result.skipped == [due]
    assert (await row(db, "scheduled_jobs", due))["state"] == "scheduled"
    assert f"cannot promote or cancel scheduled job {due}: the unique claim is held by job {holder}" in caplog.text


async def test_the_leader_reports_the_cancelled_duplicate_to_hooks(database_url, db):
    due, _holder = await superseded_due_job(db, "scheduled")
    events = []
    hooks = Hooks()
    hooks.on_event("sync_account", events.append)
    service = MaintenanceService(
        database_url, MaintenanceConfig(promote_interval=0.05, leader_election_interval=0.2),
        hooks=hooks,
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        with trio.fail_after(5):
            while not events:
                await trio.sleep(0.02)
        nursery.cancel_scope.cancel()
    [event] = events
    assert isinstance(event, JobCancelled)
    assert event.job.id == due and event.job.state == "cancelled"
    assert event.reason == promote.DUPLICATE_ERROR
