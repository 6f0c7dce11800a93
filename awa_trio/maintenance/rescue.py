"""What every rescue branch shares, whatever the engine: the drain of
batches, the one outcome type, and the side effects a committed batch owes
the outside world.

Each engine supplies only its batch (its SQL, its unique-claim fallback):
:func:`drain_rescues` runs it until one comes back short or the tick's
budget is spent, with the drain's rest between full batches.

Cancel notices go out inside each batch's transaction, before its commit:
every attempt a batch takes away from a worker (heartbeat and deadline
rescues, and every duplicate cancellation, a callback-timeout branch's
included, as awa-worker signals them; never a callback-timeout rescue, whose
handler has returned) gets ``pg_notify('awa:cancel', '{"job_id": ..,
"run_lease": ..}')``, the notice every Awa runtime listens for (awa-worker's
``cancel_listener.rs``) and answers by setting that attempt's cancel flag,
so its handler sees ``job.is_cancelled()``. Postgres delivers a notice only
when its transaction commits: a rescue that rolls back sends none, one that
commits always does. ``run_lease`` is the attempt's own: no rescue changes it
(the next claim bumps it), and the listener matches ``(job_id, run_lease)``
exactly. Each engine sends them with :func:`send_cancel_notices`.

Side effects, per batch, in this order, after its statements committed:
metrics; in-flight cancellation of the same attempts registered in this
process (:attr:`awa_trio.hooks.Hooks.in_flight`: an embedded executor does
not listen for notices); follow-up jobs, one transaction per rescued job;
then lifecycle events, handed to the hooks dispatcher without waiting (at
most ``hook_queue_size`` waiting, the rest dropped and counted). A cancel
during a batch's follow-ups (leadership lost) stands the rescue and loses
that batch's remaining follow-ups and events, as a crash would. The tick's
log lines come once, after the drain.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from ..body import BodyResult
from ..context import MaintenanceContext
from ..db import Connection
from ..hooks import FollowUpJob, Hooks, JobCancelled, JobRescued, RescueReason
from ..jobs import JobRow
from ..sql import Fragment, Statement
from .drain import BatchOutcome, DrainBudget, drain

log = logging.getLogger(__name__)

#: Event reason for a duplicate-cancelled job whose last error has no text.
DEFAULT_DUPLICATE_REASON = "rescued as duplicate: unique claim held by a newer job"
#: ``awa.dlq.reason`` of an exhausted callback timeout moved to the DLQ.
CALLBACK_TIMEOUT_DLQ_REASON = "callback_timeout"

# A follow-up job, inserted the way every Awa producer does (engine-routing,
# validating, unique-claim aware). A run_at makes it scheduled.
INSERT_FOLLOW_UP_SQL = Statement(
    """
    SELECT id
    FROM awa.insert_job_compat(
        p_kind => :kind,
        p_queue => :queue,
        p_args => :args::jsonb,
        p_state => :state::awa.job_state,
        p_priority => :priority::smallint,
        p_max_attempts => :max_attempts::smallint,
        p_run_at => :run_at::timestamptz,
        p_metadata => :metadata::jsonb,
        p_tags => :tags::text[]
    )
"""
)


#: The channel every Awa runtime listens on for cancellations of its attempts.
CANCEL_CHANNEL = "awa:cancel"

#: One cancel notice per attempt, ``{"job_id": <int>, "run_lease": <int>}``
#: (JSON numbers, as the listener parses them), unless the attempt matches
#: ``{unless}`` (an attempt of the other storage plane with the same id and
#: lease, during a transition). Returns how many went out.
CANCEL_NOTICES = Fragment(
    """
    SELECT count(pg_notify(
        'awa:cancel',
        jsonb_build_object('job_id', attempt.job_id, 'run_lease', attempt.run_lease)::text
    ))
    FROM unnest(:job_ids::bigint[], :run_leases::bigint[]) AS attempt(job_id, run_lease)
    WHERE {unless}
"""
)
#: Cancel notices for the canonical engine (nothing to tell apart).
CANCEL_NOTICES_SQL = Statement(CANCEL_NOTICES(unless="true"))


@dataclasses.dataclass(frozen=True, kw_only=True)
class Rescue:
    """What the shared loop needs of one rescue branch; each engine's rescue
    type adds its statements."""

    #: Branch name (logs, tracker).
    name: str
    #: ``awa.rescue.kind`` metric attribute: heartbeat, deadline, callback_timeout.
    metric_kind: str
    reason: RescueReason
    #: Whether attempts still running in this process are signalled.
    cancels_in_flight: bool
    #: Error entry of a job cancelled as a superseded duplicate.
    duplicate_error: str


@dataclasses.dataclass
class RescueResult(BodyResult):
    """One rescue tick (or one batch of it), on either engine."""

    #: Rows as committed: retryable, or failed for an exhausted callback
    #: (dead-lettered ones included, as ``failed``).
    rescued: list[JobRow] = dataclasses.field(default_factory=list)
    #: Rows cancelled because a newer unique duplicate holds their claim.
    duplicates_cancelled: list[JobRow] = dataclasses.field(default_factory=list)
    #: The exhausted callbacks that went to the DLQ (queue storage).
    dead_lettered: list[JobRow] = dataclasses.field(default_factory=list)
    #: Ids left untouched by the row-by-row fallback.
    skipped: list[int] = dataclasses.field(default_factory=list)
    #: Rescue statements (batches) this tick; a fallback batch counts once.
    batches: int = 0
    #: Batches redone row by row (a unique-claim conflict or a bad row).
    row_by_row_batches: int = 0
    #: False when the budget ran out with candidates possibly left.
    drained: bool = True
    #: In-flight attempts of this process that were signalled.
    cancelled_in_flight: int = 0
    #: ``awa:cancel`` notices committed with the batch.
    cancel_notices: int = 0
    follow_ups_inserted: int = 0
    #: Rescued jobs whose follow-ups failed (factory or insert); their rescue stands.
    follow_up_failures: int = 0
    #: Events the hooks dispatcher could not take.
    events_dropped: int = 0

    @property
    def row_by_row(self) -> bool:
        return self.row_by_row_batches > 0

    def merge(self, batch: RescueResult) -> None:
        """Add one batch's outcome to the tick's."""
        self.rescued += batch.rescued
        self.duplicates_cancelled += batch.duplicates_cancelled
        self.dead_lettered += batch.dead_lettered
        self.skipped += batch.skipped
        self.row_by_row_batches += batch.row_by_row_batches
        self.cancelled_in_flight += batch.cancelled_in_flight
        self.cancel_notices += batch.cancel_notices
        self.follow_ups_inserted += batch.follow_ups_inserted
        self.follow_up_failures += batch.follow_up_failures
        self.events_dropped += batch.events_dropped
        self.errors += batch.errors


#: One engine's batch: fills the part it is given (rescued, cancelled, ...)
#: and says how many rows it took; None stops the tick.
RescueBatch = Callable[[RescueResult, int], Awaitable[BatchOutcome | None]]


def rescue_budget(ctx: MaintenanceContext) -> DrainBudget:
    """The tick's budget, from the interval of the branch the body runs for
    (a body called on its own has ``drain_time_budget`` alone)."""
    if ctx.interval is None:
        return DrainBudget(ctx.config.drain_time_budget)
    return DrainBudget.for_interval(ctx.config, ctx.interval)


async def drain_rescues(
    ctx: MaintenanceContext, rescue: Rescue, batch: RescueBatch, *, budget: DrainBudget | None = None
) -> RescueResult:
    """One tick of a rescue branch: batches until one comes back short or
    the budget is spent, each batch's side effects right after it commits."""
    result = RescueResult()
    budget = budget or rescue_budget(ctx)
    batch_size = ctx.config.rescue_batch_size

    async def one_batch() -> BatchOutcome | None:
        part = RescueResult()
        taken = await batch(part, batch_size)
        await apply_side_effects(ctx, rescue, part)
        result.merge(part)
        return taken

    outcome = await drain(one_batch, budget=budget)
    result.batches = outcome.batches
    result.drained = outcome.drained
    announce(rescue, result)
    if not outcome.drained and budget.spent:
        log.info(
            "%s: time budget (%gs) spent after %d batches; the rest waits a tick",
            rescue.name,
            budget.seconds,
            outcome.batches,
        )
    return result


def announce(rescue: Rescue, result: RescueResult) -> None:
    """The tick's log lines (once, after the drain)."""
    if result.duplicates_cancelled:
        log.warning(
            "%s: cancelled %d jobs superseded by a newer unique duplicate: %s",
            rescue.name,
            len(result.duplicates_cancelled),
            job_ids(result.duplicates_cancelled),
        )
    if result.rescued:
        log.warning("%s: rescued %d jobs (%s)", rescue.name, len(result.rescued), rescue.reason)
    if result.dead_lettered:
        log.warning(
            "%s: moved %d exhausted callback timeouts to the DLQ: %s",
            rescue.name,
            len(result.dead_lettered),
            job_ids(result.dead_lettered),
        )


async def apply_side_effects(ctx: MaintenanceContext, rescue: Rescue, part: RescueResult) -> None:
    """What one committed batch owes the outside world (order in the module docstring)."""
    if part.duplicates_cancelled:
        ctx.metrics.record_rescues(
            f"{rescue.metric_kind}_duplicate_cancelled", len(part.duplicates_cancelled)
        )
    if part.rescued:
        ctx.metrics.record_rescues(rescue.metric_kind, len(part.rescued))
    for (kind, queue), count in Counter((job.kind, job.queue) for job in part.dead_lettered).items():
        ctx.metrics.record_dlq_moved(kind, queue, CALLBACK_TIMEOUT_DLQ_REASON, count)

    if part.cancel_notices:
        log.debug("%s: sent %d awa:cancel notices", rescue.name, part.cancel_notices)

    hooks: Hooks | None = ctx.hooks
    if hooks is None:
        return
    part.cancelled_in_flight = hooks.cancel_in_flight(
        attempts_to_cancel(rescue, part.rescued, part.duplicates_cancelled), part.errors
    )
    if part.cancelled_in_flight:
        log.info("%s: signalled %d attempts running in this process", rescue.name, part.cancelled_in_flight)

    for job in part.rescued:
        await insert_follow_ups(ctx, rescue, hooks, job, part)

    events: list[JobCancelled | JobRescued] = [
        JobCancelled(job, job.last_error or DEFAULT_DUPLICATE_REASON) for job in part.duplicates_cancelled
    ]
    events += [JobRescued(job, rescue.reason) for job in part.rescued]
    part.events_dropped = hooks.publish(events)


def attempts_to_cancel(
    rescue: Rescue, rescued: Sequence[JobRow], duplicates_cancelled: Sequence[JobRow]
) -> list[JobRow]:
    """The attempts a batch took away from their workers: every duplicate
    cancellation, and the rescued ones of a branch that cancels them (as
    awa-worker's ``signal_cancellation`` picks them)."""
    return [*duplicates_cancelled, *(rescued if rescue.cancels_in_flight else ())]


async def send_cancel_notices(
    conn: Connection,
    statement: Statement,
    attempts: Sequence[JobRow],
    *,
    schema: str | None = None,
) -> int:
    """``awa:cancel`` notices for ``attempts`` in ``conn``'s open transaction
    (one statement; ``statement`` is :data:`CANCEL_NOTICES_SQL` or an
    engine's variant, ``schema`` its queue-storage schema if it names one).
    They reach listeners when that transaction commits, and never if it
    rolls back. Returns how many were sent."""
    if not attempts:
        return 0
    sent = await conn.fetchval(
        *statement.bind(
            schema if "schema" in statement.slots else None,
            job_ids=[job.id for job in attempts],
            run_leases=[job.run_lease for job in attempts],
        )
    )
    return int(sent)


async def insert_follow_ups(
    ctx: MaintenanceContext, rescue: Rescue, hooks: Hooks, job: JobRow, result: RescueResult
) -> None:
    """All follow-ups of one rescued job in one transaction, after the rescue
    committed (through ``awa.insert_job_compat``, so they land on whichever
    engine is live); a failure is logged and the rescue stands."""
    if not hooks.has_follow_ups(job.kind):
        return
    try:
        follow_ups = hooks.follow_ups_for(job, rescue.reason)
    except Exception:
        # Application code: whatever it raises must not undo or stop the sweep.
        result.log_error(
            log,
            "%s: follow-up factory for %s job %s failed; the rescue stands",
            rescue.name,
            job.kind,
            job.label,
            exc_info=True,
        )
        result.follow_up_failures += 1
        return
    if not follow_ups:
        return
    try:
        async with ctx.db.transaction() as conn:
            for follow_up in follow_ups:
                await conn.fetchval(*INSERT_FOLLOW_UP_SQL.bind(**follow_up_parameters(follow_up)))
    except Exception as exc:
        # DatabaseError, or application data the driver cannot encode.
        result.log_error(
            log,
            "%s: inserting %d follow-up jobs for %s job %s failed, none inserted; the rescue stands: %s",
            rescue.name,
            len(follow_ups),
            job.kind,
            job.label,
            exc,
        )
        result.follow_up_failures += 1
        return
    result.follow_ups_inserted += len(follow_ups)
    log.info(
        "%s: inserted %d follow-up jobs for %s job %s", rescue.name, len(follow_ups), job.kind, job.label
    )


def follow_up_parameters(follow_up: FollowUpJob) -> dict[str, Any]:
    """The parameters of :data:`INSERT_FOLLOW_UP_SQL` for one follow-up."""
    return {
        "kind": follow_up.kind,
        "queue": follow_up.queue,
        "args": follow_up.args,
        "state": "available" if follow_up.run_at is None else "scheduled",
        "priority": follow_up.priority,
        "max_attempts": follow_up.max_attempts,
        "run_at": follow_up.run_at,
        "metadata": dict(follow_up.metadata),
        "tags": list(follow_up.tags),
    }


def job_ids(jobs: Sequence[JobRow], limit: int = 20) -> str:
    shown = ", ".join(job.label for job in jobs[:limit])
    return shown + (f" (+{len(jobs) - limit} more)" if len(jobs) > limit else "")
