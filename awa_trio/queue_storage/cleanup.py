"""cleanup (queue storage): purge dead-lettered jobs past retention, then the
steps every engine shares.

Finished jobs need no row-by-row delete here: they live in the ring
partitions, which the rotate branches prune a whole slot at a time. What the
rings never drop is the dead-letter queue (``{schema}.dlq_entries``, a plain
table), so this branch deletes its rows older than ``dlq_retention``:

1. a global pass over every queue whose ``queue_retention_overrides`` entry
   sets no ``dlq`` retention of its own;
2. one pass per queue that does, with that queue's retention.

Upstream deletes one ``dlq_cleanup_batch_size`` batch per pass per tick, so a
DLQ that fills faster than ``batch / cleanup_interval`` (17 rows/s at the
defaults) grows without bound. Here each pass repeats its batch until a batch
comes back short or the tick's budget, ``min(drain_time_budget,
cleanup_interval / 2)``, is spent. Every batch is its own short statement
(``FOR UPDATE SKIP LOCKED``, so a row an admin is retrying right now is left
for later and nobody waits on us), and a cancel between or during batches
leaves each batch applied whole or not at all. The first batch of each pass
always runs, so a queue with an override is never starved by the global
backlog.

Each batch is counted at once in ``awa.job.dlq_purged`` (no queue attribute
for the global pass, ``awa.job.queue`` for an override queue, as upstream).

Then the engine-independent steps of :mod:`awa_trio.branches.cleanup` run:
runtime snapshots, descriptors and expired batch operations.

Concurrent writers: rescues insert DLQ rows (recent ones, never past
retention); awa-pg's ``retry_from_dlq`` / ``purge_dlq`` lock the rows they
take, which the purge skips. The purge touches no ring table.
"""

from __future__ import annotations

import dataclasses
import logging

import trio

from ..branches.cleanup import CleanupResult, run_engine_independent_steps
from ..context import MaintenanceContext
from ..db import QueryError, describe_error
from .layout import schema_name

log = logging.getLogger(__name__)

NAME = "cleanup"

# $1 retention (s), $2 batch size, $3 queues that have their own DLQ
# retention (`queue <> ALL('{}')` is true, so with none every queue counts).
# No ORDER BY: the global pass has no index on dlq_at alone, and sorting the
# whole expired set for every batch would make a large drain quadratic.
PURGE_EXPIRED_DLQ_SQL = """
    DELETE FROM {schema}.dlq_entries
    WHERE job_id IN (
        SELECT job_id
        FROM {schema}.dlq_entries
        WHERE dlq_at < now() - make_interval(secs => $1)
          AND queue <> ALL($3::text[])
        LIMIT $2
        FOR UPDATE SKIP LOCKED
    )
"""

# One override queue ($3), oldest first along idx_awa_dlq_queue_time.
PURGE_EXPIRED_QUEUE_DLQ_SQL = """
    DELETE FROM {schema}.dlq_entries
    WHERE job_id IN (
        SELECT job_id
        FROM {schema}.dlq_entries
        WHERE queue = $3
          AND dlq_at < now() - make_interval(secs => $1)
        ORDER BY dlq_at
        LIMIT $2
        FOR UPDATE SKIP LOCKED
    )
"""


@dataclasses.dataclass
class QueueStorageCleanupResult(CleanupResult):
    #: DLQ rows deleted by the global pass.
    dlq_purged: int = 0
    #: DLQ rows deleted per queue with its own DLQ retention.
    dlq_purged_by_queue: dict[str, int] = dataclasses.field(default_factory=dict)
    #: DELETE statements run against the DLQ this tick.
    dlq_batches: int = 0
    #: The tick's budget ran out while a pass still had full batches.
    dlq_budget_exhausted: bool = False

    @property
    def total_dlq_purged(self) -> int:
        return self.dlq_purged + sum(self.dlq_purged_by_queue.values())


def tick_budget(ctx: MaintenanceContext) -> float:
    """Seconds one tick may keep taking batches."""
    return min(ctx.config.drain_time_budget, ctx.config.cleanup_interval / 2)


async def run_once(ctx: MaintenanceContext) -> QueueStorageCleanupResult:
    result = QueueStorageCleanupResult()
    await purge_expired_dlq(ctx, result)
    await run_engine_independent_steps(ctx, result)
    return result


async def purge_expired_dlq(ctx: MaintenanceContext, result: QueueStorageCleanupResult) -> None:
    config = ctx.config
    schema = schema_name(ctx)
    deadline = trio.current_time() + tick_budget(ctx)
    override_queues = sorted(
        queue for queue, policy in config.queue_retention_overrides.items() if policy.dlq is not None
    )

    result.dlq_purged = await _drain(
        ctx,
        result,
        deadline,
        None,
        PURGE_EXPIRED_DLQ_SQL.format(schema=schema),
        config.dlq_retention,
        override_queues,
    )
    if result.dlq_purged:
        log.info("%s: purged %d dead-lettered jobs past retention", NAME, result.dlq_purged)

    for queue in override_queues:
        retention = config.queue_retention_overrides[queue].dlq
        assert retention is not None  # override_queues holds only queues with one
        purged = await _drain(
            ctx,
            result,
            deadline,
            queue,
            PURGE_EXPIRED_QUEUE_DLQ_SQL.format(schema=schema),
            retention,
            queue,
        )
        result.dlq_purged_by_queue[queue] = purged
        if purged:
            log.info("%s: purged %d dead-lettered jobs past retention in queue %r", NAME, purged, queue)


async def _drain(
    ctx: MaintenanceContext,
    result: QueueStorageCleanupResult,
    deadline: float,
    queue: str | None,
    sql: str,
    retention: float,
    scope: object,
) -> int:
    """Repeat one pass's batch until it comes back short or the budget is
    spent; returns the rows deleted. A rejected statement ends the pass
    (logged, recorded); ConnectionLost and cancellation propagate."""
    batch_size = ctx.config.dlq_cleanup_batch_size
    step = "dead-lettered jobs" + (f" (queue {queue!r})" if queue else " (global pass)")
    purged = 0
    while True:
        try:
            status = await ctx.db.execute(sql, retention, batch_size, scope)
        except QueryError as exc:
            log.error("%s: failed to purge %s: %s", NAME, step, describe_error(exc))
            result.failed_steps.append(step)
            return purged
        deleted = int(status.rsplit(" ", 1)[-1])
        result.dlq_batches += 1
        purged += deleted
        ctx.metrics.record_dlq_purged(queue, deleted)
        if deleted < batch_size:
            return purged
        if trio.current_time() >= deadline:
            result.dlq_budget_exhausted = True
            log.info("%s: %s: tick budget spent with more to purge; next tick goes on", NAME, step)
            return purged
