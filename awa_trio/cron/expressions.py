"""Cron expressions that mean what they mean to Awa.

Awa v0.6.1 parses schedules with croner 2.2.0
(``Cron::new(expr).with_seconds_optional()``). croniter, which we use for the
calendar search, reads several expressions differently (seconds last, ``#``
and ``L`` ANDed with the day of month, wrap-around ranges, ``R`` and ``H``,
names in any field). So the parser here is our own: it accepts the subset of
croner's syntax whose meaning is unambiguous, expands every field to explicit
values exactly as croner does, and rejects everything else with an error that
says what to write instead. croniter then only ever sees plain value lists
over naive wall-clock times, where the two libraries agree.

Accepted (croner 2.2.0 semantics):

* 5 fields ``minute hour day-of-month month day-of-week`` (second 0), or
  6 fields with the **second first**;
* ``@yearly``, ``@annually``, ``@monthly``, ``@weekly``, ``@daily``,
  ``@hourly``, in any case;
* items ``*``, ``N``, ``N-M``, ``*/S``, ``N/S`` (N up to the field's maximum),
  ``N-M/S``, comma lists; leading zeros; any letter case;
* ``JAN``-``DEC`` in the month field and ``SUN``-``SAT`` in the day-of-week
  field; day of week 7 is Sunday (so ``1/2`` includes Sunday, as in croner);
* ``?`` as a whole day-of-month or day-of-week field (same as ``*``);
* ``L`` (last day) in the day-of-month field, also in a list (``1,L``);
* ``N#k`` (k-th weekday N of the month, k 1-5) and ``NL`` / ``N#L`` (last
  weekday N of the month) in the day-of-week field;
* when both day fields are restricted, a day matches if **either** matches
  (Vixie cron's OR; croner does this unless ``with_dom_and_dow`` is set,
  and Awa never sets it).

Rejected, although croner 2.2.0 parses them (each error says why): ``W``
(croner's "closest weekday" crosses month borders), ``1-5#2``, bare ``L``,
``7L`` and ``7#L`` in the day of week (croner parses them but never fires
them), ``?`` outside the day fields, names outside their own field (croner
reads ``0 0 * MON *`` as January), empty list items (``MON,``), ``+5``,
numbers of three or more digits, and expressions that can never fire
(``0 0 30 2 *``: croner accepts them and silently never runs the job).
"""

from __future__ import annotations

import calendar
import dataclasses
import functools
import re
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from croniter import croniter

ONE_SECOND = timedelta(seconds=1)
#: How far croniter may search for one match. Valid expressions fire at least
#: once every 28 years (the 5th Monday of February, say); this only bounds
#: the search, it never decides a fire.
MAX_YEARS_BETWEEN_MATCHES = 400

NICKNAMES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@hourly": "0 * * * *",
}
MONTH_NAMES = {
    name: number
    for number, name in enumerate(
        ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"), start=1
    )
}
WEEKDAY_NAMES = {
    name: number for number, name in enumerate(("sun", "mon", "tue", "wed", "thu", "fri", "sat"))
}


@dataclasses.dataclass(frozen=True)
class _FieldSpec:
    name: str
    low: int
    high: int
    names: dict[str, int]


SECOND, MINUTE, HOUR, DAY_OF_MONTH, MONTH, DAY_OF_WEEK = range(6)
FIELDS = (
    _FieldSpec("second", 0, 59, {}),
    _FieldSpec("minute", 0, 59, {}),
    _FieldSpec("hour", 0, 23, {}),
    _FieldSpec("day-of-month", 1, 31, {}),
    _FieldSpec("month", 1, 12, MONTH_NAMES),
    # 7 is Sunday too; croner folds it into 0 after expanding ranges and steps.
    _FieldSpec("day-of-week", 0, 7, WEEKDAY_NAMES),
)

# ASCII digits only (\d would accept other scripts' digits); at most two, as
# no field needs more.
_VALUE = r"(?:[0-9]{1,2}|[a-z]{3})"
_ITEM_RE = re.compile(
    rf"^(?:(?P<star>\*)|(?P<first>{_VALUE})(?:-(?P<last>{_VALUE}))?)(?:/(?P<step>[0-9]{{1,2}}))?$"
)
# Day of week only: "5#2" (second Friday), "5L" / "5#L" / "friL" (last Friday).
_WEEKDAY_IN_MONTH_RE = re.compile(rf"^(?P<day>{_VALUE})(?:#(?P<nth>[0-9]{{1,2}})|#?l)$")


class CronExpressionError(ValueError):
    """The text is not a cron expression awa_trio can fire exactly like Awa."""


@dataclasses.dataclass(frozen=True)
class CronExpression:
    """A parsed expression: explicit value sets per field, plus the day rule.

    ``matches`` is a direct reading of the fields (our own code, used for the
    DST rules and as the test oracle); ``next_match`` / ``prev_match`` search
    naive wall-clock time with croniter. The croniter objects are built once
    and reused (building one costs more than a search); each search is a
    synchronous call, so Trio tasks can share them, threads cannot.
    """

    text: str
    seconds: frozenset[int]
    minutes: frozenset[int]
    hours: frozenset[int]
    months: frozenset[int]
    #: Day-of-month values, and whether ``L`` (last day of the month) is listed.
    days_of_month: frozenset[int]
    last_day_of_month: bool
    #: Day-of-week values (0 = Sunday), ``N#k`` pairs, and ``NL`` weekdays.
    days_of_week: frozenset[int]
    nth_weekdays: frozenset[tuple[int, int]]
    last_weekdays: frozenset[int]
    #: croner's star flags: the raw field was exactly ``*`` or ``?``.
    any_day_of_month: bool
    any_day_of_week: bool
    #: croniter expressions (6 fields, seconds first) whose union is this one.
    search_branches: tuple[str, ...] = dataclasses.field(repr=False, compare=False)
    _searchers: tuple[croniter, ...] = dataclasses.field(repr=False, compare=False)

    @property
    def has_seconds(self) -> bool:
        return self.seconds != frozenset({0})

    def day_matches(self, year: int, month: int, day: int) -> bool:
        if self.any_day_of_month and self.any_day_of_week:
            return True
        month_length = calendar.monthrange(year, month)[1]
        by_date = day in self.days_of_month or (self.last_day_of_month and day == month_length)
        weekday = (calendar.weekday(year, month, day) + 1) % 7  # Python's Monday=0 -> cron's 1
        by_weekday = (
            weekday in self.days_of_week
            or (weekday, (day - 1) // 7 + 1) in self.nth_weekdays
            or (weekday in self.last_weekdays and day + 7 > month_length)
        )
        if self.any_day_of_month:
            return by_weekday
        if self.any_day_of_week:
            return by_date
        return by_date or by_weekday

    def matches(self, wall_clock: datetime) -> bool:
        """Does this naive wall-clock second match every field?"""
        return (
            wall_clock.second in self.seconds
            and wall_clock.minute in self.minutes
            and wall_clock.hour in self.hours
            and wall_clock.month in self.months
            and self.day_matches(wall_clock.year, wall_clock.month, wall_clock.day)
        )

    def next_match(self, wall_clock: datetime) -> datetime | None:
        """The first matching wall-clock second at or after ``wall_clock``
        (naive, whole seconds); None if there is none within the search bound."""
        from croniter import CroniterBadDateError  # loaded by the parse that built the searchers

        best = None
        start = wall_clock - ONE_SECOND  # croniter's get_next is strictly after
        for searcher in self._searchers:
            try:
                found = searcher.get_next(datetime, start_time=start)
            except CroniterBadDateError:
                continue
            if best is None or found < best:
                best = found
        return best

    def prev_match(self, wall_clock: datetime) -> datetime | None:
        """The last matching wall-clock second at or before ``wall_clock``."""
        from croniter import CroniterBadDateError

        best = None
        start = wall_clock + ONE_SECOND  # croniter's get_prev is strictly before
        for searcher in self._searchers:
            try:
                found = searcher.get_prev(datetime, start_time=start)
            except CroniterBadDateError:
                continue
            if best is None or found > best:
                best = found
        return best

    def can_fire(self) -> bool:
        """False for day-of-month/month combinations that never occur
        (``30 2``); every weekday rule occurs eventually."""
        if self.any_day_of_month or not self.any_day_of_week:
            return True
        if self.last_day_of_month:
            return True
        # 2000 is a leap year: February can have a 29th.
        longest = {month: calendar.monthrange(2000, month)[1] for month in self.months}
        return any(day <= longest[month] for day in self.days_of_month for month in self.months)


@dataclasses.dataclass
class _ParsedField:
    values: set[int]
    nth_weekdays: set[tuple[int, int]] = dataclasses.field(default_factory=set)
    last_weekdays: set[int] = dataclasses.field(default_factory=set)
    last_day_of_month: bool = False
    is_any: bool = False


def _syntax_hint(index: int) -> str:
    extras = {DAY_OF_MONTH: ", L", DAY_OF_WEEK: ", N#k, NL", MONTH: ", JAN-DEC"}.get(index, "")
    if index == DAY_OF_WEEK:
        extras += ", SUN-SAT"
    return f"use *, N, N-M, */S, N/S, N-M/S or comma lists{extras}"


def _value(token: str, index: int, *, range_end: bool = False) -> int:
    spec = FIELDS[index]
    if token.isascii() and token.isdigit():
        return int(token)
    if token in spec.names:
        number = spec.names[token]
        # croner reads "FRI-SUN" as 5-7, i.e. up to Sunday.
        return 7 if index == DAY_OF_WEEK and range_end and number == 0 else number
    if token in MONTH_NAMES or token in WEEKDAY_NAMES:
        kind = "month" if token in MONTH_NAMES else "day"
        raise CronExpressionError(
            f"{kind} name {token.upper()!r} is not allowed in the {spec.name} field "
            f"(croner would read it as a number there)"
        )
    raise CronExpressionError(f"{token!r} is not a number in the {spec.name} field")


def _check_bounds(value: int, index: int, item: str) -> None:
    spec = FIELDS[index]
    if not spec.low <= value <= spec.high:
        raise CronExpressionError(f"{item!r} is out of range {spec.low}-{spec.high} in the {spec.name} field")


def _parse_weekday_in_month(item: str, original: str, parsed: _ParsedField) -> bool:
    """``N#k``, ``NL`` and ``N#L``; False if the item is none of them."""
    match = _WEEKDAY_IN_MONTH_RE.match(item)
    if not match:
        return False
    weekday = _value(match["day"], DAY_OF_WEEK)
    _check_bounds(weekday, DAY_OF_WEEK, original)
    if match["nth"] is not None:
        nth = int(match["nth"])
        if not 1 <= nth <= 5:
            raise CronExpressionError(f"{original!r}: the occurrence after # must be 1-5")
        parsed.nth_weekdays.add((weekday % 7, nth))
    else:
        if weekday == 7:
            raise CronExpressionError(
                f"{original!r} never fires in croner 2.2.0 (Awa's parser); write 0L or SUNL "
                "for the last Sunday of the month"
            )
        parsed.last_weekdays.add(weekday)
    return True


def _parse_field(raw: str, index: int) -> _ParsedField:
    spec = FIELDS[index]
    text = raw.lower()
    if text in ("*", "?"):
        if text == "?" and index not in (DAY_OF_MONTH, DAY_OF_WEEK):
            raise CronExpressionError(
                f"'?' is only allowed as the whole day-of-month or day-of-week field, "
                f"not in the {spec.name} field"
            )
        parsed = _ParsedField(values=set(range(spec.low, spec.high + 1)), is_any=True)
    else:
        parsed = _parse_list(raw, index)
    if index == DAY_OF_WEEK and 7 in parsed.values:
        parsed.values.discard(7)
        parsed.values.add(0)
    return parsed


def _parse_list(raw: str, index: int) -> _ParsedField:
    spec = FIELDS[index]
    parsed = _ParsedField(values=set())
    for original in raw.split(","):
        item = original.lower()  # croner reads names, L and W in any case
        if not item:
            raise CronExpressionError(f"empty list item in the {spec.name} field {raw!r}")
        if "?" in item:
            raise CronExpressionError(
                f"'?' is only allowed as the whole day-of-month or day-of-week field ({raw!r})"
            )
        if index == DAY_OF_MONTH and item == "l":
            parsed.last_day_of_month = True
            continue
        if index == DAY_OF_WEEK and _parse_weekday_in_month(item, original, parsed):
            continue
        match = _ITEM_RE.match(item)
        if not match:
            if "w" in item and index == DAY_OF_MONTH:
                raise CronExpressionError(
                    f"{original!r}: W (closest weekday) is not supported; croner's W can move "
                    "the fire into the neighbouring month"
                )
            if item == "l" and index == DAY_OF_WEEK:
                raise CronExpressionError(
                    "a bare L in the day-of-week field never fires in croner 2.2.0 "
                    "(Awa's parser); write e.g. 5L for the last Friday"
                )
            raise CronExpressionError(
                f"unsupported syntax {original!r} in the {spec.name} field ({_syntax_hint(index)})"
            )
        if match["star"]:
            first, last = spec.low, spec.high
        else:
            first = _value(match["first"], index)
            if match["last"] is not None:
                last = _value(match["last"], index, range_end=True)
            else:
                # croner: "N/S" runs from N to the field's maximum (7 for weekdays).
                last = spec.high if match["step"] else first
            _check_bounds(first, index, original)
            _check_bounds(last, index, original)
            if first > last:
                raise CronExpressionError(
                    f"range {original!r} in the {spec.name} field runs backwards "
                    "(croner does not wrap around; split it into two ranges)"
                )
        step = int(match["step"]) if match["step"] else 1
        if step == 0:
            raise CronExpressionError(f"step 0 in {original!r} in the {spec.name} field")
        parsed.values.update(range(first, last + 1, step))
    return parsed


def _value_list(values: set[int] | frozenset[int]) -> str:
    return ",".join(str(value) for value in sorted(values))


def _search_branches(fields: list[_ParsedField]) -> tuple[str, ...]:
    """croniter expressions (seconds first) whose union is the expression.

    Each branch restricts at most one day field, so croniter's own
    day-of-month/day-of-week combination never comes into play; the OR is
    the union of the branches, and ``#`` / ``L`` weekday atoms and the
    last-day ``L`` get one branch each because croniter cannot list them
    next to plain values.
    """
    times = [
        "*" if fields[index].is_any else _value_list(fields[index].values) for index in (SECOND, MINUTE, HOUR)
    ]
    month = "*" if fields[MONTH].is_any else _value_list(fields[MONTH].values)
    dom, dow = fields[DAY_OF_MONTH], fields[DAY_OF_WEEK]
    # ``L`` gets a branch of its own too: croniter reads a list such as
    # ``2,3,...,31,L`` as matching the 1st (found by the brute-force check).
    date_atoms = [_value_list(dom.values)] if dom.values else []
    if dom.last_day_of_month:
        date_atoms.append("L")
    weekday_atoms = [_value_list(dow.values)] if dow.values else []
    weekday_atoms += [f"{weekday}#{nth}" for weekday, nth in sorted(dow.nth_weekdays)]
    weekday_atoms += [f"L{weekday}" for weekday in sorted(dow.last_weekdays)]

    day_pairs: list[tuple[str, str]] = []
    if dom.is_any and dow.is_any:
        day_pairs.append(("*", "*"))
    if not dom.is_any:
        day_pairs += [(atom, "*") for atom in date_atoms]
    if not dow.is_any:
        day_pairs += [("*", atom) for atom in weekday_atoms]
    return tuple(" ".join([*times, day, month, weekday]) for day, weekday in day_pairs)


@functools.lru_cache(maxsize=4096)
def parse_cron_expression(text: str) -> CronExpression:
    """Parse and validate; raises :class:`CronExpressionError` with the reason.

    Cached: the evaluator re-reads every stored expression once per second.
    """
    if not isinstance(text, str):
        raise CronExpressionError(f"a cron expression must be a string, not {type(text).__name__}")
    stripped = text.strip()
    if not stripped:
        raise CronExpressionError("the cron expression is empty")
    if stripped.startswith("@"):
        nickname = stripped.lower()
        if nickname not in NICKNAMES:
            raise CronExpressionError(f"unknown nickname {stripped!r} (supported: {', '.join(NICKNAMES)})")
        stripped = NICKNAMES[nickname]
    parts = stripped.split()
    if len(parts) == 5:
        parts.insert(0, "0")
    elif len(parts) != 6:
        raise CronExpressionError(
            f"expected 5 fields (minute hour day-of-month month day-of-week) or 6 fields "
            f"with the second first, got {len(parts)}"
        )
    fields = [_parse_field(part, index) for index, part in enumerate(parts)]
    branches = _search_branches(fields)
    # Imported here: a leader with no schedules never loads croniter.
    from croniter import CroniterError, croniter

    try:
        searchers = tuple(
            croniter(
                branch,
                datetime(2000, 1, 1),
                ret_type=datetime,
                second_at_beginning=True,
                max_years_between_matches=MAX_YEARS_BETWEEN_MATCHES,
            )
            for branch in branches
        )
    except CroniterError as exc:  # a gap between our grammar and croniter's: refuse, loudly
        raise CronExpressionError(f"{text!r} cannot be searched by croniter: {exc}") from None
    dom, dow = fields[DAY_OF_MONTH], fields[DAY_OF_WEEK]
    expression = CronExpression(
        text=text,
        seconds=frozenset(fields[SECOND].values),
        minutes=frozenset(fields[MINUTE].values),
        hours=frozenset(fields[HOUR].values),
        months=frozenset(fields[MONTH].values),
        days_of_month=frozenset(dom.values),
        last_day_of_month=dom.last_day_of_month,
        days_of_week=frozenset(dow.values),
        nth_weekdays=frozenset(dow.nth_weekdays),
        last_weekdays=frozenset(dow.last_weekdays),
        any_day_of_month=dom.is_any,
        any_day_of_week=dow.is_any,
        search_branches=branches,
        _searchers=searchers,
    )
    if not expression.can_fire():
        raise CronExpressionError(
            f"{text!r} can never fire (no month in it has those days); croner accepts it "
            "and silently never runs the job"
        )
    return expression
