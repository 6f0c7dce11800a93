"""rotate_lease: move the lease ring's cursor, then truncate its oldest sealed
slot (every ``lease_rotate_interval``, 250 ms by default).

A ``leases`` row is a running attempt that has materialised (a callback, a
heartbeat-tracked lease): it lives in the slot that was current when it was
written, until the attempt finishes and deletes it. Truncating a slot is only
ever the reclaiming of those deleted rows' dead tuples, so a slot with any
row left in it is live and is not touched. Rotation onto a slot that still
holds a lease is SkippedBusy (``lease.rows``). See
:mod:`.lease_claim_rings` for the transaction shapes.
"""

from __future__ import annotations

from ...context import MaintenanceContext
from .layout import PRUNE_LOCK_TIMEOUT
from .lease_claim_rings import (
    RingTables,
    bounded_row_count,
    bounded_rows_in_next_slot,
    heap_pages_sql,
    prune_oldest,
    rotate_ring,
)
from .rings import LEASE_RING, PruneResult, RingCursor, RingTickResult, RotateResult, run_ring_tick

NAME = "rotate_lease"

#: Rows of the slot about to become current, by upstream's blocker label.
LEASE_BUSY_COLUMNS = f"""
    {bounded_rows_in_next_slot("leases", "lease_slot")} AS "lease.rows"
"""

#: Leases still in the slot: each is a running attempt.
LEASE_LIVE_SQL = f"""
    SELECT {bounded_row_count("{leases}")}
"""

#: No heap page at all: a truncate would reclaim nothing.
LEASE_CLEAN_SQL = f"""
    SELECT {heap_pages_sql(["leases"])} = 0
"""

LEASE_RING_TABLES = RingTables(
    ring=LEASE_RING,
    children=("leases",),
    busy_columns=LEASE_BUSY_COLUMNS,
    busy_labels=("lease.rows",),
    live_sql=LEASE_LIVE_SQL,
    clean_sql=LEASE_CLEAN_SQL,
    current_reason="lease.current",
    live_reason="lease.active",
)


async def rotate(ctx: MaintenanceContext) -> RotateResult:
    return await rotate_ring(ctx, LEASE_RING_TABLES)


async def prune(
    ctx: MaintenanceContext, cursor: RingCursor | None = None, *, lock_timeout: float = PRUNE_LOCK_TIMEOUT
) -> PruneResult:
    return await prune_oldest(ctx, LEASE_RING_TABLES, cursor, lock_timeout=lock_timeout)


async def run_once(ctx: MaintenanceContext) -> RingTickResult:
    return await run_ring_tick(ctx, branch=NAME, ring=LEASE_RING, rotate=rotate, prune=prune)
