"""promote_scheduled: move due scheduled and retryable jobs to ``available``.

Canonical engine: due rows leave ``awa.scheduled_jobs`` and enter
``awa.jobs_hot`` in one statement per batch (no rows travel to the client),
scheduled first, then retryable. Each batch is one statement, hence its own
transaction: a cancel between batches (leadership lost, shutdown) leaves
every batch either fully promoted or untouched, and a batch costs a single
round trip.
"""

from __future__ import annotations

import dataclasses
import logging

import trio

from ..context import MaintenanceContext
from ..db import DatabaseError, describe_error

log = logging.getLogger(__name__)

NAME = "promote_scheduled"
PROMOTE_BATCH_SIZE = 4096
PROMOTE_MAX_BATCHES_PER_TICK = 32
#: Promoted in this order each tick.
PROMOTABLE_STATES = ("scheduled", "retryable")

# The state is a literal, not a parameter, so the planner can use the partial
# index `(run_at, id, queue) WHERE state = '<state>'` on scheduled_jobs; with a
# parameter it cannot prove the index applies. Everything that describes where
# a job runs (heartbeat, deadline, callback) is cleared; attempt, run_lease,
# errors and progress travel unchanged.
_PROMOTE_DUE_SQL_TEMPLATE = """
    WITH due AS (
        DELETE FROM awa.scheduled_jobs
        WHERE id IN (
            SELECT id
            FROM awa.scheduled_jobs
            WHERE state = '{state}'::awa.job_state
              AND run_at <= now()
            ORDER BY run_at, id
            LIMIT $1
            FOR UPDATE SKIP LOCKED
        )
        RETURNING *
    )
    INSERT INTO awa.jobs_hot (
        id, kind, queue, args, state, priority, attempt, max_attempts,
        run_at, heartbeat_at, deadline_at, attempted_at, finalized_at,
        created_at, errors, metadata, tags, unique_key, unique_states,
        callback_id, callback_timeout_at, callback_filter,
        callback_on_complete, callback_on_fail, callback_transform,
        run_lease, progress
    )
    SELECT
        id, kind, queue, args, 'available', priority, attempt, max_attempts,
        now(), NULL, NULL, attempted_at, finalized_at,
        created_at, errors, metadata, tags, unique_key, unique_states,
        NULL, NULL, NULL,
        NULL, NULL, NULL,
        run_lease, progress
    FROM due
    RETURNING queue
"""
PROMOTE_DUE_SQL = {
    state: _PROMOTE_DUE_SQL_TEMPLATE.format(state=state) for state in PROMOTABLE_STATES
}


@dataclasses.dataclass
class PromoteResult:
    #: Jobs promoted per state this tick.
    promoted: dict[str, int] = dataclasses.field(default_factory=dict)
    #: Distinct queues that received jobs.
    queues: set[str] = dataclasses.field(default_factory=set)
    batches: int = 0


async def run_once(ctx: MaintenanceContext) -> PromoteResult:
    result = PromoteResult()
    for state in PROMOTABLE_STATES:
        try:
            await promote_due_state(ctx, state, result)
        except DatabaseError as exc:
            # A failure for one state must not keep the other one waiting.
            log.error("%s: failed to promote %s jobs: %s", NAME, state, describe_error(exc))
        count = result.promoted.get(state, 0)
        if count:
            log.info("%s: promoted %d %s jobs", NAME, count, state)
    return result


async def promote_due_state(ctx: MaintenanceContext, state: str, result: PromoteResult) -> None:
    """Up to PROMOTE_MAX_BATCHES_PER_TICK batches; stop at the first short one."""
    sql = PROMOTE_DUE_SQL[state]
    for _ in range(PROMOTE_MAX_BATCHES_PER_TICK):
        started = trio.current_time()
        rows = await ctx.db.fetch(sql, PROMOTE_BATCH_SIZE)
        promoted = len(rows)
        ctx.metrics.record_promotion_batch(state, promoted, trio.current_time() - started)
        result.batches += 1
        result.promoted[state] = result.promoted.get(state, 0) + promoted
        result.queues.update(row["queue"] for row in rows)
        if promoted < PROMOTE_BATCH_SIZE:
            return
