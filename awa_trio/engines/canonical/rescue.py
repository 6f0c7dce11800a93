"""The canonical engine's rescue sweep: its statements and the unique-claim
fallback (Awa #388), for the three rescue branches.

A rescue takes a job away from a worker presumed dead (stale heartbeat),
overdue (hard deadline) or never called back (callback timeout). On the
canonical engine the rescued row leaves ``awa.jobs_hot`` for
``awa.scheduled_jobs`` (``retryable``), so each batch is one statement that
locks up to ``rescue_batch_size`` candidates with ``SKIP LOCKED``, deletes
them from ``jobs_hot`` and inserts the rescued rows into ``scheduled_jobs``,
returning them. Rows never travel to the client and the cost is per rescued
row, not per table row. (Not through the ``awa.jobs`` view, whose INSTEAD
OF trigger does the same delete and insert: every UPDATE of that view first
materialises the whole ``jobs_compat()`` function, i.e. every job in the
database, on every pass.)
The unique-claim triggers fire on the base tables either way.

A sweep drains (:mod:`awa_trio.maintenance.drain`): it repeats batches until one comes
back short or the tick's budget (``min(drain_time_budget, interval / 2)``) is
spent, so a fleet-wide crash is rescued within one tick instead of 500 jobs
per tick. Each batch is its own statement and transaction; its side effects
run right after it commits, before the next batch.

Unique-claim fallback: a rescue re-enters ``retryable``. If a job's
``unique_states`` claim ``retryable`` but not ``running``, a newer duplicate
may have taken the claim while it ran, and the batch fails with 23505 as a
whole. Then that batch goes row by row, re-checking each row's predicate; a
row whose rescue conflicts is cancelled instead (the newer duplicate wins),
and a row that cannot even be cancelled (its mask claims ``cancelled`` too)
is skipped with an error naming the claim holder. One poisoned row never
stops the others. The drain goes on with batches after a full fallback
batch that made progress; a fallback that took nothing ends the tick.

Each rescue statement (a batch, one row of the fallback, one duplicate
cancellation) runs in a transaction with the ``awa:cancel`` notices of the
attempts it took (:func:`awa_trio.maintenance.rescue.send_cancel_notices`),
so the notices go out exactly when the rescue commits.

The drain, the outcome and the side effects of a committed batch are the
shared core's (:mod:`awa_trio.maintenance.rescue`), as on queue storage.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

from ...config import DEFAULT_RESCUE_BATCH_SIZE
from ...context import MaintenanceContext
from ...db import (
    Connection,
    ConnectionLost,
    DatabaseError,
    LockTimeout,
    QueryError,
    UniqueViolation,
    describe_error,
    row_level_refusal,
)
from ...jobs import JOB_COLUMNS, JobRow
from ...maintenance.drain import BatchOutcome, DrainBudget
from ...maintenance.rescue import (
    CANCEL_NOTICES_SQL,
    Rescue,
    RescueResult,
    attempts_to_cancel,
    drain_rescues,
    send_cancel_notices,
)
from ...sql import Fragment, Statement
from .unique_claims import holder_text, unique_claim_holder

log = logging.getLogger(__name__)

#: Default rows per rescue batch (and the most one fallback batch revisits);
#: the setting is ``rescue_batch_size``.
RESCUE_BATCH_SIZE = DEFAULT_RESCUE_BATCH_SIZE
#: Column lists of the job tables, by name, for the INSERT ... SELECT /
#: RETURNING of each sweep (``hot.``: qualified, where a statement joins).
JOB_COLUMNS_SQL = ", ".join(JOB_COLUMNS)
HOT_COLUMNS_SQL = ", ".join("hot." + column for column in JOB_COLUMNS)

# The fallback's terminal move for a job whose rescue conflicts with a newer
# duplicate's claim. Guarded by the state the sweep found it in, so a job
# finished or rescued meanwhile is left alone. Both states live in jobs_hot,
# so it is an in-place UPDATE; `cancelled` is outside the default unique mask,
# so normally it claims nothing.
CANCEL_DUPLICATE_SQL = Statement(
    """
    UPDATE awa.jobs_hot
    SET state = 'cancelled',
        finalized_at = now(),
        heartbeat_at = NULL,
        deadline_at = NULL,
        callback_id = NULL,
        callback_timeout_at = NULL,
        callback_filter = NULL,
        callback_on_complete = NULL,
        callback_on_fail = NULL,
        callback_transform = NULL,
        errors = errors || jsonb_build_object('error', :error::text, 'attempt', attempt, 'at', now())
    WHERE id = :job_id
      AND state = :state::awa.job_state
    RETURNING {columns}
""",
    columns=JOB_COLUMNS_SQL,
)

#: Which candidates a rescue statement takes ({selection}): a batch, oldest
#: first, or one id re-checked against the same predicate (the row-by-row
#: fallback).
BATCH_SELECTION = Fragment("ORDER BY {order_by}, id LIMIT :limit")
ONE_SELECTION = "AND id = :job_id"

#: A rescued row's move from ``taken`` (rows deleted from jobs_hot) into
#: scheduled_jobs as `retryable`, finalized, with heartbeat, deadline and
#: every callback column cleared and one error entry (:error) appended;
#: attempt, run_at, run_lease and progress travel unchanged. Shared with the
#: canonical drain's variant (:mod:`.canonical_drain`).
RETRY_TAKEN = Fragment("""INSERT INTO awa.scheduled_jobs ({columns})
    SELECT
        id, kind, queue, args, 'retryable' AS state, priority, attempt, max_attempts,
        run_at, NULL AS heartbeat_at, NULL AS deadline_at, attempted_at, now() AS finalized_at,
        created_at,
        errors || jsonb_build_object('error', :error::text, 'attempt', attempt, 'at', now()) AS errors,
        metadata, tags, unique_key, unique_states,
        NULL AS callback_id, NULL AS callback_timeout_at, NULL AS callback_filter,
        NULL AS callback_on_complete, NULL AS callback_on_fail, NULL AS callback_transform,
        run_lease, progress
    FROM taken
    RETURNING {columns}""")

# Heartbeat and deadline rescues: locked `running` candidates leave jobs_hot
# and enter scheduled_jobs (RETRY_TAKEN). {selection} is BATCH_SELECTION or
# ONE_SELECTION.
_RUNNING_TO_RETRYABLE_TEMPLATE = """
    WITH candidates AS (
        SELECT id
        FROM awa.jobs_hot
        WHERE {predicate}
          {selection}
        FOR UPDATE SKIP LOCKED
    ),
    taken AS (
        DELETE FROM awa.jobs_hot AS hot
        USING candidates
        WHERE hot.id = candidates.id
        RETURNING hot.*
    )
    {retry_taken}
"""
_CANDIDATES_TEMPLATE = "SELECT id FROM awa.jobs_hot WHERE {predicate} ORDER BY {order_by}, id LIMIT :limit"


@dataclasses.dataclass(frozen=True)
class SweepStatements:
    batch_sql: Statement
    one_sql: Statement
    candidates_sql: Statement


def candidates_sql(predicate: str, order_by: str) -> Statement:
    """Ids of the oldest candidates (up to ``:limit``), for the row-by-row fallback."""
    return Statement(_CANDIDATES_TEMPLATE, predicate=predicate, order_by=order_by)


def running_to_retryable_statements(*, predicate: str, order_by: str) -> SweepStatements:
    """The three statements of a rescue that makes running jobs retryable.
    ``predicate`` may use named parameters of its own (passed to
    :func:`run_sweep`); the statements add ``:limit`` (batch, candidates) or
    ``:job_id`` (one), and ``:error`` (batch, one)."""
    retry_taken = RETRY_TAKEN(columns=JOB_COLUMNS_SQL)

    def statement(selection: str) -> Statement:
        return Statement(
            _RUNNING_TO_RETRYABLE_TEMPLATE, predicate=predicate, selection=selection, retry_taken=retry_taken
        )

    return SweepStatements(
        batch_sql=statement(BATCH_SELECTION(order_by=order_by)),
        one_sql=statement(ONE_SELECTION),
        candidates_sql=candidates_sql(predicate, order_by),
    )


@dataclasses.dataclass(frozen=True)
class RescueSweep(Rescue):
    """One rescue branch's SQL and vocabulary.

    The three statements take the branch's own named parameters (``params``
    of :func:`run_sweep`), and: ``batch_sql`` ``:limit`` and ``:error``
    (``rescue_error``), ``one_sql`` ``:job_id`` and ``:error``,
    ``candidates_sql`` ``:limit``.
    """

    #: The state a candidate is in (guards the duplicate cancellation).
    from_state: str
    #: Rescue up to N candidates, RETURNING the rescued rows.
    batch_sql: Statement
    #: Rescue one id if it still matches the predicate, RETURNING it.
    one_sql: Statement
    #: Ids of up to N candidates, for the row-by-row fallback.
    candidates_sql: Statement
    #: Error entry appended to a rescued job.
    rescue_error: str
    #: The ``awa:cancel`` notices of the attempts a statement took (the
    #: canonical drain's variant skips ids a queue-storage attempt shares).
    cancel_notices_sql: Statement = CANCEL_NOTICES_SQL


async def send_notices(
    conn: Connection,
    ctx: MaintenanceContext,
    sweep: RescueSweep,
    *,
    rescued: list[JobRow] | None = None,
    cancelled: list[JobRow] | None = None,
) -> int:
    """The cancel notices of what one statement took, in its transaction."""
    return await send_cancel_notices(
        conn,
        sweep.cancel_notices_sql,
        attempts_to_cancel(sweep, rescued or [], cancelled or []),
        schema=ctx.schema.queue_storage_schema,
    )


async def run_sweep(
    ctx: MaintenanceContext, sweep: RescueSweep, *, budget: DrainBudget | None = None, **params: Any
) -> RescueResult:
    """One tick of a rescue branch (the shared drain over this engine's
    batch); ``params``: the named parameters of the sweep's predicate."""

    async def batch(part: RescueResult, batch_size: int) -> BatchOutcome | None:
        return await rescue_batch(ctx, sweep, params, part, batch_size)

    return await drain_rescues(ctx, sweep, batch, budget=budget)


async def rescue_batch(
    ctx: MaintenanceContext,
    sweep: RescueSweep,
    params: Mapping[str, Any],
    part: RescueResult,
    batch_size: int,
) -> BatchOutcome | None:
    """One batched rescue statement into ``part``; on a unique-claim conflict
    or a row whose data fails the statement (an ``errors`` array that
    cannot be appended to), the same batch row by row, so that row alone
    is skipped. None: stop draining this tick."""
    try:
        async with ctx.db.transaction() as conn:
            records = await conn.fetch(
                *sweep.batch_sql.bind(**params, error=sweep.rescue_error, limit=batch_size)
            )
            rescued = [JobRow.from_record(record) for record in records]
            notices = await send_notices(conn, ctx, sweep, rescued=rescued)
    except QueryError as exc:
        problem = row_level_refusal(exc)
        if problem is None:
            raise
        log.warning(
            "%s: batched rescue %s (%s); retrying row by row", sweep.name, problem, describe_error(exc)
        )
        part.row_by_row_batches = 1
        visited = await rescue_row_by_row(ctx, sweep, params, part, limit=batch_size)
        progress = len(part.rescued) + len(part.duplicates_cancelled)
        # Go on only after a full fallback batch that moved something; its
        # skipped rows would otherwise send every batch row by row again.
        if visited == batch_size and progress:
            return BatchOutcome(progress, more=True)
        return None
    part.rescued = rescued
    part.cancel_notices = notices
    return BatchOutcome.of(len(records), batch_size)


async def rescue_row_by_row(
    ctx: MaintenanceContext,
    sweep: RescueSweep,
    params: Mapping[str, Any],
    result: RescueResult,
    *,
    limit: int = RESCUE_BATCH_SIZE,
) -> int:
    """The #388 fallback: each of up to ``limit`` candidates in its own
    statement. Returns how many candidates it went through."""
    ids = [record["id"] for record in await ctx.db.fetch(*sweep.candidates_sql.bind(**params, limit=limit))]
    for position, job_id in enumerate(ids):
        try:
            async with ctx.db.transaction() as conn:
                record = await conn.fetchrow(
                    *sweep.one_sql.bind(**params, error=sweep.rescue_error, job_id=job_id)
                )
                rescued = [] if record is None else [JobRow.from_record(record)]
                notices = await send_notices(conn, ctx, sweep, rescued=rescued)
        except UniqueViolation:
            await cancel_duplicate(ctx, sweep, job_id, result)
            continue
        except ConnectionLost as exc:
            result.log_error(
                log,
                "%s: connection lost during row-by-row rescue; %d candidates left for the next pass: %s",
                sweep.name,
                len(ids) - position,
                exc,
            )
            return position
        except LockTimeout:
            raise  # a yield: the branch retries at its next tick
        except DatabaseError as exc:
            result.log_error(log, "%s: rescue of job %d failed; skipping it: %s", sweep.name, job_id, exc)
            result.skipped.append(job_id)
            continue
        # None (nothing rescued): finished, heartbeated or taken by someone
        # else since the candidate query.
        result.rescued += rescued
        result.cancel_notices += notices
    return len(ids)


async def cancel_duplicate(
    ctx: MaintenanceContext, sweep: RescueSweep, job_id: int, result: RescueResult
) -> None:
    holder = holder_text(await unique_claim_holder(ctx, job_id))
    try:
        async with ctx.db.transaction() as conn:
            record = await conn.fetchrow(
                *CANCEL_DUPLICATE_SQL.bind(job_id=job_id, state=sweep.from_state, error=sweep.duplicate_error)
            )
            cancelled = [] if record is None else [JobRow.from_record(record)]
            notices = await send_notices(conn, ctx, sweep, cancelled=cancelled)
    except UniqueViolation:
        result.log_error(
            log,
            "%s: cannot rescue or cancel job %d: the unique claim is held by job %s and "
            "job %d's unique_states include 'cancelled'; skipping it (resolve by hand)",
            sweep.name,
            job_id,
            holder,
            job_id,
        )
        result.skipped.append(job_id)
        return
    except LockTimeout:
        raise  # a yield: the branch retries at its next tick
    except DatabaseError as exc:
        result.log_error(
            log, "%s: cancelling duplicate job %d failed; skipping it: %s", sweep.name, job_id, exc
        )
        result.skipped.append(job_id)
        return
    if record is None:
        log.info(
            "%s: job %d left %r before it could be cancelled as a duplicate; leaving it as it is",
            sweep.name,
            job_id,
            sweep.from_state,
        )
        return
    log.warning(
        "%s: rescuing job %d conflicts with the unique claim held by job %s; "
        "cancelled job %d as a superseded duplicate",
        sweep.name,
        job_id,
        holder,
        job_id,
    )
    result.duplicates_cancelled += cancelled
    result.cancel_notices += notices
