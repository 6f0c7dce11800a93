"""rescue_expired_deadlines: take back running jobs past their hard deadline.

The claim sets ``deadline_at = now() + queue deadline``; a ``running`` row
past it becomes ``retryable`` exactly like a stale-heartbeat rescue (run_at
unchanged, ``max_attempts`` not consulted, as in Awa), with the error
``hard deadline exceeded``. Earliest deadlines first, in batches of
``rescue_batch_size``, drained within the tick. Attempts of those jobs
still running in this process are cancelled. Shared machinery: :mod:`.rescue`.
"""

from __future__ import annotations

from ...context import MaintenanceContext
from ...hooks import RescueReason
from ...maintenance.rescue import RescueResult
from .rescue import RescueSweep, run_sweep, running_to_retryable_statements

NAME = "rescue_expired_deadlines"
METRIC_KIND = "deadline"
RESCUE_ERROR = "hard deadline exceeded"
DUPLICATE_ERROR = "rescued as duplicate: deadline expired and unique claim held by a newer job"

# Column effects in rescue.running_to_retryable_statements.
#: Which rows the rescue takes, and in which order (the canonical drain's
#: variant uses them too).
PREDICATE = "state = 'running' AND deadline_at IS NOT NULL AND deadline_at < now()"
ORDER_BY = "deadline_at"
STATEMENTS = running_to_retryable_statements(predicate=PREDICATE, order_by=ORDER_BY)
RESCUE_BATCH_SQL = STATEMENTS.batch_sql
RESCUE_ONE_SQL = STATEMENTS.one_sql
CANDIDATES_SQL = STATEMENTS.candidates_sql

SWEEP = RescueSweep(
    name=NAME,
    metric_kind=METRIC_KIND,
    reason=RescueReason.DEADLINE_EXCEEDED,
    from_state="running",
    batch_sql=RESCUE_BATCH_SQL,
    one_sql=RESCUE_ONE_SQL,
    candidates_sql=CANDIDATES_SQL,
    rescue_error=RESCUE_ERROR,
    duplicate_error=DUPLICATE_ERROR,
    cancels_in_flight=True,
)


async def run_once(ctx: MaintenanceContext) -> RescueResult:
    return await run_sweep(ctx, SWEEP)
