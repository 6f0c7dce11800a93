"""rescue_stale_heartbeats (queue storage): take back attempts whose worker
stopped heartbeating (crashed, killed, partitioned away).

Two populations, oldest heartbeat first, at most ``rescue_batch_size`` per
batch (leases first, receipt claims fill the rest):

* ``running`` leases whose last heartbeat is older than
  ``heartbeat_staleness``. The heartbeat is ``attempt_state.heartbeat_at``
  (where receipt-mode workers write it), else the lease's own, else (our
  addition: a lease that never heartbeated) its ``attempted_at``;
* open receipt claims, row (``lease_claims``) or compact
  (``lease_claim_batches``), with no lease row, whose last heartbeat
  (``attempt_state``, else the claim time) is as old. A claim whose
  completion advisory lock is held by its worker is skipped.

Each becomes ``retryable`` with backoff (``awa.backoff_duration``); attempts
of those jobs running in this process are cancelled. Shared machinery and
SQL: :mod:`.rescue`.
"""

from __future__ import annotations

from ...context import MaintenanceContext
from ...db import Connection
from ...hooks import RescueReason
from ...maintenance.rescue import RescueResult
from ...sql import Statement
from .rescue import QueueStorageRescue, run_rescue, take_receipts
from .rescue_sql import COMPLETION_LOCK_KEY, OUTCOME_STALE_RECEIPT, STILL_OPEN, TAKE_LEASES_TEMPLATE

NAME = "rescue_stale_heartbeats"
METRIC_KIND = "heartbeat"
LEASE_ERROR = "heartbeat stale: worker presumed dead"
RECEIPT_ERROR = "receipt claim stale: worker presumed dead"
DUPLICATE_ERROR = "rescued as duplicate: heartbeat stale and unique claim held by a newer job"

_LEASE_LAST_SEEN = "COALESCE(attempt.heartbeat_at, lease.heartbeat_at, lease.attempted_at)"
_CUTOFF = "clock_timestamp() - make_interval(secs => :staleness)"

# :staleness (s), :limit (rows), :job_ids (NULL: any job), :error.
TAKE_STALE_LEASES_SQL = Statement(
    TAKE_LEASES_TEMPLATE(
        predicate="lease.state = 'running' AND " + _LEASE_LAST_SEEN + " < " + _CUTOFF,
        order_by=_LEASE_LAST_SEEN,
    )
)

# Receipt side, step 1 of 2 (step 2: rescue_sql.CLOSE_RECEIPTS_SQL). The same
# parameters less :error. Candidates first (no locks), then only those are
# locked: the completion lock is tried on the candidate columns so that it
# is never evaluated for any other claim.
LOCK_STALE_RECEIPTS_SQL = Statement(
    """
    WITH row_candidates AS MATERIALIZED (
        SELECT claims.claim_slot, claims.job_id, claims.run_lease, NULL::bigint AS batch_id,
               COALESCE(attempt.heartbeat_at, claims.claimed_at) AS last_seen
        FROM {schema}.lease_claims AS claims
        LEFT JOIN {schema}.attempt_state AS attempt
          ON attempt.job_id = claims.job_id
         AND attempt.run_lease = claims.run_lease
        WHERE claims.closed_at IS NULL
          AND claims.claimed_at < {cutoff}
          AND COALESCE(attempt.heartbeat_at, claims.claimed_at) < {cutoff}
          AND (:job_ids::bigint[] IS NULL OR claims.job_id = ANY(:job_ids::bigint[]))
          AND {claims_open}
          AND NOT EXISTS (
              SELECT 1 FROM {schema}.leases AS lease
              WHERE lease.job_id = claims.job_id AND lease.run_lease = claims.run_lease
          )
        ORDER BY last_seen, claims.job_id
        LIMIT :limit
    ),
    batch_candidates AS MATERIALIZED (
        SELECT claim_batches.claim_slot, items.job_id, items.run_lease, claim_batches.batch_id,
               COALESCE(attempt.heartbeat_at, claim_batches.claimed_at) AS last_seen
        FROM {schema}.lease_claim_batches AS claim_batches
        CROSS JOIN LATERAL unnest(
            claim_batches.job_ids, claim_batches.run_leases, claim_batches.receipt_ids
        ) AS items(job_id, run_lease, receipt_id)
        LEFT JOIN {schema}.attempt_state AS attempt
          ON attempt.job_id = items.job_id
         AND attempt.run_lease = items.run_lease
        WHERE claim_batches.claimed_at < {cutoff}
          AND COALESCE(attempt.heartbeat_at, claim_batches.claimed_at) < {cutoff}
          AND (:job_ids::bigint[] IS NULL OR claim_batches.job_ids && :job_ids::bigint[])
          AND (:job_ids::bigint[] IS NULL OR items.job_id = ANY(:job_ids::bigint[]))
          AND {items_open}
          AND NOT EXISTS (
              SELECT 1 FROM {schema}.leases AS lease
              WHERE lease.job_id = items.job_id AND lease.run_lease = items.run_lease
          )
        ORDER BY last_seen, items.job_id
        LIMIT :limit
    ),
    candidates AS MATERIALIZED (
        SELECT * FROM row_candidates
        UNION ALL
        SELECT * FROM batch_candidates
        ORDER BY last_seen, job_id
        LIMIT :limit
    ),
    row_locked AS (
        SELECT claims.claim_slot, claims.job_id, claims.run_lease
        FROM candidates
        JOIN {schema}.lease_claims AS claims
          ON claims.claim_slot = candidates.claim_slot
         AND claims.job_id = candidates.job_id
         AND claims.run_lease = candidates.run_lease
        WHERE candidates.batch_id IS NULL
          AND claims.closed_at IS NULL
          AND pg_catalog.pg_try_advisory_xact_lock(
              {completion_lock})
        FOR UPDATE OF claims SKIP LOCKED
    ),
    locked_batches AS (
        -- Each compact batch row is locked once, however many of its items are due.
        SELECT claim_batches.claim_slot, claim_batches.batch_id
        FROM {schema}.lease_claim_batches AS claim_batches
        WHERE (claim_batches.claim_slot, claim_batches.batch_id) IN (
            SELECT claim_slot, batch_id FROM candidates WHERE batch_id IS NOT NULL
        )
        FOR UPDATE SKIP LOCKED
    ),
    batch_locked AS (
        SELECT candidates.claim_slot, candidates.job_id, candidates.run_lease
        FROM candidates
        JOIN locked_batches
          ON locked_batches.claim_slot = candidates.claim_slot
         AND locked_batches.batch_id = candidates.batch_id
        WHERE pg_catalog.pg_try_advisory_xact_lock(
              {completion_lock})
    )
    SELECT claim_slot, job_id, run_lease FROM row_locked
    UNION ALL
    SELECT claim_slot, job_id, run_lease FROM batch_locked
""",
    cutoff=_CUTOFF,
    claims_open=STILL_OPEN(
        claim_slot="claims.claim_slot",
        job_id="claims.job_id",
        run_lease="claims.run_lease",
        receipt_id="claims.receipt_id",
    ),
    items_open=STILL_OPEN(
        claim_slot="claim_batches.claim_slot",
        job_id="items.job_id",
        run_lease="items.run_lease",
        receipt_id="items.receipt_id",
    ),
    completion_lock=COMPLETION_LOCK_KEY(job_id="candidates.job_id", run_lease="candidates.run_lease"),
)


async def take_stale(
    conn: Connection, ctx: MaintenanceContext, limit: int, job_ids: list[int] | None
) -> list:
    staleness = float(ctx.config.heartbeat_staleness)
    taken = list(
        await conn.fetch(
            *TAKE_STALE_LEASES_SQL.bind(
                ctx.schema.queue_storage_schema,
                staleness=staleness,
                limit=limit,
                job_ids=job_ids,
                error=LEASE_ERROR,
            )
        )
    )
    if len(taken) < limit:
        taken += await take_receipts(
            conn,
            ctx,
            LOCK_STALE_RECEIPTS_SQL,
            {"staleness": staleness, "limit": limit - len(taken), "job_ids": job_ids},
            outcome=OUTCOME_STALE_RECEIPT,
            error=RECEIPT_ERROR,
        )
    return taken


RESCUE = QueueStorageRescue(
    name=NAME,
    metric_kind=METRIC_KIND,
    reason=RescueReason.STALE_HEARTBEAT,
    take=take_stale,
    duplicate_error=DUPLICATE_ERROR,
    cancels_in_flight=True,
)


async def run_once(ctx: MaintenanceContext) -> RescueResult:
    return await run_rescue(ctx, RESCUE)
