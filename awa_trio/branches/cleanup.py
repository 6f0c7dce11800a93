"""cleanup: delete what Awa no longer needs, so its tables stay small.

One pass, in this order, each step its own statement and its own error
handling (like upstream, a failing step is logged and the next ones still
run):

1. finished jobs past retention: ``completed`` older than
   ``completed_retention``, ``failed``/``cancelled`` older than
   ``failed_retention``, in batches of ``cleanup_batch_size``. A global
   pass skips the queues that have an entry in ``queue_retention_overrides``;
   then one pass per such queue applies that queue's own
   :class:`~awa_trio.config.RetentionPolicy`. Canonical engine only
   (finished jobs live in ``awa.jobs_hot``).
2. runtime snapshots (``awa.runtime_instances``) unseen for
   ``runtime_snapshot_retention``; a live runtime republishes its row every
   few seconds, so only dead processes disappear.
3. queue and job-kind descriptors unseen for ``descriptor_retention``
   (0 disables the step); the next descriptor sync re-creates a live one.
4. admin batch operations that are finished and past their
   ``retention_until``, oldest first, 1000 per batch; their items go with
   them (ON DELETE CASCADE).

The batched steps (1 and 4) drain: each repeats its batch until one comes
back short or the tick's budget (``min(drain_time_budget, cleanup_interval /
2)``, shared by all steps) is spent, every step taking at least one batch per
tick so an override queue is never starved by a big global backlog
(:mod:`awa_trio.maintenance.drain`). Each batch is its own short statement with ``SKIP
LOCKED``, so workers never wait on cleanup for longer than one batch.

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
from ..maintenance.drain import BatchOutcome, DrainBudget, DrainOutcome, drain

log = logging.getLogger(__name__)

NAME = "cleanup"
#: Expired batch operations deleted per batch (upstream's fixed per-pass limit).
EXPIRED_BATCH_OPERATIONS_LIMIT = 1000
#: Upstream never uses a snapshot retention below one second.
MIN_RUNTIME_SNAPSHOT_RETENTION = 1.0
#: Likewise for descriptors (when the step is enabled at all).
MIN_DESCRIPTOR_RETENTION = 1.0

# Finished jobs always sit in awa.jobs_hot (scheduled_jobs only holds
# scheduled/retryable), so the delete bypasses the awa.jobs view. `picked`
# locks what it takes and skips rows someone else holds: a row being retried
# or otherwise changed right now is left for later, never deleted after it
# stopped matching. `queue <> ALL('{}')` is true, so with no overrides the
# global pass covers every queue.
#
# Draining: a batch scans the heap from $5, the last row the previous batch
# picked (a TID range scan, physical order). Without that cursor every batch
# would start at block 0 and wade through the dead rows of all earlier
# batches (they stay until VACUUM), so a 1M-row backlog costs O(n^2) reads.
# The drain goes back to block 0 once before it stops, for rows it skipped
# (locked, or out of physical order when an index was used).
_DELETE_EXPIRED_TEMPLATE = """
    WITH picked AS (
        SELECT id, ctid
        FROM awa.jobs_hot
        WHERE ctid > $5::tid
          AND {queues}
          AND ((state = 'completed'
                AND finalized_at < now() - make_interval(secs => $1))
            OR (state IN ('failed', 'cancelled')
                AND finalized_at < now() - make_interval(secs => $2)))
        LIMIT $4
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
DELETE_EXPIRED_JOBS_SQL = _DELETE_EXPIRED_TEMPLATE.format(queues="queue <> ALL($3::text[])")
# Same rule for one queue that has its own retention policy.
DELETE_EXPIRED_QUEUE_JOBS_SQL = _DELETE_EXPIRED_TEMPLATE.format(queues="queue = $3")
#: The cursor of a drain's first batch: before every row.
HEAP_START = (0, 0)

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
    #: DELETE statements run by the batched steps this pass.
    batches: int = 0
    #: Batched steps whose backlog was left for the next tick (budget spent).
    unfinished_steps: list[str] = dataclasses.field(default_factory=list)
    #: Longest single batch, in seconds (how long its row locks were held).
    longest_batch: float = 0.0

    @property
    def total_jobs_deleted(self) -> int:
        return self.jobs_deleted + sum(self.jobs_deleted_by_queue.values())

    def add_drain(self, step: str, outcome: DrainOutcome) -> None:
        self.batches += outcome.batches
        self.longest_batch = max(self.longest_batch, outcome.longest_batch)
        if not outcome.drained and step not in self.failed_steps:
            self.unfinished_steps.append(step)


def cleanup_budget(ctx: MaintenanceContext) -> DrainBudget:
    return DrainBudget.for_interval(ctx.config, ctx.config.cleanup_interval)


async def run_once(ctx: MaintenanceContext) -> CleanupResult:
    result = CleanupResult()
    budget = cleanup_budget(ctx)
    await delete_expired_jobs(ctx, result, budget)
    await run_engine_independent_steps(ctx, result, budget)
    if result.unfinished_steps:
        log.info(
            "%s: time budget (%gs) spent after %d batches; left for the next tick: %s",
            NAME,
            budget.seconds,
            result.batches,
            ", ".join(result.unfinished_steps),
        )
    return result


async def run_engine_independent_steps(
    ctx: MaintenanceContext, result: CleanupResult, budget: DrainBudget | None = None
) -> None:
    """Snapshots, descriptors and batch operations: the same on every engine
    (queue storage's cleanup runs these after its DLQ purge). ``budget`` is
    the tick's drain budget; by default a fresh one for the cleanup interval."""
    budget = budget or cleanup_budget(ctx)
    await delete_stale_runtime_snapshots(ctx, result)
    await delete_stale_descriptors(ctx, result)
    await delete_expired_batch_operations(ctx, result, budget)


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
        config.completed_retention,
        config.failed_retention,
        override_queues,
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
            policy.completed,
            policy.failed,
            queue,
        )
        result.jobs_deleted_by_queue[queue] = deleted
        if deleted:
            log.info("%s: deleted %d finished jobs past retention in queue %r", NAME, deleted, queue)


async def delete_stale_runtime_snapshots(ctx: MaintenanceContext, result: CleanupResult) -> None:
    retention = max(ctx.config.runtime_snapshot_retention, MIN_RUNTIME_SNAPSHOT_RETENTION)
    result.runtime_snapshots_deleted = (
        await _delete_step(
            ctx,
            result,
            "runtime snapshots",
            DELETE_STALE_RUNTIME_SNAPSHOTS_SQL,
            retention,
        )
        or 0
    )
    if result.runtime_snapshots_deleted:
        log.info("%s: deleted %d stale runtime snapshots", NAME, result.runtime_snapshots_deleted)


async def delete_stale_descriptors(ctx: MaintenanceContext, result: CleanupResult) -> None:
    if ctx.config.descriptor_retention == 0:
        return
    retention = max(ctx.config.descriptor_retention, MIN_DESCRIPTOR_RETENTION)
    result.queue_descriptors_deleted = (
        await _delete_step(
            ctx,
            result,
            "queue descriptors",
            DELETE_STALE_QUEUE_DESCRIPTORS_SQL,
            retention,
        )
        or 0
    )
    result.job_kind_descriptors_deleted = (
        await _delete_step(
            ctx,
            result,
            "job kind descriptors",
            DELETE_STALE_JOB_KIND_DESCRIPTORS_SQL,
            retention,
        )
        or 0
    )
    if result.queue_descriptors_deleted or result.job_kind_descriptors_deleted:
        log.info(
            "%s: deleted %d stale queue descriptors and %d stale job kind descriptors",
            NAME,
            result.queue_descriptors_deleted,
            result.job_kind_descriptors_deleted,
        )


async def delete_expired_batch_operations(
    ctx: MaintenanceContext, result: CleanupResult, budget: DrainBudget | None = None
) -> None:
    result.batch_operations_deleted = await _drain_step(
        ctx,
        result,
        budget or cleanup_budget(ctx),
        "expired batch operations",
        DELETE_EXPIRED_BATCH_OPERATIONS_SQL,
        EXPIRED_BATCH_OPERATIONS_LIMIT,
    )
    if result.batch_operations_deleted:
        log.info("%s: deleted %d expired batch operations", NAME, result.batch_operations_deleted)


async def _drain_step(
    ctx: MaintenanceContext,
    result: CleanupResult,
    budget: DrainBudget,
    step: str,
    sql: str,
    batch_size: int,
    *args: Any,
) -> int:
    """Repeat one step's batched DELETE (row limit last) while batches come
    back full and the budget lasts; returns the rows deleted."""

    async def batch() -> BatchOutcome | None:
        deleted = await _delete_step(ctx, result, step, sql, *args, batch_size)
        return None if deleted is None else BatchOutcome.of(deleted, batch_size)

    outcome = await drain(batch, budget=budget)
    result.add_drain(step, outcome)
    return outcome.rows


async def _drain_jobs_step(
    ctx: MaintenanceContext,
    result: CleanupResult,
    budget: DrainBudget,
    step: str,
    sql: str,
    *args: Any,
) -> int:
    """The finished-jobs drain: like :func:`_drain_step`, with a heap cursor
    (see the SQL) and one more batch from the start before it ends."""
    batch_size = ctx.config.cleanup_batch_size
    cursor: Any = HEAP_START

    async def batch() -> BatchOutcome | None:
        nonlocal cursor
        try:
            row = await ctx.db.fetchone(sql, *args, batch_size, cursor)
        except QueryError as exc:
            _log_failed_step(result, step, exc)
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


async def _delete_step(
    ctx: MaintenanceContext, result: CleanupResult, step: str, sql: str, *args: Any
) -> int | None:
    """Run one DELETE and return its row count. A rejected statement (lock
    timeout, missing privilege, ...) is logged and recorded, and None returned,
    so the remaining steps still run; ConnectionLost propagates."""
    try:
        status = await ctx.db.execute(sql, *args)
    except QueryError as exc:
        _log_failed_step(result, step, exc)
        return None
    # A command tag such as "DELETE 12".
    return int(status.rsplit(" ", 1)[-1])


def _log_failed_step(result: CleanupResult, step: str, exc: QueryError) -> None:
    sqlstate = f" [{exc.sqlstate}]" if exc.sqlstate else ""
    log.error("%s: failed to delete %s%s: %s", NAME, step, sqlstate, exc)
    result.failed_steps.append(step)
