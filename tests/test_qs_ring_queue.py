"""The queue ring (rotate_queue) on a real queue-storage database: rows made
by awa-pg 0.6.1 (inserts, real ``--role auto`` workers completing, failing
and holding jobs), rotate and prune called directly or through the tick."""

from __future__ import annotations

import datetime

import pytest
import trio

from awa_trio.queue_storage import rotate_queue
from awa_trio.queue_storage.queue_ring import QUEUE_SLOT_CHILDREN, child
from awa_trio.tracker import PruneOutcome
from awa_trio.tracker_actor import run_tracker
from conftest import in_thread
from support.awa_pg import awa_pg_worker
from support.contexts import make_context
from support.helpers import metric_points
from support.qs_rings import (
    done_rows,
    insert_jobs,
    job_states,
    leader_lock_held,
    ring_state,
    run_worker_until,
    slot_generations,
    slot_row_counts,
    terminal_states,
    wait_until,
)

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
