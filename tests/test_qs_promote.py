"""promote_scheduled on queue storage, against the real schema: jobs inserted
by awa-pg 0.6.1, promoted by us, claimed and completed by an awa-pg worker."""

from __future__ import annotations

import trio
from support.awa_pg import awa_pg_worker
from support.helpers import metric_points
from support.qs_jobs import (
    Listener,
    deferred_count,
    insert_one_scheduled,
    insert_scheduled,
    make_due,
    make_retryable,
    ready_count,
)

from awa_trio.config import MaintenanceConfig
from awa_trio.engines.queue_storage import promote
from awa_trio.engines.queue_storage.registry import queue_storage_branches

AVAILABLE_ONLY = 0b10        # unique_states bit 1: the claim is held only while available
AVAILABLE_RUNNING = 0b110
SCHEDULED_ONLY = 0b1


def done_ids(worker) -> list[int]:
    return [int(line.split()[1]) for line in worker.lines if line.startswith("DONE ")]


async def test_a_20000_job_burst_is_promoted_in_one_run_and_claimable_by_awa_pg(
    qs_ctx, qs_db, qs_database_url, qs_awa_client
):
    # Upstream wedges above ~3,640 due jobs of one state. Half of these rows
    # have a NULL payload (enqueue_many_copy), half a real one (insert_many_copy);
    # 600 of them sit in a second queue, the sample a real worker completes
    # (awa-pg's worker runs ~80 jobs/s here, too slow for all 20,000 in a test).
    await insert_scheduled(qs_awa_client, 9_700, null_payload=True)
    await insert_scheduled(qs_awa_client, 9_700, null_payload=False)
    await insert_scheduled(qs_awa_client, 300, queue="sample", null_payload=True)
    await insert_scheduled(qs_awa_client, 300, queue="sample", null_payload=False)
    assert await deferred_count(qs_db, "payload IS NULL") == 10_000
    assert await make_due(qs_db) == 20_000

    result = await promote.run_once(qs_ctx)

    assert result.promoted == {"scheduled": 20_000, "retryable": 0}
    assert result.queues == {"burst", "sample"}
    assert await deferred_count(qs_db) == 0
    assert await ready_count(qs_db) == 20_000
    assert await ready_count(qs_db, "payload IS NULL") == 10_000
    # Lane positions are a gap-free run per lane, covered by the batches' segments.
    for queue, expected in (("burst", 19_400), ("sample", 600)):
        seqs = await qs_db.fetchrow(
            "SELECT min(lane_seq) AS lo, max(lane_seq) AS hi, count(DISTINCT lane_seq) AS n "
            "FROM awa.ready_entries WHERE queue = $1", queue)
        assert seqs["hi"] - seqs["lo"] + 1 == seqs["n"] == expected
        covered = await qs_db.fetchval(
            "SELECT sum(next_lane_seq - first_lane_seq) FROM awa.ready_segments "
            "WHERE queue = $1", queue)
        assert covered == expected

    # A real awa-pg worker claims and completes the sample, once each,
    # NULL-payload rows included.
    with trio.fail_after(120):
        async with awa_pg_worker(qs_database_url, "burst:sample",
                                 extra_args=["--role", "auto", "--mute-maintenance"]) as worker:
            while len(done_ids(worker)) < 600:
                await trio.sleep(0.5)
            await trio.sleep(1.0)  # a duplicate would show up now
            done = done_ids(worker)
    assert len(done) == len(set(done)) == 600
    ids = {row["job_id"] for row in await qs_db.fetch(
        "SELECT job_id FROM awa.ready_entries WHERE queue = 'sample'")}
    assert set(done) == ids


async def test_scheduled_rows_go_before_retryable_rows_and_batches_are_measured(
    qs_ctx, qs_db, qs_awa_client, metric_reader
):
    retryable = [await insert_one_scheduled(qs_awa_client, {"r": i}) for i in range(3)]
    scheduled = [await insert_one_scheduled(qs_awa_client, {"s": i}) for i in range(3)]
    # The retryable rows came due first, yet scheduled rows are promoted first.
    await make_retryable(qs_db, retryable, seconds_ago=120)
    await make_due(qs_db, "state = 'scheduled'", seconds_ago=10)

    result = await promote.run_once(qs_ctx)

    assert result.promoted == {"scheduled": 3, "retryable": 3}
    rows = await qs_db.fetch("SELECT job_id, lane_seq, attempt, run_lease FROM awa.ready_entries "
                             "WHERE queue = 'burst' ORDER BY lane_seq")
    assert [row["job_id"] for row in rows] == scheduled + retryable
    # Attempt history travels with the row.
    assert [(row["attempt"], row["run_lease"]) for row in rows[3:]] == [(1, 1)] * 3

    sizes = {attrs["awa.job.state"]: point
             for attrs, point in metric_points(metric_reader, "awa.maintenance.promote_batch_size")}
    assert sizes["scheduled"].sum == 3 and sizes["retryable"].sum == 3
    batches = {attrs["awa.job.state"]: point.value
               for attrs, point in metric_points(metric_reader, "awa.maintenance.promote_batches")}
    assert batches == {"scheduled": 1, "retryable": 1}
    durations = metric_points(metric_reader, "awa.maintenance.promote_duration")
    assert {attrs["awa.job.state"] for attrs, _ in durations} == {"scheduled", "retryable"}


async def test_paused_queues_and_rows_not_yet_due_stay_deferred(qs_ctx, qs_db, qs_awa_client):
    await insert_scheduled(qs_awa_client, 5, queue="paused")
    await insert_scheduled(qs_awa_client, 5, queue="later")
    await insert_scheduled(qs_awa_client, 5, queue="now")
    await make_due(qs_db, "queue IN ('paused', 'now')")
    await trio.to_thread.run_sync(qs_awa_client.pause_queue, "paused")

    result = await promote.run_once(qs_ctx)

    assert result.promoted["scheduled"] == 5 and result.queues == {"now"}
    assert await deferred_count(qs_db, "queue = 'paused'") == 5
    assert await deferred_count(qs_db, "queue = 'later'") == 5
    assert await ready_count(qs_db, "queue IN ('paused', 'later')") == 0

    # Resumed, the paused queue's due rows follow on the next tick.
    await trio.to_thread.run_sync(qs_awa_client.resume_queue, "paused")
    result = await promote.run_once(qs_ctx)
    assert result.promoted["scheduled"] == 5 and result.queues == {"paused"}
    assert await deferred_count(qs_db) == 5


async def test_each_queue_that_receives_jobs_is_notified(
    qs_ctx, qs_db, qs_database_url, qs_awa_client
):
    # A queue name too long for a channel: LISTEN cuts "awa:<queue>" to 63
    # bytes (at a character boundary), so the NOTIFY must be cut the same way.
    long_queue = "ü" * 40
    long_channel = ("awa:" + long_queue)[:33]  # 4 + 29 * 2 = 62 bytes; one more would be 64
    await insert_scheduled(qs_awa_client, 3, queue="alpha")
    await insert_scheduled(qs_awa_client, 2, queue="beta")
    await insert_scheduled(qs_awa_client, 2, queue="gamma")
    await insert_scheduled(qs_awa_client, 1, queue=long_queue)
    await make_due(qs_db, f"queue IN ('alpha', 'beta', '{long_queue}')")

    # (asyncpg routes notifications by the name it was given, so listen on the cut name.)
    channels = ["awa:alpha", "awa:beta", "awa:gamma", long_channel]
    async with Listener(qs_database_url, channels) as listener:
        result = await promote.run_once(qs_ctx)
        assert result.promoted["scheduled"] == 6
        assert await listener.wait_for("awa:alpha") and await listener.wait_for("awa:beta")
        assert await listener.wait_for(long_channel)
        await trio.sleep(0.3)
    # One NOTIFY per queue per batch; nothing for a queue that got no job.
    assert sorted(listener.heard) == sorted(["awa:alpha", "awa:beta", long_channel])


async def test_a_job_whose_unique_claim_is_held_waits_and_never_blocks_the_others(
    qs_ctx, qs_db, qs_awa_client
):
    unique = {"by_args": True, "states": AVAILABLE_RUNNING}
    holder = await trio.to_thread.run_sync(lambda: qs_awa_client.insert(
        {"key": 1}, kind="burst", queue="burst", unique_opts=unique))
    # Same key, claim only while available/running: may wait alongside the holder.
    waiting = await insert_one_scheduled(qs_awa_client, {"key": 1}, unique_opts=unique)
    others = [await insert_one_scheduled(qs_awa_client, {"other": i}) for i in range(3)]
    await make_due(qs_db)

    result = await promote.run_once(qs_ctx)

    assert result.promoted["scheduled"] == 3
    assert await deferred_count(qs_db, f"job_id = {waiting}") == 1
    assert await ready_count(qs_db, f"job_id = ANY(ARRAY{others}::bigint[])") == 3
    claim = await qs_db.fetchval("SELECT job_id FROM awa.job_unique_claims")
    assert claim == holder.id

    # The holder goes away (cancelled: outside the mask): the claim is free,
    # and the waiting job is promoted and takes it.
    await trio.to_thread.run_sync(qs_awa_client.cancel, holder.id)
    assert await qs_db.fetchval("SELECT count(*) FROM awa.job_unique_claims") == 0
    result = await promote.run_once(qs_ctx)
    assert result.promoted["scheduled"] == 1
    assert await ready_count(qs_db, f"job_id = {waiting}") == 1
    assert await qs_db.fetchval("SELECT job_id FROM awa.job_unique_claims") == waiting


async def test_a_unique_conflict_inside_one_batch_falls_back_row_by_row(
    qs_ctx, qs_db, qs_awa_client
):
    # Two due jobs share a key that neither holds while scheduled: promoting
    # both in one batch raises 23505; the batch goes row by row, the first
    # takes the claim, the second waits, every other job is promoted.
    unique = {"by_args": True, "states": AVAILABLE_ONLY}
    first = await insert_one_scheduled(qs_awa_client, {"key": 7}, unique_opts=unique)
    second = await insert_one_scheduled(qs_awa_client, {"key": 7}, unique_opts=unique)
    others = [await insert_one_scheduled(qs_awa_client, {"other": i}) for i in range(4)]
    await make_due(qs_db)
    await qs_db.execute("UPDATE awa.deferred_jobs SET run_at = run_at - interval '1 second' "
                        f"WHERE job_id = {first}")

    result = await promote.run_once(qs_ctx)

    assert result.promoted["scheduled"] == 5
    assert result.row_by_row == ["scheduled"]
    assert await qs_db.fetchval("SELECT job_id FROM awa.job_unique_claims") == first
    assert await deferred_count(qs_db) == 1
    assert await ready_count(qs_db, f"job_id = ANY(ARRAY{[*others, first]}::bigint[])") == 5
    # Next tick the waiting job is left out of the batch: no conflict, no fallback.
    result = await promote.run_once(qs_ctx)
    assert result.promoted == {"scheduled": 0, "retryable": 0} and result.row_by_row == []
    assert await deferred_count(qs_db, f"job_id = {second}") == 1


async def test_the_branch_runs_at_once_at_term_start_every_promote_interval():
    config = MaintenanceConfig(promote_interval="100ms")
    spec = next(s for s in queue_storage_branches(config) if s.name == promote.NAME)
    assert spec.run_once is promote.run_once
    assert spec.run_immediately and spec.interval == 0.1


async def test_a_claim_held_only_while_waiting_is_released_on_promotion(
    qs_ctx, qs_db, qs_awa_client
):
    job = await insert_one_scheduled(qs_awa_client, {"key": 3},
                                     unique_opts={"by_args": True, "states": SCHEDULED_ONLY})
    assert await qs_db.fetchval("SELECT job_id FROM awa.job_unique_claims") == job
    await make_due(qs_db)

    result = await promote.run_once(qs_ctx)

    assert result.promoted["scheduled"] == 1
    assert await qs_db.fetchval("SELECT count(*) FROM awa.job_unique_claims") == 0


async def test_a_lane_that_does_not_exist_yet_is_created_and_the_batch_retried(
    qs_ctx, qs_db, qs_awa_client
):
    # Jobs scheduled for a queue that never had a ready row: the batch's
    # reservation meets a lane with no enqueue head (SQLSTATE 55000).
    await insert_scheduled(qs_awa_client, 3, queue="fresh")
    await make_due(qs_db)
    result = promote.PromoteResult()

    await promote.promote_due_state(qs_ctx, "awa", "scheduled", result)

    assert result.lanes_created == [("fresh", 2, 0)]
    assert result.promoted == {"scheduled": 3}
    assert await ready_count(qs_db, "queue = 'fresh'") == 3


async def test_a_retryable_burst_larger_than_a_batch_promotes_in_one_run(
    qs_ctx, qs_db, qs_awa_client
):
    # Upstream's per-state wedge applies to retryable rows too.
    await insert_scheduled(qs_awa_client, 5_000, null_payload=True)
    ids = [row["job_id"] for row in await qs_db.fetch("SELECT job_id FROM awa.deferred_jobs")]
    await make_retryable(qs_db, ids)

    result = await promote.run_once(qs_ctx)

    assert result.promoted == {"scheduled": 0, "retryable": 5_000}
    assert await deferred_count(qs_db) == 0
    assert await ready_count(qs_db, "attempt = 1 AND payload IS NULL") == 5_000


async def test_a_tick_stops_at_its_batch_budget_and_at_the_first_short_batch(
    qs_ctx, qs_db, qs_awa_client, metric_reader, monkeypatch
):
    monkeypatch.setattr(promote, "PROMOTE_BATCH_SIZE", 100)
    monkeypatch.setattr(promote, "PROMOTE_MAX_BATCHES_PER_TICK", 3)
    await insert_scheduled(qs_awa_client, 350)
    await make_due(qs_db)

    first = await promote.run_once(qs_ctx)
    assert first.promoted["scheduled"] == 300 and await deferred_count(qs_db) == 50
    second = await promote.run_once(qs_ctx)
    assert second.promoted["scheduled"] == 50 and await deferred_count(qs_db) == 0
    # Batches: 3 full ones, then one short one that ends the state's loop.
    sizes = [point for attrs, point in metric_points(metric_reader,
                                                      "awa.maintenance.promote_batch_size")
             if attrs["awa.job.state"] == "scheduled"]
    assert sizes[0].count == 4 and sizes[0].sum == 350
