"""rescue_expired_deadlines: take back running jobs past their hard deadline.

The claim sets ``deadline_at = now() + queue deadline``; a ``running`` row
past it becomes ``retryable`` exactly like a stale-heartbeat rescue (run_at
unchanged, ``max_attempts`` not consulted, as upstream), with the error
``hard deadline exceeded``. Earliest deadlines first, at most
``RESCUE_BATCH_SIZE`` per pass. Attempts of those jobs still running in this
process are cancelled. Shared machinery: :mod:`.rescue`.
"""

from __future__ import annotations

from ..context import MaintenanceContext
from ..hooks import RescueReason
from .rescue import JOB_COLUMNS_SQL, RescueResult, RescueSweep, run_sweep

NAME = "rescue_expired_deadlines"
METRIC_KIND = "deadline"
RESCUE_ERROR = "hard deadline exceeded"
DUPLICATE_ERROR = "rescued as duplicate: deadline expired and unique claim held by a newer job"

# {selection} is either the batch (earliest first, $1 = row limit) or, for
# the row-by-row fallback, one id ($1) re-checked against the same
# predicate. Column effects as in rescue_stale_heartbeats.
_RESCUE_SQL_TEMPLATE = """
    WITH overdue AS (
        SELECT id
        FROM awa.jobs_hot
        WHERE state = 'running'
          AND deadline_at IS NOT NULL
          AND deadline_at < now()
          {selection}
        FOR UPDATE SKIP LOCKED
    ),
    taken AS (
        DELETE FROM awa.jobs_hot AS hot
        USING overdue
        WHERE hot.id = overdue.id
        RETURNING hot.*
    )
    INSERT INTO awa.scheduled_jobs ({columns})
    SELECT
        id, kind, queue, args, 'retryable', priority, attempt, max_attempts,
        run_at, NULL, NULL, attempted_at, now(),
        created_at,
        errors || jsonb_build_object(
            'error', 'hard deadline exceeded',
            'attempt', attempt,
            'at', now()
        ),
        metadata, tags, unique_key, unique_states,
        NULL, NULL, NULL,
        NULL, NULL, NULL,
        run_lease, progress
    FROM taken
    RETURNING {columns}
"""
RESCUE_BATCH_SQL = _RESCUE_SQL_TEMPLATE.format(
    selection="ORDER BY deadline_at, id LIMIT $1", columns=JOB_COLUMNS_SQL)
RESCUE_ONE_SQL = _RESCUE_SQL_TEMPLATE.format(selection="AND id = $1", columns=JOB_COLUMNS_SQL)

CANDIDATES_SQL = """
    SELECT id
    FROM awa.jobs_hot
    WHERE state = 'running'
      AND deadline_at IS NOT NULL
      AND deadline_at < now()
    ORDER BY deadline_at, id
    LIMIT $1
"""

SWEEP = RescueSweep(
    name=NAME,
    metric_kind=METRIC_KIND,
    reason=RescueReason.DEADLINE_EXCEEDED,
    from_state="running",
    batch_sql=RESCUE_BATCH_SQL,
    one_sql=RESCUE_ONE_SQL,
    candidates_sql=CANDIDATES_SQL,
    duplicate_error=DUPLICATE_ERROR,
    cancels_in_flight=True,
)


async def run_once(ctx: MaintenanceContext) -> RescueResult:
    return await run_sweep(ctx, SWEEP)
