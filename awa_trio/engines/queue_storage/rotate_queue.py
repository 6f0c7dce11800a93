"""Queue ring: rotate the cursor, then prune the oldest sealed slot.

The queue ring keeps ready, done, receipt and count-delta rows in one child
table per slot. Rotation moves the enqueue cursor to the next slot once that
slot is empty; prune empties the oldest sealed slot with TRUNCATE (no dead
tuples), after proving nothing in it is still needed, so the ring can come
round again. Awa's counterparts: ``QueueStorage::rotate`` / ``prune_oldest``
(v0.6.1).

Choices to keep (docs/differences.md):

* failed rows inside the failed-retention floor are copied into the live
  slot once a lap (every slot_count - 1 rotations), but only under traffic:
  a slot that holds nothing but such rows is left alone while the live slot
  has received no work, and the ring parks in front of it; an idle ring
  rewrites nothing. Rows past the floor by more than one lap's time still
  make the prune run. Under traffic each row is rewritten once a lap: the
  schema leaves no cheaper place for them (README);
* a slot that is already empty is a Noop without locks (truncating it again
  would take eight ACCESS EXCLUSIVE locks on hot partitions, every tick);
* rotate and prune run READ COMMITTED whatever the database default, so the
  gates after the lock wait see what committed during it.

The queue ring has no rescue cursors to reset: those live on the claim ring.

Concurrent writers, and what makes each pair safe:

* **Producers, promotion, move_queue** write only into the slot they read
  as current after reserving their lane position (the lane-order invariant
  in :mod:`.promote`); rotation checks the slot after the current one, which
  only a writer whose ring read is a whole lap old could write to.
* **A foreign leader's rotation or prune, our rollup**: the ring-state row
  serialises them. Rotation locks it ``SKIP LOCKED`` and moves the cursor by
  compare-and-set (a lost race is a no-op); prune and rollup lock it
  ``FOR UPDATE`` for their whole transaction.
* **Workers and rescues completing attempts of the slot** (done rows,
  receipt completions, count deltas): while an attempt of the slot is open
  (a lease, a claim without closure) or an entry is unclaimed, the gates
  skip the prune. The gates run again after the ACCESS EXCLUSIVE lock, READ
  COMMITTED, so a completion that committed during the wait is seen, and
  the fold into the rollups reads the children themselves (ground truth).
  A writer already inside a child holds a lock that makes the prune
  Blocked (10 ms lock timeout, retried with backoff), never waited for.
* **Claimers and readers of the slot** hold share locks: the same Blocked.
* The pending-ready gate looks at every generation in the child, since
  TRUNCATE empties them all.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from ...context import MaintenanceContext
from ...db import LOCK_NOT_AVAILABLE, Connection, Database, QueryError
from ...maintenance.lock_timeout import set_local_lock_timeout
from ...tracker import PruneOutcome
from . import queue_ring as sql
from .layout import PRUNE_LOCK_TIMEOUT, schema_literal, schema_name
from .rings import QUEUE_RING, PruneResult, RingCursor, RingTickResult, RotateResult, run_ring_tick

log = logging.getLogger(__name__)

NAME = "rotate_queue"


async def run_once(ctx: MaintenanceContext) -> RingTickResult:
    return await run_ring_tick(ctx, branch=NAME, ring=QUEUE_RING, rotate=rotate, prune=prune)


async def rotate(ctx: MaintenanceContext) -> RotateResult:
    """Advance the cursor to the next slot if every child of it is empty;
    otherwise SkippedBusy naming the children that still hold rows. One
    statement (:data:`.queue_ring.ROTATE_SQL`)."""
    schema = schema_name(ctx)
    row = await _fetch_one(ctx.db, *sql.ROTATE_SQL.bind(schema, schema_literal=schema_literal(schema)))
    current, generation, slot_count = (
        int(row["current_slot"]),
        int(row["generation"]),
        int(row["slot_count"]),
    )
    next_slot = (current + 1) % slot_count
    if row["moved"]:
        oldest_slot = row["oldest_slot"]
        cursor = RingCursor(
            next_slot,
            generation + 1,
            slot_count,
            oldest_clean=None if oldest_slot is None else bool(row["oldest_clean"]),
            oldest_slot=None if oldest_slot is None else int(oldest_slot),
        )
        return RotateResult(rotated=True, slot=next_slot, generation=generation + 1, cursor=cursor)
    blockers = {label: int(row[label]) for label, _table in sql.QUEUE_SLOT_CHILDREN}
    if any(blockers.values()):
        return RotateResult(
            rotated=False,
            slot=next_slot,
            blockers=blockers,
            cursor=RingCursor(current, generation, slot_count),
        )
    # Moved by another rotator since read, or its row held by a prune or rollup.
    return RotateResult(rotated=False, slot=next_slot)


async def _fetch_one(conn: Connection | Database, query: str, *args: object) -> Any:
    """The one row ``query`` always returns."""
    row = await conn.fetchrow(query, *args)
    if row is None:  # pragma: no cover - the queries above always return a row
        raise RuntimeError(f"{NAME}: expected one row from {query.strip()[:60]!r}")
    return row


class _Blocked(Exception):
    """A lock on the slot's children was not granted within the lock wait."""


async def prune(
    ctx: MaintenanceContext,
    cursor: RingCursor | None = None,
    *,
    lock_timeout: float = PRUNE_LOCK_TIMEOUT,
    defer_idle_carry: bool = True,
) -> PruneResult:
    """Empty the oldest sealed slot, if nothing in it is still needed.

    ``details`` carries ``rewritten_rows`` (failed rows copied into the live
    slot: the write cost of keeping them inside the retention floor) and the
    terminal counts folded into the rollups. ``defer_idle_carry=False``
    carries even on an idle ring, as Awa does (for measurements).

    With the ``cursor`` a rotation just saw, an oldest slot without a heap
    page (an idle ring's every tick) is a Noop after one statement outside
    any transaction; everything else takes the locked path.
    """
    schema = schema_name(ctx)
    if cursor is not None and cursor.oldest_clean is not None and cursor.oldest_slot is not None:
        # The rotation's statement looked already.
        if cursor.oldest_clean:
            return PruneResult(PruneOutcome.NOOP, slot=cursor.oldest_slot)
    elif cursor is not None:
        oldest = await ctx.db.fetchrow(
            *sql.OLDEST_SLOT_CLEAN_SQL.bind(
                schema, schema_literal=schema_literal(schema), current_slot=cursor.slot
            )
        )
        if oldest is None:
            return PruneResult(PruneOutcome.NOOP)
        if oldest["clean"]:
            return PruneResult(PruneOutcome.NOOP, slot=int(oldest["slot"]))
    floor = max(0.0, float(ctx.config.failed_retention))
    try:
        async with ctx.db.transaction(isolation=sql.READ_COMMITTED) as conn:
            result = await _prune_in_transaction(ctx, conn, schema, floor, lock_timeout, defer_idle_carry)
            committing = time.perf_counter()
    except _Blocked as blocked:
        return PruneResult(PruneOutcome.BLOCKED, slot=blocked.args[0])
    if result.outcome is PruneOutcome.PRUNED:
        result.phase_seconds["commit"] = time.perf_counter() - committing
    return result


async def _prune_in_transaction(
    ctx: MaintenanceContext,
    conn: Connection,
    schema: str,
    floor: float,
    lock_timeout: float,
    defer_idle_carry: bool,
) -> PruneResult:
    state = await _fetch_one(conn, *sql.LOCK_RING_STATE_SQL.bind(schema))
    current, slot_count = int(state["current_slot"]), int(state["slot_count"])
    target = await conn.fetchrow(*sql.OLDEST_SEALED_SLOT_SQL.bind(schema, current_slot=current))
    if target is None:
        return PruneResult(PruneOutcome.NOOP)
    slot, generation = int(target["slot"]), int(target["generation"])

    busy = await _fetch_one(conn, *sql.bind_slot(sql.CHILDREN_BUSY_SQL, schema, slot))
    if not any(busy.values()):
        # Already empty (pruned earlier, never used since): nothing to gain
        # from eight ACCESS EXCLUSIVE locks on hot partitions.
        return PruneResult(PruneOutcome.NOOP, slot=slot)

    # Gates before any exclusive lock, so a busy slot never queues hot claim
    # reads behind a doomed TRUNCATE; checked again once the locks are held.
    skipped = await _check_gates(conn, schema, slot, generation)
    if skipped is not None:
        return skipped

    if defer_idle_carry and floor > 0 and busy["queue.done_rows"]:
        has_traffic = await conn.fetchval(*sql.bind_slot(sql.CURRENT_SLOT_HAS_TRAFFIC_SQL, schema, current))
        if not has_traffic:
            grace = slot_count * float(ctx.config.queue_rotate_interval)
            only_retained = await conn.fetchval(
                *sql.bind_slot(sql.ONLY_RETAINED_FAILED_ROWS_SQL, schema, slot, floor=floor, grace=grace)
            )
            if only_retained:
                return PruneResult(
                    PruneOutcome.NOOP, slot=slot, details={"deferred_carry": True, "rewritten_rows": 0}
                )

    children = ", ".join(sql.slot_children(schema, slot))
    await set_local_lock_timeout(conn, lock_timeout)
    locking = time.perf_counter()
    try:
        await conn.execute(*sql.LOCK_SLOT_SQL.bind(children=children))
    except QueryError as exc:
        if exc.sqlstate == LOCK_NOT_AVAILABLE:
            raise _Blocked(slot) from exc
        raise
    lock_seconds = time.perf_counter() - locking

    # A producer or claimer that committed while we waited is visible now
    # (read committed: every statement takes a fresh snapshot).
    skipped = await _check_gates(conn, schema, slot, generation)
    if skipped is not None:
        return skipped

    carried = 0
    if floor > 0:
        live_generation = await conn.fetchval(*sql.SLOT_GENERATION_SQL.bind(schema, slot=current))
        carry = {"floor": floor, "live_slot": current, "live_generation": live_generation}
        status = await conn.execute(*sql.bind_slot(sql.CARRY_FAILED_ROWS_SQL, schema, slot, **carry))
        carried = _affected(status)
        if carried:
            await conn.execute(*sql.bind_slot(sql.CARRY_COUNT_DELTAS_SQL, schema, slot, **carry))

    folded = await _fetch_one(
        conn, *sql.bind_slot(sql.FOLD_INTO_ROLLUPS_SQL, schema, slot, floor=floor, floor_on=floor > 0)
    )
    truncating = time.perf_counter()
    await conn.execute(*sql.TRUNCATE_SLOT_SQL.bind(children=children))
    truncate_seconds = time.perf_counter() - truncating
    await conn.execute(*sql.DELETE_SLOT_LIVE_COUNTS_SQL.bind(schema, slot=slot))
    if carried:
        log.debug(
            "%s: carried %d failed rows inside the retention floor from slot %d to the live slot %d",
            NAME,
            carried,
            slot,
            current,
        )
    return PruneResult(
        PruneOutcome.PRUNED,
        slot=slot,
        details={
            "generation": generation,
            "carried_failed_rows": carried,
            "rewritten_rows": carried,
            "folded_completed": int(folded["completed"]),
            "folded_failed": int(folded["failed"]),
        },
        phase_seconds={"lock": lock_seconds, "truncate": truncate_seconds},
    )


async def _check_gates(conn: Connection, schema: str, slot: int, generation: int) -> PruneResult | None:
    gates = await _fetch_one(
        conn, *sql.bind_slot(sql.PRUNE_GATES_SQL, schema, slot, slot=slot, generation=generation)
    )
    for column, reason in (
        ("active_leases", sql.REASON_ACTIVE_LEASES),
        ("pending_ready", sql.REASON_PENDING_READY),
        ("unclosed_claim_refs", sql.REASON_UNCLOSED_CLAIM_REFS),
    ):
        if gates[column]:
            return PruneResult(PruneOutcome.SKIPPED_ACTIVE, slot=slot, reason=reason, count=1)
    return None


def _affected(status: str) -> int:
    """Row count of an ``INSERT 0 n`` command tag."""
    try:
        return int(status.rsplit(" ", 1)[-1])
    except (ValueError, IndexError):
        return 0
