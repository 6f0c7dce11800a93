"""rescue_stale_heartbeats: take back running jobs whose worker stopped
heartbeating (crashed, killed, partitioned away).

A ``running`` row whose ``heartbeat_at`` is older than
``heartbeat_staleness`` becomes ``retryable`` with its ``run_at`` unchanged,
so the next promotion makes it available again at once; ``max_attempts`` is
not consulted (as upstream). Oldest heartbeats first, at most
``RESCUE_BATCH_SIZE`` per pass. Attempts of those jobs still running in this
process are cancelled. Shared machinery: :mod:`.rescue`.
"""

from __future__ import annotations

from ..context import MaintenanceContext
from ..hooks import RescueReason
from .rescue import JOB_COLUMNS_SQL, RescueResult, RescueSweep, run_sweep

NAME = "rescue_stale_heartbeats"
METRIC_KIND = "heartbeat"
RESCUE_ERROR = "heartbeat stale: worker presumed dead"
DUPLICATE_ERROR = "rescued as duplicate: heartbeat stale and unique claim held by a newer job"

# $1 = staleness in seconds. {selection} is either the batch (oldest first,
# $2 = row limit) or, for the row-by-row fallback, one id ($2) re-checked
# against the same predicate. Locked candidates leave jobs_hot and enter
# scheduled_jobs as retryable: finalized, heartbeat, deadline and every
# callback column cleared, one error entry appended; attempt, run_at,
# run_lease and progress travel unchanged.
_RESCUE_SQL_TEMPLATE = """
    WITH stale AS (
        SELECT id
        FROM awa.jobs_hot
        WHERE state = 'running'
          AND heartbeat_at < now() - make_interval(secs => $1)
          {selection}
        FOR UPDATE SKIP LOCKED
    ),
    taken AS (
        DELETE FROM awa.jobs_hot AS hot
        USING stale
        WHERE hot.id = stale.id
        RETURNING hot.*
    )
    INSERT INTO awa.scheduled_jobs ({columns})
    SELECT
        id, kind, queue, args, 'retryable', priority, attempt, max_attempts,
        run_at, NULL, NULL, attempted_at, now(),
        created_at,
        errors || jsonb_build_object(
            'error', 'heartbeat stale: worker presumed dead',
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
    selection="ORDER BY heartbeat_at, id LIMIT $2", columns=JOB_COLUMNS_SQL)
RESCUE_ONE_SQL = _RESCUE_SQL_TEMPLATE.format(selection="AND id = $2", columns=JOB_COLUMNS_SQL)

CANDIDATES_SQL = """
    SELECT id
    FROM awa.jobs_hot
    WHERE state = 'running'
      AND heartbeat_at < now() - make_interval(secs => $1)
    ORDER BY heartbeat_at, id
    LIMIT $2
"""

SWEEP = RescueSweep(
    name=NAME,
    metric_kind=METRIC_KIND,
    reason=RescueReason.STALE_HEARTBEAT,
    from_state="running",
    batch_sql=RESCUE_BATCH_SQL,
    one_sql=RESCUE_ONE_SQL,
    candidates_sql=CANDIDATES_SQL,
    duplicate_error=DUPLICATE_ERROR,
    cancels_in_flight=True,
)


async def run_once(ctx: MaintenanceContext) -> RescueResult:
    return await run_sweep(ctx, SWEEP, float(ctx.config.heartbeat_staleness))
