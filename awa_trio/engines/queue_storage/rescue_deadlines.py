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
from .rescue import (
    OUTCOME_DEADLINE_RECEIPT,
    QueueStorageRescue,
    completion_lock_key,
    in_schema,
    run_rescue,
    still_open,
    take_leases_sql,
    take_receipts,
)

NAME = "rescue_expired_deadlines"
METRIC_KIND = "deadline"
RESCUE_ERROR = "hard deadline exceeded"
DUPLICATE_ERROR = "rescued as duplicate: deadline expired and unique claim held by a newer job"

# $1 = row limit, $2 = job ids or NULL.
TAKE_EXPIRED_LEASES_SQL = take_leases_sql(
    predicate=(
        "lease.state = 'running' AND lease.deadline_at IS NOT NULL AND lease.deadline_at < clock_timestamp()"
    ),
    order_by="lease.deadline_at",
    error=RESCUE_ERROR,
    limit="$1",
    job_filter="$2",
)

# Receipt side, step 1 of 2 (step 2: rescue.CLOSE_RECEIPTS_SQL). Same parameters.
LOCK_EXPIRED_RECEIPTS_SQL = f"""
    WITH candidates AS MATERIALIZED (
        SELECT claims.claim_slot, claims.job_id, claims.run_lease
        FROM {{schema}}.lease_claims AS claims
        WHERE claims.deadline_at IS NOT NULL
          AND claims.deadline_at < clock_timestamp()
          AND claims.closed_at IS NULL
          AND ($2::bigint[] IS NULL OR claims.job_id = ANY($2::bigint[]))
          AND {still_open("claims")}
          AND NOT EXISTS (
              SELECT 1 FROM {{schema}}.leases AS lease
              WHERE lease.job_id = claims.job_id AND lease.run_lease = claims.run_lease
          )
        ORDER BY claims.deadline_at, claims.job_id
        LIMIT $1
    )
    SELECT claims.claim_slot, claims.job_id, claims.run_lease
    FROM candidates
    JOIN {{schema}}.lease_claims AS claims
      ON claims.claim_slot = candidates.claim_slot
     AND claims.job_id = candidates.job_id
     AND claims.run_lease = candidates.run_lease
    WHERE claims.closed_at IS NULL
      AND pg_catalog.pg_try_advisory_xact_lock(
          {completion_lock_key("candidates.job_id", "candidates.run_lease")})
    FOR UPDATE OF claims SKIP LOCKED
"""


async def take_expired(
    conn: Connection, ctx: MaintenanceContext, limit: int, job_ids: list[int] | None
) -> list:
    taken = list(await conn.fetch(in_schema(ctx, TAKE_EXPIRED_LEASES_SQL), limit, job_ids))
    if len(taken) < limit:
        taken += await take_receipts(
            conn,
            ctx,
            LOCK_EXPIRED_RECEIPTS_SQL,
            (limit - len(taken), job_ids),
            outcome=OUTCOME_DEADLINE_RECEIPT,
            error=RESCUE_ERROR,
        )
    return taken


RESCUE = QueueStorageRescue(
    name=NAME,
    metric_kind=METRIC_KIND,
    reason=RescueReason.DEADLINE_EXCEEDED,
    interval_setting="deadline_rescue_interval",
    take=take_expired,
    duplicate_error=DUPLICATE_ERROR,
    cancels_in_flight=True,
)


async def run_once(ctx: MaintenanceContext) -> RescueResult:
    return await run_rescue(ctx, RESCUE)
