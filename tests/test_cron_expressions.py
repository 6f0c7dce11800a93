"""Cron expression parsing and calendar search: croner 2.2.0's meaning, or a
clear rejection; never a silently different fire."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from awa_trio.cron.expressions import CronExpressionError, parse_cron_expression
from awa_trio.cron.fire_times import CronSchedule

DATA = Path(__file__).parent / "data"


# -- what is accepted, and what it means -----------------------------------------


@pytest.mark.parametrize(
    ("text", "field", "expected"),
    [
        ("* * * * *", "seconds", {0}),
        ("*/15 * * * * *", "seconds", {0, 15, 30, 45}),  # 6 fields: the second first
        ("0 5 * * * *", "minutes", {5}),
        ("5-50/10 * * * *", "minutes", {5, 15, 25, 35, 45}),
        ("10/20 * * * *", "minutes", {10, 30, 50}),  # N/S runs to the field's end
        ("00 09 * * *", "hours", {9}),  # leading zeros
        ("*/90 * * * *", "minutes", {0}),  # a step wider than the range
        ("0 0 * jan-mar *", "months", {1, 2, 3}),
        ("0 0 * Jan,Jul *", "months", {1, 7}),
        ("0 0 * * 7", "days_of_week", {0}),  # 7 is Sunday
        ("0 0 * * FRI-SUN", "days_of_week", {5, 6, 0}),
        ("0 0 * * 1/2", "days_of_week", {1, 3, 5, 0}),  # croner: 1,3,5,7 -> Sunday included
        ("0 0 * * MON-FRI/2", "days_of_week", {1, 3, 5}),
        ("0 0 * * 5L", "last_weekdays", {5}),
        ("0 0 * * FRI#L", "last_weekdays", {5}),
        ("0 0 * * SUNL", "last_weekdays", {0}),
        ("0 0 * * 1#2,7#1", "nth_weekdays", {(1, 2), (0, 1)}),
        ("0 0 1,L * *", "days_of_month", {1}),
        ("@hourly", "minutes", {0}),
        ("@WEEKLY", "days_of_week", {0}),
        ("  0\t12  * * *  ", "hours", {12}),  # any whitespace between fields
    ],
)
def test_fields_expand_like_croner(text, field, expected):
    assert set(getattr(parse_cron_expression(text), field)) == expected


def test_question_mark_is_a_whole_day_field_and_means_any():
    expression = parse_cron_expression("0 0 ? * MON")
    assert expression.any_day_of_month and not expression.any_day_of_week


def test_restricted_day_of_month_and_week_combine_with_or():
    # croner without with_dom_and_dow: the 13th OR any Friday.
    expression = parse_cron_expression("0 0 13 * 5")
    assert expression.day_matches(2026, 1, 13)  # a Tuesday
    assert expression.day_matches(2026, 1, 16)  # a Friday
    assert not expression.day_matches(2026, 1, 14)


def test_nth_weekday_ors_with_restricted_day_of_month():
    # croniter would AND these (and find nothing); croner ORs them.
    schedule = CronSchedule.parse("0 0 1 * 1#2", "UTC")
    fires = list(itertools.islice(schedule.iter_fires(datetime(2026, 1, 15, tzinfo=UTC)), 3))
    assert fires == [datetime(2026, 2, 1, tzinfo=UTC), datetime(2026, 2, 9, tzinfo=UTC),
                     datetime(2026, 3, 1, tzinfo=UTC)]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty"),
        ("* * * *", "got 4"),
        ("0 0 12 * * * 2026", "got 7"),  # no year field
        ("@midnight", "unknown nickname"),
        ("@every 5m", "unknown nickname"),
        ("60 * * * *", "out of range 0-59 in the minute field"),
        ("* 24 * * *", "out of range 0-23 in the hour field"),
        ("0 0 0 * *", "out of range 1-31"),
        ("0 0 * 13 *", "out of range 1-12"),
        ("0 0 * * 8", "out of range 0-7"),
        ("*/0 * * * *", "step 0"),
        ("50-10 * * * *", "runs backwards"),
        ("0 0 * * FRI-MON", "runs backwards"),
        ("0 0 * MON *", "not allowed in the month field"),
        ("0 0 * * JUN", "not allowed in the day-of-week field"),
        ("? * * * *", "'?' is only allowed"),
        ("0 0 * * MON,", "empty list item"),
        ("0 ,0 * * *", "empty list item"),
        ("+5 * * * *", "unsupported syntax '+5'"),
        ("007 * * * *", "unsupported syntax"),
        ("H * * * *", "unsupported syntax 'H'"),
        ("R * * * *", "unsupported syntax 'R'"),
        ("0 0 15W * *", "W (closest weekday) is not supported"),
        ("0 0 LW * *", "W (closest weekday)"),
        ("0 0 L-2 * *", "unsupported syntax 'L-2'"),
        ("0 0 * * L", "bare L"),
        ("0 0 * * 7L", "never fires"),
        ("0 0 * * 7#L", "never fires"),
        ("0 0 * * 1#6", "must be 1-5"),
        ("0 0 * * 1-5#2", "unsupported syntax '1-5#2'"),
        ("0 0 30 2 *", "can never fire"),
        ("0 0 31 4,6,9,11 *", "can never fire"),
        ("٣ * * * *", "unsupported syntax"),  # a non-ASCII digit
    ],
)
def test_rejections_say_why(text, message):
    with pytest.raises(CronExpressionError) as caught:
        parse_cron_expression(text)
    assert message in str(caught.value)


def test_february_29th_is_rare_but_valid():
    schedule = CronSchedule.parse("0 0 29 2 *", "UTC")
    assert schedule.next_fire_after(datetime(2026, 1, 1, tzinfo=UTC)) == datetime(2028, 2, 29, tzinfo=UTC)


# -- croner 2.2.0 ground truth -----------------------------------------------------

# croner accepts these, we refuse them on purpose (see the expressions module docstring).
REJECTED_ON_PURPOSE = {
    "? * * * *", "0 0 * MON *", "0 0 * * JUN", "0 0 * * MON,", "0 ,0 * * *", "* * * * * ,",
    "+5 * * * *", "0 0 15W * *", "0 0 15w * *", "0 0 1W * *", "0 0 31W * *", "0 0 15W * 1",
    "0 0 * * 1-5#2",
}


def _fixture_cases(name: str):
    for line in (DATA / name).read_text().splitlines():
        if line.startswith("#") or not line.strip():
            continue
        expression, zone, start, outcome = line.split("|", 3)
        verdict, _, detail = outcome.partition(" ")
        fires = detail.split() if verdict == "OK" else []
        yield expression, zone, datetime.fromisoformat(start.replace("Z", "+00:00")), verdict, [
            datetime.fromisoformat(fire.replace("Z", "+00:00")) for fire in fires
        ]


def test_croner_ground_truth():
    """Every fixture case: croner's error -> we reject; croner's fires -> the
    same fires, except croner's instants before the start (it yields the
    repeated hour's first pass when started in its second pass)."""
    checked = 0
    for expression, zone, start, verdict, expected in _fixture_cases("croner_2_2_0_fire_times.txt"):
        case = f"{expression}|{zone}|{start}"
        try:
            schedule = CronSchedule.parse(expression, zone)
        except CronExpressionError as exc:
            # Rejecting what croner never fires ("0 0 30 2 *", "0 0 * * L") changes no fire.
            never_fires = verdict == "OK" and not expected
            assert verdict == "ERR" or never_fires or expression in REJECTED_ON_PURPOSE, (case, exc)
            continue
        assert verdict == "OK", f"croner rejects {case} but we accept it"
        floor_start = start.replace(microsecond=0)
        wanted = [fire for fire in expected if fire >= floor_start]
        got = list(itertools.islice(schedule.iter_fires(start), len(wanted)))
        assert got == wanted, case
        if len(wanted) < len(expected):  # only a start in a repeated hour's second pass
            assert start.astimezone(schedule.zone).fold == 1, case
        checked += 1
    assert checked > 300


def test_croner_ground_truth_at_dst_transitions():
    """Around each transition: the same fires as croner, except where croner
    breaks: it replays the repeated hour (forever, for a fire in its last
    second) and stops for good at gaps longer than an hour."""
    seen = set()
    for expression, zone, start, _, expected in _fixture_cases("croner_2_2_0_dst_edges.txt"):
        case = f"{expression}|{zone}|{start}"
        schedule = CronSchedule.parse(expression, zone)
        got = list(itertools.islice(schedule.iter_fires(start), 5))
        assert all(a < b for a, b in itertools.pairwise(got)), case
        replay = next((i for i in range(1, len(expected)) if expected[i] <= expected[i - 1]), None)
        if got == expected:
            seen.add("same")
        elif replay is not None:
            assert got[:replay] == expected[:replay], case
            # We resume after the repeated hour: later on the wall clock, and
            # not in the hour's second pass (croner fires a repeated time once).
            previous_wall = expected[replay - 1].astimezone(schedule.zone).replace(tzinfo=None)
            resumed = got[replay].astimezone(schedule.zone)
            assert resumed.fold == 0 and resumed.replace(tzinfo=None) > previous_wall, case
            seen.add("croner replays")
        else:
            assert zone == "Antarctica/Troll" and len(expected) < 5, case  # a two-hour gap
            assert got[: len(expected)] == expected, case
            seen.add("croner stops")
    assert seen == {"same", "croner replays", "croner stops"}


# -- calendar search against a direct reading of the fields ----------------------


def _reference_next(expression, wall_clock: datetime, days: int = 800) -> datetime | None:
    """First matching second at or after wall_clock, by walking the calendar."""
    times = sorted(itertools.product(expression.hours, expression.minutes, expression.seconds))
    day = wall_clock.date()
    for _ in range(days):
        if day.month in expression.months and expression.day_matches(day.year, day.month, day.day):
            for hour, minute, second in times:
                candidate = datetime(day.year, day.month, day.day, hour, minute, second)
                if candidate >= wall_clock:
                    return candidate
        day += timedelta(days=1)
    return None


def _reference_prev(expression, wall_clock: datetime, days: int = 800) -> datetime | None:
    times = sorted(itertools.product(expression.hours, expression.minutes, expression.seconds),
                   reverse=True)
    day = wall_clock.date()
    for _ in range(days):
        if day.month in expression.months and expression.day_matches(day.year, day.month, day.day):
            for hour, minute, second in times:
                candidate = datetime(day.year, day.month, day.day, hour, minute, second)
                if candidate <= wall_clock:
                    return candidate
        day -= timedelta(days=1)
    return None


def _items(low: int, high: int):
    value = st.integers(low, high)
    return st.one_of(
        value.map(str),
        st.tuples(value, value).map(lambda ab: f"{min(ab)}-{max(ab)}"),
        st.integers(1, high - low + 1).map(lambda step: f"*/{step}"),
        st.tuples(value, st.integers(1, high - low + 1)).map(lambda vs: f"{vs[0]}/{vs[1]}"),
    )


def _field(low: int, high: int, star: float = 0.5):
    listed = st.lists(_items(low, high), min_size=1, max_size=3).map(",".join)
    return st.one_of(st.just("*"), listed) if star else listed


DAY_OF_MONTH = st.one_of(st.just("*"), st.just("?"), st.just("L"), _field(1, 28, 0),
                         _field(1, 31, 0).map(lambda f: f + ",L"))
DAY_OF_WEEK = st.one_of(
    st.just("*"), st.just("?"), _field(0, 7, 0),
    st.tuples(st.integers(0, 7), st.integers(1, 5)).map(lambda dk: f"{dk[0]}#{dk[1]}"),
    st.integers(0, 6).map(lambda d: f"{d}L"),
    st.sampled_from(["MON-FRI", "SAT,SUN", "FRI#L", "SUN#1"]),
)


@st.composite
def expressions(draw, with_seconds=None):
    fields = [draw(_field(0, 59)), draw(_field(0, 23)), draw(DAY_OF_MONTH),
              draw(_field(1, 12, 0.8)), draw(DAY_OF_WEEK)]
    if with_seconds if with_seconds is not None else draw(st.booleans()):
        fields.insert(0, draw(_field(0, 59)))
    return " ".join(fields)


NAIVE = st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2040, 1, 1)).map(
    lambda d: d.replace(microsecond=0)
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=expressions(), wall_clock=NAIVE)
def test_search_matches_walking_the_calendar(text, wall_clock):
    try:
        expression = parse_cron_expression(text)
    except CronExpressionError:
        return  # e.g. "0 0 31 2 *": never fires
    found_next = expression.next_match(wall_clock)
    expected_next = _reference_next(expression, wall_clock)
    if expected_next is not None:
        assert found_next == expected_next
    found_prev = expression.prev_match(wall_clock)
    expected_prev = _reference_prev(expression, wall_clock)
    if expected_prev is not None:
        assert found_prev == expected_prev
    for found in (found_next, found_prev):
        assert found is None or expression.matches(found)


def test_matches_reads_last_weekday_and_nth_weekday():
    expression = parse_cron_expression("0 0 * * 5L,1#2")
    assert expression.day_matches(2026, 1, 30)  # January 2026's last Friday
    assert not expression.day_matches(2026, 1, 23)  # a Friday, not the last
    assert expression.day_matches(2026, 1, 12)  # the second Monday
    assert not expression.day_matches(2026, 1, 5)  # the first Monday


@pytest.mark.parametrize("text", ["* * * 2/1,L * *", "0 0 2-31,L * *", "0 0 15,L * *"])
def test_last_day_listed_with_other_days_never_matches_a_day_outside_them(text):
    """croniter reads ``2,...,31,L`` as matching the 1st; the searches must not
    (found by the brute-force property test)."""
    expression = parse_cron_expression(text)
    assert expression.next_match(datetime(2024, 1, 1)).day != 1
    assert expression.prev_match(datetime(2024, 1, 1, 23, 59, 59)).month == 12
