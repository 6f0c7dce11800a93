"""batch_operations on a real awa 0.6.1 schema, with operations submitted,
cancelled and read back through awa-pg's own client."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import threading
import uuid

import asyncpg
import pytest
import trio
from conftest import in_thread
from support.contexts import make_context
from support.helpers import advisory_lock_holders, dirty_admin_keys, dirty_admin_tables

from awa_trio.engines.canonical import batch_operations
from awa_trio.engines.canonical.batch_operations import CANONICAL_STORAGE, RUNNER_LOCK_KEY, run_once
from awa_trio.maintenance import batch_operations as runner

ORIGINAL_PRIORITY = "_awa_original_priority"
ORIGINAL_QUEUE = "_awa_original_queue"

# Test-only trigger: the first time the given job's item is recorded, ask for
# the operation's cancellation, as cancel_batch_operation would.
CANCEL_ON_ITEM_TRIGGER_SQL = """
    CREATE FUNCTION test_cancel_on_item() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF NEW.job_id = {job_id} THEN
            UPDATE awa.batch_operations SET state = 'cancelling'
            WHERE id = NEW.operation_id AND state IN ('pending', 'scanning', 'running');
        END IF;
        RETURN NEW;
    END $$;
    CREATE TRIGGER test_cancel_on_item AFTER {event} ON awa.batch_operation_items
        FOR EACH ROW EXECUTE FUNCTION test_cancel_on_item();
"""


async def insert_job(awa_client, queue: str, *, priority: int = 2, scheduled: bool = False,
                     metadata: dict | None = None, tags: list[str] | None = None) -> int:
    run_at = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1) if scheduled else None
    job = await in_thread(
        awa_client.insert, {"q": queue}, kind="batch_probe", queue=queue, priority=priority,
        run_at=run_at, metadata=metadata, tags=tags,
    )
    return job.id


async def insert_jobs(awa_client, queue: str, count: int, **kwargs) -> list[int]:
    return [await insert_job(awa_client, queue, **kwargs) for _ in range(count)]


async def job_row(db, job_id: int) -> dict:
    row = await db.fetchrow(
        "SELECT queue, priority, state::text AS state, metadata FROM awa.jobs WHERE id = $1",
        job_id,
    )
    return dict(row)


async def operation_row(db, operation_id: str) -> dict:
    row = await db.fetchrow(
        "SELECT * FROM awa.batch_operations WHERE id = $1", uuid.UUID(operation_id)
    )
    return dict(row)


async def item_states(db, operation_id: str) -> dict[int, str]:
    rows = await db.fetch(
        "SELECT job_id, state FROM awa.batch_operation_items WHERE operation_id = $1",
        uuid.UUID(operation_id),
    )
    return {row["job_id"]: row["state"] for row in rows}


async def test_set_priority_runs_end_to_end_and_awa_pg_reads_the_result(db, awa_client):
    ctx = await make_context(db)
    available = await insert_jobs(awa_client, "bulk", 2, priority=3)
    scheduled = await insert_job(awa_client, "bulk", priority=4, scheduled=True)
    stamped = await insert_job(awa_client, "bulk", priority=3, metadata={ORIGINAL_PRIORITY: 4})
    already = await insert_job(awa_client, "bulk", priority=1)
    elsewhere = await insert_job(awa_client, "other", priority=3)
    op = await in_thread(awa_client.set_priority, 1, filter={"queue": "bulk"},
                         submitted_by="ops")

    result = await run_once(ctx)

    assert result.claimed and result.operation_id == uuid.UUID(op["id"])
    assert (result.processed, result.skipped, result.errored) == (4, 1, 0)
    assert result.finalized_state == "completed"
    for job_id in available:
        assert await job_row(db, job_id) == {
            "queue": "bulk", "priority": 1, "state": "available",
            "metadata": {ORIGINAL_PRIORITY: 3},
        }
    assert await job_row(db, scheduled) == {
        "queue": "bulk", "priority": 1, "state": "scheduled", "metadata": {ORIGINAL_PRIORITY: 4},
    }
    assert (await job_row(db, stamped))["metadata"] == {ORIGINAL_PRIORITY: 4}
    assert await job_row(db, already) == {
        "queue": "bulk", "priority": 1, "state": "available", "metadata": {},
    }
    assert (await job_row(db, elsewhere))["priority"] == 3

    expected_items = {job_id: "processed" for job_id in [*available, scheduled, stamped]}
    expected_items[already] = "skipped"
    assert await item_states(db, op["id"]) == expected_items

    row = await operation_row(db, op["id"])
    assert row["state"] == "completed"
    assert (row["total_matched"], row["processed"], row["skipped"], row["errored"]) == (5, 4, 1, 0)
    assert row["cursor"] == {"after_job_id": 0, "max_job_id": already}
    assert row["runner_instance"] == result.runner_instance
    assert row["started_at"] is not None and row["last_error"] is None
    retention = row["retention_until"] - row["finalized_at"]
    assert abs(retention - dt.timedelta(days=90)) < dt.timedelta(seconds=1)

    seen = await in_thread(awa_client.get_batch_operation, op["id"])
    assert seen["state"] == "completed"
    assert (seen["total_matched"], seen["processed"], seen["skipped"], seen["errored"]) == (
        5, 4, 1, 0)
    assert seen["cursor"] == {"after_job_id": 0, "max_job_id": already}
    assert seen["runner_instance"] == str(result.runner_instance)
    assert seen["submitted_by"] == "ops" and seen["finalized_at"] and seen["retention_until"]
    listed = await in_thread(awa_client.list_batch_operations, state="completed")
    assert [entry["id"] for entry in listed] == [op["id"]]

    # A finished operation is never claimed again.
    assert not (await run_once(ctx)).claimed


async def listen_once(dsn: str, channel: str, ready: threading.Event, timeout: float) -> list[str]:
    """Channels notified on ``channel`` within ``timeout`` (stops at the first).
    Listens with plain asyncpg on its own loop in a worker thread."""

    def listen() -> list[str]:
        async def main() -> list[str]:
            conn = await asyncpg.connect(dsn)
            got: list[str] = []
            try:
                await conn.add_listener(channel, lambda _c, _pid, chan, _payload: got.append(chan))
                ready.set()
                deadline = asyncio.get_running_loop().time() + timeout
                while not got and asyncio.get_running_loop().time() < deadline:
                    await asyncio.sleep(0.02)
            finally:
                await conn.close()
            return got

        return asyncio.run(main())

    return await trio.to_thread.run_sync(listen)


async def test_move_queue_stamps_originals_wakes_the_new_queue_and_marks_admin_cache(
    db, database_url, awa_client
):
    ctx = await make_context(db)
    moved = await insert_jobs(awa_client, "old", 2, priority=2)
    moved_scheduled = await insert_job(awa_client, "old", priority=3, scheduled=True)
    previously_moved = await insert_job(awa_client, "old", metadata={ORIGINAL_QUEUE: "first"})
    stays = await insert_job(awa_client, "keep", priority=2)
    dirty_queues_table, _ = await dirty_admin_tables(db)
    await db.execute(f"DELETE FROM {dirty_queues_table}")
    op = await in_thread(awa_client.move_queue, "new", priority=4, filter={"queue": "old"})

    ready = threading.Event()
    notified: list[str] = []

    async def collect() -> None:
        notified.extend(await listen_once(database_url, "awa:new", ready, timeout=5))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(collect)
        await trio.to_thread.run_sync(ready.wait, 5)
        result = await run_once(ctx)

    assert (result.processed, result.skipped, result.finalized_state) == (4, 0, "completed")
    for job_id in moved:
        assert await job_row(db, job_id) == {
            "queue": "new", "priority": 4, "state": "available",
            "metadata": {ORIGINAL_QUEUE: "old", ORIGINAL_PRIORITY: 2},
        }
    assert await job_row(db, moved_scheduled) == {
        "queue": "new", "priority": 4, "state": "scheduled",
        "metadata": {ORIGINAL_QUEUE: "old", ORIGINAL_PRIORITY: 3},
    }
    assert (await job_row(db, previously_moved))["metadata"] == {
        ORIGINAL_QUEUE: "first", ORIGINAL_PRIORITY: 2,
    }
    assert (await job_row(db, stays))["queue"] == "keep"
    # Workers of the new queue are woken; admin counts of both queues are redone.
    assert notified and set(notified) == {"awa:new"}
    dirty, _ = await dirty_admin_keys(db)
    assert dirty == {"old", "new"}

    # Without a priority, only the queue changes and only the queue is stamped.
    op2 = await in_thread(awa_client.move_queue, "newest", filter={"queue": "keep"})
    assert (await run_once(ctx)).processed == 1
    assert await job_row(db, stays) == {
        "queue": "newest", "priority": 2, "state": "available",
        "metadata": {ORIGINAL_QUEUE: "keep"},
    }
    for operation in (op, op2):
        seen = await in_thread(awa_client.get_batch_operation, operation["id"])
        assert seen["state"] == "completed" and seen["errored"] == 0


async def test_a_job_that_no_longer_qualifies_at_apply_time_is_skipped(db, awa_client):
    ctx = await make_context(db)
    first, cancelled, running, last = await insert_jobs(awa_client, "drift", 4, priority=3)
    op = await in_thread(awa_client.set_priority, 2, filter={"queue": "drift"})

    scanned = await run_once(ctx, chunk_size=1)
    assert (scanned.scanned, scanned.processed) == (4, 1)
    # Between chunks: one job is cancelled, one is claimed by a worker.
    await in_thread(awa_client.cancel, cancelled)
    await db.execute(
        "UPDATE awa.jobs_hot SET state = 'running', attempt = 1, heartbeat_at = now() "
        "WHERE id = $1", running,
    )

    rest = await run_once(ctx)

    assert (rest.processed, rest.skipped, rest.finalized_state) == (1, 2, "completed")
    assert await item_states(db, op["id"]) == {
        first: "processed", cancelled: "skipped", running: "skipped", last: "processed",
    }
    assert await job_row(db, cancelled) == {
        "queue": "drift", "priority": 3, "state": "cancelled", "metadata": {},
    }
    assert (await job_row(db, running))["priority"] == 3
    assert (await job_row(db, last))["priority"] == 2
    row = await operation_row(db, op["id"])
    assert (row["total_matched"], row["processed"], row["skipped"]) == (4, 2, 2)


async def test_chunks_progress_over_ticks_with_a_fresh_runner_each_and_operations_run_fifo(
    db, awa_client
):
    ctx = await make_context(db)
    jobs = await insert_jobs(awa_client, "chunked", 5, priority=4)
    later_job = await insert_job(awa_client, "later", priority=4)
    op = await in_thread(awa_client.set_priority, 3, filter={"queue": "chunked"})
    later = await in_thread(awa_client.set_priority, 1, filter={"queue": "later"})

    runners = []
    progress = []
    for _ in range(3):
        result = await run_once(ctx, chunk_size=2, scan_page_size=2)
        assert result.operation_id == uuid.UUID(op["id"])
        runners.append(result.runner_instance)
        row = await operation_row(db, op["id"])
        assert row["runner_instance"] == result.runner_instance
        progress.append((row["state"], row["processed"], result.processed))
        # The later operation waits until this one is finished.
        assert (await operation_row(db, later["id"]))["state"] == "pending"

    assert progress == [("running", 2, 2), ("running", 4, 2), ("completed", 5, 1)]
    assert len(set(runners)) == 3
    assert (await operation_row(db, op["id"]))["total_matched"] == 5
    assert set((await item_states(db, op["id"])).values()) == {"processed"}
    assert [(await job_row(db, job_id))["priority"] for job_id in jobs] == [3] * 5

    result = await run_once(ctx, chunk_size=2)
    assert result.operation_id == uuid.UUID(later["id"]) and result.finalized_state == "completed"
    assert (await job_row(db, later_job))["priority"] == 1


async def test_cancel_between_chunks_ends_cancelled_with_the_rest_skipped(db, awa_client):
    ctx = await make_context(db)
    jobs = await insert_jobs(awa_client, "halt", 5, priority=4)
    op = await in_thread(awa_client.set_priority, 1, filter={"queue": "halt"})

    first = await run_once(ctx, chunk_size=2)
    assert (first.processed, first.finalized_state) == (2, None)
    cancelling = await in_thread(awa_client.cancel_batch_operation, op["id"])
    assert cancelling["state"] == "cancelling"

    second = await run_once(ctx, chunk_size=2)

    assert (second.processed, second.skipped, second.finalized_state) == (0, 3, "cancelled")
    assert [(await job_row(db, job_id))["priority"] for job_id in jobs] == [1, 1, 4, 4, 4]
    assert list((await item_states(db, op["id"])).values()).count("skipped") == 3
    seen = await in_thread(awa_client.get_batch_operation, op["id"])
    assert seen["state"] == "cancelled"
    assert (seen["total_matched"], seen["processed"], seen["skipped"]) == (5, 2, 3)
    assert seen["finalized_at"] is not None
    assert not (await run_once(ctx, chunk_size=2)).claimed
    with pytest.raises(Exception, match="cannot be cancelled"):
        await in_thread(awa_client.cancel_batch_operation, op["id"])


async def test_cancel_before_the_first_tick_touches_nothing(db, awa_client, monkeypatch):
    monkeypatch.setenv("AWA_BATCH_OP_RETENTION_DAYS", "7")
    ctx = await make_context(db)
    job = await insert_job(awa_client, "early", priority=4)
    op = await in_thread(awa_client.move_queue, "elsewhere", filter={"queue": "early"})
    await in_thread(awa_client.cancel_batch_operation, op["id"])

    result = await run_once(ctx)

    assert (result.claimed, result.finalized_state, result.skipped) == (True, "cancelled", 0)
    assert (await job_row(db, job))["queue"] == "early"
    row = await operation_row(db, op["id"])
    assert row["state"] == "cancelled"
    assert row["total_matched"] is None and row["cursor"] is None
    assert row["started_at"] is not None and row["runner_instance"] == result.runner_instance
    retention = row["retention_until"] - row["finalized_at"]
    assert abs(retention - dt.timedelta(days=7)) < dt.timedelta(seconds=1)
    assert await item_states(db, op["id"]) == {}


async def test_a_cancel_during_a_chunk_stops_it_at_the_next_item_and_is_never_completed(
    db, awa_client
):
    ctx = await make_context(db)
    first, second, third = await insert_jobs(awa_client, "mid", 3, priority=4)
    await db.execute(CANCEL_ON_ITEM_TRIGGER_SQL.format(job_id=first, event="UPDATE"))
    op = await in_thread(awa_client.set_priority, 1, filter={"queue": "mid"})

    result = await run_once(ctx)

    assert (result.processed, result.skipped, result.finalized_state) == (1, 2, "cancelled")
    assert await item_states(db, op["id"]) == {
        first: "processed", second: "skipped", third: "skipped",
    }
    assert [(await job_row(db, job_id))["priority"] for job_id in (first, second, third)] == [
        1, 4, 4]
    seen = await in_thread(awa_client.get_batch_operation, op["id"])
    assert (seen["state"], seen["processed"], seen["skipped"]) == ("cancelled", 1, 2)


async def test_a_cancel_during_the_scan_ends_the_operation_without_changing_jobs(db, awa_client):
    ctx = await make_context(db)
    jobs = await insert_jobs(awa_client, "scan", 6, priority=4)
    await db.execute(CANCEL_ON_ITEM_TRIGGER_SQL.format(job_id=jobs[0], event="INSERT"))
    op = await in_thread(awa_client.set_priority, 1, filter={"queue": "scan"})

    result = await run_once(ctx, scan_page_size=2)

    assert result.finalized_state == "cancelled" and result.processed == 0
    items = await item_states(db, op["id"])
    assert 0 < len(items) < 6 and set(items.values()) == {"skipped"}
    assert {(await job_row(db, job_id))["priority"] for job_id in jobs} == {4}
    row = await operation_row(db, op["id"])
    assert row["total_matched"] is None and row["skipped"] == len(items)


async def test_finalisation_never_overwrites_a_cancel_or_a_finished_operation(db, awa_client):
    await insert_job(awa_client, "fin")
    op = await in_thread(awa_client.set_priority, 1, filter={"queue": "fin"})
    operation_id = uuid.UUID(op["id"])
    await db.execute(
        "UPDATE awa.batch_operations SET state = 'running' WHERE id = $1", operation_id
    )
    await in_thread(awa_client.cancel_batch_operation, op["id"])

    async with db.acquire() as conn:
        outcome = runner.BatchOperationsResult(operation_id=operation_id)
        await runner.finalize_operation(conn, outcome, "completed")
        assert outcome.finalized_state == "cancelled"
        finished_at = (await operation_row(db, op["id"]))["finalized_at"]

        again = runner.BatchOperationsResult(operation_id=operation_id)
        await runner.finalize_operation(conn, again, "completed")
        assert again.finalized_state is None

    row = await operation_row(db, op["id"])
    assert row["state"] == "cancelled" and row["finalized_at"] == finished_at


async def test_the_runner_lock_keeps_out_a_concurrent_runner(db, awa_client):
    ctx = await make_context(db)
    await insert_jobs(awa_client, "locked", 3, priority=4)
    op = await in_thread(awa_client.set_priority, 1, filter={"queue": "locked"})

    # awa-pg's runner holds the session lock on another connection...
    async with db.acquire() as other_runner:
        assert await other_runner.fetchval("SELECT pg_try_advisory_lock($1)", RUNNER_LOCK_KEY)
        busy = await run_once(ctx)
        await other_runner.fetchval("SELECT pg_advisory_unlock($1)", RUNNER_LOCK_KEY)
    # ... or a transaction-level lock on the same key: both keep us out.
    async with db.transaction() as other_tx:
        await other_tx.fetchval("SELECT pg_advisory_xact_lock($1)", RUNNER_LOCK_KEY)
        busy_xact = await run_once(ctx)

    for result in (busy, busy_xact):
        assert result.runner_lock_busy and not result.claimed
    row = await operation_row(db, op["id"])
    assert (row["state"], row["started_at"], row["runner_instance"]) == ("pending", None, None)
    assert await item_states(db, op["id"]) == {}

    # Two of our runners at once: while one works, the other stays out.
    await db.execute("""
        CREATE FUNCTION test_slow_item() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN PERFORM pg_sleep(0.3); RETURN NEW; END $$;
        CREATE TRIGGER test_slow_item AFTER UPDATE ON awa.batch_operation_items
            FOR EACH ROW EXECUTE FUNCTION test_slow_item();
    """)
    results = []

    async def runner() -> None:
        results.append(await run_once(ctx))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(runner)
        with trio.fail_after(5):
            while not await advisory_lock_holders(db, RUNNER_LOCK_KEY):
                await trio.sleep(0.01)
        results.append(await run_once(ctx))

    assert [(r.claimed, r.runner_lock_busy) for r in results] == [(False, True), (True, False)]
    assert results[1].finalized_state == "completed"
    # Released on the connection that took it.
    assert await advisory_lock_holders(db, RUNNER_LOCK_KEY) == []


async def test_a_failing_job_is_recorded_as_errored_and_the_operation_completes(db, awa_client):
    ctx = await make_context(db)
    good = await insert_job(awa_client, "err", priority=3)
    bad = await insert_job(awa_client, "err", priority=3)
    await db.execute("UPDATE awa.jobs_hot SET metadata = '[1]' WHERE id = $1", bad)
    op = await in_thread(awa_client.set_priority, 1, filter={"queue": "err"})

    result = await run_once(ctx)

    assert (result.processed, result.errored, result.finalized_state) == (1, 1, "completed")
    assert await job_row(db, bad) == {
        "queue": "err", "priority": 3, "state": "available", "metadata": [1],
    }
    assert (await job_row(db, good))["priority"] == 1
    error = await db.fetchval(
        "SELECT error FROM awa.batch_operation_items WHERE operation_id = $1 AND job_id = $2",
        uuid.UUID(op["id"]), bad,
    )
    assert error.startswith(f"job_id={bad}: ") and "_awa_original_priority" in error
    seen = await in_thread(awa_client.get_batch_operation, op["id"])
    assert (seen["state"], seen["processed"], seen["errored"]) == ("completed", 1, 1)
    assert seen["last_error"] == error


async def test_an_unrunnable_operation_fails_instead_of_blocking_the_ones_behind_it(
    db, awa_client
):
    ctx = await make_context(db)
    job = await insert_job(awa_client, "behind", priority=4)
    # Only a hand-written row can hold this: awa-pg refuses it on submit.
    broken = await db.fetchval("""
        INSERT INTO awa.batch_operations (id, op_kind, filter, spec, state, submitted_at)
        VALUES (gen_random_uuid(), 'set_priority', '{"state": "running"}',
                '{"op_kind": "set_priority", "priority": 1}', 'pending',
                clock_timestamp() - interval '1 minute')
        RETURNING id::text
    """)
    op = await in_thread(awa_client.set_priority, 1, filter={"queue": "behind"})

    failed = await run_once(ctx)
    assert (failed.operation_id, failed.finalized_state) == (uuid.UUID(broken), "failed")
    seen = await in_thread(awa_client.get_batch_operation, broken)
    assert seen["state"] == "failed"
    assert seen["last_error"] == "set_priority only supports available or scheduled state filters"

    behind = await run_once(ctx)
    assert (behind.operation_id, behind.finalized_state) == (uuid.UUID(op["id"]), "completed")
    assert (await job_row(db, job))["priority"] == 1


async def test_without_a_pending_operation_a_tick_is_a_quiet_no_op(db, awa_client, caplog):
    ctx = await make_context(db)
    await insert_job(awa_client, "idle")
    caplog.set_level(logging.DEBUG, logger=batch_operations.__name__)

    result = await run_once(ctx)

    assert not result.claimed and not result.runner_lock_busy
    assert (result.processed, result.skipped, result.errored) == (0, 0, 0)
    assert not [r for r in caplog.records
                if r.name == batch_operations.__name__ and r.levelno >= logging.INFO]
    assert await advisory_lock_holders(db, RUNNER_LOCK_KEY) == []


@pytest.mark.parametrize(
    ("spec", "job_filter", "reason"),
    [
        ({"op_kind": "set_priority", "priority": 5}, {}, "priority must be between 1 and 4"),
        ({"op_kind": "set_priority"}, {}, "priority must be between 1 and 4"),
        ({"op_kind": "move_queue", "queue": ""}, {}, "destination queue"),
        ({"op_kind": "move_queue", "queue": "x" * 201}, {}, "destination queue"),
        ({"op_kind": "delete"}, {}, "unknown batch operation kind"),
        ({"op_kind": "move_queue", "queue": "q"}, {"state": "failed"},
         "move_queue only supports available or scheduled state filters"),
        ({"op_kind": "set_priority", "priority": 1}, {"ids": ["1"]}, "filter.ids"),
        ({"op_kind": "set_priority", "priority": 1}, {"created_at_lt": "yesterday"},
         "filter.created_at_lt"),
    ],
)
def test_decoding_refuses_what_awa_pg_would_refuse(spec, job_filter, reason):
    with pytest.raises(runner.InvalidBatchOperation, match=reason):
        runner.decode_operation(spec, job_filter, CANONICAL_STORAGE)


def test_decoding_reads_awa_pg_filters():
    plan = runner.decode_operation(
        {"op_kind": "move_queue", "queue": "q", "priority": None},
        {"kind": "k", "queue": None, "ids": [3, 4], "tag": "t", "state": "scheduled",
         "created_at_gte": "2026-01-02T03:04:05.123456789Z", "created_at_lt": None},
        CANONICAL_STORAGE,
    )
    assert plan.apply_sql == batch_operations.APPLY_MOVE_QUEUE_SQL
    assert plan.apply_args == {"queue": "q", "priority": None}
    assert plan.filter_args == {
        "state": "scheduled", "kind": "k", "queue": None, "tag": "t", "ids": [3, 4],
        "created_at_gte": dt.datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=dt.UTC), "created_at_lt": None,
    }


@pytest.mark.parametrize(
    ("raw", "days"),
    [(None, 90), ("7", 7), ("+7", 7), ("0", 90), ("-3", 90), ("7d", 90), (" 7", 90)],
)
def test_retention_days_follow_awa(monkeypatch, raw, days):
    if raw is None:
        monkeypatch.delenv("AWA_BATCH_OP_RETENTION_DAYS", raising=False)
    else:
        monkeypatch.setenv("AWA_BATCH_OP_RETENTION_DAYS", raw)
    assert runner.retention_days() == days
