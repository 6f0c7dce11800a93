"""cron_sync and cron_eval: the two leader branches of periodic jobs.

``cron_sync`` upserts this process's registered schedules on winning
leadership and every ``cron_sync_interval`` (60 s); it never deletes rows,
because other deployments sharing the database register their own.

``cron_eval`` runs every ``cron_eval_interval`` (1 s) over **every** row in
``awa.cron_jobs`` (not only ours: the lock holder fires every deployment's
schedules): it skips paused schedules,
computes the due fires (:func:`~awa_trio.cron.fire_times.compute_fire_times`)
and enqueues them oldest first, each with the compare-and-set of
:data:`~awa_trio.cron.store.ATOMIC_ENQUEUE_SQL` chained on the previous
fire. A missed compare-and-set (another leader got there, or the schedule was
paused meanwhile) or an error stops that schedule for this pass; the others
carry on. A row whose expression, zone, policy or metadata we cannot use
is skipped every pass until someone fixes or deletes it, and logged once
(an ERROR line when the problem first appears, DEBUG while it stands); so is
a fire that ``awa.insert_job_compat`` refuses for the row's values.

The pass is evaluated against the database clock (the clock that wrote
``created_at``), so a leader with a skewed clock fires on time.

On time: each pass also finds the next fire of every schedule it read (the
first fire after its mark, memoised like the due check), and the branch
wakes then rather than at its next tick, so a fire is enqueued within a few
milliseconds of its time. A schedule whose next fire is already past (a
missed compare-and-set, an error, the catch-up limit) waits for the next
tick; so do schedules added or changed after the pass.
"""

from __future__ import annotations

import dataclasses
import logging
import weakref
from datetime import datetime, timedelta

import trio

from ..body import BodyResult
from ..branch import BranchSpec
from ..config import MaintenanceConfig
from ..context import MaintenanceContext
from ..db import Database, DatabaseError, LockTimeout, describe_error, is_row_data_error
from .expressions import CronExpressionError
from .fire_times import (
    CATCH_UP_LIMIT,
    FIRST_REGISTRATION_LOOKBACK,
    CronSchedule,
    InvalidPolicyError,
    UnknownTimezoneError,
    compute_fire_times,
    floor_to_second,
    format_fire_time,
    parse_policy,
)
from .store import CronJobRow, atomic_enqueue, list_cron_jobs, upsert_cron_job

log = logging.getLogger(__name__)

CRON_SYNC = "cron_sync"
CRON_EVAL = "cron_eval"


@dataclasses.dataclass
class CronSyncResult(BodyResult):
    #: Schedules upserted this pass, and how many of them were new rows.
    upserted: int = 0
    registered: list[str] = dataclasses.field(default_factory=list)
    failed: int = 0


@dataclasses.dataclass
class CronEvalResult(BodyResult):
    schedules: int = 0
    paused: int = 0
    #: Rows skipped because their expression, zone or policy is unreadable.
    invalid: list[str] = dataclasses.field(default_factory=list)
    #: (schedule name, job id, fire time) of every job enqueued this pass.
    enqueued: list[tuple[str, int, datetime]] = dataclasses.field(default_factory=list)
    #: Schedules whose compare-and-set missed (claimed elsewhere or paused).
    claimed_elsewhere: list[str] = dataclasses.field(default_factory=list)
    failed: list[str] = dataclasses.field(default_factory=list)
    #: Schedules that hit the catch-up limit (more fires come next pass).
    limited: list[str] = dataclasses.field(default_factory=list)
    #: The earliest fire after this pass's clock of the schedules it read.
    next_fire: datetime | None = None
    #: Trio time at which that fire falls due (set by the branch's body).
    next_due_at: float | None = None
    #: The database clock the pass evaluated against, and the Trio time its
    #: reply arrived.
    evaluated_at: datetime | None = None
    listed_at: float | None = None


async def sync_periodic_jobs(ctx: MaintenanceContext) -> CronSyncResult:
    """Upsert every registered schedule, each in its own statement, so one
    bad row cannot keep the others out."""
    result = CronSyncResult()
    for job in ctx.periodic_jobs:
        try:
            inserted = await upsert_cron_job(ctx.db, job)
        except LockTimeout:
            raise  # a yield: the branch retries at its next tick
        except DatabaseError as exc:
            result.failed += 1
            result.log_error(log, "%s: failed to sync periodic job %r: %s", CRON_SYNC, job.name, exc)
            continue
        result.upserted += 1
        if inserted:
            result.registered.append(job.name)
    if result.registered:
        log.info(
            "%s: registered %d new periodic jobs: %s",
            CRON_SYNC,
            len(result.registered),
            ", ".join(result.registered),
        )
    if result.upserted:
        log.debug("%s: synced %d periodic jobs", CRON_SYNC, result.upserted)
    return result


class ProblemLog:
    """Says each schedule's problem once: an ERROR line on the first pass
    that meets it, DEBUG while the same problem stands. A schedule that is
    fine again (or gone) is forgotten, so a new breakage is said again. A
    bad row evaluated every second would otherwise log 86,400 lines a day."""

    def __init__(self) -> None:
        self._said: dict[str, str] = {}
        self._seen: set[str] = set()

    def report(self, result: BodyResult, name: str, problem: str, message: str, *args: object) -> None:
        """Say the problem; the first time it is said (at ERROR), it is also
        one of ``result``'s errors."""
        self._seen.add(name)
        said = self._said.get(name) == problem
        self._said[name] = problem
        if said:
            log.debug(message, *args)
        else:
            result.log_error(log, message, *args)

    def end_pass(self) -> None:
        for name in self._said.keys() - self._seen:
            del self._said[name]
        self._seen = set()


#: The branch's problem log, one per database (that is, per service).
_PROBLEM_LOGS: weakref.WeakKeyDictionary[Database, ProblemLog] = weakref.WeakKeyDictionary()


#: Early wakes of cron_eval come at least this long after a pass started.
MIN_WAKE_GAP = 0.002


async def evaluate_cron_schedules(ctx: MaintenanceContext) -> CronEvalResult:
    problems = _PROBLEM_LOGS.setdefault(ctx.db, ProblemLog())
    started = trio.current_time()
    result = await evaluate_schedules(ctx.db, problems=problems)
    if result.next_fire is not None and result.evaluated_at is not None:
        # Counted from the reply that read the clock, so the wake is never
        # early by the database clock.
        delay = (result.next_fire - result.evaluated_at).total_seconds()
        result.next_due_at = (result.listed_at or started) + max(delay, 0.0)
    return result


def next_fire_due_at(result: object) -> float | None:
    """cron_eval's ``next_wake`` (None: a pass that returned nothing, e.g.
    one that yielded to a lock; the grid wakes it)."""
    return result.next_due_at if isinstance(result, CronEvalResult) else None


def _next_fire(schedule: CronSchedule, row: CronJobRow, mark: datetime | None) -> datetime | None:
    """The schedule's first fire after ``mark`` (its last enqueued fire),
    or its first fire at all when it never fired."""
    if mark is None:
        start = floor_to_second(row.created_at - FIRST_REGISTRATION_LOOKBACK)
        return schedule.next_fire_after(start - timedelta(seconds=1))
    return schedule.next_fire_after(mark)


async def evaluate_schedules(
    db: Database,
    *,
    now: datetime | None = None,
    limit: int = CATCH_UP_LIMIT,
    problems: ProblemLog | None = None,
) -> CronEvalResult:
    """One pass over every schedule. ``now`` defaults to the database clock;
    without ``problems`` (the log of earlier passes) every problem is logged."""
    result = CronEvalResult()
    problems = problems or ProblemLog()
    evaluated_at, rows = await list_cron_jobs(db)
    result.listed_at = trio.current_time()
    now = now or evaluated_at
    if now is None:  # no schedules, so no database clock and nothing to fire
        return result
    result.schedules = len(rows)
    result.evaluated_at = now
    for row in rows:
        await trio.lowlevel.checkpoint()  # fire computation is CPU; let other tasks in
        if row.is_paused:
            result.paused += 1
            log.debug("%s: schedule %r is paused", CRON_EVAL, row.name)
            continue
        fires = _due_fires(row, now, limit, result, problems)
        if not fires:
            _note_next_fire(row, row.last_enqueued_at, now, result)
            continue
        if len(fires) >= limit:
            result.limited.append(row.name)
            log.warning(
                "%s: schedule %r reached the catch-up limit of %d fires in one pass; "
                "the remaining fires follow in the next passes",
                CRON_EVAL,
                row.name,
                limit,
            )
        await _enqueue_in_order(db, row, fires, result, problems)
        if result.enqueued and result.enqueued[-1][0] == row.name and result.enqueued[-1][2] == fires[-1]:
            _note_next_fire(row, fires[-1], now, result)
    problems.end_pass()
    return result


def _note_next_fire(row: CronJobRow, mark: datetime | None, now: datetime, result: CronEvalResult) -> None:
    """Keep the earliest next fire after ``now`` of the schedules read."""
    if result.invalid and result.invalid[-1] == row.name:
        return
    try:
        schedule = CronSchedule.parse(row.cron_expr, row.timezone)
        fire = _next_fire(schedule, row, mark)
    except (CronExpressionError, UnknownTimezoneError, TypeError, ValueError, OverflowError):
        return
    if fire is not None and fire > now and (result.next_fire is None or fire < result.next_fire):
        result.next_fire = fire


def _due_fires(
    row: CronJobRow, now: datetime, limit: int, result: CronEvalResult, problems: ProblemLog
) -> list[datetime]:
    try:
        schedule = CronSchedule.parse(row.cron_expr, row.timezone)
        policy = parse_policy(row.missed_fire_policy)
    except CronExpressionError as exc:
        problem = f"invalid cron expression {row.cron_expr!r}: {exc}"
    except (UnknownTimezoneError, InvalidPolicyError) as exc:
        problem = str(exc)
    else:
        if not isinstance(row.metadata, dict):
            # The fire merges cron_name into it with ||, which would make
            # the job's metadata a JSON array instead.
            problem = f"metadata must be a JSON object, not {type(row.metadata).__name__}"
        else:
            try:
                return compute_fire_times(
                    schedule,
                    policy=policy,
                    created_at=row.created_at,
                    last_enqueued_at=row.last_enqueued_at,
                    now=now,
                    limit=limit,
                )
            except (TypeError, ValueError, OverflowError) as exc:
                # Marks no clock reaches: 'infinity' (which the driver cannot
                # compare), year 1 or 9999 (out of datetime's range when stepped).
                problem = (
                    f"cannot compute fire times from created_at {row.created_at!r} and "
                    f"last_enqueued_at {row.last_enqueued_at!r}: {exc}"
                )
    result.invalid.append(row.name)
    problems.report(result, row.name, problem, "%s: skipping schedule %r: %s", CRON_EVAL, row.name, problem)
    return []


async def _enqueue_in_order(
    db: Database, row: CronJobRow, fires: list[datetime], result: CronEvalResult, problems: ProblemLog
) -> None:
    previous = row.last_enqueued_at
    for fire in fires:
        try:
            job_id = await atomic_enqueue(db, row.name, fire, previous)
        except LockTimeout:
            raise  # a yield: the branch retries at its next tick
        except DatabaseError as exc:
            result.failed.append(row.name)
            message = "%s: failed to enqueue periodic job %r for fire time %s: %s"
            arguments = (CRON_EVAL, row.name, format_fire_time(fire), exc)
            if is_row_data_error(exc):
                # The row's own values (a priority out of range, too many tags):
                # the same refusal every pass until someone fixes the row.
                problems.report(result, row.name, describe_error(exc), message, *arguments)
            else:
                result.log_error(log, message, *arguments)
            return
        if job_id is None:
            result.claimed_elsewhere.append(row.name)
            log.debug(
                "%s: fire %s of %r was already claimed or the schedule was paused",
                CRON_EVAL,
                format_fire_time(fire),
                row.name,
            )
            return
        previous = fire
        result.enqueued.append((row.name, job_id, fire))
        # DEBUG: a schedule of every second would otherwise log 86,400 INFO
        # lines a day; the jobs themselves, the metrics and status show fires.
        log.debug(
            "%s: enqueued periodic job %r as job %d for fire time %s",
            CRON_EVAL,
            row.name,
            job_id,
            format_fire_time(fire),
        )


def cron_branches(config: MaintenanceConfig) -> list[BranchSpec]:
    """The two cron branches, for the branch registry.

    cron_sync runs at once on winning leadership, then every interval.
    cron_eval has no cooldown: a slow pass must never make the tracker skip
    the next one, or fires would be late.
    """
    return [
        BranchSpec(CRON_SYNC, config.cron_sync_interval, sync_periodic_jobs, run_immediately=True),
        BranchSpec(
            CRON_EVAL,
            config.cron_eval_interval,
            evaluate_cron_schedules,
            cooldown=False,
            run_immediately=True,
            next_wake=next_fire_due_at,
            min_wake_gap=MIN_WAKE_GAP,
        ),
    ]
