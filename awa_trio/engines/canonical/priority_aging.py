"""priority_aging: low-priority jobs that keep waiting move up, so a steady
stream of urgent work cannot starve them forever.

Each tick, every ``available`` job with ``priority > 1`` whose ``run_at`` is
at least ``priority_aging_interval`` old gains one level (priority 1 is the
highest), so a job rises at most one level per interval. The first time a
job is aged its original priority is kept in
``metadata._awa_original_priority`` (the key the admin batch operations use
too, so whichever touched the job first wins); later passes leave it alone.

The pass drains rather than aging a fixed 1000 jobs per tick (see
:mod:`awa_trio.maintenance.drain`): batches of ``priority_aging_batch_size``, each its
own statement, until a batch comes back short or the tick's budget is spent.
A job aged this tick must not be aged again by the next batch, and aging
does not change ``run_at``; so the pass goes level by level, most urgent
first (2, then 3, then 4): a job aged from level L lands on L - 1, a level
this tick has already finished. Each level takes at least one batch per
tick; what a spent budget leaves waits for the next tick, one interval
later.

Canonical engine only: queue storage ages priorities at claim time and needs
no physical pass.
"""

from __future__ import annotations

import dataclasses
import logging

from ...body import BodyResult
from ...context import MaintenanceContext
from ...maintenance.drain import BatchOutcome, DrainBudget, drain
from ...sql import Statement

log = logging.getLogger(__name__)

NAME = "priority_aging"
#: Least urgent priority awa allows (CHECK constraint ``priority BETWEEN 1 AND 4``).
LOWEST_PRIORITY = 4
#: Levels aged each tick, in this order (see the module docstring).
AGED_LEVELS = tuple(range(2, LOWEST_PRIORITY + 1))

# One batch of one level (:priority), of jobs available for :age seconds
# or more. Rows a worker is claiming right now are skipped, never waited
# for; they are running by the time this pass could touch them. A priority-only update does not mark the admin cache dirty (its
# triggers watch queue, state and kind). Eligible rows of a level lead its
# range of the dequeue index (queue, priority, run_at, id), so a batch reads
# little beyond the rows it ages.
AGE_WAITING_PRIORITIES_SQL = Statement("""
    WITH eligible AS (
        SELECT id
        FROM awa.jobs_hot
        WHERE state = 'available'
          AND priority = :priority
          AND run_at <= now() - make_interval(secs => :age)
        LIMIT :limit
        FOR UPDATE SKIP LOCKED
    )
    UPDATE awa.jobs_hot AS job
    SET priority = job.priority - 1,
        metadata = CASE
            WHEN job.metadata ? '_awa_original_priority' THEN job.metadata
            ELSE job.metadata || jsonb_build_object('_awa_original_priority', job.priority)
        END
    FROM eligible
    WHERE job.id = eligible.id
    RETURNING job.queue
""")


@dataclasses.dataclass
class PriorityAgingResult(BodyResult):
    #: Jobs moved up one priority level this pass.
    aged: int = 0
    #: Distinct queues of the aged jobs.
    queues: set[str] = dataclasses.field(default_factory=set)
    #: Jobs aged per starting level.
    aged_by_level: dict[int, int] = dataclasses.field(default_factory=dict)
    batches: int = 0
    #: False when the budget ran out before every level was drained.
    drained: bool = True


async def run_once(ctx: MaintenanceContext) -> PriorityAgingResult:
    config = ctx.config
    result = PriorityAgingResult()
    budget = DrainBudget.for_interval(config, config.priority_aging_interval)
    batch_size = config.priority_aging_batch_size
    for level in AGED_LEVELS:

        async def batch(level: int = level) -> BatchOutcome:
            rows = await ctx.db.fetch(
                *AGE_WAITING_PRIORITIES_SQL.bind(
                    age=config.priority_aging_interval, priority=level, limit=batch_size
                )
            )
            result.queues.update(row["queue"] for row in rows)
            return BatchOutcome.of(len(rows), batch_size)

        outcome = await drain(batch, budget=budget)
        result.batches += outcome.batches
        result.aged += outcome.rows
        if outcome.rows:
            result.aged_by_level[level] = outcome.rows
        # A spent budget still gives the next level its one batch: what it
        # ages lands on a level already done this tick.
        result.drained = result.drained and outcome.drained
    if result.aged:
        log.info(
            "%s: raised the priority of %d waiting jobs in %d queues", NAME, result.aged, len(result.queues)
        )
    if not result.drained:
        log.info(
            "%s: time budget (%gs) spent after %d batches; the rest waits a tick",
            NAME,
            budget.seconds,
            result.batches,
        )
    return result
