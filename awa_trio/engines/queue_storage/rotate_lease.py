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
from ...sql import Fragment, Statement
from .layout import PRUNE_LOCK_TIMEOUT
from .lease_claim_rings import (
    BOUNDED_ROW_COUNT,
    BOUNDED_ROWS_IN_NEXT_SLOT,
    RingTables,
    heap_pages,
    prune_oldest,
    rotate_ring,
)
from .rings import LEASE_RING, PruneResult, RingCursor, RingTickResult, RotateResult, run_ring_tick

NAME = "rotate_lease"

#: Rows of the slot about to become current, by Awa's blocker label.
LEASE_BUSY_COLUMNS = Fragment("""
    {lease_rows} AS "lease.rows"
""")

#: Leases still in the slot: each is a running attempt.
LEASE_LIVE_SQL = Statement(
    """
    SELECT {live}
""",
    live=BOUNDED_ROW_COUNT(table="{leases}"),
)

#: No heap page at all: a truncate would reclaim nothing.
LEASE_CLEAN = Fragment("""
    SELECT {heap_pages} = 0
""")


def lease_clean(slot: str) -> str:
    """:data:`LEASE_CLEAN` for ``slot`` (an SQL expression)."""
    return LEASE_CLEAN(heap_pages=heap_pages(("leases",), slot))


LEASE_RING_TABLES = RingTables(
    ring=LEASE_RING,
    children=("leases",),
    busy_columns=LEASE_BUSY_COLUMNS(
        lease_rows=BOUNDED_ROWS_IN_NEXT_SLOT(parent="leases", slot_column="lease_slot")
    ),
    busy_labels=("lease.rows",),
    slot_is_empty='busy."lease.rows" = 0',
    live_sql=LEASE_LIVE_SQL,
    clean=lease_clean,
    current_reason="lease.current",
    live_reason="lease.active",
)

LEASE_CLEAN_SQL = LEASE_RING_TABLES.clean_sql
#: The rotation (ROTATE_SQL placed for the lease ring).
LEASE_ROTATE_SQL = LEASE_RING_TABLES.rotate_sql


async def rotate(ctx: MaintenanceContext) -> RotateResult:
    return await rotate_ring(ctx, LEASE_RING_TABLES)


async def prune(
    ctx: MaintenanceContext, cursor: RingCursor | None = None, *, lock_timeout: float = PRUNE_LOCK_TIMEOUT
) -> PruneResult:
    return await prune_oldest(ctx, LEASE_RING_TABLES, cursor, lock_timeout=lock_timeout)


async def run_once(ctx: MaintenanceContext) -> RingTickResult:
    return await run_ring_tick(ctx, branch=NAME, ring=LEASE_RING, rotate=rotate, prune=prune)
