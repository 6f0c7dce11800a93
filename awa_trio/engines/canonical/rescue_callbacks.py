"""rescue_expired_callbacks: give up on external callbacks that never came.

A ``waiting_external`` row past ``callback_timeout_at`` is retried with
backoff (``retryable``, ``run_at = now() + awa.backoff_duration(attempt,
max_attempts)``), or ``failed`` when that attempt was its last (run_at
kept). Callback columns are cleared and ``callback timed out`` recorded.
Nothing is running in any process, so no in-flight cancellation. Earliest
timeouts first, in batches of ``rescue_batch_size``, drained within the
tick. Shared machinery:
:mod:`.rescue`.
"""

from __future__ import annotations

from ...context import MaintenanceContext
from ...hooks import RescueReason
from ...maintenance.rescue import RescueResult
from ...sql import Statement
from .rescue import (
    BATCH_SELECTION,
    HOT_COLUMNS_SQL,
    JOB_COLUMNS_SQL,
    ONE_SELECTION,
    RescueSweep,
    candidates_sql,
    run_sweep,
)

NAME = "rescue_expired_callbacks"
METRIC_KIND = "callback_timeout"
RESCUE_ERROR = "callback timed out"
DUPLICATE_ERROR = "rescued as duplicate: callback timed out and unique claim held by a newer job"

# {selection} is either the batch (earliest first, up to :limit) or, for
# the row-by-row fallback, one id (:job_id) re-checked against the same
# predicate; :error is RESCUE_ERROR. Exhausted rows stay in jobs_hot (failed, updated in place); the
# others move to scheduled_jobs (retryable with backoff). heartbeat_at and
# deadline_at were cleared when the job started waiting and are kept as is.
_RESCUE_SQL_TEMPLATE = """
    WITH expired AS (
        SELECT id, attempt >= max_attempts AS exhausted
        FROM awa.jobs_hot
        WHERE state = 'waiting_external'
          AND callback_timeout_at IS NOT NULL
          AND callback_timeout_at < now()
          {selection}
        FOR UPDATE SKIP LOCKED
    ),
    failed AS (
        UPDATE awa.jobs_hot AS hot
        SET state = 'failed',
            finalized_at = now(),
            callback_id = NULL,
            callback_timeout_at = NULL,
            callback_filter = NULL,
            callback_on_complete = NULL,
            callback_on_fail = NULL,
            callback_transform = NULL,
            errors = hot.errors || jsonb_build_object(
                'error', :error::text,
                'attempt', hot.attempt,
                'at', now()
            )
        FROM expired
        WHERE hot.id = expired.id
          AND expired.exhausted
        RETURNING {hot_columns}
    ),
    taken AS (
        DELETE FROM awa.jobs_hot AS hot
        USING expired
        WHERE hot.id = expired.id
          AND NOT expired.exhausted
        RETURNING hot.*
    ),
    retried AS (
        INSERT INTO awa.scheduled_jobs ({columns})
        SELECT
            id, kind, queue, args, 'retryable' AS state, priority, attempt, max_attempts,
            now() + awa.backoff_duration(attempt, max_attempts) AS run_at,
            heartbeat_at, deadline_at, attempted_at, now() AS finalized_at,
            created_at,
            errors || jsonb_build_object(
                'error', :error::text,
                'attempt', attempt,
                'at', now()
            ) AS errors,
            metadata, tags, unique_key, unique_states,
            NULL AS callback_id, NULL AS callback_timeout_at, NULL AS callback_filter,
            NULL AS callback_on_complete, NULL AS callback_on_fail, NULL AS callback_transform,
            run_lease, progress
        FROM taken
        RETURNING {columns}
    )
    SELECT * FROM failed
    UNION ALL
    SELECT * FROM retried
"""
RESCUE_BATCH_SQL = Statement(
    _RESCUE_SQL_TEMPLATE,
    selection=BATCH_SELECTION(order_by="callback_timeout_at"),
    columns=JOB_COLUMNS_SQL,
    hot_columns=HOT_COLUMNS_SQL,
)
RESCUE_ONE_SQL = Statement(
    _RESCUE_SQL_TEMPLATE, selection=ONE_SELECTION, columns=JOB_COLUMNS_SQL, hot_columns=HOT_COLUMNS_SQL
)
CANDIDATES_SQL = candidates_sql(
    "state = 'waiting_external' AND callback_timeout_at IS NOT NULL AND callback_timeout_at < now()",
    "callback_timeout_at",
)

SWEEP = RescueSweep(
    name=NAME,
    metric_kind=METRIC_KIND,
    reason=RescueReason.EXPIRED_CALLBACK,
    from_state="waiting_external",
    batch_sql=RESCUE_BATCH_SQL,
    one_sql=RESCUE_ONE_SQL,
    candidates_sql=CANDIDATES_SQL,
    rescue_error=RESCUE_ERROR,
    duplicate_error=DUPLICATE_ERROR,
    cancels_in_flight=False,
)


async def run_once(ctx: MaintenanceContext) -> RescueResult:
    return await run_sweep(ctx, SWEEP)
