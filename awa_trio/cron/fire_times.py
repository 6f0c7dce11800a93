"""When a schedule fires: croner's iteration rules in a time zone, and the
missed-fire policies of Awa's evaluator. Pure functions, no database.

The fires of a schedule from a start instant are what Awa's
``croner 2.2.0 iter_from(start)`` yields, which is decided on naive wall-clock
time in the schedule's zone:

* the search is inclusive at one-second resolution (sub-seconds dropped);
* a matching wall-clock time that occurs twice (autumn overlap) fires once,
  at the earlier instant; the repeated hour is not searched again;
* matching wall-clock times that do not exist (spring gap) fire once, at the
  transition instant (the first existing second after them). The search then
  resumes after the gap, so the gap's end time (``02:00`` when clocks jump
  from ``01:00``) is swallowed. When the second just before the gap fired,
  croner resumes at the gap's end and the gap fires nothing.

Two places where croner misbehaves and we do not follow it (docs/cron.md):

* croner's iterator steps ``fire + 1 s`` in absolute time, so after a fire in
  the last second before clocks go back it lands in the repeated hour and
  replays it (for ``59 59 1 * * *`` it yields the same instant forever). We
  continue after the repeated hour.
* croner gives up for good on gaps longer than an hour (``InvalidTime``: the
  schedule would never fire again); we treat every gap alike.
We also never return instants before the start (croner does when started in
the second pass of a repeated hour): on first registration such an instant
would lie before the schedule's own lookback window (``* * * * *`` in
Europe/London created at 01:30 in the repeated hour would fire 00:59 UTC at
once). The schedule's first fire is the first one its iteration reaches.

Policies (Awa's ``compute_fire_times``, whose rows we fire too): first registration fires only
the latest due fire at or after ``created_at - 1 min``; ``coalesce`` fires the
latest due fire after ``last_enqueued_at``, found by searching backwards from
now, so a day-long outage costs what a minute does; ``catch_up`` fires every
missed one, oldest first, at most ``limit`` per pass.

Zone rules come from :mod:`zoneinfo` (the system tz database, else the
``tzdata`` package); Awa embeds chrono-tz's copy. A zone whose rules
changed recently fires by whichever copy is newer until both are updated.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from .expressions import CronExpression, parse_cron_expression

ONE_SECOND = timedelta(seconds=1)
#: Most fires one schedule enqueues per evaluator pass under catch_up.
CATCH_UP_LIMIT = 1000
#: A new schedule's search starts this long before its row was created, so a
#: schedule created at 12:00:30 fires its 12:00:00 fire at once.
FIRST_REGISTRATION_LOOKBACK = timedelta(minutes=1)
#: Zone names that are files in the tz database but mean "this machine".
_MACHINE_DEPENDENT_ZONES = frozenset({"localtime", "posixrules"})


class MissedFirePolicy(enum.StrEnum):
    COALESCE = "coalesce"
    CATCH_UP = "catch_up"


class UnknownTimezoneError(ValueError):
    """Not an IANA zone name known to this machine's tz database."""


class InvalidPolicyError(ValueError):
    pass


def parse_policy(value: object) -> MissedFirePolicy:
    """Exactly ``coalesce`` or ``catch_up`` (case-sensitive, as Awa reads the same rows)."""
    if isinstance(value, str):
        try:
            return MissedFirePolicy(value)
        except ValueError:
            pass
    choices = " or ".join(repr(policy.value) for policy in MissedFirePolicy)
    raise InvalidPolicyError(f"invalid missed fire policy {value!r} (use {choices})")


@functools.cache
def _known_zone_names() -> frozenset[str]:
    return frozenset(available_timezones())


@functools.lru_cache(maxsize=1024)
def load_zone(name: str) -> ZoneInfo:
    """An IANA zone; raises :class:`UnknownTimezoneError`."""
    known = isinstance(name, str) and name not in _MACHINE_DEPENDENT_ZONES
    if not known or name not in _known_zone_names():
        raise UnknownTimezoneError(
            f"unknown timezone {name!r} (use an IANA name such as 'UTC' or 'Europe/London')"
        )
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise UnknownTimezoneError(f"unknown timezone {name!r}: {exc}") from None


def floor_to_second(instant: datetime) -> datetime:
    return instant.replace(microsecond=0)


def format_fire_time(fire_time: datetime) -> str:
    """PostgreSQL's text of a timestamptz in a UTC session, e.g.
    ``2026-11-30 17:21:24+00``: what Awa stores as ``cron_fire_time``.

    Built here rather than with ``$1::text`` so it cannot depend on the
    session's TimeZone or DateStyle.
    """
    utc = fire_time.astimezone(UTC)
    text = f"{utc.year:04d}-{utc.month:02d}-{utc.day:02d} {utc.hour:02d}:{utc.minute:02d}:{utc.second:02d}"
    if utc.microsecond:
        text += f".{utc.microsecond:06d}".rstrip("0")
    return text + "+00"


@dataclasses.dataclass(frozen=True)
class CronSchedule:
    """An expression in a zone: the fire-time arithmetic."""

    expression: CronExpression
    zone: ZoneInfo

    @classmethod
    def parse(cls, cron_expr: str, timezone_name: str) -> CronSchedule:
        return cls(parse_cron_expression(cron_expr), load_zone(timezone_name))

    # -- wall clock <-> instants ---------------------------------------------

    def wall_clock(self, instant: datetime) -> datetime:
        """The naive local time of an instant, whole seconds."""
        return floor_to_second(instant).astimezone(self.zone).replace(tzinfo=None)

    def instant_of(self, wall_clock: datetime) -> tuple[datetime, bool]:
        """croner's ``from_naive``: (instant, True if it was in a gap).

        A repeated wall-clock time is its earlier instant; a missing one is
        the transition instant that ends its gap.
        """
        earlier = wall_clock.replace(tzinfo=self.zone, fold=0).astimezone(UTC)
        if self.wall_clock(earlier) == wall_clock:
            return earlier, False
        later = wall_clock.replace(tzinfo=self.zone, fold=1).astimezone(UTC)
        if self.wall_clock(later) == wall_clock:
            return later, False
        # In a gap: the two readings straddle the transition; find the first
        # instant whose wall clock is past this one.
        low, high = min(earlier, later), max(earlier, later)
        while high - low > ONE_SECOND:
            middle = floor_to_second(low + (high - low) / 2)
            if self.wall_clock(middle) > wall_clock:
                high = middle
            else:
                low = middle
        return high, True

    def _repeated_hour_start(self, instant: datetime) -> datetime | None:
        """If ``instant`` is in the second pass of a repeated hour, the
        instant the clocks went back; otherwise None."""
        local = floor_to_second(instant).astimezone(self.zone)
        if not local.fold:
            return None
        offset = _utc_offset(local)
        low = floor_to_second(instant) - (_utc_offset(local.replace(fold=0)) - offset)
        high = floor_to_second(instant)
        while high - low > ONE_SECOND:  # low: before the transition, high: after
            middle = floor_to_second(low + (high - low) / 2)
            if middle.astimezone(self.zone).utcoffset() == offset:
                high = middle
            else:
                low = middle
        return high

    def _first_wall_clock_from(self, start: datetime) -> datetime:
        """Where the forward search begins for fires at or after ``start``."""
        went_back = self._repeated_hour_start(start)
        if went_back is not None:
            # Every wall-clock time left in the repeated hour maps to its
            # first pass, before start: resume after the hour.
            return self.wall_clock(went_back - ONE_SECOND) + ONE_SECOND
        return self.wall_clock(start)

    def _last_wall_clock_until(self, now: datetime) -> datetime:
        """The latest wall-clock time whose fire instant is at or before now."""
        went_back = self._repeated_hour_start(now)
        if went_back is not None:
            return self.wall_clock(went_back - ONE_SECOND)
        return self.wall_clock(now)

    # -- iteration -------------------------------------------------------------

    def iter_fires(self, start: datetime) -> Iterator[datetime]:
        """Fires at or after ``floor(start)``, ascending, without end."""
        start = floor_to_second(start)
        cursor = self._first_wall_clock_from(start)
        while True:
            match = self.expression.next_match(cursor)
            if match is None:
                return
            fire, _ = self.instant_of(match)
            if fire >= start:
                yield fire
            # croner resumes at fire + 1 s; never move backwards in wall-clock
            # time (that is the repeated-hour replay bug).
            cursor = max(self.wall_clock(fire + ONE_SECOND), match + ONE_SECOND)

    def fires_between(self, after: datetime, until: datetime, limit: int) -> list[datetime]:
        """Fires ``f`` with ``after < f <= until`` of the iteration from
        ``after``, oldest first, at most ``limit``."""
        fires: list[datetime] = []
        if limit <= 0:
            return fires
        for fire in self.iter_fires(after):
            if fire > until:
                break
            if fire > after:
                fires.append(fire)
                if len(fires) >= limit:
                    break
        return fires

    def next_fire_after(self, after: datetime) -> datetime | None:
        return _first_fire(self, after, after=True)

    def latest_fire(self, start: datetime, now: datetime) -> datetime | None:
        """The last fire of ``iter_fires(start)`` at or before ``now``,
        found by searching backwards from now (cost independent of the span)."""
        start = floor_to_second(start)
        if now < start:
            return None
        match = self.expression.prev_match(self._last_wall_clock_until(now))
        while match is not None:
            fire, in_gap = self.instant_of(match)
            if fire > now:
                match = self.expression.prev_match(match - ONE_SECOND)
                continue
            if fire < start:
                return None
            if in_gap:
                # The gap fires at the transition only if the iteration entered
                # the gap: it began before it, and the second just before the
                # transition did not fire (croner then resumes past the gap).
                before = self.wall_clock(fire - ONE_SECOND)
                if fire > start and not self.expression.matches(before):
                    return fire
                match = self.expression.prev_match(before)
                continue
            return fire
        return None


@functools.lru_cache(maxsize=16384)
def _first_fire(schedule: CronSchedule, start: datetime, *, after: bool) -> datetime | None:
    """The first fire of ``iter_fires(start)`` (strictly after ``start`` if
    ``after``). Memoised: the evaluator asks the same question of every idle
    schedule every second, and the answer only changes when its mark moves."""
    return next((fire for fire in schedule.iter_fires(start) if not after or fire > start), None)


def compute_fire_times(
    schedule: CronSchedule,
    *,
    policy: MissedFirePolicy,
    created_at: datetime,
    last_enqueued_at: datetime | None,
    now: datetime,
    limit: int = CATCH_UP_LIMIT,
) -> list[datetime]:
    """The fires to enqueue now, oldest first (as Awa's ``compute_fire_times``)."""
    if last_enqueued_at is None:
        start = created_at - FIRST_REGISTRATION_LOOKBACK
        first = _first_fire(schedule, floor_to_second(start), after=False)
        if first is None or first > now:
            return []
        latest = schedule.latest_fire(start, now)
        return [] if latest is None else [latest]
    first_missed = _first_fire(schedule, last_enqueued_at, after=True)
    if first_missed is None or first_missed > now:
        return []
    if policy is MissedFirePolicy.CATCH_UP:
        return schedule.fires_between(last_enqueued_at, now, limit)
    latest = schedule.latest_fire(last_enqueued_at, now)
    return [latest] if latest is not None and latest > last_enqueued_at else [first_missed]


def _utc_offset(aware: datetime) -> timedelta:
    """The offset of a datetime in a zone (never None for an aware one)."""
    offset = aware.utcoffset()
    if offset is None:
        raise ValueError(f"{aware!r} has no time zone")
    return offset
