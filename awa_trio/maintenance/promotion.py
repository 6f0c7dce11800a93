"""The promotion skeleton both engines' ``promote_scheduled`` run: the due
probe that spares an idle database the batch statements and tells the
branch when the next job falls due (so it wakes then, not at its next
poll), one pass per
state with a failure in one never holding up the other, the one result
type, and the row-by-row fallback a refused batch falls back to. Each
engine supplies its statements: a state's batches, and how one row is
promoted or, on a unique-claim conflict, dealt with."""

from __future__ import annotations

import dataclasses
import logging
import weakref
from collections.abc import Awaitable, Callable, Iterable, Sequence

import trio

from ..body import BodyResult
from ..context import MaintenanceContext
from ..db import ConnectionLost, Database, DatabaseError, LockTimeout, UniqueViolation, describe_error
from ..jobs import JobRow
from .planes import Planes

log = logging.getLogger(__name__)

PROMOTABLE_STATES = ("scheduled", "retryable")
#: Due jobs one batch promotes at most.
PROMOTE_BATCH_SIZE = 4096
#: Batches per state and tick; a short batch ends the state's pass sooner.
PROMOTE_MAX_BATCHES_PER_TICK = 32
#: Each promotable state as the SQL literal the engines' statements place at
#: import: a literal, not a parameter, so the planner can use the partial
#: index per state (a generic plan cannot prove it applies to a parameter).
STATE_LITERALS = {state: f"'{state}'" for state in PROMOTABLE_STATES}
#: The probe's column of seconds until a state's next job falls due.
NEXT_IN_COLUMNS = {state: f"{state}_next_in" for state in PROMOTABLE_STATES}
#: A promotion commits without waiting for its WAL flush (the WAL writer
#: flushes it within a few hundred milliseconds). On time, a leader commits
#: about once per distinct run_at instead of once per poll, and a flush per
#: commit would cost the server more than the promotion itself (measured:
#: ~0.35 ms of backend CPU and ~3 ms of wall time per commit). It is safe:
#: WAL is replayed in order, so anything durable that depends on the
#: promotion (a worker's claim, its completion) flushes the promotion with
#: it, and a promotion lost in a crash leaves its jobs due, to be promoted
#: again: never lost, never run twice.
ASYNC_COMMIT = {"synchronous_commit": "off"}


@dataclasses.dataclass
class PromoteResult(BodyResult):
    """One promotion tick, on either engine."""

    #: Jobs promoted per state this tick.
    promoted: dict[str, int] = dataclasses.field(default_factory=dict)
    #: Distinct queues that received jobs (each was notified).
    queues: set[str] = dataclasses.field(default_factory=set)
    batches: int = 0
    #: States whose batch was refused over one row and went row by row.
    row_by_row: list[str] = dataclasses.field(default_factory=list)
    #: Due jobs cancelled because another job holds their unique claim (canonical).
    duplicates_cancelled: list[JobRow] = dataclasses.field(default_factory=list)
    #: Due jobs left in place: a claim held elsewhere, or their statement failed.
    skipped: list[int] = dataclasses.field(default_factory=list)
    #: Lanes (queue, priority, shard) created for due rows that had none (queue storage).
    lanes_created: list[tuple[str, int, int]] = dataclasses.field(default_factory=list)
    #: Trio time at which the next job not yet due falls due (None: none known).
    next_due_at: float | None = None

    @property
    def total(self) -> int:
        return sum(self.promoted.values())


#: One state's batches into the result (DatabaseError: that state failed).
PromoteState = Callable[[str, PromoteResult], Awaitable[None]]


@dataclasses.dataclass(frozen=True)
class PromotedBatch:
    """What one committed batch promoted."""

    #: Trio time its statement began (the batch duration metric's start).
    started: float
    promoted: int
    #: The queues it filed jobs into, and each job's lateness in seconds.
    queues: Iterable[str]
    lateness: Iterable[float]


#: One batch of a state, given the batch size. None: no batch was committed
#: and the state's pass ends here (it went row by row instead).
PromoteBatch = Callable[[int], Awaitable[PromotedBatch | None]]
#: One due job promoted on its own: the (queue, rows) it filed, empty if
#: it had gone meanwhile.
PromoteOne = Callable[[int], Awaitable[Sequence[tuple[str, int]]]]
#: What to do with a due job whose promotion hit a unique claim held elsewhere.
OnClaimConflict = Callable[[int], Awaitable[None]]


def next_due_at(result: object) -> float | None:
    """The branch's ``next_wake``: when the pass's probe saw the next job
    fall due. During a staged transition the body serves both planes and
    returns one result per plane (None for a plane that failed): the
    earlier of the two."""
    if isinstance(result, PromoteResult):
        return result.next_due_at
    if not isinstance(result, Planes):
        return None
    times = [plane.next_due_at for plane in result.results() if isinstance(plane, PromoteResult)]
    return min((time for time in times if time is not None), default=None)


@dataclasses.dataclass
class _Forecast:
    """What the last pass's probe said comes due next: when (Trio time) and
    in which states."""

    at: float | None = None
    states: tuple[str, ...] = ()


#: Per database and probe (engine, schema): the last pass's forecast.
_FORECASTS: weakref.WeakKeyDictionary[Database, dict[str, _Forecast]] = weakref.WeakKeyDictionary()


async def promote_due(
    ctx: MaintenanceContext, name: str, due_check_sql: str, promote_state: PromoteState
) -> PromoteResult:
    """One pass: the due probe (per state, whether rows are due and the
    seconds until the first one that is not), then each due state's
    batches; a state with nothing due records an empty batch.

    A pass that wakes for a run_at the previous probe reported runs that
    state's batches first and probes after them, so the job is promoted one
    round trip sooner and the probe's next due time is read after the rows
    it just promoted (a probe before them would report one of them as next
    whenever it came due between the two statements: an empty pass). The
    delay is counted from the probe's reply, so the wake is never before
    the row's run_at by the database clock."""
    result = PromoteResult()
    started = trio.current_time()
    forecast = _FORECASTS.setdefault(ctx.db, {}).setdefault(due_check_sql, _Forecast())
    first = forecast.states if forecast.at is not None and started >= forecast.at else ()
    forecast.at, forecast.states = None, ()
    for state in first:
        await _promote_state(ctx, name, state, promote_state, result)
    try:
        due = await ctx.db.fetchone(due_check_sql)
    except LockTimeout:
        raise  # a yield: the branch retries at its next tick
    except DatabaseError as exc:
        result.log_error(log, "%s: failed to promote due jobs (due check): %s", name, describe_error(exc))
        return result
    replied = trio.current_time()
    delays = {state: due[NEXT_IN_COLUMNS[state]] for state in PROMOTABLE_STATES}
    known = [delay for delay in delays.values() if delay is not None]
    if known:
        earliest = min(known)
        result.next_due_at = replied + max(earliest, 0.0)
        forecast.at = result.next_due_at
        forecast.states = tuple(state for state, delay in delays.items() if delay == earliest)
    for state in PROMOTABLE_STATES:
        if not due[state]:
            if state not in first:
                record_empty_pass(ctx, state, result, trio.current_time() - started)
            continue
        await _promote_state(ctx, name, state, promote_state, result)
    return result


async def _promote_state(
    ctx: MaintenanceContext, name: str, state: str, promote_state: PromoteState, result: PromoteResult
) -> None:
    before = result.promoted.get(state, 0)
    try:
        await promote_state(state, result)
    except LockTimeout:
        raise  # a yield: the branch retries at its next tick
    except DatabaseError as exc:
        # A failure for one state must not keep the other one waiting.
        result.log_error(log, "%s: failed to promote %s jobs: %s", name, state, describe_error(exc))
    count = result.promoted.get(state, 0) - before
    if count:
        log.debug("%s: promoted %d %s jobs (%d queues)", name, count, state, len(result.queues))


async def promote_batches(
    ctx: MaintenanceContext,
    state: str,
    result: PromoteResult,
    batch: PromoteBatch,
    *,
    batch_size: int = PROMOTE_BATCH_SIZE,
    max_batches: int = PROMOTE_MAX_BATCHES_PER_TICK,
) -> None:
    """Up to ``max_batches`` batches of one state, each recorded in the
    metrics and the result; stop at the first short one."""
    for _ in range(max_batches):
        filed = await batch(batch_size)
        if filed is None:
            return
        ctx.metrics.record_promotion_batch(state, filed.promoted, trio.current_time() - filed.started)
        ctx.metrics.record_promotion_lateness(state, filed.lateness)
        result.batches += 1
        result.promoted[state] = result.promoted.get(state, 0) + filed.promoted
        result.queues.update(filed.queues)
        if filed.promoted < batch_size:
            return


def record_empty_pass(ctx: MaintenanceContext, state: str, result: PromoteResult, seconds: float) -> None:
    """The due check stands in for the empty batch a state would have run,
    so batch metrics and counts read as they did before the check."""
    ctx.metrics.record_promotion_batch(state, 0, seconds)
    result.batches += 1
    result.promoted.setdefault(state, 0)


async def promote_row_by_row(
    name: str,
    state: str,
    ids: Sequence[int],
    promote_one: PromoteOne,
    on_claim_conflict: OnClaimConflict,
    result: PromoteResult,
) -> None:
    """The fallback for a refused batch: each due job in its own statement,
    so only the row at fault waits; a lost connection leaves the rest for
    the next tick."""
    result.row_by_row.append(state)
    promoted = 0
    for position, job_id in enumerate(ids):
        try:
            filed = await promote_one(job_id)
        except UniqueViolation:
            await on_claim_conflict(job_id)
            continue
        except ConnectionLost as exc:
            result.log_error(
                log,
                "%s: connection lost during row-by-row promotion; %d %s jobs left for the next tick: %s",
                name,
                len(ids) - position,
                state,
                exc,
            )
            break
        except LockTimeout:
            raise  # a yield: the branch retries at its next tick
        except DatabaseError as exc:
            result.log_error(
                log,
                "%s: promoting %s job %d failed; skipping it: %s",
                name,
                state,
                job_id,
                describe_error(exc),
            )
            result.skipped.append(job_id)
            continue
        for queue, rows in filed:
            promoted += rows
            result.queues.add(queue)
    result.promoted[state] = result.promoted.get(state, 0) + promoted
