"""promote_scheduled: move due scheduled and retryable jobs to ``available``.

Canonical engine: due rows leave ``awa.scheduled_jobs`` and enter
``awa.jobs_hot`` in one statement per batch (no rows travel to the client),
scheduled first, then retryable. Each batch is one statement, hence its own
transaction: a cancel between batches (leadership lost, shutdown) leaves
every batch either fully promoted or untouched, and a batch costs a single
round trip.

Unique-claim conflicts: a job whose ``unique_states`` claim ``available``
but not its waiting state (``scheduled`` or ``retryable``) cannot be
promoted while another job holds its claim, and the trigger refuses the
whole batch with SQLSTATE 23505, which would fail every tick and never
promote that state again. So the refused batch goes row by row; a job whose
promotion conflicts is cancelled as a duplicate (the job holding the claim
wins, as River discards such jobs when it schedules them), a job that cannot
even be cancelled is skipped with an error naming the claim holder, and
every other due job is promoted.
"""

from __future__ import annotations

import logging

import trio

from ...context import MaintenanceContext
from ...db import DatabaseError, LockTimeout, QueryError, UniqueViolation, describe_error, row_level_refusal
from ...hooks import JobCancelled
from ...jobs import JOB_COLUMNS, JobRow
from ...maintenance.promotion import (
    NEXT_IN_COLUMNS,
    PROMOTABLE_STATES,
    PROMOTE_BATCH_SIZE,
    PROMOTE_MAX_BATCHES_PER_TICK,
    STATE_LITERALS,
    PromotedBatch,
    PromoteResult,
    promote_batches,
    promote_due,
)
from ...maintenance.promotion import promote_row_by_row as shared_row_by_row
from ...sql import Fragment, Statement
from .unique_claims import holder_text, unique_claim_holder

log = logging.getLogger(__name__)

NAME = "promote_scheduled"
#: Error entry of a due job cancelled because another job holds its unique claim.
DUPLICATE_ERROR = "cancelled as duplicate: came due while another job held its unique claim"

# The state is a literal, not a parameter, so the planner can use the partial
# index `(run_at, id, queue) WHERE state = '<state>'` on scheduled_jobs; with a
# parameter a generic plan cannot prove the index applies. So each state has
# its own statement, the literal placed at import ({state}, from
# STATE_LITERALS). Everything that describes where
# a job runs (heartbeat, deadline, callback) is cleared; attempt, run_lease,
# errors and progress travel unchanged.
#
# run_at: awa.notify_new_job, which fires on jobs_hot for an available row
# with run_at <= now(), NOTIFYs 'awa:<queue>'; a channel name longer than 63
# bytes fails the whole statement (SQLSTATE 22023), and Awa allows queue
# names of 200 characters. Jobs of such a queue get a run_at one microsecond
# later, so the trigger (which could not notify them anyway) does not fire.
#
# {result}: a batch returns each job's queue and lateness (seconds from its
# run_at to now(), the promotion time), read from the deleted row since the
# filed one's run_at is now(); the one-row fallback returns the filed row.
_PROMOTE_DUE_SQL_TEMPLATE = """
    WITH due AS (
        DELETE FROM awa.scheduled_jobs
        WHERE id IN (
            SELECT id
            FROM awa.scheduled_jobs
            WHERE state = {state}::awa.job_state
              AND run_at <= now()
              {selection}
            FOR UPDATE SKIP LOCKED
        )
        RETURNING *
    ),
    filed AS (
    INSERT INTO awa.jobs_hot ({columns})
    SELECT
        id, kind, queue, args, 'available' AS state, priority, attempt, max_attempts,
        CASE WHEN octet_length('awa:' || queue) > 63 THEN now() + interval '1 microsecond'
             ELSE now() END AS run_at,
        NULL AS heartbeat_at, NULL AS deadline_at, attempted_at, finalized_at,
        created_at, errors, metadata, tags, unique_key, unique_states,
        NULL AS callback_id, NULL AS callback_timeout_at, NULL AS callback_filter,
        NULL AS callback_on_complete, NULL AS callback_on_fail, NULL AS callback_transform,
        run_lease, progress
    FROM due
    RETURNING {returning}
    )
    {result}
"""
_COLUMNS_SQL = ", ".join(JOB_COLUMNS)
# The batch's commit does not wait for its WAL flush (promotion.ASYNC_COMMIT, set by
# the statement itself: it is its own transaction, and the setting is read
# at commit). The init plan runs once, when the first promoted row is read.
_BATCH_RESULT = """SELECT due.queue, EXTRACT(EPOCH FROM now() - due.run_at)::float8 AS lateness
    FROM due
    WHERE (SELECT set_config('synchronous_commit', 'off', true)) IS NOT NULL"""
_BATCH_SELECTION = "ORDER BY run_at, id LIMIT :limit"
_ONE_SELECTION = "AND id = :job_id"
PROMOTE_DUE_SQL = {
    state: Statement(
        _PROMOTE_DUE_SQL_TEMPLATE,
        state=STATE_LITERALS[state],
        selection=_BATCH_SELECTION,
        columns=_COLUMNS_SQL,
        returning="id",
        result=_BATCH_RESULT,
    )
    for state in PROMOTABLE_STATES
}
#: The row-by-row fallback: one id, re-checked against the same predicate.
PROMOTE_ONE_SQL = {
    state: Statement(
        _PROMOTE_DUE_SQL_TEMPLATE,
        state=STATE_LITERALS[state],
        selection=_ONE_SELECTION,
        columns=_COLUMNS_SQL,
        returning=_COLUMNS_SQL,
        result="SELECT * FROM filed",
    )
    for state in PROMOTABLE_STATES
}
_DUE_IDS_TEMPLATE = """
        SELECT id
        FROM awa.scheduled_jobs
        WHERE state = {state}::awa.job_state
          AND run_at <= now()
        ORDER BY run_at, id
        LIMIT :limit
    """
DUE_IDS_SQL = {
    state: Statement(_DUE_IDS_TEMPLATE, state=STATE_LITERALS[state]) for state in PROMOTABLE_STATES
}

# The due probe, in one round trip: per state, whether rows are due and
# the seconds until the first one that is not (NULL: none). Each is an index
# probe of the state's partial run_at index (plans in
# docs/branches-canonical.md); an idle pass costs this one statement.
_STATE_PROBE = Fragment("""EXISTS (
           SELECT 1 FROM awa.scheduled_jobs
           WHERE state = {state}::awa.job_state AND run_at <= now()
       ) AS {due},
       EXTRACT(EPOCH FROM (
           SELECT run_at FROM awa.scheduled_jobs
           WHERE state = {state}::awa.job_state AND run_at > now()
           ORDER BY run_at
           LIMIT 1
       ) - now())::float8 AS {next_in}""")
DUE_STATES_SQL = Statement(
    "SELECT "
    + ",\n       ".join(
        _STATE_PROBE(state=STATE_LITERALS[state], due=state, next_in=NEXT_IN_COLUMNS[state])
        for state in PROMOTABLE_STATES
    )
)

# A due job that cannot be promoted leaves scheduled_jobs as `cancelled`
# (terminal rows live in jobs_hot), guarded by the state it was found in and
# with one error entry appended. `cancelled` is outside the default unique
# mask, so normally it claims nothing.
CANCEL_DUPLICATE_SQL = Statement(
    """
    WITH taken AS (
        DELETE FROM awa.scheduled_jobs
        WHERE id = :job_id
          AND state = :state::awa.job_state
        RETURNING *
    )
    INSERT INTO awa.jobs_hot ({columns})
    SELECT
        id, kind, queue, args, 'cancelled' AS state, priority, attempt, max_attempts,
        run_at, NULL AS heartbeat_at, NULL AS deadline_at, attempted_at, now() AS finalized_at,
        created_at,
        errors || jsonb_build_object('error', :error::text, 'attempt', attempt, 'at', now()) AS errors,
        metadata, tags, unique_key, unique_states,
        NULL AS callback_id, NULL AS callback_timeout_at, NULL AS callback_filter,
        NULL AS callback_on_complete, NULL AS callback_on_fail, NULL AS callback_transform,
        run_lease, progress
    FROM taken
    RETURNING {columns}
""",
    columns=_COLUMNS_SQL,
)


async def run_once(ctx: MaintenanceContext) -> PromoteResult:
    async def promote_state(state: str, result: PromoteResult) -> None:
        await promote_due_state(ctx, state, result)

    result = await promote_due(ctx, NAME, DUE_STATES_SQL.render(), promote_state)
    if result.duplicates_cancelled and ctx.hooks is not None:
        ctx.hooks.publish(JobCancelled(job, DUPLICATE_ERROR) for job in result.duplicates_cancelled)
    return result


async def promote_due_state(ctx: MaintenanceContext, state: str, result: PromoteResult) -> None:
    """Up to PROMOTE_MAX_BATCHES_PER_TICK batches; stop at the first short one.
    A batch refused over one row (a unique claim, a value a trigger rejects)
    goes row by row, so only that row waits."""
    statement = PROMOTE_DUE_SQL[state]

    async def batch(limit: int) -> PromotedBatch | None:
        started = trio.current_time()
        try:
            rows = await ctx.db.fetch(*statement.bind(limit=limit))
        except QueryError as exc:
            problem = row_level_refusal(exc)
            if problem is None:
                raise
            log.warning(
                "%s: a batch of %s jobs %s (%s); promoting row by row",
                NAME,
                state,
                problem,
                describe_error(exc),
            )
            await promote_row_by_row(ctx, state, result)
            # What is left is due again next tick, batched once more.
            return None
        return PromotedBatch(
            started,
            len(rows),
            queues=(row["queue"] for row in rows),
            lateness=(row["lateness"] for row in rows),
        )

    await promote_batches(
        ctx, state, result, batch, batch_size=PROMOTE_BATCH_SIZE, max_batches=PROMOTE_MAX_BATCHES_PER_TICK
    )


async def promote_row_by_row(ctx: MaintenanceContext, state: str, result: PromoteResult) -> None:
    """The fallback for a refused batch: each due job in its own statement; a
    job whose claim is held elsewhere is cancelled as a duplicate."""
    ids = [record["id"] for record in await ctx.db.fetch(*DUE_IDS_SQL[state].bind(limit=PROMOTE_BATCH_SIZE))]

    async def promote_one(job_id: int) -> list[tuple[str, int]]:
        # None: deleted, rescheduled or taken by another leader meanwhile.
        record = await ctx.db.fetchrow(*PROMOTE_ONE_SQL[state].bind(job_id=job_id))
        return [] if record is None else [(record["queue"], 1)]

    async def on_claim_conflict(job_id: int) -> None:
        await cancel_duplicate(ctx, state, job_id, result)

    await shared_row_by_row(NAME, state, ids, promote_one, on_claim_conflict, result)


async def cancel_duplicate(ctx: MaintenanceContext, state: str, job_id: int, result: PromoteResult) -> None:
    holder = holder_text(await unique_claim_holder(ctx, job_id))
    try:
        record = await ctx.db.fetchrow(
            *CANCEL_DUPLICATE_SQL.bind(job_id=job_id, state=state, error=DUPLICATE_ERROR)
        )
    except UniqueViolation:
        result.log_error(
            log,
            "%s: cannot promote or cancel %s job %d: the unique claim is held by job %s "
            "and its unique_states include 'cancelled'; leaving it (resolve by hand)",
            NAME,
            state,
            job_id,
            holder,
        )
        result.skipped.append(job_id)
        return
    except LockTimeout:
        raise  # a yield: the branch retries at its next tick
    except DatabaseError as exc:
        result.log_error(
            log,
            "%s: cancelling duplicate %s job %d failed; skipping it: %s",
            NAME,
            state,
            job_id,
            describe_error(exc),
        )
        result.skipped.append(job_id)
        return
    if record is not None:
        log.warning(
            "%s: %s job %d came due while job %s holds its unique claim; cancelled it as a duplicate",
            NAME,
            state,
            job_id,
            holder,
        )
        result.duplicates_cancelled.append(JobRow.from_record(record))
