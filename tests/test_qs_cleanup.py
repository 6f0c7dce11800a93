"""cleanup on queue storage: the DLQ purge (global retention, per-queue
overrides, draining a backlog within a tick or across ticks) and the
engine-independent steps, on databases finalised by a real awa-pg runtime."""

from __future__ import annotations

import datetime as dt
import time
import uuid

import trio
from conftest import in_thread
from support.contexts import make_context
from support.helpers import metric_points
from support.qs_dlq import add_bulk_dlq_rows, backdate_dlq, dead_letter_with_awa_pg, dlq_ids

from awa_trio.config import RetentionPolicy
from awa_trio.engines.queue_storage import cleanup
from awa_trio.metrics import JOB_DLQ_PURGED

DAY = dt.timedelta(days=1)
HOUR = dt.timedelta(hours=1)


def purged_by_attributes(metric_reader) -> dict[str | None, int]:
    return {
        attributes.get("awa.job.queue"): point.value
        for attributes, point in metric_points(metric_reader, JOB_DLQ_PURGED)
    }


async def test_global_retention_purges_only_expired_rows_that_awa_pg_dead_lettered(
    qs_database_url, qs_db, qs_awa_client, meter_provider, metric_reader
):
    job_ids = await dead_letter_with_awa_pg(qs_database_url, qs_db, qs_awa_client, "mail", 4)
    expired, kept = job_ids[:2], job_ids[2:]
    await backdate_dlq(qs_db, expired, 31 * DAY)  # default retention: 30 days
    ctx = await make_context(qs_db, meter_provider=meter_provider)

    result = await cleanup.run_once(ctx)

    assert (result.dlq_purged, result.dlq_purged_by_queue, result.failed_steps) == (2, {}, [])
    assert await dlq_ids(qs_db) == kept
    assert await in_thread(qs_awa_client.dlq_depth) == 2
    assert purged_by_attributes(metric_reader) == {None: 2}

    again = await cleanup.run_once(ctx)
    assert again.dlq_purged == 0 and await dlq_ids(qs_db) == kept


async def test_per_queue_dlq_retention_overrides_the_global_one(
    qs_db, meter_provider, metric_reader
):
    rows = {}
    for queue in ("short", "long", "plain", "completed_only"):
        rows[queue, "2h"] = await add_bulk_dlq_rows(qs_db, queue, 2, 2 * HOUR)
        rows[queue, "40d"] = await add_bulk_dlq_rows(qs_db, queue, 3, 40 * DAY)
    ctx = await make_context(
        qs_db, meter_provider=meter_provider,
        queue_retention_overrides={
            "short": RetentionPolicy(dlq="1h"),
            "long": RetentionPolicy(dlq="60d"),
            # No DLQ retention of its own: the global 30 days applies.
            "completed_only": RetentionPolicy(completed="1h"),
        },
    )

    result = await cleanup.run_once(ctx)

    assert result.dlq_purged == 6  # plain and completed_only, 40-day-old rows
    assert result.dlq_purged_by_queue == {"long": 0, "short": 5}
    assert await dlq_ids(qs_db, "short") == []
    assert await dlq_ids(qs_db, "long") == sorted(rows["long", "2h"] + rows["long", "40d"])
    assert await dlq_ids(qs_db, "plain") == rows["plain", "2h"]
    assert await dlq_ids(qs_db, "completed_only") == rows["completed_only", "2h"]
    assert purged_by_attributes(metric_reader) == {None: 6, "short": 5}


async def test_a_backlog_of_more_than_ten_batches_drains_in_one_tick(qs_db, meter_provider,
                                                                     metric_reader):
    expired = await add_bulk_dlq_rows(qs_db, "bulk", 1_050, 31 * DAY)
    fresh = await add_bulk_dlq_rows(qs_db, "bulk", 7, 29 * DAY)
    ctx = await make_context(qs_db, meter_provider=meter_provider, dlq_cleanup_batch_size=50,
                             drain_time_budget="30s")

    result = await cleanup.run_once(ctx)

    assert result.dlq_purged == 1_050 and result.unfinished_steps == []
    assert result.dlq_batches == 22  # 21 full batches, then an empty one
    assert await dlq_ids(qs_db) == fresh
    assert purged_by_attributes(metric_reader) == {None: 1_050}
    assert not set(expired) & set(await dlq_ids(qs_db))


async def test_a_tiny_budget_drains_the_backlog_one_batch_per_tick(qs_db):
    await add_bulk_dlq_rows(qs_db, "bulk", 35, 31 * DAY)
    fresh = await add_bulk_dlq_rows(qs_db, "bulk", 3, 1 * DAY)
    override = await add_bulk_dlq_rows(qs_db, "own", 12, 3 * HOUR)
    ctx = await make_context(
        qs_db, dlq_cleanup_batch_size=10, drain_time_budget="0.001ms",  # spent by any batch
        queue_retention_overrides={"own": RetentionPolicy(dlq="1h")},
    )

    remaining_global = []
    remaining_own = []
    for _ in range(4):
        result = await cleanup.run_once(ctx)
        remaining_global.append(len(await dlq_ids(qs_db, "bulk")))
        remaining_own.append(len(await dlq_ids(qs_db, "own")))
        # Each pass takes its first batch even when the budget is spent, so
        # the override queue is never starved by the global backlog.
        assert result.dlq_batches == 2
    assert remaining_global == [28, 18, 8, 3]
    assert remaining_own == [2, 0, 0, 0]
    assert await dlq_ids(qs_db, "bulk") == fresh
    assert set(override).isdisjoint(await dlq_ids(qs_db))


async def test_a_row_locked_by_someone_else_is_skipped_not_waited_for(qs_db):
    expired = await add_bulk_dlq_rows(qs_db, "mail", 5, 31 * DAY)
    ctx = await make_context(qs_db, lock_timeout="30s")
    async with qs_db.acquire() as holder:
        await holder.execute("BEGIN")
        await holder.execute("SELECT 1 FROM awa.dlq_entries WHERE job_id = $1 FOR UPDATE",
                             expired[0])
        started = time.monotonic()
        with trio.fail_after(10):
            result = await cleanup.run_once(ctx)
        assert time.monotonic() - started < 5
        assert result.dlq_purged == 4
        assert await dlq_ids(qs_db) == [expired[0]]
        await holder.execute("ROLLBACK")
    assert (await cleanup.run_once(ctx)).dlq_purged == 1


async def test_engine_independent_steps_run_after_the_purge(qs_db, qs_awa_client):
    await add_bulk_dlq_rows(qs_db, "mail", 3, 31 * DAY)
    stale_runtime = uuid.uuid4()
    await qs_db.execute(
        """
        INSERT INTO awa.runtime_instances (
            instance_id, pid, version, started_at, last_seen_at, snapshot_interval_ms,
            healthy, postgres_connected, poll_loop_alive, heartbeat_alive, shutting_down, leader
        )
        VALUES ($1, 1, '0.6.1', now() - interval '25 hours', now() - interval '25 hours',
                10000, true, true, true, true, false, false)
        """,
        stale_runtime,
    )
    await qs_db.execute(
        "INSERT INTO awa.queue_descriptors (queue, descriptor_hash, last_seen_at)"
        " VALUES ('gone', 'h', now() - interval '31 days')"
    )
    await qs_db.execute(
        "INSERT INTO awa.job_kind_descriptors (kind, descriptor_hash, last_seen_at)"
        " VALUES ('gone_kind', 'h', now() - interval '31 days')"
    )
    submitted = await in_thread(qs_awa_client.set_priority, 1, filter={"queue": "nowhere"})
    await qs_db.execute(
        "UPDATE awa.batch_operations SET state = 'completed',"
        " finalized_at = now() - interval '91 days', retention_until = now() - interval '1 day'"
        " WHERE id = $1",
        uuid.UUID(submitted["id"]),
    )

    result = await cleanup.run_once(await make_context(qs_db))

    assert result.dlq_purged == 3
    assert result.runtime_snapshots_deleted == 1
    assert (result.queue_descriptors_deleted, result.job_kind_descriptors_deleted) == (1, 1)
    assert result.batch_operations_deleted == 1
    assert result.failed_steps == []
    assert await qs_db.fetchval("SELECT count(*) FROM awa.runtime_instances") == 0
    assert await qs_db.fetchval("SELECT count(*) FROM awa.batch_operations") == 0


async def test_a_failing_dlq_step_is_logged_and_the_other_steps_still_run(qs_db, caplog):
    await qs_db.execute("ALTER TABLE awa.dlq_entries RENAME TO dlq_entries_moved")
    await qs_db.execute(
        "INSERT INTO awa.queue_descriptors (queue, descriptor_hash, last_seen_at)"
        " VALUES ('gone', 'h', now() - interval '31 days')"
    )

    result = await cleanup.run_once(await make_context(qs_db))

    assert result.failed_steps == ["dead-lettered jobs (global pass)"]
    assert result.queue_descriptors_deleted == 1
    assert "failed to purge dead-lettered jobs (global pass)" in caplog.text


async def test_cancelled_mid_drain_leaves_each_batch_whole_or_untouched(qs_db):
    total, batch = 50_000, 100
    await add_bulk_dlq_rows(qs_db, "bulk", total, 31 * DAY)
    ctx = await make_context(qs_db, dlq_cleanup_batch_size=batch, drain_time_budget="30s")

    with trio.move_on_after(0.3) as scope:  # leadership lost mid-drain
        await cleanup.run_once(ctx)

    assert scope.cancelled_caught
    left = len(await dlq_ids(qs_db))
    assert 0 < left < total
    assert (total - left) % batch == 0  # no batch half applied
    # Nothing of ours is still running on the server.
    assert await qs_db.fetchval(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND query LIKE '%DELETE FROM awa.dlq_entries%' AND state = 'active'"
        " AND pid <> pg_backend_pid()"
    ) == 0
    assert (await cleanup.run_once(ctx)).dlq_purged == left
    assert await dlq_ids(qs_db) == []
