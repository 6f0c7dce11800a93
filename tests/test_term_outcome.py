"""A term's end as a value: what ``term_outcome`` makes of the exception
group a term ended with, and that the elector does what an outcome says
(hold off, retry after the error backoff, wait for a check), with no
server: a stand-in lock that is always free."""

from __future__ import annotations

import logging

import pytest
import trio

from awa_trio import MaintenanceConfig
from awa_trio import term_outcome as term_outcome_module
from awa_trio.db import ConnectionLost, QueryError
from awa_trio.errors import LeadershipAbandoned, UnsupportedSchema
from awa_trio.leadership import (
    HoldOff,
    LeaderElector,
    LeadershipState,
    RetryAfterError,
    StandAgain,
    WaitUntil,
)
from awa_trio.term_outcome import ABANDON_PENALTY_INTERVALS, SCHEMA_RECHECK_INTERVAL, term_outcome

CONFIG = MaintenanceConfig(leader_election_interval=3)


def group(*errors: BaseException) -> BaseExceptionGroup:
    return BaseExceptionGroup("term", list(errors))


# -- term_outcome: the exception group, as an outcome ------------------------


def test_a_branch_that_kept_crashing_holds_the_node_off_two_election_intervals():
    outcome = term_outcome(group(LeadershipAbandoned("broken: crashed 3 times within 10s")), None, CONFIG)
    assert outcome == HoldOff(ABANDON_PENALTY_INTERVALS * 3, reason="broken: crashed 3 times within 10s")
    assert ABANDON_PENALTY_INTERVALS == 2


def test_an_unsupported_schema_waits_for_the_schema_check():
    nested = group(ExceptionGroup("branches", [UnsupportedSchema("no awa schema")]))
    outcome = term_outcome(nested, None, CONFIG)
    assert isinstance(outcome, WaitUntil)
    assert outcome.reason == "no awa schema"
    assert outcome.every == SCHEMA_RECHECK_INTERVAL == 1.0
    assert outcome.check_name == "schema check"
    assert outcome.passed == "a supported awa schema is back"


def test_the_schema_outranks_a_crashing_branch_which_outranks_a_database_error():
    both = group(LeadershipAbandoned("broken"), UnsupportedSchema("awa schema version 41"))
    assert isinstance(term_outcome(both, None, CONFIG), WaitUntil)
    crash_and_error = group(ConnectionLost("gone"), LeadershipAbandoned("broken"))
    assert term_outcome(crash_and_error, None, CONFIG) == HoldOff(6, reason="broken")


def test_a_database_error_starting_the_term_retries_after_the_error_backoff():
    outcome = term_outcome(group(ConnectionLost("connection was closed")), None, CONFIG)
    assert outcome == RetryAfterError("connection was closed")
    two = term_outcome(group(ConnectionLost("a"), QueryError("b")), None, CONFIG)
    assert isinstance(two, RetryAfterError)


def test_anything_else_has_no_outcome_and_propagates():
    assert term_outcome(group(KeyError("bug")), None, CONFIG) is None
    assert term_outcome(group(ConnectionLost("gone"), KeyError("bug")), None, CONFIG) is None
    assert term_outcome(group(LeadershipAbandoned("x"), RuntimeError("bug")), None, CONFIG) is None


async def test_the_schema_check_says_why_or_none(monkeypatch):
    answers: list[BaseException | None] = [UnsupportedSchema("awa schema version 99 is newer"), None]

    async def read_supported_schema(ctx):
        answer = answers.pop(0)
        if answer is not None:
            raise answer

    monkeypatch.setattr(term_outcome_module, "read_supported_schema", read_supported_schema)
    outcome = term_outcome(group(UnsupportedSchema("no awa schema")), object(), CONFIG)
    assert isinstance(outcome, WaitUntil)
    assert await outcome.check() == "awa schema version 99 is newer"
    assert await outcome.check() is None


# -- the elector obeys -------------------------------------------------------


class FreeLock:
    """A stand-in database whose lock every election attempt takes; records
    when each attempt happened. ``lose()`` closes the lock connection under
    the leader, as the server terminating it would."""

    server_address = "stand-in:5432"
    backend_pid = 7

    def __init__(self) -> None:
        self.attempts: list[float] = []
        self.closed = False
        self._on_termination: list = []

    async def connect_dedicated(self, **_kwargs):
        self.closed = False
        return self

    async def listen(self, channel, callback) -> None:
        pass

    async def fetch(self, sql, *args):
        if "pg_try_advisory_lock" in sql:
            self.attempts.append(trio.current_time())
            return [{"in_recovery": False, "read_only": False, "acquired": True, "backend_pid": 7,
                     "holder_pid": None}]
        return [{"held": True, "in_recovery": False, "read_only": False}]

    async def fetchval(self, sql, *args):
        return True

    def note_backend_pid(self, pid: int) -> None:
        pass

    def on_termination(self, callback) -> None:
        self._on_termination.append(callback)

    def lose(self) -> None:
        for callback in self._on_termination:
            callback()

    def is_closed(self) -> bool:
        return self.closed

    async def close(self) -> None:
        self.closed = True


class TermError(Exception):
    """What the stand-in term ends with; the outcome is decided by the test."""


async def failing_term(*, task_status=trio.TASK_STATUS_IGNORED):
    task_status.started()
    raise TermError("the term ended")


async def endless_term(*, task_status=trio.TASK_STATUS_IGNORED):
    task_status.started()
    await trio.sleep_forever()


def outcomes(*values):
    """An outcome_of that answers ``values`` in turn, then holds off for good."""
    queue = list(values)

    def outcome_of(group):
        if group.split(TermError)[1] is not None:
            return None  # the test's own cancel, on its way out
        return queue.pop(0) if queue else HoldOff(1000)

    return outcome_of


async def run_for(elector: LeaderElector, seconds: float) -> None:
    with trio.move_on_after(seconds):
        await elector.run()


async def test_hold_off_stays_out_then_stands_again(autojump_clock, caplog):
    lock = FreeLock()
    elector = LeaderElector(lock, CONFIG, LeadershipState(), failing_term,
                            outcome_of=outcomes(HoldOff(7, reason="a branch kept crashing"), HoldOff(2)))
    began = trio.current_time()
    await run_for(elector, 20)
    assert [round(when - began, 6) for when in lock.attempts] == [0, 7, 9]
    assert caplog.text.count("giving up leadership: a branch kept crashing") == 1


async def test_retry_after_error_waits_the_error_backoff(autojump_clock, caplog):
    lock = FreeLock()
    retry = RetryAfterError("connection was closed")
    elector = LeaderElector(lock, CONFIG, LeadershipState(), failing_term,
                            outcome_of=outcomes(retry, retry, retry))
    began = trio.current_time()
    await run_for(elector, 1)
    # Each term starts with the lock taken, which resets the backoff.
    assert [round(when - began, 6) for when in lock.attempts] == [0, 0.1, 0.2, 0.3]
    assert caplog.text.count(
        "leadership term failed, releasing the lock and retrying: connection was closed") == 3


async def test_wait_until_follows_until_the_check_passes(autojump_clock, caplog):
    caplog.set_level(logging.DEBUG, logger="awa_trio.leadership")
    lock = FreeLock()
    state = LeadershipState()
    seen: list[str | None] = []
    answers: list[str | BaseException | None] = ["still broken", ConnectionLost("gone"), None]

    async def check():
        seen.append(state.not_leading_reason)
        answer = answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    wait = WaitUntil(reason="no widget", check=check, every=0.5, check_name="widget check",
                     passed="the widget is back")
    elector = LeaderElector(lock, CONFIG, state, failing_term, outcome_of=outcomes(wait))
    began = trio.current_time()
    await run_for(elector, 5)
    assert [round(when - began, 6) for when in lock.attempts] == [0, 1.5]
    assert seen == ["no widget", "still broken", "still broken"]
    assert state.not_leading_reason is None
    text = caplog.text
    assert text.count("stepping down, not leading: no widget; checking again every 0.5s") == 1
    assert text.count("widget check failed (will retry): gone") == 1
    assert text.count("the widget is back; taking part in the election") == 1


async def test_a_lost_lock_stands_again_at_once(autojump_clock):
    lock = FreeLock()
    elector = LeaderElector(lock, CONFIG, LeadershipState(), endless_term, outcome_of=outcomes())
    began = trio.current_time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(elector.run)
        await trio.sleep(1)
        lock.lose()
        await trio.sleep(1)
        nursery.cancel_scope.cancel()
    assert [round(when - began, 6) for when in lock.attempts] == [0, 1]
    assert StandAgain() == StandAgain()


async def test_resigning_holds_off_for_resign_hold_off_whatever_the_term_says(autojump_clock, caplog):
    lock = FreeLock()
    config = MaintenanceConfig(leader_election_interval=3, resign_hold_off=5)
    elector = LeaderElector(lock, config, LeadershipState(), endless_term, outcome_of=outcomes())
    began = trio.current_time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(elector.run)
        await trio.sleep(1)
        assert elector.resign()
        await trio.sleep(10)
        nursery.cancel_scope.cancel()
    assert [round(when - began, 6) for when in lock.attempts] == [0, 6]
    assert "resigning maintenance leadership; staying a follower for 5s" in caplog.text


async def test_a_group_without_an_outcome_propagates(autojump_clock):
    lock = FreeLock()
    elector = LeaderElector(lock, CONFIG, LeadershipState(), failing_term)  # no outcome_of
    with pytest.raises(BaseExceptionGroup) as raised:
        await run_for(elector, 5)
    matched, rest = raised.value.split(TermError)
    assert matched is not None and rest is None
    assert lock.closed, "the lock was released on the way out"
