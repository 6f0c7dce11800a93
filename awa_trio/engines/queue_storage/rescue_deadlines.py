"""rescue_expired_deadlines (queue storage): take back attempts past their
hard deadline.

Two populations, earliest deadline first, at most ``rescue_batch_size`` per
batch (leases first):

* ``running`` leases with ``deadline_at`` in the past;
* open row receipt claims (``lease_claims``) with no lease row whose
  ``deadline_at`` passed: on the fast claim path a running job has no
  ``leases`` row at all and its deadline lives here. A claim whose
  completion advisory lock is held by its worker is skipped.

Each becomes ``retryable`` with backoff (``awa.backoff_duration``), error
``hard deadline exceeded``; attempts still running in this process are
cancelled. Shared machinery and SQL: :mod:`.rescue`.
"""

from __future__ import annotations

from ...context import MaintenanceContext
from ...db import Connection
from ...hooks import RescueReason
from ...maintenance.rescue import RescueResult
from ...sql import Statement
from .rescue import QueueStorageRescue, run_rescue, take_receipts
from .rescue_sql import COMPLETION_LOCK_KEY, OUTCOME_DEADLINE_RECEIPT, STILL_OPEN, TAKE_LEASES_TEMPLATE

NAME = "rescue_expired_deadlines"
METRIC_KIND = "deadline"
RESCUE_ERROR = "hard deadline exceeded"
DUPLICATE_ERROR = "rescued as duplicate: deadline expired and unique claim held by a newer job"

# :limit (rows), :job_ids (NULL: any job), :error.
TAKE_EXPIRED_LEASES_SQL = Statement(
    TAKE_LEASES_TEMPLATE(
        predicate=(
            "lease.state = 'running' AND lease.deadline_at IS NOT NULL AND lease.deadline_at < clock_timestamp()"
        ),
        order_by="lease.deadline_at",
    )
)

# Receipt side, step 1 of 2 (step 2: rescue_sql.CLOSE_RECEIPTS_SQL). The same
# parameters less :error.
LOCK_EXPIRED_RECEIPTS_SQL = Statement(
    """
    WITH candidates AS MATERIALIZED (
        SELECT claims.claim_slot, claims.job_id, claims.run_lease
        FROM {schema}.lease_claims AS claims
        WHERE claims.deadline_at IS NOT NULL
          AND claims.deadline_at < clock_timestamp()
          AND claims.closed_at IS NULL
          AND (:job_ids::bigint[] IS NULL OR claims.job_id = ANY(:job_ids::bigint[]))
          AND {claims_open}
          AND NOT EXISTS (
              SELECT 1 FROM {schema}.leases AS lease
              WHERE lease.job_id = claims.job_id AND lease.run_lease = claims.run_lease
          )
        ORDER BY claims.deadline_at, claims.job_id
        LIMIT :limit
    )
    SELECT claims.claim_slot, claims.job_id, claims.run_lease
    FROM candidates
    JOIN {schema}.lease_claims AS claims
      ON claims.claim_slot = candidates.claim_slot
     AND claims.job_id = candidates.job_id
     AND claims.run_lease = candidates.run_lease
    WHERE claims.closed_at IS NULL
      AND pg_catalog.pg_try_advisory_xact_lock(
          {completion_lock})
    FOR UPDATE OF claims SKIP LOCKED
""",
    claims_open=STILL_OPEN(
        claim_slot="claims.claim_slot",
        job_id="claims.job_id",
        run_lease="claims.run_lease",
        receipt_id="claims.receipt_id",
    ),
    completion_lock=COMPLETION_LOCK_KEY(job_id="candidates.job_id", run_lease="candidates.run_lease"),
)


async def take_expired(
    conn: Connection, ctx: MaintenanceContext, limit: int, job_ids: list[int] | None
) -> list:
    taken = list(
        await conn.fetch(
            *TAKE_EXPIRED_LEASES_SQL.bind(
                ctx.schema.queue_storage_schema, limit=limit, job_ids=job_ids, error=RESCUE_ERROR
            )
        )
    )
    if len(taken) < limit:
        taken += await take_receipts(
            conn,
            ctx,
            LOCK_EXPIRED_RECEIPTS_SQL,
            {"limit": limit - len(taken), "job_ids": job_ids},
            outcome=OUTCOME_DEADLINE_RECEIPT,
            error=RESCUE_ERROR,
        )
    return taken


RESCUE = QueueStorageRescue(
    name=NAME,
    metric_kind=METRIC_KIND,
    reason=RescueReason.DEADLINE_EXCEEDED,
    take=take_expired,
    duplicate_error=DUPLICATE_ERROR,
    cancels_in_flight=True,
)


async def run_once(ctx: MaintenanceContext) -> RescueResult:
    return await run_rescue(ctx, RESCUE)
