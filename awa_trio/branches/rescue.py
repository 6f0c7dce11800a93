"""What the three rescue branches share: the sweep, the unique-claim fallback
(#388 upstream) and the side effects of a committed rescue.

A rescue takes a job away from a worker presumed dead (stale heartbeat),
overdue (hard deadline) or never called back (callback timeout). On the
canonical engine the rescued row leaves ``awa.jobs_hot`` for
``awa.scheduled_jobs`` (``retryable``), so each batch is one statement that
locks up to ``rescue_batch_size`` candidates with ``SKIP LOCKED``, deletes
them from ``jobs_hot`` and inserts the rescued rows into ``scheduled_jobs``,
returning them. Rows never travel to the client and the cost is per rescued
row, not per table row. (Upstream UPDATEs the
``awa.jobs`` view instead, whose INSTEAD OF trigger does the same delete and
insert; but every UPDATE of that view first materialises the whole
``jobs_compat()`` function, i.e. every job in the database, on every pass.)
The unique-claim triggers fire on the base tables either way.

A sweep drains (:mod:`awa_trio.drain`): it repeats batches until one comes
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

Side effects, per batch, in this order, after its statements committed:
metrics; in-flight cancellation (heartbeat and deadline rescues, and every
duplicate cancellation); follow-up jobs, one transaction per rescued job;
then lifecycle events, handed to the hooks dispatcher without waiting (at
most ``hook_queue_size`` waiting, the rest dropped and counted). A cancel
during a batch's follow-ups (leadership lost) stands the rescue and loses
that batch's remaining follow-ups and events, as a crash would.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import Any, Protocol

from ..config import DEFAULT_RESCUE_BATCH_SIZE
from ..context import MaintenanceContext
from ..db import ConnectionLost, DatabaseError, QueryError, UniqueViolation, describe_error, row_level_refusal
from ..drain import BatchOutcome, DrainBudget, drain
from ..hooks import FollowUpJob, Hooks, JobCancelled, JobRescued, RescueReason
from ..jobs import JOB_COLUMNS, JobRow
from .unique_claims import holder_text, unique_claim_holder

log = logging.getLogger(__name__)

#: Default rows per rescue batch (and the most one fallback batch revisits);
#: the setting is ``rescue_batch_size``.
RESCUE_BATCH_SIZE = DEFAULT_RESCUE_BATCH_SIZE
#: Event reason for a duplicate-cancelled job whose last error has no text.
DEFAULT_DUPLICATE_REASON = "rescued as duplicate: unique claim held by a newer job"

#: Column list of the job tables, for the INSERT ... SELECT / RETURNING of each sweep.
JOB_COLUMNS_SQL = ", ".join(JOB_COLUMNS)

# The fallback's terminal move for a job whose rescue conflicts with a newer
# duplicate's claim. Guarded by the state the sweep found it in, so a job
# finished or rescued meanwhile is left alone. Both states live in jobs_hot,
# so it is an in-place UPDATE; `cancelled` is outside the default unique mask,
# so normally it claims nothing.
CANCEL_DUPLICATE_SQL = f"""
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
        errors = errors || jsonb_build_object('error', $3::text, 'attempt', attempt, 'at', now())
    WHERE id = $1
      AND state = $2::awa.job_state
    RETURNING {JOB_COLUMNS_SQL}
"""

# A follow-up job, inserted the way every Awa producer does (engine-routing,
# validating, unique-claim aware). A run_at makes it scheduled.
INSERT_FOLLOW_UP_SQL = """
    SELECT id
    FROM awa.insert_job_compat(
        p_kind => $1,
        p_queue => $2,
        p_args => $3::jsonb,
        p_state => $4::awa.job_state,
        p_priority => $5::smallint,
        p_max_attempts => $6::smallint,
        p_run_at => $7::timestamptz,
        p_metadata => $8::jsonb,
        p_tags => $9::text[]
    )
"""


def sql_text_literal(text: str) -> str:
    """A constant (never user input) as an SQL string literal."""
    return "'" + text.replace("'", "''") + "'"


# Heartbeat and deadline rescues: locked `running` candidates leave jobs_hot
# and enter scheduled_jobs as `retryable`, finalized, with heartbeat,
# deadline and every callback column cleared and one error entry appended;
# attempt, run_at, run_lease and progress travel unchanged. {selection} is
# either the batch (ORDER BY ... LIMIT) or one id re-checked against the
# same predicate (the row-by-row fallback).
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
    INSERT INTO awa.scheduled_jobs ({columns})
    SELECT
        id, kind, queue, args, 'retryable', priority, attempt, max_attempts,
        run_at, NULL, NULL, attempted_at, now(),
        created_at,
        errors || jsonb_build_object('error', {error}, 'attempt', attempt, 'at', now()),
        metadata, tags, unique_key, unique_states,
        NULL, NULL, NULL,
        NULL, NULL, NULL,
        run_lease, progress
    FROM taken
    RETURNING {columns}
"""


@dataclasses.dataclass(frozen=True)
class SweepStatements:
    batch_sql: str
    one_sql: str
    candidates_sql: str


def candidates_sql(predicate: str, order_by: str, limit_param: int) -> str:
    """Ids of the oldest candidates, for the row-by-row fallback."""
    return f"SELECT id FROM awa.jobs_hot WHERE {predicate} ORDER BY {order_by}, id LIMIT ${limit_param}"


def running_to_retryable_statements(
    *, predicate: str, order_by: str, error: str, next_param: int
) -> SweepStatements:
    """The three statements of a rescue that makes running jobs retryable.
    ``predicate`` may use parameters ``$1 .. $(next_param - 1)``; the row
    limit (or the job id) is ``$next_param``."""

    def statement(selection: str) -> str:
        return _RUNNING_TO_RETRYABLE_TEMPLATE.format(
            predicate=predicate,
            selection=selection,
            error=sql_text_literal(error),
            columns=JOB_COLUMNS_SQL,
        )

    return SweepStatements(
        batch_sql=statement(f"ORDER BY {order_by}, id LIMIT ${next_param}"),
        one_sql=statement(f"AND id = ${next_param}"),
        candidates_sql=candidates_sql(predicate, order_by, next_param),
    )


@dataclasses.dataclass(frozen=True)
class RescueSweep:
    """One rescue branch's SQL and vocabulary.

    The three statements take the branch's own parameters first (``params``
    of :func:`run_sweep`), then one more: ``batch_sql`` and
    ``candidates_sql`` a row limit, ``one_sql`` a job id.
    """

    #: Branch name (logs, tracker).
    name: str
    #: ``awa.rescue.kind`` metric attribute: heartbeat, deadline, callback_timeout.
    metric_kind: str
    reason: RescueReason
    #: The state a candidate is in (guards the duplicate cancellation).
    from_state: str
    #: Rescue up to N candidates, RETURNING the rescued rows.
    batch_sql: str
    #: Rescue one id if it still matches the predicate, RETURNING it.
    one_sql: str
    #: Ids of up to N candidates, for the row-by-row fallback.
    candidates_sql: str
    #: Error entry of a job cancelled as a superseded duplicate.
    duplicate_error: str
    #: Whether attempts still running in this process are signalled.
    cancels_in_flight: bool
    #: The config field holding this branch's interval (sets the drain budget);
    #: None: the budget is ``drain_time_budget`` alone.
    interval_setting: str | None = None


@dataclasses.dataclass
class RescueResult:
    #: Rows as committed: retryable (or failed, for an exhausted callback).
    rescued: list[JobRow] = dataclasses.field(default_factory=list)
    #: Rows cancelled because a newer unique duplicate holds their claim.
    duplicates_cancelled: list[JobRow] = dataclasses.field(default_factory=list)
    #: Ids left untouched by the fallback: not even cancellable, or their statement failed.
    skipped: list[int] = dataclasses.field(default_factory=list)
    #: The batch hit a unique-claim conflict and the pass went row by row.
    row_by_row: bool = False
    #: In-flight attempts of this process that were signalled.
    cancelled_in_flight: int = 0
    follow_ups_inserted: int = 0
    #: Rescued jobs whose follow-ups failed (factory or insert); their rescue stands.
    follow_up_failures: int = 0
    #: Events the hooks dispatcher could not take.
    events_dropped: int = 0
    #: Rescue statements (batches) this pass; a fallback batch counts once.
    batches: int = 0
    #: False when the budget ran out with candidates possibly left.
    drained: bool = True

    def merge(self, batch: RescueResult) -> None:
        """Add one batch's outcome to the tick's."""
        self.rescued += batch.rescued
        self.duplicates_cancelled += batch.duplicates_cancelled
        self.skipped += batch.skipped
        self.row_by_row = self.row_by_row or batch.row_by_row
        self.cancelled_in_flight += batch.cancelled_in_flight
        self.follow_ups_inserted += batch.follow_ups_inserted
        self.follow_up_failures += batch.follow_up_failures
        self.events_dropped += batch.events_dropped


def sweep_budget(ctx: MaintenanceContext, sweep: RescueSweep) -> DrainBudget:
    if sweep.interval_setting is None:
        return DrainBudget(ctx.config.drain_time_budget)
    return DrainBudget.for_interval(ctx.config, getattr(ctx.config, sweep.interval_setting))


async def run_sweep(
    ctx: MaintenanceContext, sweep: RescueSweep, *params: Any, budget: DrainBudget | None = None
) -> RescueResult:
    """One tick of a rescue branch: batches until one comes back short or the
    budget is spent, each batch's side effects right after it commits."""
    result = RescueResult()
    budget = budget or sweep_budget(ctx, sweep)
    batch_size = ctx.config.rescue_batch_size

    async def batch() -> BatchOutcome | None:
        part = RescueResult()
        taken = await rescue_batch(ctx, sweep, params, part, batch_size)
        await _apply_side_effects(ctx, sweep, part)
        result.merge(part)
        return taken

    outcome = await drain(batch, budget=budget)
    result.batches = outcome.batches
    result.drained = outcome.drained
    _announce(sweep, result)
    if not outcome.drained and budget.spent:
        log.info(
            "%s: time budget (%gs) spent after %d batches; the rest waits a tick",
            sweep.name,
            budget.seconds,
            outcome.batches,
        )
    return result


async def rescue_batch(
    ctx: MaintenanceContext,
    sweep: RescueSweep,
    params: Sequence[Any],
    part: RescueResult,
    batch_size: int,
) -> BatchOutcome | None:
    """One batched rescue statement into ``part``; on a unique-claim conflict
    or a row whose data fails the statement (an ``errors`` array that
    cannot be appended to), the same batch row by row, so that row alone
    is skipped. None: stop draining this tick."""
    try:
        records = await ctx.db.fetch(sweep.batch_sql, *params, batch_size)
    except QueryError as exc:
        problem = row_level_refusal(exc)
        if problem is None:
            raise
        log.warning(
            "%s: batched rescue %s (%s); retrying row by row", sweep.name, problem, describe_error(exc)
        )
        part.row_by_row = True
        visited = await rescue_row_by_row(ctx, sweep, params, part, limit=batch_size)
        progress = len(part.rescued) + len(part.duplicates_cancelled)
        # Go on only after a full fallback batch that moved something; its
        # skipped rows would otherwise send every batch row by row again.
        if visited == batch_size and progress:
            return BatchOutcome(progress, more=True)
        return None
    part.rescued = [JobRow.from_record(record) for record in records]
    return BatchOutcome.of(len(records), batch_size)


async def rescue_row_by_row(
    ctx: MaintenanceContext,
    sweep: RescueSweep,
    params: Sequence[Any],
    result: RescueResult,
    *,
    limit: int = RESCUE_BATCH_SIZE,
) -> int:
    """The #388 fallback: each of up to ``limit`` candidates in its own
    statement. Returns how many candidates it went through."""
    ids = [record["id"] for record in await ctx.db.fetch(sweep.candidates_sql, *params, limit)]
    for position, job_id in enumerate(ids):
        try:
            record = await ctx.db.fetchrow(sweep.one_sql, *params, job_id)
        except UniqueViolation:
            await cancel_duplicate(ctx, sweep, job_id, result)
            continue
        except ConnectionLost as exc:
            log.error(
                "%s: connection lost during row-by-row rescue; %d candidates left for the next pass: %s",
                sweep.name,
                len(ids) - position,
                exc,
            )
            return position
        except DatabaseError as exc:
            log.error("%s: rescue of job %d failed; skipping it: %s", sweep.name, job_id, exc)
            result.skipped.append(job_id)
            continue
        # None: finished, heartbeated or taken by someone else since the candidate query.
        if record is not None:
            result.rescued.append(JobRow.from_record(record))
    return len(ids)


async def cancel_duplicate(
    ctx: MaintenanceContext, sweep: RescueSweep, job_id: int, result: RescueResult
) -> None:
    holder = holder_text(await unique_claim_holder(ctx, job_id))
    try:
        record = await ctx.db.fetchrow(CANCEL_DUPLICATE_SQL, job_id, sweep.from_state, sweep.duplicate_error)
    except UniqueViolation:
        log.error(
            "%s: cannot rescue or cancel job %d: the unique claim is held by job %s and "
            "job %d's unique_states include 'cancelled'; skipping it (resolve by hand)",
            sweep.name,
            job_id,
            holder,
            job_id,
        )
        result.skipped.append(job_id)
        return
    except DatabaseError as exc:
        log.error("%s: cancelling duplicate job %d failed; skipping it: %s", sweep.name, job_id, exc)
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
    result.duplicates_cancelled.append(JobRow.from_record(record))


def _announce(sweep: RescueSweep, result: RescueResult) -> None:
    if result.duplicates_cancelled:
        log.warning(
            "%s: cancelled %d jobs superseded by a newer unique duplicate: %s",
            sweep.name,
            len(result.duplicates_cancelled),
            _ids(result.duplicates_cancelled),
        )
    if result.rescued:
        log.warning("%s: rescued %d jobs (%s)", sweep.name, len(result.rescued), sweep.reason)


async def _apply_side_effects(ctx: MaintenanceContext, sweep: RescueSweep, result: RescueResult) -> None:
    """What a committed batch owes the outside world (order in the module
    docstring); the tick's log lines come once, after the drain."""
    if result.duplicates_cancelled:
        ctx.metrics.record_rescues(
            f"{sweep.metric_kind}_duplicate_cancelled", len(result.duplicates_cancelled)
        )
    if result.rescued:
        ctx.metrics.record_rescues(sweep.metric_kind, len(result.rescued))

    hooks: Hooks | None = ctx.hooks
    if hooks is None:
        return
    signalled = list(result.duplicates_cancelled)
    if sweep.cancels_in_flight:
        signalled += result.rescued
    result.cancelled_in_flight = hooks.cancel_in_flight(signalled)
    if result.cancelled_in_flight:
        log.info("%s: signalled %d attempts running in this process", sweep.name, result.cancelled_in_flight)

    for job in result.rescued:
        await insert_follow_ups(ctx, sweep, hooks, job, result)

    events: list[JobCancelled | JobRescued] = [
        JobCancelled(job, job.last_error or DEFAULT_DUPLICATE_REASON) for job in result.duplicates_cancelled
    ]
    events += [JobRescued(job, sweep.reason) for job in result.rescued]
    result.events_dropped = hooks.publish(events)


class RescueKind(Protocol):
    """What the follow-up step needs of a rescue (either engine's)."""

    @property
    def name(self) -> str: ...
    @property
    def reason(self) -> RescueReason: ...


class FollowUpCounts(Protocol):
    follow_ups_inserted: int
    follow_up_failures: int


async def insert_follow_ups(
    ctx: MaintenanceContext, sweep: RescueKind, hooks: Hooks, job: JobRow, result: FollowUpCounts
) -> None:
    """All follow-ups of one rescued job in one transaction, after the rescue
    committed (through ``awa.insert_job_compat``, so they land on whichever
    engine is live); a failure is logged and the rescue stands. Shared by the
    queue-storage rescues."""
    if not hooks.has_follow_ups(job.kind):
        return
    try:
        follow_ups = hooks.follow_ups_for(job, sweep.reason)
    except Exception:
        # Application code: whatever it raises must not undo or stop the sweep.
        log.exception(
            "%s: follow-up factory for %s job %s failed; the rescue stands", sweep.name, job.kind, job.label
        )
        result.follow_up_failures += 1
        return
    if not follow_ups:
        return
    try:
        async with ctx.db.transaction() as conn:
            for follow_up in follow_ups:
                await conn.fetchval(INSERT_FOLLOW_UP_SQL, *follow_up_arguments(follow_up))
    except Exception as exc:
        # DatabaseError, or application data the driver cannot encode.
        log.error(
            "%s: inserting %d follow-up jobs for %s job %s failed, none inserted; the rescue stands: %s",
            sweep.name,
            len(follow_ups),
            job.kind,
            job.label,
            exc,
        )
        result.follow_up_failures += 1
        return
    result.follow_ups_inserted += len(follow_ups)
    log.info("%s: inserted %d follow-up jobs for %s job %s", sweep.name, len(follow_ups), job.kind, job.label)


def follow_up_arguments(follow_up: FollowUpJob) -> tuple[Any, ...]:
    return (
        follow_up.kind,
        follow_up.queue,
        follow_up.args,
        "available" if follow_up.run_at is None else "scheduled",
        follow_up.priority,
        follow_up.max_attempts,
        follow_up.run_at,
        dict(follow_up.metadata),
        list(follow_up.tags),
    )


def _ids(jobs: Sequence[JobRow], limit: int = 20) -> str:
    shown = ", ".join(str(job.id) for job in jobs[:limit])
    return shown + (f" (+{len(jobs) - limit} more)" if len(jobs) > limit else "")
