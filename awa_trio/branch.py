"""One actor per maintenance branch: its own timer, its own failures.

Timing (same as awa-worker's ``tokio::time::interval`` with the first tick
skipped): ticks fall on a fixed grid ``start + k * interval``, ``k >= 1``,
so the first body runs one interval after the branch starts. Ticks that
pass while a body is still running are dropped, not bunched up: after a slow
body the branch waits for the next grid point still in the future. (Tokio's
default would fire the missed ticks back to back; a maintenance pass already
does all the work its batch limits allow, so a burst only adds load and
distorts the overrun samples.)

Failure policy:

* a :class:`~awa_trio.db.DatabaseError` or a body running past
  ``branch_timeout`` is logged with the branch name, and the branch runs
  again at its next tick;
* a body that carries on past a failure of its own (promotion of one state
  failing while the other goes on, a rescue row skipped) logs it at ERROR
  and returns it in its result's ``errors`` (:mod:`awa_trio.body`): such a
  body counts as failed too (the branch-error metric, ``last_error`` in
  /status), so a branch that fails every tick never looks healthy. Health
  is read from the result, never from the log, so no logging configuration
  can change it;
* any other exception is a bug: :func:`supervise_branch` logs it with its
  traceback and restarts that branch (its next body runs one interval
  later). More than ``branch_restart_limit`` crashes within
  ``branch_restart_window`` means the bug is not transient, so the
  supervisor raises :class:`~awa_trio.errors.LeadershipAbandoned`: the whole
  leader scope is cancelled, the lock released, and another node (perhaps
  running a fixed version) can lead. The cluster is never left silently
  without maintenance by a crashed actor.

Early wakes: a branch whose spec has ``next_wake`` (promote_scheduled,
cron_eval) may run before its next grid tick, at the time its last body
said the next piece of work falls due (at least ``min_wake_gap`` after
that body started). The grid stays where it was; an early pass goes
through the tracker like any other, so its duration counts towards
overrun hysteresis and a cooldown skips it.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import math
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import trio

from .body import errors_of
from .context import MaintenanceContext
from .db import DatabaseError, LockTimeout, describe_error, find_lock_holder
from .errors import LeadershipAbandoned
from .logs import CURRENT_BRANCH, connection_recovered

if TYPE_CHECKING:
    from .tracker_actor import TrackerClient
    from .work_summary import WorkSummary

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class BranchSpec:
    """A maintenance branch: what to run and how often."""

    #: Name used in logs, metrics and the tracker (e.g. ``promote_scheduled``).
    name: str
    #: Seconds between ticks.
    interval: float
    #: One pass of the branch. Returns a small result for tests and logs; a
    #: :class:`~awa_trio.body.BodyResult` with ``errors`` marks the pass failed.
    run_once: Callable[[MaintenanceContext], Awaitable[Any]]
    #: False tracks overruns without ever skipping bodies (terminal_count_rollup).
    cooldown: bool = True
    #: Run a first body as soon as the branch starts (cron_sync on election).
    run_immediately: bool = False
    #: From a body's result, the Trio time its next piece of work falls due
    #: (None: nothing known before the next tick). The branch then wakes
    #: at the earlier of that time and its next tick.
    next_wake: Callable[[Any], float | None] | None = None
    #: Early wakes come at least this long after the previous body started,
    #: so work due in a steady stream is batched, not run once per item.
    min_wake_gap: float = 0.0


def next_tick_after(previous_tick: float, interval: float, now: float) -> float:
    """The first grid point after ``previous_tick`` that is not in the past."""
    next_tick = previous_tick + interval
    if next_tick < now:
        missed = math.ceil((now - next_tick) / interval)
        next_tick += missed * interval
    return next_tick


class BranchSlot:
    """A running branch's current spec and context, and whether it is paused.

    The term swaps them on a live reload (:meth:`update`) and the actor picks
    them up at its next tick, keeping its grid anchor, its tracker state and
    the lock; a changed interval wakes it to re-plan that tick at once.
    """

    def __init__(self, spec: BranchSpec, ctx: MaintenanceContext, work: WorkSummary | None = None):
        self.spec = spec
        self.ctx = ctx
        #: Where the term adds up what the bodies did (its minute's log line).
        self.work = work
        #: A paused branch keeps its timer but runs no body (resume: next tick).
        self.paused = False
        #: Cancelled when a reload disables the branch.
        self.cancel_scope = trio.CancelScope()
        #: Set (and replaced) by every update: wakes the actor to re-plan.
        self.updated = trio.Event()

    def update(self, spec: BranchSpec, ctx: MaintenanceContext) -> None:
        self.spec, self.ctx = spec, ctx
        self.updated.set()
        self.updated = trio.Event()


async def run_branch(
    spec: BranchSpec, ctx: MaintenanceContext, tracker: TrackerClient, slot: BranchSlot | None = None
) -> None:
    """Tick forever (until cancelled): ask the tracker, run the body, report.
    With a ``slot``, the spec and context are read from it at every tick."""
    slot = slot or BranchSlot(spec, ctx)
    yields = YieldEpisode()
    CURRENT_BRANCH.set(slot.spec.name)
    anchor = trio.current_time()
    planned = slot.spec.interval
    tick = anchor if slot.spec.run_immediately else anchor + planned
    #: When the last body said its next work falls due (before ``tick``).
    early: float | None = None
    while True:
        updated = slot.updated
        wake = tick if early is None else min(tick, early)
        with trio.move_on_at(wake):
            await updated.wait()
        if updated.is_set():
            if slot.spec.interval != planned:
                # Reloaded: the next tick is on the new interval's grid from the last one.
                planned = slot.spec.interval
                tick = next_tick_after(anchor, planned, trio.current_time())
            continue
        spec = slot.spec
        early = None
        if not slot.paused:
            decision = await tracker.begin_tick(spec.name, spec.interval, cooldown=spec.cooldown)
            if decision.run:
                # The lock may have gone while the tracker answered: a cancel
                # of the leader scope is delivered only at a checkpoint, and
                # none lies between this reply and the body's first statement.
                await trio.lowlevel.checkpoint_if_cancelled()
                started = trio.current_time()
                outcome = await run_body(spec, slot.ctx, yields)
                await tracker.finish_tick(spec.name, trio.current_time() - started, error=outcome.error)
                if slot.work is not None:
                    slot.work.record(outcome.result)
                if spec.next_wake is not None and outcome.error is None and not outcome.yielded:
                    due = spec.next_wake(outcome.result)
                    if due is not None:
                        early = max(due, started + spec.min_wake_gap)
        now = trio.current_time()
        interval = slot.spec.interval
        if wake >= tick or tick <= now:
            # The grid tick fired, or passed while the body ran (dropped).
            anchor = tick
            tick = next_tick_after(tick, interval, now)
        elif interval != planned:
            # Reloaded while an early pass ran.
            tick = next_tick_after(anchor, interval, now)
        planned = interval
        if early is not None and early >= tick:
            early = None


@dataclasses.dataclass(frozen=True)
class BodyOutcome:
    result: Any = None
    #: One line saying what went wrong, for /status (None: the body succeeded).
    error: str | None = None
    #: A statement gave up a lock wait (statement_lock_timeout): not a failure.
    yielded: bool = False


@dataclasses.dataclass
class YieldEpisode:
    """A branch's consecutive yields: the first is logged at INFO, the rest
    only counted, and the next body that runs through says how long the
    episode lasted (a DDL of minutes would otherwise log every tick)."""

    count: int = 0
    started: float = 0.0


async def run_body(
    spec: BranchSpec, ctx: MaintenanceContext, yields: YieldEpisode | None = None
) -> BodyOutcome:
    """One body, with the expected faults logged and swallowed."""
    started = trio.current_time()
    yields = yields if yields is not None else YieldEpisode()
    if isinstance(ctx, MaintenanceContext):  # not a test's stand-in
        # The body sizes its work by its branch's interval (a rescue's drain budget).
        ctx = dataclasses.replace(ctx, interval=spec.interval)
    try:
        with trio.fail_after(ctx.config.branch_timeout):
            result = await spec.run_once(ctx)
    except LockTimeout as exc:
        # An operator's DDL (or any long lock) always wins: the statement gave
        # up its wait before PostgreSQL's deadlock detector could pick the
        # DDL, and its transaction rolled back, so the branch holds nothing.
        ctx.metrics.record_branch_yield(spec.name)
        if yields.count == 0:
            yields.started = started
            log.info(
                "%s: yielded to a lock on %s held by another session (waited statement_lock_timeout, "
                "%gs); retrying at the next tick",
                spec.name,
                await find_lock_holder(ctx.db, exc) or "a table or row",
                ctx.config.statement_lock_timeout,
            )
        else:
            log.debug("%s: yielded again (lock on %s)", spec.name, exc.relation or "a table")
        yields.count += 1
        return BodyOutcome(yielded=True)
    except DatabaseError as exc:
        ctx.metrics.record_branch_error(spec.name)
        log.error("%s: database error %s", spec.name, describe_error(exc))
        return BodyOutcome(error=f"database error {describe_error(exc)}")
    except trio.TooSlowError:
        ctx.metrics.record_branch_error(spec.name)
        log.error(
            "%s: body ran longer than branch_timeout (%.1fs) and was cancelled",
            spec.name,
            ctx.config.branch_timeout,
        )
        return BodyOutcome(error=f"ran longer than branch_timeout ({ctx.config.branch_timeout:g}s)")
    if yields.count:
        log.info(
            "%s: resumed after yielding %d time%s over %.1fs",
            spec.name,
            yields.count,
            "" if yields.count == 1 else "s",
            started - yields.started,
        )
        yields.count = 0
    errors = errors_of(result)
    if errors:
        # The body went on past failures of its own.
        ctx.metrics.record_branch_error(spec.name)
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        return BodyOutcome(result=result, error=f"{errors[0]}{more}")
    # Closes a connection-trouble episode the log filter opened (the body may
    # have logged its own errors, step by step, and still come back).
    connection_recovered(spec.name, log, since=started)
    return BodyOutcome(result=result)


async def supervise_branch(
    spec: BranchSpec,
    ctx: MaintenanceContext,
    tracker: TrackerClient,
    *,
    slot: BranchSlot | None = None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run a branch, restarting it after a crash with bounded intensity."""
    limit = ctx.config.branch_restart_limit
    window = ctx.config.branch_restart_window
    crashes: collections.deque[float] = collections.deque()
    task_status.started()
    while True:
        try:
            await run_branch(spec, ctx, tracker, slot)
        except Exception as exc:
            now = trio.current_time()
            crashes.append(now)
            while crashes and crashes[0] < now - window:
                crashes.popleft()
            if len(crashes) > limit:
                log.critical(
                    "%s: crashed %d times within %.0fs; giving up leadership so a healthy node can take over",
                    spec.name,
                    len(crashes),
                    window,
                    exc_info=exc,
                )
                raise LeadershipAbandoned(
                    f"branch {spec.name} crashed {len(crashes)} times within {window:g}s"
                ) from exc
            ctx.metrics.record_branch_error(spec.name)
            log.error(
                "%s: crashed (%d of %d allowed within %.0fs); restarting",
                spec.name,
                len(crashes),
                limit,
                window,
                exc_info=exc,
            )
