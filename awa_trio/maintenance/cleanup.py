"""Cleanup steps every engine runs the same way, and the one result type.

After an engine's own steps (finished jobs past retention on canonical,
dead-lettered rows past retention on queue storage), cleanup deletes:

1. runtime snapshots (``awa.runtime_instances``) unseen for
   ``runtime_snapshot_retention``; a live runtime republishes its row every
   few seconds, so only dead processes disappear;
2. queue and job-kind descriptors unseen for ``descriptor_retention``
   (0 disables the step); the next descriptor sync re-creates a live one;
3. admin batch operations that are finished and past their
   ``retention_until``, oldest first, 1000 per batch; their items go with
   them (ON DELETE CASCADE).

Each step is its own statement with its own error handling: a failing step
is logged and the next ones still run. Batched steps drain
(:mod:`awa_trio.maintenance.drain`) within the tick's budget,
``min(drain_time_budget, cleanup_interval / 2)``, shared by every step of
the tick, each step taking at least one batch.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from ..body import BodyResult
from ..context import MaintenanceContext
from ..db import LockTimeout, QueryError, rows_affected
from ..sql import Statement
from .drain import BatchOutcome, DrainBudget, DrainOutcome, drain

log = logging.getLogger(__name__)

NAME = "cleanup"
#: Rows per batch of the expired-batch-operations step.
EXPIRED_BATCH_OPERATIONS_LIMIT = 1000
#: Floors that keep a zero retention from deleting live rows.
MIN_RUNTIME_SNAPSHOT_RETENTION = 1.0
MIN_DESCRIPTOR_RETENTION = 1.0

# A runtime's snapshot row is refreshed on every publish (every ~10 s).
DELETE_STALE_RUNTIME_SNAPSHOTS_SQL = Statement("""
    DELETE FROM awa.runtime_instances
    WHERE last_seen_at < now() - make_interval(secs => :retention)
""")

# Descriptors are refreshed (last_seen_at) by every sync of a live runtime;
# nothing references them, so deleting is always safe.
DELETE_STALE_QUEUE_DESCRIPTORS_SQL = Statement("""
    DELETE FROM awa.queue_descriptors
    WHERE last_seen_at < now() - make_interval(secs => :retention)
""")
DELETE_STALE_JOB_KIND_DESCRIPTORS_SQL = Statement("""
    DELETE FROM awa.job_kind_descriptors
    WHERE last_seen_at < now() - make_interval(secs => :retention)
""")

# retention_until is stamped when the batch runner finalises an operation.
# An operation that is still pending/running is never deleted, whatever its
# retention_until says.
DELETE_EXPIRED_BATCH_OPERATIONS_SQL = Statement("""
    DELETE FROM awa.batch_operations
    WHERE id IN (
        SELECT id
        FROM awa.batch_operations
        WHERE retention_until IS NOT NULL
          AND retention_until < clock_timestamp()
          AND state IN ('completed', 'cancelled', 'failed')
        ORDER BY retention_until
        LIMIT :limit
        FOR UPDATE SKIP LOCKED
    )
""")


@dataclasses.dataclass
class CleanupResult(BodyResult):
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
    #: Dead-lettered rows deleted by the global pass (queue storage).
    dlq_purged: int = 0
    #: Dead-lettered rows deleted per queue with its own DLQ retention.
    dlq_purged_by_queue: dict[str, int] = dataclasses.field(default_factory=dict)
    #: DELETE statements run against the DLQ this tick.
    dlq_batches: int = 0

    @property
    def total_jobs_deleted(self) -> int:
        return self.jobs_deleted + sum(self.jobs_deleted_by_queue.values())

    @property
    def total_dlq_purged(self) -> int:
        return self.dlq_purged + sum(self.dlq_purged_by_queue.values())

    def add_drain(self, step: str, outcome: DrainOutcome) -> None:
        self.batches += outcome.batches
        self.longest_batch = max(self.longest_batch, outcome.longest_batch)
        if not outcome.drained and step not in self.failed_steps:
            self.unfinished_steps.append(step)


def cleanup_budget(ctx: MaintenanceContext) -> DrainBudget:
    return DrainBudget.for_interval(ctx.config, ctx.config.cleanup_interval)


async def run_cleanup(
    ctx: MaintenanceContext,
    engine_steps: Callable[[MaintenanceContext, CleanupResult, DrainBudget], Awaitable[None]],
) -> CleanupResult:
    """One cleanup tick: the engine's own steps, then the shared ones, all
    within one budget; one line if the budget ran out with work left."""
    result = CleanupResult()
    budget = cleanup_budget(ctx)
    await engine_steps(ctx, result, budget)
    await run_engine_independent_steps(ctx, result, budget)
    if result.unfinished_steps:
        log.info(
            "%s: time budget (%gs) spent after %d batches; left for the next tick: %s",
            NAME,
            budget.seconds,
            result.batches + result.dlq_batches,
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


async def delete_stale_runtime_snapshots(ctx: MaintenanceContext, result: CleanupResult) -> None:
    retention = max(ctx.config.runtime_snapshot_retention, MIN_RUNTIME_SNAPSHOT_RETENTION)
    result.runtime_snapshots_deleted = (
        await delete_step(
            ctx,
            result,
            "runtime snapshots",
            DELETE_STALE_RUNTIME_SNAPSHOTS_SQL,
            retention=retention,
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
        await delete_step(
            ctx,
            result,
            "queue descriptors",
            DELETE_STALE_QUEUE_DESCRIPTORS_SQL,
            retention=retention,
        )
        or 0
    )
    result.job_kind_descriptors_deleted = (
        await delete_step(
            ctx,
            result,
            "job kind descriptors",
            DELETE_STALE_JOB_KIND_DESCRIPTORS_SQL,
            retention=retention,
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
    result.batch_operations_deleted = await drain_step(
        ctx,
        result,
        budget or cleanup_budget(ctx),
        "expired batch operations",
        DELETE_EXPIRED_BATCH_OPERATIONS_SQL,
        EXPIRED_BATCH_OPERATIONS_LIMIT,
    )
    if result.batch_operations_deleted:
        log.info("%s: deleted %d expired batch operations", NAME, result.batch_operations_deleted)


async def drain_step(
    ctx: MaintenanceContext,
    result: CleanupResult,
    budget: DrainBudget,
    step: str,
    statement: Statement,
    batch_size: int,
    **values: Any,
) -> int:
    """Repeat one step's batched DELETE (row limit ``:limit``) while batches
    come back full and the budget lasts; returns the rows deleted."""

    async def batch() -> BatchOutcome | None:
        deleted = await delete_step(ctx, result, step, statement, **values, limit=batch_size)
        return None if deleted is None else BatchOutcome.of(deleted, batch_size)

    outcome = await drain(batch, budget=budget)
    result.add_drain(step, outcome)
    return outcome.rows


async def delete_step(
    ctx: MaintenanceContext, result: CleanupResult, step: str, statement: Statement, **values: Any
) -> int | None:
    """Run one DELETE and return its row count. A rejected statement (lock
    timeout, missing privilege, ...) is logged and recorded, and None returned,
    so the remaining steps still run; ConnectionLost propagates."""
    try:
        status = await ctx.db.execute(*statement.bind(**values))
    except LockTimeout:
        raise  # a yield: the branch retries at its next tick
    except QueryError as exc:
        log_failed_step(result, step, exc)
        return None
    return rows_affected(status)


def log_failed_step(result: CleanupResult, step: str, exc: QueryError) -> None:
    sqlstate = f" [{exc.sqlstate}]" if exc.sqlstate else ""
    result.log_error(log, "%s: failed to delete %s%s: %s", NAME, step, sqlstate, exc)
    result.failed_steps.append(step)
