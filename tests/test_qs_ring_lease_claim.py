"""Lease and claim rings on a real queue-storage database: rotation as a
compare-and-set onto empty slots only, prune of the oldest sealed slot behind
its gates and a short exclusive lock, and the tracker's backoff.

Claims and leases come from real awa-pg 0.6.1 workers (a hanging handler
keeps a fast-path claim open; a handler that registers a callback
materialises a ``leases`` row). The test holds Awa's leader lock throughout,
so those runtimes never lead and never rotate a ring themselves. A claimer
or lease writer that read the cursor before a rotation (the race the
post-lock gate exists for) cannot be timed from outside awa-pg, so the test
plays it with one INSERT in a transaction of its own.
"""

from __future__ import annotations

import dataclasses

import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.awa_pg import awa_pg_worker
from support.contexts import make_context
from support.helpers import metric_points
from support.qs_claims import (
    CLAIMED_JOBS_SQL,
    CLOSURE_BATCH_SQL,
    COMPACT_CLAIM_SQL,
    EXPLICIT_CLOSURE_SQL,
    LAGGARD_CLAIM_SQL,
    LAGGARD_LEASE_SQL,
    RESET_CLAIM_PLANE_SQL,
    ROW_CLAIM_SQL,
    SET_CLAIM_RING_SQL,
    WAITING_ON_LOCK_SQL,
    callback_worker,
    claim_closed,
    claim_slot_of,
    claim_slot_rows,
    compact_claim_of,
    insert_job,
    leader_lock_held,
    receipt_closed,
    relfilenode,
    ring_cursor,
    slot_rows,
    wait_for_exclusive_waiter,
    wait_for_lock_waiter,
    wait_until,
)

from awa_trio.db import open_database
from awa_trio.engines.queue_storage import rotate_claim, rotate_lease
from awa_trio.engines.queue_storage.lease_claim_rings import oldest_sealed_slot
from awa_trio.tracker import PruneOutcome
from awa_trio.tracker_actor import run_tracker

ROTATE_ATTEMPTS = "awa.maintenance.rotate.attempts"
ROTATE_SKIPPED_ROWS = "awa.maintenance.rotate.skipped_rows"
PRUNE_ATTEMPTS = "awa.maintenance.prune.attempts"
PRUNE_SKIPPED_ROWS = "awa.maintenance.prune.skipped_rows"
#: Long enough that a prune which tried to lock would visibly wait.
PATIENT_LOCK_TIMEOUT = 5.0


def counter(reader, name: str, **attributes) -> int:
    """Sum of a counter's points whose attributes include ``attributes``."""
    wanted = {f"awa.ring.{key}" if key != "ring" else "awa.ring": value
              for key, value in attributes.items()}
    return sum(point.value for attrs, point in metric_points(reader, name)
               if wanted.items() <= attrs.items())


def histogram_sum(reader, name: str, **attributes) -> int:
    wanted = {f"awa.ring.{key}" if key != "ring" else "awa.ring": value
              for key, value in attributes.items()}
    return sum(point.sum for attrs, point in metric_points(reader, name)
               if wanted.items() <= attrs.items())


async def open_transaction(db, sql: str, *args):
    """A dedicated connection left inside a transaction after ``sql``."""
    conn = await db.connect_dedicated(application_name="test-other-session")
    await conn.execute("BEGIN")
    await conn.execute(sql, *args)
    return conn


async def finish(conn, verb: str = "COMMIT") -> None:
    await conn.execute(verb)
    await conn.close()


async def complete_one_job(db, client, worker, kind: str, queue: str) -> int:
    """Run one job through a real worker; returns once its claim is closed."""
    job_id = await insert_job(client, kind, queue)
    await worker.wait_for_line(f"DONE {job_id}")
    await wait_until(lambda: claim_closed(db, job_id))
    return job_id


# --- the oldest sealed slot ---------------------------------------------------


@given(slot_count=st.integers(1, 16), rotations=st.integers(0, 60))
def test_oldest_sealed_slot_is_the_longest_sealed_slot_of_a_simulated_ring(slot_count, rotations):
    handed_out = [0]  # slots in the order they became current
    for _ in range(rotations):
        handed_out.append((handed_out[-1] + 1) % slot_count)
    current, generation = handed_out[-1], rotations
    # Slots holding a lap not yet overwritten, oldest first, current excluded.
    recent = handed_out[-slot_count:]
    sealed = [slot for slot in recent if slot != current]
    expected = None
    if sealed:
        oldest = sealed[0]
        expected = (oldest, generation - (len(recent) - 1))
    assert oldest_sealed_slot(current, generation, slot_count) == expected


# --- claim ring ---------------------------------------------------------------


async def test_claim_ring_rotates_through_every_slot_with_increasing_generations(
    qs_database_url, qs_db, qs_ctx, qs_awa_client, metric_reader
):
    db, ctx = qs_db, qs_ctx
    _, _, slot_count = await ring_cursor(db, "claim")
    assert slot_count > 2
    async with leader_lock_held(db), awa_pg_worker(
        qs_database_url, "ring_done:ring_q", behaviour="complete", extra_args=["--role", "auto"]
    ) as worker:
        # What the claim ring should hold: job ids by slot, emptied on prune.
        model = {slot: set() for slot in range(slot_count)}
        claim_slots = []
        seen = []
        for _ in range(slot_count + 2):
            job_id = await complete_one_job(db, qs_awa_client, worker, "ring_done", "ring_q")
            claim_slots.append(await claim_slot_of(db, job_id))
            model[claim_slots[-1]].add(job_id)
            before = await ring_cursor(db, "claim")
            tick = await rotate_claim.run_once(ctx)
            assert tick.rotate.rotated, tick
            seen.append((tick.rotate.slot, tick.rotate.generation))
            current, generation, _ = await ring_cursor(db, "claim")
            assert (current, generation) == (tick.rotate.slot, tick.rotate.generation)
            assert (current, generation) == ((before[0] + 1) % slot_count, before[1] + 1)
            oldest_slot, _ = oldest_sealed_slot(current, generation, slot_count)
            assert tick.prune.slot == oldest_slot
            if model[oldest_slot]:
                assert tick.prune.outcome is PruneOutcome.PRUNED, tick
                model[oldest_slot].clear()
                assert set((await claim_slot_rows(db, oldest_slot)).values()) == {0}
            else:
                # Slot 0, pruned on the first tick, stays the oldest until the
                # ring is full; nothing new went into it meanwhile.
                assert tick.prune.outcome is PruneOutcome.NOOP, tick
                assert tick.prune.details == {"empty": True}

    assert seen == [((index + 1) % slot_count, index + 1) for index in range(slot_count + 2)]
    # Every job's claim went into the slot that was current at its claim.
    assert claim_slots == [index % slot_count for index in range(slot_count + 2)]
    for slot, jobs in model.items():
        rows = await db.fetch("SELECT job_id FROM awa.lease_claims WHERE claim_slot = $1", slot)
        assert {row["job_id"] for row in rows} == jobs, slot
    slot_generations = dict(await db.fetch("SELECT slot, generation FROM awa.claim_ring_slots"))
    assert slot_generations == {slot: generation for slot, generation in seen[-slot_count:]}
    assert counter(metric_reader, ROTATE_ATTEMPTS, ring="claim", outcome="rotated") == slot_count + 2
    # Slot 0 on the first tick, then, once the ring was full, one slot a tick.
    assert counter(metric_reader, PRUNE_ATTEMPTS, ring="claim", outcome="pruned") == 4
    gauge = metric_points(metric_reader, "awa.ring.generation")
    assert [point.value for attrs, point in gauge if attrs == {"awa.ring": "claim"}] == [slot_count + 2]


async def test_open_claim_keeps_its_slot_and_rotation_onto_it_is_skipped_busy(
    qs_database_url, qs_db, qs_ctx, qs_awa_client, metric_reader
):
    db, ctx = qs_db, qs_ctx
    _, _, slot_count = await ring_cursor(db, "claim")
    async with leader_lock_held(db), awa_pg_worker(
        qs_database_url, "ring_hang:ring_q", behaviour="hang", extra_args=["--role", "auto"]
    ) as worker:
        job_id = await insert_job(qs_awa_client, "ring_hang", "ring_q")
        await worker.wait_for_line(f"START {job_id}")
        assert await claim_slot_of(db, job_id) == 0
        for _ in range(slot_count - 1):
            tick = await rotate_claim.run_once(ctx)
            assert tick.rotate.rotated
            assert tick.prune.outcome is PruneOutcome.SKIPPED_ACTIVE
            assert (tick.prune.slot, tick.prune.reason, tick.prune.count) == (0, "claim.open", 1)
        assert await ring_cursor(db, "claim") == (slot_count - 1, slot_count - 1, slot_count)

        tick = await rotate_claim.run_once(ctx)
        assert not tick.rotate.rotated
        assert tick.rotate.slot == 0
        assert tick.rotate.blockers == {
            "claim.rows": 1, "claim.closure_rows": 0, "claim.closure_batch_rows": 0}
        assert await ring_cursor(db, "claim") == (slot_count - 1, slot_count - 1, slot_count)
        assert await claim_slot_of(db, job_id) == 0

    assert counter(metric_reader, ROTATE_ATTEMPTS, ring="claim", outcome="skipped_busy",
                   blocker="claim.rows") == 1
    assert counter(metric_reader, ROTATE_ATTEMPTS, ring="claim", outcome="skipped_busy") == 1
    assert histogram_sum(metric_reader, ROTATE_SKIPPED_ROWS, ring="claim",
                         blocker="claim.rows") == 1
    assert counter(metric_reader, PRUNE_ATTEMPTS, ring="claim", outcome="skipped_active",
                   reason="claim.open") == slot_count
    assert histogram_sum(metric_reader, PRUNE_SKIPPED_ROWS, ring="claim",
                         reason="claim.open") == slot_count


async def test_open_claim_skips_the_prune_before_any_exclusive_lock(
    qs_database_url, qs_db, qs_ctx, qs_awa_client
):
    db, ctx = qs_db, qs_ctx
    async with leader_lock_held(db), awa_pg_worker(
        qs_database_url, "ring_hang:ring_q", behaviour="hang", extra_args=["--role", "auto"]
    ) as worker:
        job_id = await insert_job(qs_awa_client, "ring_hang", "ring_q")
        await worker.wait_for_line(f"START {job_id}")
        assert (await rotate_claim.rotate(ctx)).rotated
        # A reader of the claim plane: any exclusive lock attempt would wait on it.
        reader = await open_transaction(db, "SELECT count(*) FROM awa.lease_claims")
        try:
            started = trio.current_time()
            result = await rotate_claim.prune(ctx, lock_timeout=PATIENT_LOCK_TIMEOUT)
            elapsed = trio.current_time() - started
        finally:
            await finish(reader)
        assert result.outcome is PruneOutcome.SKIPPED_ACTIVE
        assert (result.slot, result.reason, result.count) == (0, "claim.open", 1)
        assert result.details == {"after_lock": False}
        assert elapsed < 1.0, elapsed
        assert await claim_slot_of(db, job_id) == 0


async def test_claim_written_while_the_prune_waits_for_its_lock_stops_the_truncate(
    qs_database_url, qs_db, qs_ctx, qs_awa_client
):
    db, ctx = qs_db, qs_ctx
    async with leader_lock_held(db), awa_pg_worker(
        qs_database_url, "ring_done:ring_q", behaviour="complete", extra_args=["--role", "auto"]
    ) as worker:
        done_job = await complete_one_job(db, qs_awa_client, worker, "ring_done", "ring_q")
    assert (await rotate_claim.rotate(ctx)).rotated  # slot 0 sealed, its claim closed
    waiting_job = await insert_job(qs_awa_client, "nobody_runs", "idle_q")

    # A claimer that read the cursor before the rotation: its claim lands in
    # slot 0, committed only once the prune already waits for the lock.
    laggard = await open_transaction(db, LAGGARD_CLAIM_SQL, 0, waiting_job)
    outcome = {}
    async with trio.open_nursery() as nursery:
        async def prune():
            outcome["result"] = await rotate_claim.prune(ctx, lock_timeout=PATIENT_LOCK_TIMEOUT)
        nursery.start_soon(prune)
        await wait_for_exclusive_waiter(db, "awa.lease_claims_0")
        await finish(laggard)
    result = outcome["result"]
    assert result.outcome is PruneOutcome.SKIPPED_ACTIVE
    assert (result.slot, result.reason, result.count) == (0, "claim.open", 1)
    assert result.details == {"after_lock": True}
    assert await claim_slot_of(db, waiting_job) == 0
    assert await claim_slot_of(db, done_job) == 0


async def test_reader_holding_access_share_blocks_the_claim_prune_until_it_lets_go(
    qs_database_url, qs_db, qs_ctx, qs_awa_client, metric_reader
):
    db, ctx = qs_db, qs_ctx
    async with leader_lock_held(db), awa_pg_worker(
        qs_database_url, "ring_done:ring_q", behaviour="complete", extra_args=["--role", "auto"]
    ) as worker:
        for _ in range(3):
            await complete_one_job(db, qs_awa_client, worker, "ring_done", "ring_q")
    assert (await rotate_claim.rotate(ctx)).rotated
    # As a receipt rescue sweep that went through the slot leaves its cursors.
    await db.execute(
        "UPDATE awa.claim_ring_slots SET rescue_cursor_claimed_at = now(), rescue_cursor_job_id = 7,"
        " rescue_cursor_run_lease = 1, deadline_cursor_deadline_at = now(),"
        " deadline_cursor_job_id = 7, deadline_cursor_run_lease = 1 WHERE slot = 0")
    before = await claim_slot_rows(db, 0)
    assert before["lease_claims"] == 3
    filenode = await relfilenode(db, "awa.lease_claims_0")

    reader = await open_transaction(db, "LOCK TABLE awa.lease_claims_0 IN ACCESS SHARE MODE")
    try:
        started = trio.current_time()
        blocked = await rotate_claim.run_once(ctx)
        elapsed = trio.current_time() - started
        assert blocked.prune.outcome is PruneOutcome.BLOCKED
        assert blocked.prune.slot == 0
        assert elapsed < 1.0, elapsed
        assert await claim_slot_rows(db, 0) == before
    finally:
        await finish(reader)

    assert metric_points(metric_reader, "awa.maintenance.prune.duration") == []

    pruned = await rotate_claim.run_once(ctx)
    assert pruned.prune.outcome is PruneOutcome.PRUNED
    assert pruned.prune.slot == 0
    assert set((await claim_slot_rows(db, 0)).values()) == {0}
    # awa.maintenance.prune.duration: one point per phase of the prune that truncated.
    durations = metric_points(metric_reader, "awa.maintenance.prune.duration")
    assert sorted((a["awa.ring"], a["awa.maintenance.phase"], p.count) for a, p in durations) == [
        ("claim", "commit", 1), ("claim", "lock", 1), ("claim", "truncate", 1)]
    assert all(0 < p.sum < 5 for _, p in durations)
    assert await relfilenode(db, "awa.lease_claims_0") != filenode
    assert await db.fetchval(
        "SELECT rescue_cursor_claimed_at = '-infinity' AND rescue_cursor_job_id = 0"
        " AND rescue_cursor_run_lease = 0 AND deadline_cursor_deadline_at = '-infinity'"
        " AND deadline_cursor_job_id = 0 AND deadline_cursor_run_lease = 0"
        " FROM awa.claim_ring_slots WHERE slot = 0")
    assert counter(metric_reader, PRUNE_ATTEMPTS, ring="claim", outcome="blocked", reason="none") == 1
    assert counter(metric_reader, PRUNE_ATTEMPTS, ring="claim", outcome="pruned", reason="none") == 1


async def test_compact_claims_of_a_zero_deadline_queue_keep_their_slot_until_each_is_closed(
    qs_database_url, qs_db, qs_ctx, qs_awa_client
):
    db, ctx = qs_db, qs_ctx
    async with leader_lock_held(db), callback_worker(
        qs_database_url, "ring_compact:compact_q", callback=False, deadline_ms=0
    ) as worker:
        hanging = await insert_job(qs_awa_client, "ring_compact", "compact_q", {"hang": True})
        finished = await insert_job(qs_awa_client, "ring_compact", "compact_q", {"hang": False})
        await worker.wait_for_line(f"START {hanging}")
        await worker.wait_for_line(f"DONE {finished}")
        done_claim = await compact_claim_of(db, finished)
        await wait_until(lambda: receipt_closed(db, done_claim["receipt_id"]))
    # The worker is gone; its hanging claim is compact and still open.
    open_claim = await compact_claim_of(db, hanging)
    assert (open_claim["claim_slot"], done_claim["claim_slot"]) == (0, 0)
    assert await slot_rows(db, "lease_claims", 0) == 0
    assert not await receipt_closed(db, open_claim["receipt_id"])

    assert (await rotate_claim.rotate(ctx)).rotated
    skipped = await rotate_claim.prune(ctx)
    assert (skipped.outcome, skipped.reason, skipped.count) == (
        PruneOutcome.SKIPPED_ACTIVE, "claim.open", 1)
    assert await compact_claim_of(db, hanging) is not None

    # What the receipt rescue appends for a stale compact claim.
    await db.execute(CLOSURE_BATCH_SQL, 0, open_claim["receipt_id"])
    pruned = await rotate_claim.prune(ctx)
    assert (pruned.outcome, pruned.slot) == (PruneOutcome.PRUNED, 0)
    assert set((await claim_slot_rows(db, 0)).values()) == {0}


# --- lease ring ---------------------------------------------------------------


async def lease_slot_of(db, job_id: int) -> int | None:
    return await db.fetchval("SELECT lease_slot FROM awa.leases WHERE job_id = $1", job_id)


async def has_lease(db, job_id: int) -> bool:
    return await lease_slot_of(db, job_id) is not None


async def test_live_lease_keeps_its_slot_and_rotation_onto_it_is_skipped_busy(
    qs_database_url, qs_db, qs_ctx, qs_awa_client, metric_reader
):
    db, ctx = qs_db, qs_ctx
    _, _, slot_count = await ring_cursor(db, "lease")
    async with leader_lock_held(db), callback_worker(qs_database_url, "ring_cb:ring_q") as worker:
        job_id = await insert_job(qs_awa_client, "ring_cb", "ring_q", {"hang": True})
        await worker.wait_for_line(f"START {job_id}")
        await wait_until(lambda: has_lease(db, job_id))
        assert await lease_slot_of(db, job_id) == 0

        assert (await rotate_lease.rotate(ctx)).rotated
        reader = await open_transaction(db, "SELECT count(*) FROM awa.leases")
        try:
            started = trio.current_time()
            gated = await rotate_lease.prune(ctx, lock_timeout=PATIENT_LOCK_TIMEOUT)
            elapsed = trio.current_time() - started
        finally:
            await finish(reader)
        assert gated.outcome is PruneOutcome.SKIPPED_ACTIVE
        assert (gated.slot, gated.reason, gated.count, gated.details) == (
            0, "lease.active", 1, {"after_lock": False})
        assert elapsed < 1.0, elapsed

        for _ in range(slot_count - 2):
            tick = await rotate_lease.run_once(ctx)
            assert tick.rotate.rotated
            assert (tick.prune.outcome, tick.prune.reason) == (
                PruneOutcome.SKIPPED_ACTIVE, "lease.active")
        tick = await rotate_lease.run_once(ctx)
        assert not tick.rotate.rotated
        assert (tick.rotate.slot, tick.rotate.blockers) == (0, {"lease.rows": 1})
        assert await ring_cursor(db, "lease") == (slot_count - 1, slot_count - 1, slot_count)
        assert await lease_slot_of(db, job_id) == 0

    assert counter(metric_reader, ROTATE_ATTEMPTS, ring="lease", outcome="skipped_busy",
                   blocker="lease.rows") == 1
    assert histogram_sum(metric_reader, ROTATE_SKIPPED_ROWS, ring="lease", blocker="lease.rows") == 1
    assert counter(metric_reader, ROTATE_ATTEMPTS, ring="lease", outcome="rotated") == slot_count - 2
    assert counter(metric_reader, PRUNE_ATTEMPTS, ring="lease", outcome="skipped_active",
                   reason="lease.active") == slot_count - 1


async def test_lease_prune_waits_out_late_writers_and_readers_then_truncates(
    qs_database_url, qs_db, qs_ctx, qs_awa_client, metric_reader
):
    db, ctx = qs_db, qs_ctx
    async with leader_lock_held(db), callback_worker(qs_database_url, "ring_cb:ring_q") as worker:
        finished = await insert_job(qs_awa_client, "ring_cb", "ring_q", {"hang": False})
        await worker.wait_for_line(f"DONE {finished}")
        await wait_until(lambda: claim_closed(db, finished))
    # The lease came and went: slot 0 holds only its dead tuple.
    assert await slot_rows(db, "leases", 0) == 0
    assert await db.fetchval("SELECT pg_relation_size('awa.leases_0')") > 0
    _, generation, _ = await ring_cursor(db, "lease")
    assert (await rotate_lease.rotate(ctx)).rotated

    # A lease writer that read the cursor before the rotation commits while
    # the prune waits for the lock.
    waiting_job = await insert_job(qs_awa_client, "nobody_runs", "idle_q")
    laggard = await open_transaction(db, LAGGARD_LEASE_SQL, 0, generation, waiting_job)
    outcome = {}
    async with trio.open_nursery() as nursery:
        async def prune():
            outcome["result"] = await rotate_lease.prune(ctx, lock_timeout=PATIENT_LOCK_TIMEOUT)
        nursery.start_soon(prune)
        await wait_for_exclusive_waiter(db, "awa.leases_0")
        await finish(laggard)
    late = outcome["result"]
    assert (late.outcome, late.slot, late.reason, late.count, late.details) == (
        PruneOutcome.SKIPPED_ACTIVE, 0, "lease.active", 1, {"after_lock": True})
    assert await lease_slot_of(db, waiting_job) == 0

    # That attempt ends; a reader of the lease plane still holds ACCESS SHARE.
    await db.execute("DELETE FROM awa.leases WHERE job_id = $1", waiting_job)
    filenode = await relfilenode(db, "awa.leases_0")
    reader = await open_transaction(db, "SELECT count(*) FROM awa.leases")
    try:
        blocked = await rotate_lease.prune(ctx)
        assert (blocked.outcome, blocked.slot) == (PruneOutcome.BLOCKED, 0)
    finally:
        await finish(reader)
    pruned = await rotate_lease.prune(ctx)
    assert (pruned.outcome, pruned.slot) == (PruneOutcome.PRUNED, 0)
    assert await relfilenode(db, "awa.leases_0") != filenode
    assert await db.fetchval("SELECT pg_relation_size('awa.leases_0')") == 0


# --- both rings ---------------------------------------------------------------


async def test_rotation_gives_way_at_once_when_another_rotator_holds_the_cursor(
    qs_db, qs_ctx, metric_reader
):
    db, ctx = qs_db, qs_ctx
    for ring, module in (("lease", rotate_lease), ("claim", rotate_claim)):
        current, generation, slot_count = await ring_cursor(db, ring)
        assert (current, generation) == (0, 0)
        # The other rotator has moved the cursor and not yet committed: our
        # rotator reads (0, 0) and finds slot 1 empty, but must not wait for
        # the cursor row while it holds the children's share locks. It reports
        # a lost compare-and-set and leaves the move to the other one.
        # The prune that follows does wait for the row (it holds no child
        # lock while it waits): that wait is the sign the rotation gave way.
        other = await open_transaction(
            db, f"UPDATE awa.{ring}_ring_state SET current_slot = 1, generation = 1")
        outcome = {}
        async with trio.open_nursery() as nursery:
            async def tick(module=module, outcome=outcome):
                outcome["result"] = await module.run_once(ctx)
            nursery.start_soon(tick)
            await wait_for_lock_waiter(db, f"%FROM awa.{ring}_ring_state%FOR UPDATE%")
            rotate_waits = await db.fetchval(WAITING_ON_LOCK_SQL, "%SKIP LOCKED%")
            await finish(other)
        assert not rotate_waits
        result = outcome["result"].rotate
        assert (result.rotated, result.slot, result.blockers) == (False, 1, {})
        assert await ring_cursor(db, ring) == (1, 1, slot_count)
        assert counter(metric_reader, ROTATE_ATTEMPTS, ring=ring, outcome="skipped_busy",
                       blocker="lost_cas") == 1


async def test_idle_rings_prune_nothing_and_truncate_nothing(qs_db, qs_ctx, metric_reader):
    db, ctx = qs_db, qs_ctx
    filenodes = {table: await relfilenode(db, table)
                 for table in ("awa.leases_0", "awa.lease_claims_0", "awa.lease_claim_batches_0",
                               "awa.lease_claim_closures_0", "awa.lease_claim_closure_batches_0")}
    for _ in range(3):
        for module in (rotate_lease, rotate_claim):
            tick = await module.run_once(ctx)
            assert tick.rotate.rotated
            assert (tick.prune.outcome, tick.prune.slot) == (PruneOutcome.NOOP, 0)
    assert {table: await relfilenode(db, table) for table in filenodes} == filenodes
    assert counter(metric_reader, PRUNE_ATTEMPTS, outcome="noop") == 6


async def test_tracker_backoff_gates_the_claim_prune(
    qs_database_url, qs_db, qs_ctx, qs_awa_client, metric_reader
):
    db = qs_db
    async with leader_lock_held(db), awa_pg_worker(
        qs_database_url, "ring_done:ring_q", behaviour="complete", extra_args=["--role", "auto"]
    ) as worker:
        await complete_one_job(db, qs_awa_client, worker, "ring_done", "ring_q")

    ticks = []
    async with trio.open_nursery() as nursery:
        tracker = await nursery.start(run_tracker, qs_ctx.metrics)
        ctx = dataclasses.replace(qs_ctx, tracker=tracker)
        reader = await open_transaction(db, "LOCK TABLE awa.lease_claims_0 IN ACCESS SHARE MODE")
        try:
            for _ in range(3):  # blocked, then two ticks of backoff (2 ** 1)
                ticks.append(await rotate_claim.run_once(ctx))
        finally:
            await finish(reader)
        for _ in range(2):  # runs again: pruned, then nothing left (noop)
            ticks.append(await rotate_claim.run_once(ctx))
        nursery.cancel_scope.cancel()

    assert [tick.rotate.rotated for tick in ticks] == [True] * 5
    assert [tick.prune_backed_off for tick in ticks] == [False, True, True, False, False]
    assert [tick.prune and tick.prune.outcome for tick in ticks] == [
        PruneOutcome.BLOCKED, None, None, PruneOutcome.PRUNED, PruneOutcome.NOOP]
    assert counter(metric_reader, PRUNE_ATTEMPTS, ring="claim") == 3
    assert set((await claim_slot_rows(db, 0)).values()) == {0}


# --- claim prune against a model ---------------------------------------------


async def test_a_claim_closed_twice_cannot_hide_an_open_claim(qs_db, qs_ctx):
    """Ledger totals balance (two claims, two closures) while one claim is
    open: upstream's count proof would truncate it; the per-claim proof
    does not. Rows written as awa-pg shapes them."""
    db, ctx = qs_db, qs_ctx
    closed_twice = await db.fetchrow(ROW_CLAIM_SQL, 1)
    await db.fetchrow(ROW_CLAIM_SQL, 2)  # job 2: never closed
    await db.execute(EXPLICIT_CLOSURE_SQL, 0, 1)
    await db.execute(CLOSURE_BATCH_SQL, 0, closed_twice["receipt_id"])
    assert (await rotate_claim.rotate(ctx)).rotated
    for _ in range(2):
        result = await rotate_claim.prune(ctx)
        assert (result.outcome, result.reason, result.count) == (
            PruneOutcome.SKIPPED_ACTIVE, "claim.open", 1)
    assert await db.fetchval("SELECT count(*) FROM awa.lease_claims_0") == 2


@dataclasses.dataclass
class ModelClaim:
    slot: int
    receipt_id: int
    closures: int = 0


claim_ops = st.one_of(
    st.tuples(st.just("claim"), st.booleans(), st.integers(1, 3)),
    st.tuples(st.just("close"), st.integers(0, 60), st.sampled_from(["explicit", "batch", "both"])),
    st.just(("rotate",)),
    st.just(("prune",)),
)


async def run_claim_plane_example(dsn: str, slot_count: int, ops) -> None:
    async with open_database(dsn, pool_size=2) as db:
        await db.execute(RESET_CLAIM_PLANE_SQL)
        await db.execute(SET_CLAIM_RING_SQL, slot_count)
        ctx = await make_context(db)
        current, generation = 0, 0
        claims: dict[int, ModelClaim] = {}
        next_job = 1
        for op in ops:
            if op[0] == "claim":
                _, compact, count = op
                jobs = list(range(next_job, next_job + count))
                next_job += count
                if compact:
                    row = await db.fetchrow(COMPACT_CLAIM_SQL, jobs)
                    assert row["claim_slot"] == current
                    for job_id, receipt_id in zip(jobs, row["receipt_ids"], strict=True):
                        claims[job_id] = ModelClaim(current, receipt_id)
                else:
                    for job_id in jobs:
                        row = await db.fetchrow(ROW_CLAIM_SQL, job_id)
                        assert row["claim_slot"] == current
                        claims[job_id] = ModelClaim(current, row["receipt_id"])
            elif op[0] == "close" and claims:
                _, index, how = op
                job_id = sorted(claims)[index % len(claims)]
                claim = claims[job_id]
                if how in ("explicit", "both"):
                    await db.execute(EXPLICIT_CLOSURE_SQL, claim.slot, job_id)
                if how in ("batch", "both"):
                    await db.execute(CLOSURE_BATCH_SQL, claim.slot, claim.receipt_id)
                claim.closures += 1
            elif op[0] == "rotate":
                result = await rotate_claim.rotate(ctx)
                next_slot = (current + 1) % slot_count
                busy = any(claim.slot == next_slot for claim in claims.values())
                assert result.rotated is not busy, (op, result)
                if busy:
                    assert result.blockers["claim.rows"] > 0
                else:
                    current, generation = next_slot, generation + 1
                    assert (result.slot, result.generation) == (current, generation)
            elif op[0] == "prune":
                result = await rotate_claim.prune(ctx)
                oldest = oldest_sealed_slot(current, generation, slot_count)
                in_slot = {job_id: claim for job_id, claim in claims.items()
                           if oldest and claim.slot == oldest[0]}
                open_claims = [job_id for job_id, claim in in_slot.items() if not claim.closures]
                if oldest is None:
                    assert result.outcome is PruneOutcome.NOOP, (op, result)
                elif not in_slot:
                    # Nothing live; dead rows of an earlier example may be reclaimed.
                    assert result.outcome in (PruneOutcome.NOOP, PruneOutcome.PRUNED), (op, result)
                elif open_claims:
                    assert result.outcome is PruneOutcome.SKIPPED_ACTIVE, (op, result)
                    assert result.reason == "claim.open"
                    assert 1 <= result.count <= len(open_claims)
                else:
                    assert result.outcome is PruneOutcome.PRUNED, (op, result)
                    for job_id in in_slot:
                        del claims[job_id]
            in_db = {(row["claim_slot"], row["job_id"]) for row in await db.fetch(CLAIMED_JOBS_SQL)}
            assert in_db == {(claim.slot, job_id) for job_id, claim in claims.items()}, op


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(slot_count=st.sampled_from([2, 3, 8]), ops=st.lists(claim_ops, min_size=1, max_size=30))
def test_claim_prune_never_truncates_an_open_claim_and_rotation_only_enters_empty_slots(
    qs_database_url, slot_count, ops
):
    trio.run(run_claim_plane_example, qs_database_url, slot_count, ops)
