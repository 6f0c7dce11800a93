"""terminal_count_rollup on queue storage: terminal deltas written by a real
awa-pg worker failing jobs are folded into the live counts, the exact counts
never change, and the fold stands down under a pinned snapshot or a held lock."""

from __future__ import annotations

from contextlib import asynccontextmanager

import trio
from support.awa_pg import awa_pg_worker
from support.qs_jobs import rotate_queue_ring, terminal_count

from awa_trio.config import MaintenanceConfig
from awa_trio.engines.queue_storage import terminal_count_rollup as rollup
from awa_trio.engines.queue_storage.registry import queue_storage_branches
from awa_trio.engines.queue_storage.terminal_count_rollup import SlotOutcome
from awa_trio.leadership import LOCK_KEY

FAILED_JOBS = 40


@asynccontextmanager
async def holding_leader_lock(db):
    """The test leads: awa-pg runtimes stay followers (no rotation, no rollup of theirs)."""
    async with db.acquire() as conn:
        assert await conn.fetchval("SELECT pg_try_advisory_lock($1)", LOCK_KEY)
        try:
            yield
        finally:
            await conn.execute("SELECT pg_advisory_unlock($1)", LOCK_KEY)


async def failed_stat(client, queue: str) -> int:
    stats = await trio.to_thread.run_sync(client.queue_stats)
    return next(stat.failed for stat in stats if stat.queue == queue)


async def fail_jobs_into_deltas(db, dsn, client, count: int = FAILED_JOBS) -> int:
    """``count`` jobs (max_attempts 1) failed by a real awa-pg worker: each
    leaves a failed done row and a +1 terminal delta in the current slot.
    Returns that slot."""
    slot = await db.fetchval("SELECT current_slot FROM awa.queue_ring_state")
    await trio.to_thread.run_sync(lambda: client.insert_many_copy(
        [{"n": i} for i in range(count)], kind="doomed", queue="failing", max_attempts=1))
    with trio.fail_after(60):
        async with awa_pg_worker(dsn, "doomed:failing", behaviour="fail",
                                 extra_args=["--role", "auto", "--mute-maintenance"]):
            while await db.fetchval("SELECT count(*) FROM awa.done_entries "
                                    "WHERE queue = 'failing' AND state = 'failed'") < count:
                await trio.sleep(0.2)
            # Every claim closed before the worker goes.
            await trio.sleep(0.5)
    return slot


async def delta_rows(db, slot: int) -> int:
    return await db.fetchval(f"SELECT count(*) FROM awa.queue_terminal_count_deltas_{int(slot)}")


async def test_rollup_folds_a_sealed_slot_and_the_exact_counts_do_not_move(
    qs_ctx, qs_db, qs_database_url, qs_awa_client
):
    async with holding_leader_lock(qs_db):
        slot = await fail_jobs_into_deltas(qs_db, qs_database_url, qs_awa_client)
        deltas_before = await delta_rows(qs_db, slot)
        keys = await qs_db.fetchval(
            "SELECT count(DISTINCT (priority, enqueue_shard, counter_bucket)) "
            "FROM awa.queue_terminal_count_deltas WHERE queue = 'failing'")
        assert deltas_before == FAILED_JOBS
        assert await terminal_count(qs_db, "failing") == FAILED_JOBS
        assert await failed_stat(qs_awa_client, "failing") == FAILED_JOBS

        # The slot still takes terminal rows while it is current: left alone.
        result = await rollup.run_once(qs_ctx)
        assert (result.rolled_slots, result.slots) == (0, [])
        assert await delta_rows(qs_db, slot) == FAILED_JOBS

        await rotate_queue_ring(qs_db)
        result = await rollup.run_once(qs_ctx)

        assert result.slots == [(slot, 0, SlotOutcome.ROLLED, None)]
        assert (result.rolled_slots, result.delta_rows, result.grouped_keys) == (
            1, FAILED_JOBS, keys)
        assert (result.skipped_active_slots, result.blocked_slots,
                result.skipped_mvcc_pinned) == (0, 0, False)
        assert await delta_rows(qs_db, slot) == 0
        assert await qs_db.fetchval(
            "SELECT sum(live_terminal_count) FROM awa.queue_terminal_live_counts "
            "WHERE queue = 'failing' AND ready_slot = $1", slot) == FAILED_JOBS
        assert await terminal_count(qs_db, "failing") == FAILED_JOBS
        assert await failed_stat(qs_awa_client, "failing") == FAILED_JOBS

        # Nothing pending: the next tick does nothing.
        result = await rollup.run_once(qs_ctx)
        assert (result.rolled_slots, result.slots) == (0, [])


async def test_rollup_refuses_under_a_pinned_snapshot_and_succeeds_once_it_is_released(
    qs_ctx, qs_db, qs_database_url, qs_awa_client
):
    async with holding_leader_lock(qs_db):
        slot = await fail_jobs_into_deltas(qs_db, qs_database_url, qs_awa_client)
        await rotate_queue_ring(qs_db)

        async with qs_db.acquire() as reader:
            await reader.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            # The snapshot is taken here and held until COMMIT.
            seen = await reader.fetchval(
                "SELECT sum(terminal_delta) FROM awa.queue_terminal_count_deltas "
                "WHERE queue = 'failing'")
            assert seen == FAILED_JOBS

            result = await rollup.run_once(qs_ctx)

            assert result.skipped_mvcc_pinned
            assert result.rolled_slots == 0
            assert result.slots == [(slot, 0, SlotOutcome.SKIPPED_MVCC_PINNED, None)]
            assert await delta_rows(qs_db, slot) == FAILED_JOBS
            # The pinned reader's view stays whole (that is what the refusal protects).
            assert await reader.fetchval(
                "SELECT count(*) FROM awa.queue_terminal_count_deltas "
                "WHERE queue = 'failing'") == FAILED_JOBS
            await reader.execute("COMMIT")

        result = await rollup.run_once(qs_ctx)
        assert (result.rolled_slots, result.delta_rows, result.skipped_mvcc_pinned) == (
            1, FAILED_JOBS, False)
        assert await delta_rows(qs_db, slot) == 0
        assert await terminal_count(qs_db, "failing") == FAILED_JOBS


async def test_a_lock_held_on_the_delta_table_makes_the_slot_blocked_until_released(
    qs_ctx, qs_db, qs_database_url, qs_awa_client
):
    async with holding_leader_lock(qs_db):
        slot = await fail_jobs_into_deltas(qs_db, qs_database_url, qs_awa_client, count=5)
        await rotate_queue_ring(qs_db)

        async with qs_db.acquire() as holder:
            # READ COMMITTED and idle: holds the lock without pinning a snapshot.
            await holder.execute("BEGIN")
            await holder.execute(
                f"LOCK TABLE awa.queue_terminal_count_deltas_{int(slot)} IN ACCESS SHARE MODE")
            result = await rollup.run_once(qs_ctx)
            assert result.blocked_slots == 1 and result.rolled_slots == 0
            assert result.slots == [(slot, 0, SlotOutcome.BLOCKED, "lock_timeout")]
            assert await delta_rows(qs_db, slot) == 5
            await holder.execute("COMMIT")

        result = await rollup.run_once(qs_ctx)
        assert (result.rolled_slots, result.delta_rows) == (1, 5)
        assert await terminal_count(qs_db, "failing") == 5


async def test_the_branch_is_tracked_but_never_skipped_by_cooldown():
    config = MaintenanceConfig(terminal_count_rollup_interval="30s")
    spec = next(s for s in queue_storage_branches(config) if s.name == rollup.NAME)
    assert spec.run_once is rollup.run_once
    assert spec.cooldown is False and spec.interval == 30.0


async def test_at_most_four_slots_are_folded_per_tick_oldest_generation_first(
    qs_ctx, qs_db, qs_database_url, qs_awa_client
):
    async with holding_leader_lock(qs_db):
        slots = []
        with trio.fail_after(90):
            async with awa_pg_worker(qs_database_url, "doomed:failing", behaviour="fail",
                                     extra_args=["--role", "auto", "--mute-maintenance"]):
                for lap in range(5):
                    slots.append(await qs_db.fetchval(
                        "SELECT current_slot FROM awa.queue_ring_state"))
                    await trio.to_thread.run_sync(lambda lap=lap: qs_awa_client.insert_many_copy(
                        [{"lap": lap, "n": i} for i in range(3)], kind="doomed",
                        queue="failing", max_attempts=1))
                    while await qs_db.fetchval(
                            "SELECT count(*) FROM awa.done_entries WHERE queue = 'failing'"
                    ) < 3 * (lap + 1):
                        await trio.sleep(0.1)
                    await trio.sleep(0.3)
                    await rotate_queue_ring(qs_db)

        first = await rollup.run_once(qs_ctx)
        assert [entry[0] for entry in first.slots] == slots[:4]
        assert (first.rolled_slots, first.delta_rows) == (4, 12)
        second = await rollup.run_once(qs_ctx)
        assert [entry[0] for entry in second.slots] == slots[4:]
        assert (second.rolled_slots, second.delta_rows) == (1, 3)
        assert await terminal_count(qs_db, "failing") == 15
        assert await failed_stat(qs_awa_client, "failing") == 15
