"""queue_stats on queue storage: depth per state (DLQ included), lag and DLQ
depth of jobs made by awa-pg and its workers; zeroing of drained and
vanished queues; and no waiting on a prune's ACCESS EXCLUSIVE locks."""

from __future__ import annotations

import datetime as dt
import time

import trio
from conftest import in_thread
from support.awa_pg import awa_pg_worker
from support.contexts import make_context
from support.helpers import metric_points
from support.qs_dlq import (
    DLQ_KIND,
    add_bulk_dlq_rows,
    dead_letter_with_awa_pg,
    fail_jobs_with_awa_pg,
    holding_leader_lock,
)

from awa_trio.engines.queue_storage import queue_stats
from awa_trio.metrics import JOB_DLQ_DEPTH, QUEUE_DEPTH, QUEUE_LAG

ZERO_DEPTH = dict.fromkeys(queue_stats.DEPTH_STATES, 0)


def depths(reader) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for attributes, point in metric_points(reader, QUEUE_DEPTH):
        out.setdefault(attributes["awa.job.queue"], {})[attributes["awa.job.state"]] = point.value
    return out


def gauge_by_queue(reader, name: str) -> dict[str, float]:
    return {attrs["awa.job.queue"]: point.value for attrs, point in metric_points(reader, name)}


def published(result) -> dict[str, dict[str, int]]:
    return {stats.queue: stats.depth for stats in result.queues}


async def insert(awa_client, queue: str, *, kind: str = "idle", run_at=None, max_attempts=25):
    job = await in_thread(awa_client.insert, {}, kind=kind, queue=queue, run_at=run_at,
                          max_attempts=max_attempts)
    return job.id


async def age_ready_jobs(db, queue: str, seconds: float) -> None:
    """Make the queue's ready jobs look ``seconds`` older (awa-pg sends a job
    with a run_at, even a past one, to the scheduled state)."""
    await db.execute(
        "UPDATE awa.ready_entries SET run_at = run_at - make_interval(secs => $2)"
        " WHERE queue = $1",
        queue, seconds,
    )


async def test_depth_per_state_lag_and_dlq_depth_of_what_awa_pg_made(
    qs_database_url, qs_db, qs_awa_client, meter_provider, metric_reader
):
    now = dt.datetime.now(dt.UTC)
    for _ in range(3):
        await insert(qs_awa_client, "ready")
    await age_ready_jobs(qs_db, "ready", 60)
    for _ in range(2):
        await insert(qs_awa_client, "ready", run_at=now + dt.timedelta(hours=1))  # scheduled
    # broken: two failed jobs moved to the DLQ, one failed job left in the
    # ring; flaky: one job failed once and waiting to be retried.
    await dead_letter_with_awa_pg(qs_database_url, qs_db, qs_awa_client, "broken", 2)
    failed = [await insert(qs_awa_client, "broken", kind=DLQ_KIND, max_attempts=1)]
    await fail_jobs_with_awa_pg(qs_database_url, qs_db, "broken", failed)
    retrying = [await insert(qs_awa_client, "flaky", kind=DLQ_KIND, max_attempts=5)]
    await fail_jobs_with_awa_pg(qs_database_url, qs_db, "flaky", retrying,
                                until_state="retryable")
    for _ in range(2):
        await insert(qs_awa_client, "busy", kind="hangs")
    ctx = await make_context(qs_db, meter_provider=meter_provider)

    async with holding_leader_lock(qs_db):
        async with awa_pg_worker(qs_database_url, "hangs:busy", behaviour="hang",
                                 extra_args=["--role", "auto"]) as worker:
            with trio.fail_after(10):  # both hanging jobs claimed
                while len([line for line in worker.lines if line.startswith("START")]) < 2:
                    await trio.sleep(0.1)
            result = await queue_stats.run_once(ctx)

    assert result.skipped_parts == []
    expected = {
        "ready": {**ZERO_DEPTH, "available": 3, "scheduled": 2},
        "broken": {**ZERO_DEPTH, "failed": 3},
        "flaky": {**ZERO_DEPTH, "retryable": 1},
        "busy": {**ZERO_DEPTH, "running": 2},
    }
    assert published(result) == expected
    assert depths(metric_reader) == expected
    assert gauge_by_queue(metric_reader, JOB_DLQ_DEPTH) == {
        "ready": 0, "broken": 2, "flaky": 0, "busy": 0,
    }
    lags = gauge_by_queue(metric_reader, QUEUE_LAG)
    assert set(lags) == {"ready"}  # only it has ready jobs
    assert 60 <= lags["ready"] < 120
    # awa-pg's own reading agrees on the DLQ.
    assert await in_thread(qs_awa_client.dlq_depth, queue="broken") == 2


async def test_drained_and_vanished_queues_go_to_zero(
    qs_database_url, qs_db, qs_awa_client, meter_provider, metric_reader
):
    ids = [await insert(qs_awa_client, "work", kind="quick") for _ in range(3)]
    await age_ready_jobs(qs_db, "work", 30)
    await add_bulk_dlq_rows(qs_db, "ghost", 4, dt.timedelta(days=1))
    ctx = await make_context(qs_db, meter_provider=meter_provider)

    first = await queue_stats.run_once(ctx)
    assert published(first)["work"]["available"] == 3
    assert published(first)["ghost"] == {**ZERO_DEPTH, "failed": 4}
    assert gauge_by_queue(metric_reader, QUEUE_LAG)["work"] >= 30
    assert gauge_by_queue(metric_reader, JOB_DLQ_DEPTH)["ghost"] == 4

    # A real awa-pg worker drains "work"; the DLQ rows of "ghost" go away.
    async with holding_leader_lock(qs_db):
        async with awa_pg_worker(qs_database_url, "quick:work",
                                 extra_args=["--role", "auto"]) as worker:
            # Completions are flushed in batches after the handler returns.
            with trio.fail_after(20):
                while await qs_db.fetchval(
                    "SELECT count(*) FROM awa.receipt_completion_batches AS batch,"
                    " unnest(batch.job_ids) AS job_id WHERE job_id = ANY($1)", ids,
                ) < len(ids):
                    await trio.sleep(0.1)
            assert len([line for line in worker.lines if line.startswith("DONE")]) == len(ids)
    await qs_db.execute("DELETE FROM awa.dlq_entries WHERE queue = 'ghost'")

    second = await queue_stats.run_once(ctx)

    assert second.vanished == {"ghost"}
    assert published(second)["work"] == ZERO_DEPTH
    assert "ghost" not in published(second)
    assert depths(metric_reader)["work"] == ZERO_DEPTH
    assert depths(metric_reader)["ghost"] == ZERO_DEPTH
    assert gauge_by_queue(metric_reader, QUEUE_LAG)["work"] == 0
    assert gauge_by_queue(metric_reader, JOB_DLQ_DEPTH)["ghost"] == 0


async def current_queue_slot(db) -> int:
    return await db.fetchval("SELECT current_slot FROM awa.queue_ring_state WHERE singleton")


async def test_never_waits_on_a_ring_child_held_access_exclusive(
    qs_db, qs_awa_client, meter_provider, metric_reader
):
    for _ in range(2):
        await insert(qs_awa_client, "locked")
    await age_ready_jobs(qs_db, "locked", 30)
    await add_bulk_dlq_rows(qs_db, "locked", 1, dt.timedelta(days=1))
    ctx = await make_context(qs_db, meter_provider=meter_provider, lock_timeout="30s")
    before = await queue_stats.run_once(ctx)
    lag_before = gauge_by_queue(metric_reader, QUEUE_LAG)["locked"]
    slot = await current_queue_slot(qs_db)

    # What a queue-ring prune holds while it truncates a slot, plus a lease
    # and a claim child, each as its prune would.
    async with qs_db.acquire() as prune:
        await prune.execute("BEGIN")
        await prune.execute(
            f"LOCK TABLE awa.ready_entries_{slot}, awa.done_entries_{slot},"
            f" awa.ready_tombstones_{slot}, awa.leases_0, awa.lease_claims_0"
            " IN ACCESS EXCLUSIVE MODE"
        )
        started = time.monotonic()
        with trio.fail_after(5):
            during = await queue_stats.run_once(ctx)
        elapsed = time.monotonic() - started
        waiting = await qs_db.fetchval(
            "SELECT count(*) FROM pg_locks WHERE NOT granted"
            " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        )
        await prune.execute("ROLLBACK")

    assert elapsed < 1.5, f"queue_stats waited {elapsed:.2f}s on a prune's lock"
    assert waiting == 0
    assert during.skipped_parts == ["lease_ring", "claim_ring", "queue_ring"]
    # The control part still published; the ring gauges kept their values.
    assert published(during)["locked"] == {"available": 2, "scheduled": 0, "retryable": 0}
    assert depths(metric_reader)["locked"] == published(before)["locked"]
    assert gauge_by_queue(metric_reader, QUEUE_LAG)["locked"] == lag_before
    assert gauge_by_queue(metric_reader, JOB_DLQ_DEPTH)["locked"] == 1
    assert during.vanished == set()

    after = await queue_stats.run_once(ctx)
    assert after.skipped_parts == []
    assert published(after)["locked"] == {**ZERO_DEPTH, "available": 2, "failed": 1}


async def test_a_lock_on_one_ring_skips_only_that_rings_gauges(qs_db, qs_awa_client):
    await insert(qs_awa_client, "one")
    ctx = await make_context(qs_db)
    async with qs_db.acquire() as prune:
        await prune.execute("BEGIN")
        await prune.execute("LOCK TABLE awa.leases_3 IN ACCESS EXCLUSIVE MODE")
        with trio.fail_after(5):
            result = await queue_stats.run_once(ctx)
        await prune.execute("ROLLBACK")
    assert result.skipped_parts == ["lease_ring"]
    assert published(result)["one"] == {
        "available": 1, "scheduled": 0, "retryable": 0, "failed": 0,
    }
