"""The queue ring (rotate_queue) on a real queue-storage database: rows made
by awa-pg 0.6.1 (inserts, real ``--role auto`` workers completing, failing
and holding jobs), rotate and prune called directly or through the tick."""

from __future__ import annotations

import dataclasses

import trio
from conftest import in_thread
from support.awa_pg import awa_pg_worker
from support.contexts import make_context
from support.helpers import metric_points
from support.qs_rings import (
    done_rows,
    exact_terminal_total,
    finish_jobs,
    insert_jobs,
    job_states,
    leader_lock_held,
    pruned_rollups,
    ring_state,
    slot_generations,
    slot_row_counts,
    wait_until,
)

from awa_trio.engines.queue_storage import rotate_queue
from awa_trio.engines.queue_storage.queue_ring import QUEUE_SLOT_CHILDREN, child
from awa_trio.tracker import PruneOutcome
from awa_trio.tracker_actor import run_tracker

DAY = 86400.0


async def rotate_to_slot(ctx, slot: int) -> None:
    """Rotate (without pruning) until the cursor is on ``slot``."""
    for _ in range(64):
        if (await ring_state(ctx.db))[0] == slot:
            return
        result = await rotate_queue.rotate(ctx)
        assert result.rotated, result
    raise AssertionError("ring never reached the slot")


async def access_share_holder(db, table: str):
    """A second session inside a transaction holding ACCESS SHARE on ``table``."""
    conn = await db.connect_dedicated()
    await conn.execute("BEGIN")
    await conn.execute(f"LOCK TABLE {table} IN ACCESS SHARE MODE")
    return conn


async def exclusive_locks_on(db, tables) -> list:
    return await db.fetch(
        "SELECT relation::regclass::text AS rel, mode, granted FROM pg_locks "
        "WHERE mode = 'AccessExclusiveLock' AND relation = ANY($1::regclass[])", list(tables))


async def queue_totals(client, queue: str) -> dict:
    stats = {s.queue: s for s in await in_thread(client.queue_stats)}
    stat = stats[queue]
    return {name: getattr(stat, name) for name in ("completed", "failed", "available", "running")
            if hasattr(stat, name)}


# --- rotation -------------------------------------------------------------------------


async def test_rotate_walks_every_slot_with_increasing_generations(qs_ctx):
    before_slot, before_generation = await ring_state(qs_ctx.db)
    slot_count = await qs_ctx.db.fetchval("SELECT slot_count FROM awa.queue_ring_state")
    seen = []
    for step in range(1, slot_count + 1):
        result = await rotate_queue.rotate(qs_ctx)
        assert result.rotated, result
        assert result.generation == before_generation + step
        assert result.slot == (before_slot + step) % slot_count
        seen.append(result.slot)
        assert await ring_state(qs_ctx.db) == (result.slot, result.generation)
        assert (await slot_generations(qs_ctx.db))[result.slot] == result.generation
    assert sorted(seen) == list(range(slot_count))
    generations = await slot_generations(qs_ctx.db)
    # Every slot now carries a distinct generation, newest on the cursor.
    assert len(set(generations.values())) == slot_count
    assert max(generations.values()) == before_generation + slot_count


async def test_rotating_onto_a_busy_slot_is_skipped_busy_naming_the_blocker(
        qs_ctx, qs_awa_client, metric_reader):
    start_slot, _ = await ring_state(qs_ctx.db)
    await insert_jobs(qs_awa_client, 3, kind="ring_busy")
    slot_count = await qs_ctx.db.fetchval("SELECT slot_count FROM awa.queue_ring_state")
    await rotate_to_slot(qs_ctx, (start_slot - 1) % slot_count)
    before = await ring_state(qs_ctx.db)

    result = await rotate_queue.rotate(qs_ctx)
    assert not result.rotated
    assert result.slot == start_slot
    assert result.blockers["queue.ready_rows"] == 1
    assert result.blockers["queue.done_rows"] == 0
    assert set(result.blockers) == {label for label, _ in QUEUE_SLOT_CHILDREN}
    assert await ring_state(qs_ctx.db) == before

    # Through the tick: upstream's metric attributes, one point per blocker.
    await rotate_queue.run_once(qs_ctx)
    attempts = metric_points(metric_reader, "awa.maintenance.rotate.attempts")
    busy = [(a, p.value) for a, p in attempts if a["awa.ring.outcome"] == "skipped_busy"]
    # awa-pg's insert writes a ready row and a ready segment.
    assert sorted(a["awa.ring.blocker"] for a, _ in busy) == [
        "queue.ready_rows", "queue.ready_segments"]
    assert all(a["awa.ring"] == "queue" and value == 1 for a, value in busy)


# --- prune ----------------------------------------------------------------------------


async def test_prune_on_an_untouched_ring_is_noop(qs_ctx):
    result = await rotate_queue.prune(qs_ctx)
    assert result.outcome is PruneOutcome.NOOP


async def test_prune_of_an_empty_sealed_slot_takes_no_lock(qs_ctx):
    await rotate_queue.rotate(qs_ctx)
    target = (await ring_state(qs_ctx.db))[0] - 1
    holder = await access_share_holder(qs_ctx.db, child("awa", "ready_entries", target))
    try:
        result = await rotate_queue.prune(qs_ctx)
    finally:
        await holder.close()
    assert result.outcome is PruneOutcome.NOOP
    assert result.slot == target


async def test_pending_ready_rows_skip_prune_before_any_exclusive_lock(qs_ctx, qs_awa_client):
    slot, _ = await ring_state(qs_ctx.db)
    await insert_jobs(qs_awa_client, 2, kind="ring_pending")
    await rotate_queue.rotate(qs_ctx)
    # A reader holds ACCESS SHARE on the slot's ready child: had prune asked
    # for ACCESS EXCLUSIVE it would have waited out its lock timeout and
    # reported Blocked, and pg_locks would show the waiting request.
    ready_child = child("awa", "ready_entries", slot)
    holder = await access_share_holder(qs_ctx.db, ready_child)
    try:
        result = await rotate_queue.prune(qs_ctx, lock_timeout=2.0)
        assert await holder.fetchval(f"SELECT count(*) FROM {ready_child}") == 2
    finally:
        await holder.close()
    assert result.outcome is PruneOutcome.SKIPPED_ACTIVE
    assert (result.slot, result.reason, result.count) == (slot, "queue.pending_ready", 1)
    assert await exclusive_locks_on(qs_ctx.db, [ready_child]) == []
    assert (await slot_row_counts(qs_ctx.db, slot))["queue.ready_rows"] == 2


async def test_an_unclaimed_row_of_another_generation_of_the_slot_skips_prune(qs_ctx, qs_awa_client):
    # TRUNCATE empties the whole child: a ready row filed under an older
    # generation of the slot (as a writer whose ring read is a lap old would
    # file it) must hold the prune back like the slot's own rows.
    slot, _ = await ring_state(qs_ctx.db)
    [job_id] = await insert_jobs(qs_awa_client, 1, kind="ring_stale")
    await qs_ctx.db.execute(
        "UPDATE awa.ready_entries SET ready_generation = ready_generation - 100 WHERE job_id = $1", job_id)
    await rotate_queue.rotate(qs_ctx)

    result = await rotate_queue.prune(qs_ctx)

    assert result.outcome is PruneOutcome.SKIPPED_ACTIVE
    assert (result.slot, result.reason) == (slot, "queue.pending_ready")
    assert (await slot_row_counts(qs_ctx.db, slot))["queue.ready_rows"] == 1


async def test_an_open_claim_skips_prune_before_any_exclusive_lock(
        qs_ctx, qs_awa_client, qs_database_url):
    slot, _ = await ring_state(qs_ctx.db)
    [job_id] = await insert_jobs(qs_awa_client, 1, kind="ring_hang")
    async with leader_lock_held(qs_ctx.db), awa_pg_worker(
            qs_database_url, "ring_hang", behaviour="hang", extra_args=["--role", "auto"]) as worker:
        await worker.wait_for_line(f"START {job_id}", timeout=30)
        await rotate_queue.rotate(qs_ctx)
        # Claimed (no pending ready row left), still running on a receipt
        # claim with no closure evidence yet: the slot is still needed. A
        # reader on the slot is not made to wait, so no lock was asked for.
        ready_child = child("awa", "ready_entries", slot)
        holder = await access_share_holder(qs_ctx.db, ready_child)
        try:
            started = trio.current_time()
            result = await rotate_queue.prune(qs_ctx, lock_timeout=2.0)
            assert trio.current_time() - started < 1.5
        finally:
            await holder.close()
        assert result.outcome is PruneOutcome.SKIPPED_ACTIVE
        assert (result.slot, result.reason, result.count) == (slot, "queue.unclosed_claim_refs", 1)
        assert (await job_states(qs_awa_client, [job_id]))[job_id] == "running"
    assert (await slot_row_counts(qs_ctx.db, slot))["queue.ready_rows"] == 1


async def test_work_that_commits_during_the_lock_wait_is_seen_by_the_second_gate(
        qs_ctx, qs_awa_client, qs_database_url):
    """The race upstream's second gate exists for. The lease is written by
    SQL: no real claimer can be made to commit inside a 10 s lock wait on cue."""
    slot, generation = await ring_state(qs_ctx.db)
    ids = await insert_jobs(qs_awa_client, 3, kind="ring_done")
    await finish_jobs(qs_database_url, qs_ctx.db, qs_awa_client, "ring_done", "complete", ids)
    await rotate_queue.rotate(qs_ctx)
    receipt_child = child("awa", "receipt_completion_batches", slot)
    holder = await access_share_holder(qs_ctx.db, receipt_child)
    results = []
    async with trio.open_nursery() as nursery:
        async def prune_waiting():
            results.append(await rotate_queue.prune(qs_ctx, lock_timeout=10.0))
        nursery.start_soon(prune_waiting)
        # Wait until the prune queues for its exclusive lock behind the reader.
        await wait_until(lambda: _waiting_exclusive(qs_ctx.db, receipt_child), timeout=10)
        # Meanwhile a lease of the slot's generation commits (a claim racing
        # the prune; leases are not among the locked children).
        await qs_ctx.db.execute(
            "INSERT INTO awa.leases (lease_slot, lease_generation, ready_slot, ready_generation, "
            "job_id, queue, priority, lane_seq) "
            "SELECT current_slot, generation, $1, $2, 999999, 'default', 2, 999999 "
            "FROM awa.lease_ring_state", slot, generation)
        await holder.execute("COMMIT")
    await holder.close()
    [result] = results
    assert result.outcome is PruneOutcome.SKIPPED_ACTIVE
    assert result.reason == "queue.active_leases"
    # Nothing was truncated.
    assert (await slot_row_counts(qs_ctx.db, slot))["queue.ready_rows"] == 3


async def _waiting_exclusive(db, table: str) -> bool:
    locks = await exclusive_locks_on(db, [table])
    return any(not lock["granted"] for lock in locks)


async def test_a_reader_blocks_prune_until_it_lets_go(qs_ctx, qs_awa_client, qs_database_url):
    slot, _ = await ring_state(qs_ctx.db)
    ids = await insert_jobs(qs_awa_client, 4, kind="ring_done")
    await finish_jobs(qs_database_url, qs_ctx.db, qs_awa_client, "ring_done", "complete", ids)
    await rotate_queue.rotate(qs_ctx)
    receipt_child = child("awa", "receipt_completion_batches", slot)
    holder = await access_share_holder(qs_ctx.db, receipt_child)
    try:
        started = trio.current_time()
        blocked = await rotate_queue.prune(qs_ctx, lock_timeout=0.05)
        waited = trio.current_time() - started
        # The reader was never made to wait, and no lock request is left behind.
        assert await holder.fetchval(f"SELECT count(*) FROM {receipt_child}") >= 1
        assert await exclusive_locks_on(qs_ctx.db, [receipt_child]) == []
    finally:
        await holder.close()
    assert blocked.outcome is PruneOutcome.BLOCKED
    assert blocked.slot == slot
    assert waited < 2.0

    pruned = await rotate_queue.prune(qs_ctx)
    assert pruned.outcome is PruneOutcome.PRUNED
    assert pruned.slot == slot
    assert await slot_row_counts(qs_ctx.db, slot) == {label: 0 for label, _ in QUEUE_SLOT_CHILDREN}
    assert pruned.details["folded_completed"] == 4
    assert await pruned_rollups(qs_ctx.db, "default") == (4, 0)
    # The ring moves on onto the emptied slot once it comes round.
    await rotate_to_slot(qs_ctx, slot)
    assert (await ring_state(qs_ctx.db))[0] == slot


async def test_a_pruning_tick_records_lock_truncate_and_commit_durations(
        qs_ctx, qs_awa_client, qs_database_url, metric_reader):
    """awa.maintenance.prune.duration (upstream main, #442): one point per
    phase for a prune that truncated, none for one a lock blocked."""
    slot, _ = await ring_state(qs_ctx.db)
    ids = await insert_jobs(qs_awa_client, 3, kind="ring_done")
    await finish_jobs(qs_database_url, qs_ctx.db, qs_awa_client, "ring_done", "complete", ids)
    await rotate_queue.rotate(qs_ctx)
    holder = await access_share_holder(qs_ctx.db, child("awa", "done_entries", slot))
    try:
        blocked = await rotate_queue.run_once(qs_ctx)
    finally:
        await holder.close()
    assert blocked.prune.outcome is PruneOutcome.BLOCKED
    assert metric_points(metric_reader, "awa.maintenance.prune.duration") == []

    pruned = await rotate_queue.run_once(qs_ctx)
    assert (pruned.prune.outcome, pruned.prune.slot) == (PruneOutcome.PRUNED, slot)
    assert await slot_row_counts(qs_ctx.db, slot) == {label: 0 for label, _ in QUEUE_SLOT_CHILDREN}
    points = {attrs["awa.maintenance.phase"]: (attrs, point)
              for attrs, point in metric_points(metric_reader, "awa.maintenance.prune.duration")}
    assert sorted(points) == ["commit", "lock", "truncate"]
    for phase, (attrs, point) in points.items():
        assert attrs == {"awa.ring": "queue", "awa.maintenance.phase": phase}
        assert point.count == 1 and 0 < point.sum < 5, (phase, point)
        assert tuple(point.explicit_bounds)[:3] == (0.001, 0.005, 0.010)
    assert pruned.prune.phase_seconds == {phase: point.sum for phase, (_, point) in points.items()}


async def test_failed_rows_inside_the_floor_survive_prune_and_stay_retryable(
        qs_database_url, qs_db, qs_awa_client, meter_provider):
    ctx = await make_context(qs_db, meter_provider=meter_provider, failed_retention=DAY)
    slot, _ = await ring_state(qs_db)
    ids = await insert_jobs(qs_awa_client, 6, kind="ring_fail", max_attempts=1)
    await finish_jobs(qs_database_url, qs_db, qs_awa_client, "ring_fail", "fail", ids)
    assert set((await job_states(qs_awa_client, ids)).values()) == {"failed"}
    old, young = ids[:2], ids[2:]
    # Two failures finalised long ago: outside the one-day floor.
    await qs_db.execute(
        "UPDATE awa.done_entries SET finalized_at = now() - interval '2 days' "
        "WHERE job_id = ANY($1::bigint[])", old)
    total_before = await exact_terminal_total(qs_db, "default")
    assert total_before == 6

    await rotate_queue.rotate(ctx)
    live_slot, live_generation = await ring_state(qs_db)
    result = await rotate_queue.prune(ctx)
    assert result.outcome is PruneOutcome.PRUNED and result.slot == slot
    assert result.details["carried_failed_rows"] == 4
    assert result.details["rewritten_rows"] == 4
    assert result.details["folded_failed"] == 2

    rows = await done_rows(qs_db)
    assert [r["job_id"] for r in rows] == young
    assert {(r["ready_slot"], r["ready_generation"]) for r in rows} == {(live_slot, live_generation)}
    # Self-contained: args survive the truncate of their ready rows.
    assert all(r["args"] is not None and "n" in r["args"] for r in rows)
    states = await job_states(qs_awa_client, ids)
    assert states == {job_id: "failed" for job_id in young}
    # Counts stay exact: two folded into the rollup, four still live.
    assert await pruned_rollups(qs_db, "default") == (0, 2)
    assert await exact_terminal_total(qs_db, "default") == total_before

    retried = await in_thread(qs_awa_client.retry_failed, kind="ring_fail")
    assert sorted(job.id for job in retried.jobs) == young if hasattr(retried.jobs, "__iter__") \
        else retried.jobs == 4
    states = await job_states(qs_awa_client, young)
    assert set(states.values()) <= {"available", "scheduled", "retryable"}
    assert await done_rows(qs_db) == []


async def test_an_idle_ring_does_not_rewrite_failed_rows_every_lap(
        qs_database_url, qs_db, qs_awa_client, meter_provider):
    """Upstream copies every failed row inside the floor into the live slot
    once a lap, traffic or not; here an idle ring leaves them where they are
    (rotation waits on them), and the first job that arrives releases them."""
    ctx = await make_context(qs_db, meter_provider=meter_provider, failed_retention=DAY)
    ids = await insert_jobs(qs_awa_client, 5, kind="ring_fail", max_attempts=1)
    await finish_jobs(qs_database_url, qs_db, qs_awa_client, "ring_fail", "fail", ids)
    slot_count = await qs_db.fetchval("SELECT slot_count FROM awa.queue_ring_state")

    async def laps(n: int, **prune_options) -> tuple[int, int]:
        rewritten = rotations = 0
        for _ in range(n * slot_count):
            if (await rotate_queue.rotate(ctx)).rotated:
                rotations += 1
            result = await rotate_queue.prune(ctx, **prune_options)
            rewritten += result.details.get("rewritten_rows", 0)
        return rewritten, rotations

    # Upstream's rule, for the record: carried rows land in the live slot,
    # which is the oldest again slot_count - 1 rotations later, so all five
    # are rewritten once every slot_count - 1 rotations.
    upstream_rewritten, upstream_rotations = await laps(3, defer_idle_carry=False)
    assert upstream_rotations == 3 * slot_count
    assert upstream_rewritten == 5 * (1 + (3 * slot_count - 1) // (slot_count - 1))

    # Ours: the ring parks before the slot holding them; nothing rewritten.
    ours_rewritten, ours_rotations = await laps(3)
    assert ours_rewritten == 0
    assert ours_rotations <= slot_count
    busy = await rotate_queue.rotate(ctx)
    assert not busy.rotated and busy.blockers["queue.done_rows"] == 1
    assert set((await job_states(qs_awa_client, ids)).values()) == {"failed"}
    assert await exact_terminal_total(qs_db, "default") == 5

    # Traffic: the live slot gets a ready row, the prune carries (once), and
    # the ring moves on.
    await insert_jobs(qs_awa_client, 1, kind="ring_other")
    result = await rotate_queue.prune(ctx)
    assert result.outcome is PruneOutcome.PRUNED
    assert result.details["rewritten_rows"] == 5
    assert (await rotate_queue.rotate(ctx)).rotated
    assert set((await job_states(qs_awa_client, ids)).values()) == {"failed"}
    assert await exact_terminal_total(qs_db, "default") == 5


async def test_rows_past_the_floor_still_expire_on_an_idle_ring(
        qs_database_url, qs_db, qs_awa_client, meter_provider):
    ctx = await make_context(qs_db, meter_provider=meter_provider, failed_retention=DAY,
                             queue_rotate_interval=1.0)
    ids = await insert_jobs(qs_awa_client, 3, kind="ring_fail", max_attempts=1)
    await finish_jobs(qs_database_url, qs_db, qs_awa_client, "ring_fail", "fail", ids)
    slot_count = await qs_db.fetchval("SELECT slot_count FROM awa.queue_ring_state")
    for _ in range(2 * slot_count):  # park the idle ring on the carried rows
        await rotate_queue.rotate(ctx)
        await rotate_queue.prune(ctx)
    assert not (await rotate_queue.rotate(ctx)).rotated
    # One row left the floor more than a lap (16 x 1 s) ago.
    await qs_db.execute(
        "UPDATE awa.done_entries SET finalized_at = now() - interval '1 day 1 minute' "
        "WHERE job_id = $1", ids[0])
    result = await rotate_queue.prune(ctx)
    assert result.outcome is PruneOutcome.PRUNED
    assert result.details["folded_failed"] == 1
    assert result.details["rewritten_rows"] == 2
    assert sorted(await job_states(qs_awa_client, ids)) == ids[1:]
    assert await exact_terminal_total(qs_db, "default") == 3


async def test_terminal_counts_stay_exact_over_laps_of_real_work(
        qs_database_url, qs_db, qs_awa_client, meter_provider):
    ctx = await make_context(qs_db, meter_provider=meter_provider, failed_retention=DAY)
    completed = await insert_jobs(qs_awa_client, 6, kind="ring_done")
    await finish_jobs(qs_database_url, qs_db, qs_awa_client, "ring_done", "complete", completed)
    await rotate_queue.rotate(ctx)
    failed = await insert_jobs(qs_awa_client, 4, kind="ring_fail", max_attempts=1)
    await finish_jobs(qs_database_url, qs_db, qs_awa_client, "ring_fail", "fail", failed)
    await rotate_queue.rotate(ctx)
    stats_before = await in_thread(qs_awa_client.queue_stats)
    assert await exact_terminal_total(qs_db, "default") == 10

    outcomes = []
    slot_count = await qs_db.fetchval("SELECT slot_count FROM awa.queue_ring_state")
    for _ in range(2 * slot_count):
        await rotate_queue.rotate(ctx)
        outcomes.append((await rotate_queue.prune(ctx)).outcome)
        assert await exact_terminal_total(qs_db, "default") == 10
    assert PruneOutcome.PRUNED in outcomes
    assert await pruned_rollups(qs_db, "default") == (6, 0)
    assert sorted(r["job_id"] for r in await done_rows(qs_db, "failed")) == failed
    stats_after = await in_thread(qs_awa_client.queue_stats)
    assert [(s.queue, s.failed, s.available, s.running) for s in stats_after] == [
        (s.queue, s.failed, s.available, s.running) for s in stats_before]
    assert {s.failed for s in stats_after if s.queue == "default"} == {4}


async def test_the_tracker_backoff_gates_prune(qs_ctx, qs_awa_client, metric_reader):
    await insert_jobs(qs_awa_client, 1, kind="ring_pending")
    await rotate_queue.rotate(qs_ctx)
    async with trio.open_nursery() as nursery:
        tracker = await nursery.start(run_tracker, qs_ctx.metrics)
        ctx = dataclasses.replace(qs_ctx, tracker=tracker)
        first = await rotate_queue.run_once(ctx)
        assert first.prune.outcome is PruneOutcome.SKIPPED_ACTIVE
        assert first.prune.reason == "queue.pending_ready"
        # Backoff level 1: the next two prunes are skipped, the third runs.
        ticks = [await rotate_queue.run_once(ctx) for _ in range(3)]
        assert [t.prune_backed_off for t in ticks] == [True, True, False]
        assert ticks[2].prune.outcome is PruneOutcome.SKIPPED_ACTIVE
        nursery.cancel_scope.cancel()
    prunes = metric_points(metric_reader, "awa.maintenance.prune.attempts")
    assert [(a, p.value) for a, p in prunes] == [
        ({"awa.ring": "queue", "awa.ring.outcome": "skipped_active",
          "awa.ring.reason": "queue.pending_ready"}, 2)]


async def test_prune_reads_committed_even_when_the_database_defaults_to_repeatable_read(
        qs_database_url, qs_db, qs_awa_client, meter_provider):
    """The post-lock gates must see work that committed while the prune
    waited; a repeatable-read snapshot taken before the wait would not, and
    TRUNCATE would then drop a slot a claim still needs."""
    from awa_trio.db import open_database

    slot, generation = await ring_state(qs_db)
    ids = await insert_jobs(qs_awa_client, 2, kind="ring_done")
    await finish_jobs(qs_database_url, qs_db, qs_awa_client, "ring_done", "complete", ids)
    database = await qs_db.fetchval("SELECT current_database()")
    await qs_db.execute(f'ALTER DATABASE "{database}" SET default_transaction_isolation = '
                        "'repeatable read'")
    async with open_database(qs_database_url) as rr_db:
        # The database's default is repeatable read (our connections set read
        # committed over it, and the prune asks for it in its BEGIN besides).
        assert "default_transaction_isolation=repeatable read" in await rr_db.fetchval(
            "SELECT setconfig FROM pg_db_role_setting WHERE setrole = 0 AND setdatabase = "
            "(SELECT oid FROM pg_database WHERE datname = current_database())")
        ctx = await make_context(rr_db, meter_provider=meter_provider)
        await rotate_queue.rotate(ctx)
        receipt_child = child("awa", "receipt_completion_batches", slot)
        holder = await access_share_holder(qs_db, receipt_child)
        results = []
        async with trio.open_nursery() as nursery:
            async def prune_waiting():
                results.append(await rotate_queue.prune(ctx, lock_timeout=10.0))
            nursery.start_soon(prune_waiting)
            await wait_until(lambda: _waiting_exclusive(qs_db, receipt_child), timeout=10)
            await qs_db.execute(
                "INSERT INTO awa.leases (lease_slot, lease_generation, ready_slot, ready_generation, "
                "job_id, queue, priority, lane_seq) "
                "SELECT current_slot, generation, $1, $2, 999999, 'default', 2, 999999 "
                "FROM awa.lease_ring_state", slot, generation)
            await holder.execute("COMMIT")
        await holder.close()
    [result] = results
    assert (result.outcome, result.reason) == (PruneOutcome.SKIPPED_ACTIVE, "queue.active_leases")
    assert (await slot_row_counts(qs_db, slot))["queue.receipt_completion_batch_rows"] >= 1


async def test_a_snapshot_older_than_a_prune_misses_the_carried_rows(
        qs_database_url, qs_db, qs_awa_client, meter_provider):
    """What README warns about: TRUNCATE is not MVCC-safe. A repeatable-read
    reader whose snapshot predates the prune sees neither the truncated slot
    nor the rows carried out of it; a fresh statement sees them all."""
    ctx = await make_context(qs_db, meter_provider=meter_provider, failed_retention=DAY)
    ids = await insert_jobs(qs_awa_client, 3, kind="ring_fail", max_attempts=1)
    await finish_jobs(qs_database_url, qs_db, qs_awa_client, "ring_fail", "fail", ids)
    await rotate_queue.rotate(ctx)
    reader = await qs_db.connect_dedicated()
    try:
        await reader.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        await reader.fetchval("SELECT 1")  # snapshot taken, no table touched yet
        result = await rotate_queue.prune(ctx)
        assert result.outcome is PruneOutcome.PRUNED and result.details["carried_failed_rows"] == 3
        stale = await reader.fetchval("SELECT count(*) FROM awa.done_entries WHERE state = 'failed'")
        await reader.execute("ROLLBACK")
    finally:
        await reader.close()
    assert stale == 0
    assert await qs_db.fetchval("SELECT count(*) FROM awa.done_entries WHERE state = 'failed'") == 3


UPSTREAM_LEADER_SCRIPT = """
import asyncio, sys, awa
async def main(dsn):
    client = awa.AsyncClient(dsn)
    @client.task(dict, kind="upstream_idle_noop", queue="upstream_idle")
    async def noop(job):
        pass
    await client.start([{"name": "upstream_idle", "max_workers": 1}],
                       storage_transition_role="auto", leader_election_interval_ms=100,
                       failed_retention_hours=24.0,
                       queue_storage_queue_rotate_interval_ms=100)
    print("READY", flush=True)
    await asyncio.sleep(3600)
asyncio.run(main(sys.argv[1]))
"""


async def test_an_awa_pg_leader_takes_over_a_parked_ring(
        qs_database_url, qs_db, qs_awa_client, meter_provider):
    """The parked ring is a state upstream's own leader understands: it
    carries the rows as it always does and the ring turns again, with every
    failed job still failed and the counts unchanged."""
    import subprocess
    import sys

    ctx = await make_context(qs_db, meter_provider=meter_provider, failed_retention=DAY)
    ids = await insert_jobs(qs_awa_client, 4, kind="ring_fail", max_attempts=1)
    await finish_jobs(qs_database_url, qs_db, qs_awa_client, "ring_fail", "fail", ids)
    slot_count = await qs_db.fetchval("SELECT slot_count FROM awa.queue_ring_state")
    for _ in range(2 * slot_count):
        await rotate_queue.run_once(ctx)
    assert not (await rotate_queue.rotate(ctx)).rotated  # parked
    _, parked_generation = await ring_state(qs_db)

    leader = await trio.lowlevel.open_process(
        [sys.executable, "-c", UPSTREAM_LEADER_SCRIPT, qs_database_url], stdout=subprocess.DEVNULL)
    try:
        async def turned() -> bool:
            return (await ring_state(qs_db))[1] >= parked_generation + slot_count
        await wait_until(turned, timeout=120)
    finally:
        leader.kill()
        with trio.move_on_after(5):
            await leader.wait()
    assert set((await job_states(qs_awa_client, ids)).values()) == {"failed"}
    assert await exact_terminal_total(qs_db, "default") == 4
    assert await pruned_rollups(qs_db, "default") == (0, 0)
