"""rescue_stale_heartbeats: take back running jobs whose worker stopped
heartbeating (crashed, killed, partitioned away).

A ``running`` row whose ``heartbeat_at`` is older than
``heartbeat_staleness`` becomes ``retryable`` with its ``run_at`` unchanged,
so the next promotion makes it available again at once; ``max_attempts`` is
not consulted (as in Awa). Oldest heartbeats first, in batches of
``rescue_batch_size``, drained within the tick. Attempts of those jobs
still running in this process are cancelled. Shared machinery: :mod:`.rescue`.
"""

from __future__ import annotations

from ...context import MaintenanceContext
from ...hooks import RescueReason
from ...maintenance.rescue import RescueResult
from .rescue import RescueSweep, run_sweep, running_to_retryable_statements

NAME = "rescue_stale_heartbeats"
METRIC_KIND = "heartbeat"
RESCUE_ERROR = "heartbeat stale: worker presumed dead"
DUPLICATE_ERROR = "rescued as duplicate: heartbeat stale and unique claim held by a newer job"

# :staleness in seconds; column effects in rescue.running_to_retryable_statements.
#: Which rows the rescue takes, and in which order (the canonical drain's
#: variant uses them too).
PREDICATE = "state = 'running' AND heartbeat_at < now() - make_interval(secs => :staleness)"
ORDER_BY = "heartbeat_at"
STATEMENTS = running_to_retryable_statements(predicate=PREDICATE, order_by=ORDER_BY)
RESCUE_BATCH_SQL = STATEMENTS.batch_sql
RESCUE_ONE_SQL = STATEMENTS.one_sql
CANDIDATES_SQL = STATEMENTS.candidates_sql

SWEEP = RescueSweep(
    name=NAME,
    metric_kind=METRIC_KIND,
    reason=RescueReason.STALE_HEARTBEAT,
    from_state="running",
    batch_sql=RESCUE_BATCH_SQL,
    one_sql=RESCUE_ONE_SQL,
    candidates_sql=CANDIDATES_SQL,
    rescue_error=RESCUE_ERROR,
    duplicate_error=DUPLICATE_ERROR,
    cancels_in_flight=True,
)


async def run_once(ctx: MaintenanceContext) -> RescueResult:
    return await run_sweep(ctx, SWEEP, staleness=float(ctx.config.heartbeat_staleness))
