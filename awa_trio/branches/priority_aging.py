"""priority_aging: low-priority jobs that keep waiting move up, so a steady
stream of urgent work cannot starve them forever.

Each pass, ``available`` jobs with ``priority > 1`` whose ``run_at`` is at
least ``priority_aging_interval`` old gain one level (priority 1 is the
highest). The first time a job is aged its original priority is kept in
``metadata._awa_original_priority`` (the key the admin batch operations use
too, so whichever touched the job first wins); later passes leave it alone.

Canonical engine only: queue storage ages priorities at claim time and needs
no physical pass.
"""

from __future__ import annotations

import dataclasses
import logging

from ..context import MaintenanceContext

log = logging.getLogger(__name__)

NAME = "priority_aging"
#: Jobs aged per pass (upstream's fixed limit).
PRIORITY_AGING_BATCH_SIZE = 1000

# Rows a worker is claiming right now are skipped, never waited for; they are
# running by the time this pass could touch them. A priority-only update does
# not mark the admin cache dirty (its triggers watch queue, state and kind).
AGE_WAITING_PRIORITIES_SQL = """
    WITH eligible AS (
        SELECT id
        FROM awa.jobs_hot
        WHERE state = 'available'
          AND priority > 1
          AND run_at <= now() - make_interval(secs => $1)
        LIMIT $2
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
"""


@dataclasses.dataclass
class PriorityAgingResult:
    #: Jobs moved up one priority level this pass.
    aged: int = 0
    #: Distinct queues of the aged jobs.
    queues: set[str] = dataclasses.field(default_factory=set)


async def run_once(ctx: MaintenanceContext) -> PriorityAgingResult:
    result = PriorityAgingResult()
    rows = await ctx.db.fetch(
        AGE_WAITING_PRIORITIES_SQL, ctx.config.priority_aging_interval, PRIORITY_AGING_BATCH_SIZE
    )
    result.aged = len(rows)
    result.queues = {row["queue"] for row in rows}
    if result.aged:
        log.info("%s: raised the priority of %d waiting jobs in %d queues",
                 NAME, result.aged, len(result.queues))
    return result
