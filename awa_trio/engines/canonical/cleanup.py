"""cleanup on the canonical engine: finished jobs past retention, then the
steps every engine shares (:mod:`awa_trio.maintenance.cleanup`: runtime
snapshots, descriptors, expired batch operations).

Finished jobs: ``completed`` older than ``completed_retention``,
``failed``/``cancelled`` older than ``failed_retention``, in batches of
``cleanup_batch_size``. A global pass skips the queues that have an entry in
``queue_retention_overrides``; then one pass per such queue applies that
queue's own :class:`~awa_trio.config.RetentionPolicy`. Finished jobs live in
``awa.jobs_hot``. The passes drain within the tick's budget, shared with
the later steps, each taking at least one batch per tick so an override
queue is never starved by a big global backlog. Each batch is its own short
statement with ``SKIP LOCKED``, so workers never wait on cleanup for longer
than one batch.

Dead-letter cleanup belongs to the queue-storage engine (its DLQ rows live
in ring tables this branch never touches); on canonical there is nothing to
delete, so it has no step here.

A lost connection is not one step's problem: it propagates, the branch actor
logs it once with the branch name, and the whole pass runs again next tick
(instead of every remaining step waiting out its own connect timeout).
"""

from __future__ import annotations

import logging
from typing import Any

from ...context import MaintenanceContext
from ...db import LockTimeout, QueryError
from ...maintenance.cleanup import (
    NAME,
    CleanupResult,
    cleanup_budget,
    log_failed_step,
    run_cleanup,
)
from ...maintenance.drain import BatchOutcome, DrainBudget, drain
from ...sql import Statement

log = logging.getLogger(__name__)

__all__ = ["NAME", "CleanupResult", "delete_expired_jobs", "run_once"]


# Finished jobs always sit in awa.jobs_hot (scheduled_jobs only holds
# scheduled/retryable), so the delete bypasses the awa.jobs view. `picked`
# locks what it takes and skips rows someone else holds: a row being retried
# or otherwise changed right now is left for later, never deleted after it
# stopped matching. `queue <> ALL('{}')` is true, so with no overrides the
# global pass covers every queue.
#
# Draining: a batch scans the heap from :cursor, the last row the previous batch
# picked (a TID range scan, physical order). Without that cursor every batch
# would start at block 0 and wade through the dead rows of all earlier
# batches (they stay until VACUUM), so a 1M-row backlog costs O(n^2) reads.
# The drain goes back to block 0 once before it stops, for rows it skipped
# (locked, or out of physical order when an index was used).
_DELETE_EXPIRED_TEMPLATE = """
    WITH picked AS (
        SELECT id, ctid
        FROM awa.jobs_hot
        WHERE ctid > :cursor::tid
          AND {queues}
          AND ((state = 'completed'
                AND finalized_at < now() - make_interval(secs => :completed_retention))
            OR (state IN ('failed', 'cancelled')
                AND finalized_at < now() - make_interval(secs => :failed_retention)))
        LIMIT :limit
        FOR UPDATE SKIP LOCKED
    ),
    deleted AS (
        DELETE FROM awa.jobs_hot AS job
        USING picked
        WHERE job.id = picked.id
        RETURNING 1
    )
    SELECT
        (SELECT count(*) FROM picked) AS picked,
        (SELECT count(*) FROM deleted) AS deleted,
        (SELECT max(ctid) FROM picked) AS last_picked
"""
DELETE_EXPIRED_JOBS_SQL = Statement(_DELETE_EXPIRED_TEMPLATE, queues="queue <> ALL(:queues::text[])")
# Same rule for one queue that has its own retention policy.
DELETE_EXPIRED_QUEUE_JOBS_SQL = Statement(_DELETE_EXPIRED_TEMPLATE, queues="queue = :queue")
#: The cursor of a drain's first batch: before every row.
HEAP_START = (0, 0)


async def run_once(ctx: MaintenanceContext) -> CleanupResult:
    return await run_cleanup(ctx, delete_expired_jobs)


async def delete_expired_jobs(
    ctx: MaintenanceContext, result: CleanupResult, budget: DrainBudget | None = None
) -> None:
    config = ctx.config
    budget = budget or cleanup_budget(ctx)
    override_queues = sorted(config.queue_retention_overrides)
    result.jobs_deleted = await _drain_jobs_step(
        ctx,
        result,
        budget,
        "finished jobs (global pass)",
        DELETE_EXPIRED_JOBS_SQL,
        completed_retention=config.completed_retention,
        failed_retention=config.failed_retention,
        queues=override_queues,
    )
    if result.jobs_deleted:
        log.info("%s: deleted %d finished jobs past retention", NAME, result.jobs_deleted)

    for queue in override_queues:
        policy = config.queue_retention_overrides[queue]
        deleted = await _drain_jobs_step(
            ctx,
            result,
            budget,
            f"finished jobs (queue {queue!r})",
            DELETE_EXPIRED_QUEUE_JOBS_SQL,
            completed_retention=policy.completed,
            failed_retention=policy.failed,
            queue=queue,
        )
        result.jobs_deleted_by_queue[queue] = deleted
        if deleted:
            log.info("%s: deleted %d finished jobs past retention in queue %r", NAME, deleted, queue)


async def _drain_jobs_step(
    ctx: MaintenanceContext,
    result: CleanupResult,
    budget: DrainBudget,
    step: str,
    statement: Statement,
    **values: Any,
) -> int:
    """The finished-jobs drain: like :func:`_drain_step`, with a heap cursor
    (see the SQL) and one more batch from the start before it ends."""
    batch_size = ctx.config.cleanup_batch_size
    cursor: Any = HEAP_START

    async def batch() -> BatchOutcome | None:
        nonlocal cursor
        try:
            row = await ctx.db.fetchone(*statement.bind(**values, limit=batch_size, cursor=cursor))
        except LockTimeout:
            raise  # a yield: the branch retries at its next tick
        except QueryError as exc:
            log_failed_step(result, step, exc)
            return None
        picked, deleted, last_picked = row["picked"], row["deleted"], row["last_picked"]
        if picked >= batch_size:
            cursor = last_picked
            return BatchOutcome(deleted, more=True)
        if cursor != HEAP_START:
            # Reached the end of the heap: once more from the start.
            cursor = HEAP_START
            return BatchOutcome(deleted, more=True)
        return BatchOutcome(deleted, more=False)

    outcome = await drain(batch, budget=budget)
    result.add_drain(step, outcome)
    return outcome.rows
