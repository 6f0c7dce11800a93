"""rescue_expired_callbacks (queue storage): give up on external callbacks
that never came.

A job waiting for a callback is always a materialised ``leases`` row in
``waiting_external``. Past ``callback_timeout_at`` (earliest first, at most
``rescue_batch_size`` per batch) it is retried with backoff
(``retryable``, ``run_at = now() + awa.backoff_duration(attempt,
max_attempts)``), or, when that attempt was its last, it fails for good: a
``failed`` done row, or straight into ``dlq_entries`` (reason
``callback_timeout``, metric ``awa.job.dlq_moved``) when
``dlq_policy.enabled_for(queue)``. That move is one statement, not a failed
row moved by a second transaction, so no reader ever sees the job
failed-but-not-yet-dead-lettered. awa-pg cannot switch
the DLQ on from Python, so awa_trio's ``--dlq-enabled-default`` /
``--dlq-queue`` are how a Python fleet gets these moves.

Nothing is running in any process, so no in-flight cancellation. Shared
machinery and SQL: :mod:`.rescue`.
"""

from __future__ import annotations

from ...context import MaintenanceContext
from ...db import Connection
from ...hooks import RescueReason
from ...maintenance.rescue import RescueResult
from ...sql import Statement
from .rescue import QueueStorageRescue, run_rescue
from .rescue_sql import TAKE_LEASES_TEMPLATE

NAME = "rescue_expired_callbacks"
METRIC_KIND = "callback_timeout"
RESCUE_ERROR = "callback timed out"
DUPLICATE_ERROR = "rescued as duplicate: callback timed out and unique claim held by a newer job"

# :limit (rows), :job_ids (NULL: any job), :error.
TAKE_EXPIRED_CALLBACKS_SQL = Statement(
    TAKE_LEASES_TEMPLATE(
        predicate=(
            "lease.state = 'waiting_external' AND lease.callback_timeout_at IS NOT NULL "
            "AND lease.callback_timeout_at < clock_timestamp()"
        ),
        order_by="lease.callback_timeout_at",
    )
)


async def take_expired_callbacks(
    conn: Connection, ctx: MaintenanceContext, limit: int, job_ids: list[int] | None
) -> list:
    return list(
        await conn.fetch(
            *TAKE_EXPIRED_CALLBACKS_SQL.bind(
                ctx.schema.queue_storage_schema, limit=limit, job_ids=job_ids, error=RESCUE_ERROR
            )
        )
    )


RESCUE = QueueStorageRescue(
    name=NAME,
    metric_kind=METRIC_KIND,
    reason=RescueReason.EXPIRED_CALLBACK,
    take=take_expired_callbacks,
    duplicate_error=DUPLICATE_ERROR,
    cancels_in_flight=False,
    exhausts_to_failed=True,
)


async def run_once(ctx: MaintenanceContext) -> RescueResult:
    return await run_rescue(ctx, RESCUE)
