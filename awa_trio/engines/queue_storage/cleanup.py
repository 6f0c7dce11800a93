"""cleanup (queue storage): purge dead-lettered jobs past retention, then the
steps every engine shares.

Finished jobs need no row-by-row delete here: they live in the ring
partitions, which the rotate branches prune a whole slot at a time. What the
rings never drop is the dead-letter queue (``{schema}.dlq_entries``, a plain
table), so this branch deletes its rows older than ``dlq_retention``:

1. a global pass over every queue whose ``queue_retention_overrides`` entry
   sets no ``dlq`` retention of its own;
2. one pass per queue that does, with that queue's retention.

One ``dlq_cleanup_batch_size`` batch per pass per tick would let a DLQ that
fills faster than ``batch / cleanup_interval`` (17 rows/s at the defaults)
grow without bound, so each pass repeats its batch until a batch comes back
short or the tick's budget, ``min(drain_time_budget,
cleanup_interval / 2)``, is spent. Every batch is its own short statement
(``FOR UPDATE SKIP LOCKED``, so a row an admin is retrying right now is left
for later and nobody waits on us), and a cancel between or during batches
leaves each batch applied whole or not at all. The first batch of each pass
always runs, so a queue with an override is never starved by the global
backlog.

Each batch is counted at once in ``awa.job.dlq_purged`` (no queue attribute
for the global pass, ``awa.job.queue`` for an override queue, as Awa records it).

Then the steps every engine shares (:mod:`awa_trio.maintenance.cleanup`):
runtime snapshots, descriptors and expired batch operations, within the
same tick budget.

Concurrent writers: rescues insert DLQ rows (recent ones, never past
retention); awa-pg's ``retry_from_dlq`` / ``purge_dlq`` lock the rows they
take, which the purge skips. The purge touches no ring table.
"""

from __future__ import annotations

import logging
from typing import Any

from ...context import MaintenanceContext
from ...db import LockTimeout, QueryError, describe_error, rows_affected
from ...maintenance.cleanup import (
    NAME,
    CleanupResult,
    run_cleanup,
)
from ...maintenance.drain import BatchOutcome, DrainBudget, drain
from ...sql import Statement
from .layout import schema_name

log = logging.getLogger(__name__)

__all__ = ["NAME", "purge_expired_dlq", "run_once"]

# :retention (s), :batch_size, :override_queues: the queues that have their
# own DLQ retention (`queue <> ALL('{}')` is true, so with none every queue
# counts). No ORDER BY: the global pass has no index on dlq_at alone, and
# sorting the whole expired set for every batch would make a large drain
# quadratic.
PURGE_EXPIRED_DLQ_SQL = Statement("""
    DELETE FROM {schema}.dlq_entries
    WHERE job_id IN (
        SELECT job_id
        FROM {schema}.dlq_entries
        WHERE dlq_at < now() - make_interval(secs => :retention)
          AND queue <> ALL(:override_queues::text[])
        LIMIT :batch_size
        FOR UPDATE SKIP LOCKED
    )
""")

# One override queue (:queue), oldest first along idx_awa_dlq_queue_time.
PURGE_EXPIRED_QUEUE_DLQ_SQL = Statement("""
    DELETE FROM {schema}.dlq_entries
    WHERE job_id IN (
        SELECT job_id
        FROM {schema}.dlq_entries
        WHERE queue = :queue
          AND dlq_at < now() - make_interval(secs => :retention)
        ORDER BY dlq_at
        LIMIT :batch_size
        FOR UPDATE SKIP LOCKED
    )
""")


async def run_once(ctx: MaintenanceContext) -> CleanupResult:
    return await run_cleanup(ctx, purge_expired_dlq)


async def purge_expired_dlq(ctx: MaintenanceContext, result: CleanupResult, budget: DrainBudget) -> None:
    config = ctx.config
    override_queues = sorted(
        queue for queue, policy in config.queue_retention_overrides.items() if policy.dlq is not None
    )

    result.dlq_purged = await purge_pass(
        ctx,
        result,
        budget,
        None,
        PURGE_EXPIRED_DLQ_SQL,
        config.dlq_retention,
        {"override_queues": override_queues},
    )
    if result.dlq_purged:
        log.info("%s: purged %d dead-lettered jobs past retention", NAME, result.dlq_purged)

    for queue in override_queues:
        retention = config.queue_retention_overrides[queue].dlq
        assert retention is not None  # override_queues holds only queues with one
        purged = await purge_pass(
            ctx, result, budget, queue, PURGE_EXPIRED_QUEUE_DLQ_SQL, retention, {"queue": queue}
        )
        result.dlq_purged_by_queue[queue] = purged
        if purged:
            log.info("%s: purged %d dead-lettered jobs past retention in queue %r", NAME, purged, queue)


async def purge_pass(
    ctx: MaintenanceContext,
    result: CleanupResult,
    budget: DrainBudget,
    queue: str | None,
    statement: Statement,
    retention: float,
    scope: dict[str, Any],
) -> int:
    """One pass's batches, drained (resting between full ones) until one
    comes back short or the budget is spent; returns the rows deleted. A
    rejected statement ends the pass (logged, recorded); ConnectionLost and
    cancellation propagate. Each batch is counted in awa.job.dlq_purged at once.
    ``scope``: the statement's parameters besides retention and batch size."""
    batch_size = ctx.config.dlq_cleanup_batch_size
    schema = schema_name(ctx)
    step = "dead-lettered jobs" + (f" (queue {queue!r})" if queue else " (global pass)")

    async def batch() -> BatchOutcome | None:
        try:
            status = await ctx.db.execute(
                *statement.bind(schema, retention=retention, batch_size=batch_size, **scope)
            )
        except LockTimeout:
            raise  # a yield: the branch retries at its next tick
        except QueryError as exc:
            result.log_error(log, "%s: failed to purge %s: %s", NAME, step, describe_error(exc))
            result.failed_steps.append(step)
            return None
        deleted = rows_affected(status)
        result.dlq_batches += 1
        ctx.metrics.record_dlq_purged(queue, deleted)
        return BatchOutcome.of(deleted, batch_size)

    outcome = await drain(batch, budget=budget)
    if not outcome.drained and step not in result.failed_steps:
        result.unfinished_steps.append(step)
    return outcome.rows
