"""cleanup: delete what Awa no longer needs, so its tables stay small.

One pass, in this order, each step its own statement and its own error
handling (like upstream, a failing step is logged and the next ones still
run):

1. finished jobs past retention: ``completed`` older than
   ``completed_retention``, ``failed``/``cancelled`` older than
   ``failed_retention``, at most ``cleanup_batch_size`` rows per pass. A
   global pass skips the queues that have an entry in
   ``queue_retention_overrides``; then one pass per such queue applies that
   queue's own :class:`~awa_trio.config.RetentionPolicy`. Canonical engine
   only (finished jobs live in ``awa.jobs_hot``).
2. runtime snapshots (``awa.runtime_instances``) unseen for
   ``runtime_snapshot_retention``; a live runtime republishes its row every
   few seconds, so only dead processes disappear.
3. queue and job-kind descriptors unseen for ``descriptor_retention``
   (0 disables the step); the next descriptor sync re-creates a live one.
4. admin batch operations that are finished and past their
   ``retention_until``, oldest first, 1000 per pass; their items go with
   them (ON DELETE CASCADE).

Dead-letter cleanup belongs to the queue-storage engine (its DLQ rows live
in ring tables this branch never touches); on canonical there is nothing to
delete, so it has no step here.

A lost connection is not one step's problem: it propagates, the branch actor
logs it once with the branch name, and the whole pass runs again next tick
(instead of every remaining step waiting out its own connect timeout).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from ..context import MaintenanceContext
from ..db import QueryError

log = logging.getLogger(__name__)

NAME = "cleanup"
#: Expired batch operations deleted per pass (upstream's fixed limit).
EXPIRED_BATCH_OPERATIONS_LIMIT = 1000
#: Upstream never uses a snapshot retention below one second.
MIN_RUNTIME_SNAPSHOT_RETENTION = 1.0
#: Likewise for descriptors (when the step is enabled at all).
MIN_DESCRIPTOR_RETENTION = 1.0

# Finished jobs always sit in awa.jobs_hot (scheduled_jobs only holds
# scheduled/retryable), so the delete bypasses the awa.jobs view. The inner
# select locks what it picks and skips rows someone else holds: a row being
# retried or otherwise changed right now is left for the next pass, never
# deleted after it stopped matching. `queue <> ALL('{}')` is true, so with no
# overrides the global pass covers every queue.
DELETE_EXPIRED_JOBS_SQL = """
    DELETE FROM awa.jobs_hot
    WHERE id IN (
        SELECT id
        FROM awa.jobs_hot
        WHERE ((state = 'completed'
                AND finalized_at < now() - make_interval(secs => $1))
            OR (state IN ('failed', 'cancelled')
                AND finalized_at < now() - make_interval(secs => $2)))
          AND queue <> ALL($3::text[])
        LIMIT $4
        FOR UPDATE SKIP LOCKED
    )
"""

# Same rule for one queue that has its own retention policy.
DELETE_EXPIRED_QUEUE_JOBS_SQL = """
    DELETE FROM awa.jobs_hot
    WHERE id IN (
        SELECT id
        FROM awa.jobs_hot
        WHERE queue = $3
          AND ((state = 'completed'
                AND finalized_at < now() - make_interval(secs => $1))
            OR (state IN ('failed', 'cancelled')
                AND finalized_at < now() - make_interval(secs => $2)))
        LIMIT $4
        FOR UPDATE SKIP LOCKED
    )
"""

# A runtime's snapshot row is refreshed on every publish (every ~10 s).
DELETE_STALE_RUNTIME_SNAPSHOTS_SQL = """
    DELETE FROM awa.runtime_instances
    WHERE last_seen_at < now() - make_interval(secs => $1)
"""

# Descriptors are refreshed (last_seen_at) by every sync of a live runtime;
# nothing references them, so deleting is always safe.
DELETE_STALE_QUEUE_DESCRIPTORS_SQL = """
    DELETE FROM awa.queue_descriptors
    WHERE last_seen_at < now() - make_interval(secs => $1)
"""
DELETE_STALE_JOB_KIND_DESCRIPTORS_SQL = """
    DELETE FROM awa.job_kind_descriptors
    WHERE last_seen_at < now() - make_interval(secs => $1)
"""

# retention_until is stamped when the batch runner finalises an operation.
# An operation that is still pending/running is never deleted, whatever its
# retention_until says.
DELETE_EXPIRED_BATCH_OPERATIONS_SQL = """
    DELETE FROM awa.batch_operations
    WHERE id IN (
        SELECT id
        FROM awa.batch_operations
        WHERE retention_until IS NOT NULL
          AND retention_until < clock_timestamp()
          AND state IN ('completed', 'cancelled', 'failed')
        ORDER BY retention_until
        LIMIT $1
        FOR UPDATE SKIP LOCKED
    )
"""


@dataclasses.dataclass
class CleanupResult:
    #: Finished jobs deleted by the global pass (queues without an override).
    jobs_deleted: int = 0
    #: Finished jobs deleted per override queue.
    jobs_deleted_by_queue: dict[str, int] = dataclasses.field(default_factory=dict)
    runtime_snapshots_deleted: int = 0
    queue_descriptors_deleted: int = 0
    job_kind_descriptors_deleted: int = 0
    batch_operations_deleted: int = 0
    #: Steps that failed this pass (already logged).
    failed_steps: list[str] = dataclasses.field(default_factory=list)

    @property
    def total_jobs_deleted(self) -> int:
        return self.jobs_deleted + sum(self.jobs_deleted_by_queue.values())


async def run_once(ctx: MaintenanceContext) -> CleanupResult:
    result = CleanupResult()
    await delete_expired_jobs(ctx, result)
    await run_engine_independent_steps(ctx, result)
    return result


async def run_engine_independent_steps(ctx: MaintenanceContext, result: CleanupResult) -> None:
    """Snapshots, descriptors and batch operations: the same on every engine
    (queue storage's cleanup runs these after its DLQ purge)."""
    await delete_stale_runtime_snapshots(ctx, result)
    await delete_stale_descriptors(ctx, result)
    await delete_expired_batch_operations(ctx, result)


async def delete_expired_jobs(ctx: MaintenanceContext, result: CleanupResult) -> None:
    config = ctx.config
    override_queues = sorted(config.queue_retention_overrides)
    result.jobs_deleted = await _delete_step(
        ctx, result, "finished jobs (global pass)", DELETE_EXPIRED_JOBS_SQL,
        config.completed_retention, config.failed_retention, override_queues,
        config.cleanup_batch_size,
    )
    if result.jobs_deleted:
        log.info("%s: deleted %d finished jobs past retention", NAME, result.jobs_deleted)

    for queue in override_queues:
        policy = config.queue_retention_overrides[queue]
        deleted = await _delete_step(
            ctx, result, f"finished jobs (queue {queue!r})", DELETE_EXPIRED_QUEUE_JOBS_SQL,
            policy.completed, policy.failed, queue, config.cleanup_batch_size,
        )
        result.jobs_deleted_by_queue[queue] = deleted
        if deleted:
            log.info("%s: deleted %d finished jobs past retention in queue %r",
                     NAME, deleted, queue)


async def delete_stale_runtime_snapshots(ctx: MaintenanceContext, result: CleanupResult) -> None:
    retention = max(ctx.config.runtime_snapshot_retention, MIN_RUNTIME_SNAPSHOT_RETENTION)
    result.runtime_snapshots_deleted = await _delete_step(
        ctx, result, "runtime snapshots", DELETE_STALE_RUNTIME_SNAPSHOTS_SQL, retention,
    )
    if result.runtime_snapshots_deleted:
        log.info("%s: deleted %d stale runtime snapshots", NAME, result.runtime_snapshots_deleted)


async def delete_stale_descriptors(ctx: MaintenanceContext, result: CleanupResult) -> None:
    if ctx.config.descriptor_retention == 0:
        return
    retention = max(ctx.config.descriptor_retention, MIN_DESCRIPTOR_RETENTION)
    result.queue_descriptors_deleted = await _delete_step(
        ctx, result, "queue descriptors", DELETE_STALE_QUEUE_DESCRIPTORS_SQL, retention,
    )
    result.job_kind_descriptors_deleted = await _delete_step(
        ctx, result, "job kind descriptors", DELETE_STALE_JOB_KIND_DESCRIPTORS_SQL, retention,
    )
    if result.queue_descriptors_deleted or result.job_kind_descriptors_deleted:
        log.info(
            "%s: deleted %d stale queue descriptors and %d stale job kind descriptors",
            NAME, result.queue_descriptors_deleted, result.job_kind_descriptors_deleted,
        )


async def delete_expired_batch_operations(ctx: MaintenanceContext, result: CleanupResult) -> None:
    result.batch_operations_deleted = await _delete_step(
        ctx, result, "expired batch operations", DELETE_EXPIRED_BATCH_OPERATIONS_SQL,
        EXPIRED_BATCH_OPERATIONS_LIMIT,
    )
    if result.batch_operations_deleted:
        log.info("%s: deleted %d expired batch operations", NAME, result.batch_operations_deleted)


async def _delete_step(
    ctx: MaintenanceContext, result: CleanupResult, step: str, sql: str, *args: Any
) -> int:
    """Run one step's DELETE and return its row count. A rejected statement
    (lock timeout, missing privilege, ...) is logged and recorded so the
    remaining steps still run; ConnectionLost propagates."""
    try:
        status = await ctx.db.execute(sql, *args)
    except QueryError as exc:
        sqlstate = f" [{exc.sqlstate}]" if exc.sqlstate else ""
        log.error("%s: failed to delete %s%s: %s", NAME, step, sqlstate, exc)
        result.failed_steps.append(step)
        return 0
    # A command tag such as "DELETE 12".
    return int(status.rsplit(" ", 1)[-1])
