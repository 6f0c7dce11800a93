"""rotate_claim: move the claim ring's cursor, then truncate its oldest sealed
slot once every claim in it is closed (every ``claim_rotate_interval``).

On the fast claim path a running job has no ``leases`` row: its claim (a
row-local ``lease_claims`` row, with ``deadline_at``, or one item of a
compact ``lease_claim_batches`` row) is all that says the attempt is running.
A claim is closed once the closure ledgers of its slot hold evidence for it:
an explicit ``lease_claim_closures`` row for its (job_id, run_lease), or a
``lease_claim_closure_batches`` row whose receipt ranges contain its receipt.
A slot may be truncated only when every one of its claims is closed; the
claim otherwise waits for completion or for the receipt rescues.

Equal totals (claims = closures) do not prove it: a claim closed twice can
hide an open one. So the totals only short-cut the obvious case (more claims
than closures: that many are open at least); when they balance, each claim
is looked up in the ledgers.
See :mod:`.lease_claim_rings` for the transaction shapes.
"""

from __future__ import annotations

from ...context import MaintenanceContext
from ...sql import Fragment, Statement
from .layout import PRUNE_LOCK_TIMEOUT
from .lease_claim_rings import (
    BOUNDED_ROWS_IN_NEXT_SLOT,
    RingTables,
    heap_pages,
    prune_oldest,
    rotate_ring,
)
from .rings import CLAIM_RING, PruneResult, RingCursor, RingTickResult, RotateResult, run_ring_tick

NAME = "rotate_claim"

CLAIM_CHILDREN = (
    "lease_claims",
    "lease_claim_batches",
    "lease_claim_closures",
    "lease_claim_closure_batches",
)

#: Rows of the slot about to become current, by Awa's blocker label
#: (row-local and compact claims both count as ``claim.rows``).
CLAIM_BUSY_COLUMNS = Fragment("""
        {claims}
          + {claim_batches} AS "claim.rows",
        {closures} AS "claim.closure_rows",
        {closure_batches}
            AS "claim.closure_batch_rows"
""")

#: Open claims of the slot: at least claims - closures when the ledgers are
#: short, else the exact number of claims without closure evidence.
CLAIM_OPEN_SQL = Statement("""
    WITH totals AS (
        SELECT
            (SELECT count(*) FROM {lease_claims})
              + (SELECT COALESCE(sum(claimed_count), 0) FROM {lease_claim_batches}) AS claimed,
            (SELECT count(*) FROM {lease_claim_closures})
              + (SELECT COALESCE(sum(closed_count), 0) FROM {lease_claim_closure_batches}) AS closed
    ),
    claims AS (
        SELECT job_id, run_lease, receipt_id
        FROM {lease_claims}
        UNION ALL
        SELECT item.job_id, item.run_lease, item.receipt_id
        FROM {lease_claim_batches} AS batch,
             unnest(batch.job_ids, batch.run_leases, batch.receipt_ids)
                 AS item(job_id, run_lease, receipt_id)
    ),
    -- Receipts a compact closure names in its array and in its ranges both.
    -- One hash of them beats a GiST probe per claim (10,000 claims: about
    -- 30 ms against 130 ms, bench/bench_claim_prune.py).
    closed_receipts AS (
        SELECT receipt.id
        FROM {lease_claim_closure_batches} AS closure_batch,
             unnest(closure_batch.receipt_ids) AS receipt(id)
        WHERE closure_batch.receipt_ranges @> receipt.id
    ),
    unclosed AS (
        SELECT count(*) AS open_claims
        FROM claims
        WHERE (SELECT claimed <= closed FROM totals)
          AND NOT EXISTS (
              SELECT 1 FROM {lease_claim_closures} AS closure
              WHERE closure.claim_slot = {slot}
                AND closure.job_id = claims.job_id
                AND closure.run_lease = claims.run_lease
          )
          AND NOT EXISTS (
              SELECT 1 FROM closed_receipts WHERE closed_receipts.id = claims.receipt_id
          )
    )
    SELECT CASE WHEN claimed > closed THEN claimed - closed
                ELSE (SELECT open_claims FROM unclosed) END
    FROM totals
""")

#: No heap page in any child and rescue cursors already at their start: a
#: truncate would reclaim nothing.
CLAIM_CLEAN = Fragment("""
    SELECT {heap_pages} = 0
       AND EXISTS (
           SELECT 1 FROM {schema}.claim_ring_slots
           WHERE slot = {slot}
             AND rescue_cursor_claimed_at = '-infinity'
             AND rescue_cursor_job_id = 0
             AND rescue_cursor_run_lease = 0
             AND deadline_cursor_deadline_at = '-infinity'
             AND deadline_cursor_job_id = 0
             AND deadline_cursor_run_lease = 0
       )
""")


def claim_clean(slot: str) -> str:
    """:data:`CLAIM_CLEAN` for ``slot`` (an SQL expression)."""
    return CLAIM_CLEAN(heap_pages=heap_pages(CLAIM_CHILDREN, slot), slot=slot)


#: The slot's rescue sweeps start again from the beginning of its next lap.
RESET_RESCUE_CURSORS_SQL = Statement("""
    UPDATE {schema}.claim_ring_slots
    SET rescue_cursor_claimed_at = '-infinity',
        rescue_cursor_job_id = 0,
        rescue_cursor_run_lease = 0,
        deadline_cursor_deadline_at = '-infinity',
        deadline_cursor_job_id = 0,
        deadline_cursor_run_lease = 0
    WHERE slot = {slot}
""")

CLAIM_RING_TABLES = RingTables(
    ring=CLAIM_RING,
    children=CLAIM_CHILDREN,
    busy_columns=CLAIM_BUSY_COLUMNS(
        claims=BOUNDED_ROWS_IN_NEXT_SLOT(parent="lease_claims", slot_column="claim_slot"),
        claim_batches=BOUNDED_ROWS_IN_NEXT_SLOT(parent="lease_claim_batches", slot_column="claim_slot"),
        closures=BOUNDED_ROWS_IN_NEXT_SLOT(parent="lease_claim_closures", slot_column="claim_slot"),
        closure_batches=BOUNDED_ROWS_IN_NEXT_SLOT(
            parent="lease_claim_closure_batches", slot_column="claim_slot"
        ),
    ),
    busy_labels=("claim.rows", "claim.closure_rows", "claim.closure_batch_rows"),
    slot_is_empty='busy."claim.rows" = 0 AND busy."claim.closure_rows" = 0 AND busy."claim.closure_batch_rows" = 0',
    live_sql=CLAIM_OPEN_SQL,
    clean=claim_clean,
    current_reason="claim.current",
    live_reason="claim.open",
    after_truncate_sql=RESET_RESCUE_CURSORS_SQL,
)

CLAIM_CLEAN_SQL = CLAIM_RING_TABLES.clean_sql
#: The rotation (ROTATE_SQL placed for the claim ring).
CLAIM_ROTATE_SQL = CLAIM_RING_TABLES.rotate_sql


async def rotate(ctx: MaintenanceContext) -> RotateResult:
    return await rotate_ring(ctx, CLAIM_RING_TABLES)


async def prune(
    ctx: MaintenanceContext, cursor: RingCursor | None = None, *, lock_timeout: float = PRUNE_LOCK_TIMEOUT
) -> PruneResult:
    return await prune_oldest(ctx, CLAIM_RING_TABLES, cursor, lock_timeout=lock_timeout)


async def run_once(ctx: MaintenanceContext) -> RingTickResult:
    return await run_ring_tick(ctx, branch=NAME, ring=CLAIM_RING, rotate=rotate, prune=prune)
