"""Fire times: the seed's compute_fire_times cases, DST, and properties
against a brute-force reading of croner's rules, second by second."""

from __future__ import annotations

import functools
import itertools
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from test_cron_expressions import expressions

from awa_trio.cron.expressions import CronExpression, CronExpressionError
from awa_trio.cron.fire_times import (
    CATCH_UP_LIMIT,
    CronSchedule,
    MissedFirePolicy,
    compute_fire_times,
    format_fire_time,
)

SECOND = timedelta(seconds=1)
COALESCE, CATCH_UP = MissedFirePolicy.COALESCE, MissedFirePolicy.CATCH_UP


def utc(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)


def fires_for(expression, *, policy, last, now, created_at=None, zone="UTC", limit=CATCH_UP_LIMIT):
    return compute_fire_times(
        CronSchedule.parse(expression, zone),
        policy=policy,
        created_at=created_at if created_at is not None else last,
        last_enqueued_at=last,
        now=now,
        limit=limit,
    )


# -- the seed's compute_fire_times tests (awa-worker maintenance.rs) --------------


def test_coalesces_missed_existing_fires_by_default():
    last, now = utc(2026, 5, 7, 12, 0, 0), utc(2026, 5, 7, 12, 0, 20)
    assert fires_for("*/5 * * * * *", policy=COALESCE, last=last, now=now) == [utc(2026, 5, 7, 12, 0, 20)]


def test_coalesces_to_latest_fire_after_long_outage():
    last, now = utc(2026, 5, 6, 12, 0, 0), utc(2026, 5, 7, 12, 0, 20)
    fires = fires_for("*/1 * * * * *", policy=COALESCE, last=last, now=now, limit=2)
    assert fires == [utc(2026, 5, 7, 12, 0, 20)]


def test_catches_up_when_policy_requests_it():
    last, now = utc(2026, 5, 7, 12, 0, 0), utc(2026, 5, 7, 12, 0, 20)
    assert fires_for("*/5 * * * * *", policy=CATCH_UP, last=last, now=now) == [
        utc(2026, 5, 7, 12, 0, 5), utc(2026, 5, 7, 12, 0, 10),
        utc(2026, 5, 7, 12, 0, 15), utc(2026, 5, 7, 12, 0, 20),
    ]


def test_limits_catch_up_work():
    last, now = utc(2026, 5, 7, 12, 0, 0), utc(2026, 5, 7, 12, 0, 30)
    assert fires_for("*/5 * * * * *", policy=CATCH_UP, last=last, now=now, limit=2) == [
        utc(2026, 5, 7, 12, 0, 5), utc(2026, 5, 7, 12, 0, 10),
    ]


def test_keeps_first_registration_latest_only():
    created_at, now = utc(2026, 5, 7, 12, 0, 30), utc(2026, 5, 7, 12, 0, 55)
    fires = fires_for("*/5 * * * * *", policy=CATCH_UP, last=None, created_at=created_at, now=now)
    assert fires == [utc(2026, 5, 7, 12, 0, 55)]


# -- first registration and boundaries -------------------------------------------


def test_new_minute_schedule_fires_the_current_minute_at_once():
    # Created at 12:00:30.25: the 12:00:00 fire counts (search from 11:59:30).
    fires = fires_for("* * * * *", policy=COALESCE, last=None,
                      created_at=utc(2026, 5, 7, 12, 0, 30, 250000), now=utc(2026, 5, 7, 12, 0, 31))
    assert fires == [utc(2026, 5, 7, 12, 0, 0)]


def test_new_hourly_schedule_waits_for_its_hour():
    fires = fires_for("0 * * * *", policy=COALESCE, last=None,
                      created_at=utc(2026, 5, 7, 14, 35), now=utc(2026, 5, 7, 14, 59, 59))
    assert fires == []


def test_nothing_is_due_before_the_next_fire_and_the_mark_itself_is_excluded():
    last = utc(2026, 5, 7, 12, 0, 0)
    for policy in MissedFirePolicy:
        assert fires_for("0 * * * *", policy=policy, last=last, now=last) == []
        assert fires_for("0 * * * *", policy=policy, last=last, now=utc(2026, 5, 7, 12, 59, 59)) == []
        assert fires_for("0 * * * *", policy=policy, last=last, now=utc(2026, 5, 7, 13)) == [utc(2026, 5, 7, 13)]


def test_a_mark_in_the_future_fires_nothing():
    # e.g. the expression was edited, or another leader's clock ran ahead.
    assert fires_for("* * * * * *", policy=CATCH_UP, last=utc(2026, 5, 7, 13), now=utc(2026, 5, 7, 12)) == []


def test_format_fire_time_is_postgres_text_in_utc():
    assert format_fire_time(utc(2026, 11, 30, 17, 21, 24)) == "2026-11-30 17:21:24+00"
    auckland = datetime(2026, 12, 1, 6, 21, 24, tzinfo=ZoneInfo("Pacific/Auckland"))
    assert format_fire_time(auckland) == "2026-11-30 17:21:24+00"
    assert format_fire_time(utc(2026, 1, 2, 3, 4, 5, 120000)) == "2026-01-02 03:04:05.12+00"


# -- DST: spring forward fires at most once, fall back exactly once (as croner) -------


LONDON, AUCKLAND = "Europe/London", "Pacific/Auckland"


def test_london_spring_forward_gap_fires_once_at_the_transition():
    # 2026-03-29: 01:00 GMT -> 02:00 BST; 01:30 local does not exist.
    fires = fires_for("30 1 * * *", policy=CATCH_UP, zone=LONDON,
                      last=utc(2026, 3, 27, 1, 30), now=utc(2026, 3, 31, 12))
    assert fires == [utc(2026, 3, 28, 1, 30), utc(2026, 3, 29, 1, 0), utc(2026, 3, 30, 0, 30),
                     utc(2026, 3, 31, 0, 30)]
    # Three gap fires (01:00, 01:20, 01:40) collapse into one at 02:00 BST.
    fires = fires_for("*/20 1 * * *", policy=CATCH_UP, zone=LONDON,
                      last=utc(2026, 3, 28, 12), now=utc(2026, 3, 29, 12))
    assert fires == [utc(2026, 3, 29, 1, 0)]


def test_london_fall_back_fires_the_repeated_time_once():
    # 2026-10-25: 02:00 BST -> 01:00 GMT; 01:xx happens twice.
    fires = fires_for("30 1 * * *", policy=CATCH_UP, zone=LONDON,
                      last=utc(2026, 10, 24, 12), now=utc(2026, 10, 25, 12))
    assert fires == [utc(2026, 10, 25, 0, 30)]  # 01:30 BST, the earlier instant
    fires = fires_for("*/15 * * * *", policy=CATCH_UP, zone=LONDON,
                      last=utc(2026, 10, 24, 23, 50), now=utc(2026, 10, 25, 2, 20))
    # The first pass of 01:xx fires; the second pass (01:00Z-02:00Z) does not.
    assert fires == [utc(2026, 10, 25, 0, 0), utc(2026, 10, 25, 0, 15), utc(2026, 10, 25, 0, 30),
                     utc(2026, 10, 25, 0, 45), utc(2026, 10, 25, 2, 0), utc(2026, 10, 25, 2, 15)]
    # Coalescing in the second pass finds the first pass's last fire.
    assert fires_for("*/15 * * * *", policy=COALESCE, zone=LONDON,
                     last=utc(2026, 10, 24, 23, 50), now=utc(2026, 10, 25, 1, 40)) == [utc(2026, 10, 25, 0, 45)]


def test_first_registration_in_the_repeated_hour_fires_nothing_from_before_its_start():
    """Deliberately unlike upstream, which would enqueue croner's 00:59Z fire
    (before the lookback window) at once; the first fire here is 02:00Z."""
    created_at = utc(2026, 10, 25, 1, 30)  # 01:30 GMT, the second pass of 01:xx
    for now, expected in ((utc(2026, 10, 25, 1, 30, 10), []),
                          (utc(2026, 10, 25, 1, 59, 59), []),
                          (utc(2026, 10, 25, 2, 0, 10), [utc(2026, 10, 25, 2, 0)])):
        assert fires_for("* * * * *", policy=COALESCE, zone=LONDON, last=None,
                         created_at=created_at, now=now) == expected


def test_catch_up_takes_at_most_1000_fires_per_pass_by_default():
    assert CATCH_UP_LIMIT == 1000
    last = utc(2026, 5, 7, 12)
    fires = compute_fire_times(CronSchedule.parse("* * * * * *", "UTC"), policy=CATCH_UP,
                               created_at=last, last_enqueued_at=last, now=last + 2500 * SECOND)
    assert len(fires) == 1000
    assert (fires[0], fires[-1]) == (last + SECOND, last + 1000 * SECOND)


def local(zone: str, *parts: int, fold: int = 0) -> datetime:
    return datetime(*parts, tzinfo=ZoneInfo(zone), fold=fold).astimezone(UTC)


def test_auckland_0230_daily_across_both_transitions():
    # 2026-04-05 03:00 NZDT -> 02:00 NZST: 02:30 happens twice, fires once (NZDT).
    fires = fires_for("30 2 * * *", policy=CATCH_UP, zone=AUCKLAND,
                      last=local(AUCKLAND, 2026, 4, 4, 2, 30), now=local(AUCKLAND, 2026, 4, 6, 12))
    assert fires == [local(AUCKLAND, 2026, 4, 5, 2, 30, fold=0), local(AUCKLAND, 2026, 4, 6, 2, 30)]
    assert fires[0] == utc(2026, 4, 4, 13, 30)
    # During the second 02:30 nothing more is due.
    assert fires_for("30 2 * * *", policy=COALESCE, zone=AUCKLAND, last=fires[0],
                     now=local(AUCKLAND, 2026, 4, 5, 2, 45, fold=1)) == []
    # 2026-09-27 02:00 NZST -> 03:00 NZDT: no 02:30; it fires at 03:00 NZDT.
    fires = fires_for("30 2 * * *", policy=CATCH_UP, zone=AUCKLAND,
                      last=local(AUCKLAND, 2026, 9, 26, 2, 30), now=local(AUCKLAND, 2026, 9, 28, 12))
    assert fires == [local(AUCKLAND, 2026, 9, 27, 3, 0), local(AUCKLAND, 2026, 9, 28, 2, 30)]
    assert fires[0] == utc(2026, 9, 26, 14, 0)
    # Coalescing over a week, up to each transition fire.
    for now, latest in [(local(AUCKLAND, 2026, 4, 5, 2, 40, fold=1), utc(2026, 4, 4, 13, 30)),
                        (local(AUCKLAND, 2026, 9, 27, 3, 0), utc(2026, 9, 26, 14, 0))]:
        last = now - timedelta(days=7)
        assert fires_for("30 2 * * *", policy=COALESCE, zone=AUCKLAND, last=last, now=now) == [latest]


def test_a_gap_fire_is_swallowed_when_the_second_before_the_gap_fired():
    # croner resumes at the gap's end (02:00:00 BST) after a fire at 00:59:59 GMT.
    for policy in MissedFirePolicy:
        fires = fires_for("59 * * * * *", policy=policy, zone=LONDON,
                          last=utc(2026, 3, 29, 0, 58, 59), now=utc(2026, 3, 29, 1, 0, 30))
        assert fires == [utc(2026, 3, 29, 0, 59, 59)]
    fires = fires_for("59 * * * * *", policy=CATCH_UP, zone=LONDON,
                      last=utc(2026, 3, 29, 0, 59, 59), now=utc(2026, 3, 29, 1, 1, 0))
    assert fires == [utc(2026, 3, 29, 1, 0, 59)]  # 02:00:59 BST
    # One second earlier, the search enters the gap: it fires at the transition.
    fires = fires_for("58 * * * * *", policy=CATCH_UP, zone=LONDON,
                      last=utc(2026, 3, 29, 0, 58, 58), now=utc(2026, 3, 29, 1, 1, 0))
    assert fires == [utc(2026, 3, 29, 0, 59, 58), utc(2026, 3, 29, 1, 0, 0), utc(2026, 3, 29, 1, 0, 58)]
    assert fires_for("58 * * * * *", policy=COALESCE, zone=LONDON, last=utc(2026, 3, 29, 0, 59, 58),
                     now=utc(2026, 3, 29, 1, 0, 30)) == [utc(2026, 3, 29, 1, 0, 0)]


def test_a_fire_in_the_last_second_before_clocks_go_back_is_not_replayed():
    # croner 2.2.0 yields 00:59:59Z forever here (upstream's evaluator spins);
    # we fire it once and go on to the next day.
    fires = fires_for("59 59 1 * * *", policy=CATCH_UP, zone=LONDON,
                      last=utc(2026, 10, 24, 0, 59, 59), now=utc(2026, 10, 26, 12))
    assert fires == [utc(2026, 10, 25, 0, 59, 59), utc(2026, 10, 26, 1, 59, 59)]
    fires = fires_for("* * * * * *", policy=CATCH_UP, zone=LONDON,
                      last=utc(2026, 10, 25, 0, 59, 58), now=utc(2026, 10, 25, 2, 0, 1))
    assert fires == [utc(2026, 10, 25, 0, 59, 59), utc(2026, 10, 25, 2, 0, 0), utc(2026, 10, 25, 2, 0, 1)]


def test_a_gap_longer_than_an_hour_does_not_stop_the_schedule():
    # Antarctica/Troll jumps +00 -> +02 (2026-03-29 01:00Z); croner gives up for good.
    fires = fires_for("0 1,2 * * *", policy=CATCH_UP, zone="Antarctica/Troll",
                      last=utc(2026, 3, 28, 2), now=utc(2026, 3, 30, 12))
    assert fires == [utc(2026, 3, 29, 1), utc(2026, 3, 29, 23), utc(2026, 3, 30, 0)]


# -- coalesce cost does not grow with the outage ------------------------------------


def _count_searches(monkeypatch) -> list[int]:
    calls = [0]
    for method in ("next_match", "prev_match"):
        original = getattr(CronExpression, method)

        def counting(self, wall_clock, _original=original):
            calls[0] += 1
            return _original(self, wall_clock)

        monkeypatch.setattr(CronExpression, method, counting)
    return calls


@pytest.mark.parametrize("outage", [timedelta(minutes=1), timedelta(days=1), timedelta(days=365)])
def test_coalesce_searches_a_constant_number_of_times(monkeypatch, outage):
    now = utc(2026, 5, 7, 12, 0, 20)
    calls = _count_searches(monkeypatch)
    fires = fires_for("* * * * * *", policy=COALESCE, last=now - outage, now=now)
    assert fires == [now]
    assert calls[0] <= 4  # not one per missed second


# -- properties against a brute-force reading of croner's rules ------------------------


def _is_fire(expression, zone, instant: datetime, start: datetime) -> bool:
    """Does the iteration from ``start`` fire at ``instant``? Decided from the
    instant's own wall clock (our own reading of croner's rules, no search)."""
    local = instant.astimezone(zone)
    wall = local.replace(tzinfo=None)
    if local.fold:  # the second pass of a repeated time: croner fires the first
        return False
    if expression.matches(wall):
        return True
    wall_before = (instant - SECOND).astimezone(zone).replace(tzinfo=None)
    if wall - wall_before > SECOND:  # `instant` ends a gap (clocks jumped forward)
        if instant - SECOND < start:  # the search began at the gap's end
            return False
        if expression.matches(wall_before):  # croner then resumes past the gap
            return False
        gap = wall_before + SECOND
        while gap < wall:
            if expression.matches(gap):
                return True
            gap += SECOND
    return False


def brute_force_fires(expression, zone, start: datetime, until: datetime) -> list[datetime]:
    """Every fire in [floor(start), until], checking each candidate instant."""
    start = start.replace(microsecond=0)
    step = SECOND if expression.has_seconds else timedelta(minutes=1)
    candidate = start if expression.has_seconds else start.replace(second=0)
    fires = []
    while candidate <= until:
        if candidate >= start and _is_fire(expression, zone, candidate, start):
            fires.append(candidate)
        candidate += step
    return fires


ZONES = ["UTC", "Europe/London", "America/New_York", "Pacific/Auckland", "Australia/Lord_Howe",
         "Europe/Dublin", "Pacific/Chatham", "Antarctica/Troll"]


@functools.cache
def transitions(zone_name: str) -> tuple[datetime, ...]:
    zone, found = ZoneInfo(zone_name), []
    instant = utc(2024, 1, 1)
    offset = instant.astimezone(zone).utcoffset()
    while instant < utc(2028, 1, 1):
        instant += timedelta(minutes=30)
        if instant.astimezone(zone).utcoffset() != offset:
            found.append(instant)
            offset = instant.astimezone(zone).utcoffset()
    return tuple(found)


@st.composite
def windows(draw, expression: CronExpression, zone_name: str):
    """(last_enqueued_at, now): often straddling a DST transition; at most
    3 h for second-level expressions, 3 days for minute-level ones."""
    longest = 3 * 3600 if expression.has_seconds else 3 * 86400
    span = timedelta(seconds=draw(st.integers(1, longest)))
    near = transitions(zone_name)
    if near and draw(st.booleans()):
        anchor = draw(st.sampled_from(near)) + timedelta(seconds=draw(st.integers(-3 * 3600, 3 * 3600)))
    else:
        anchor = utc(2024, 1, 1) + timedelta(seconds=draw(st.integers(0, 4 * 365 * 86400)))
    last = anchor - span * draw(st.floats(0, 1))
    if draw(st.booleans()):
        last = last.replace(microsecond=0)
    return last, last + span


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), text=expressions(), zone_name=st.sampled_from(ZONES))
def test_policies_agree_with_brute_force(data, text, zone_name):
    try:
        schedule = CronSchedule.parse(text, zone_name)
    except CronExpressionError:
        assume(False)
    last, now = data.draw(windows(schedule.expression, zone_name))
    expected = [fire for fire in brute_force_fires(schedule.expression, schedule.zone, last, now)
                if fire > last]
    limit = data.draw(st.sampled_from([CATCH_UP_LIMIT, 1, 3, 50]))

    def compute(policy, last_enqueued_at=last, created_at=last):
        return compute_fire_times(schedule, policy=policy, created_at=created_at,
                                  last_enqueued_at=last_enqueued_at, now=now, limit=limit)

    caught_up = compute(CATCH_UP)
    assert caught_up == expected[:limit]
    assert compute(COALESCE) == expected[-1:]
    assert all(a < b for a, b in itertools.pairwise(caught_up))
    assert all(last < fire <= now for fire in caught_up)
    # First registration: only the latest fire since created_at - 1 min, whatever the policy.
    created_at = last + timedelta(seconds=60)
    since_created = brute_force_fires(schedule.expression, schedule.zone, last, now)
    for policy in MissedFirePolicy:
        assert compute(policy, last_enqueued_at=None, created_at=created_at) == since_created[-1:]
