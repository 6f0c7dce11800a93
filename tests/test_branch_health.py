"""A branch's health comes from what its body returns, never from the log:
logging levels, handlers and propagation of an embedding application
change what is printed, not whether a pass failed."""

import contextlib
import dataclasses
import logging
import types

import pytest
from support.contexts import make_context

from awa_trio.body import BodyResult, errors_of
from awa_trio.branch import BranchSpec, run_body
from awa_trio.config import MaintenanceConfig
from awa_trio.db import QueryError
from awa_trio.engines.canonical import promote
from awa_trio.engines.queue_storage.planes import PlaneResults, both_planes
from awa_trio.sql import Statement

log = logging.getLogger("awa_trio.test_branch_health")


class CountingMetrics:
    def __init__(self):
        self.branch_errors: list[str] = []

    def record_branch_error(self, branch):
        self.branch_errors.append(branch)


def fake_context():
    return types.SimpleNamespace(config=MaintenanceConfig(), metrics=CountingMetrics())


@contextlib.contextmanager
def silenced_awa_trio_logging():
    """What an application's logging config may do: raise the level, drop
    the handlers, stop propagation."""
    logger = logging.getLogger("awa_trio")
    level, handlers, propagate = logger.level, list(logger.handlers), logger.propagate
    logger.setLevel(logging.CRITICAL)
    for handler in handlers:
        logger.removeHandler(handler)
    logger.propagate = False
    try:
        yield
    finally:
        logger.setLevel(level)
        for handler in handlers:
            logger.addHandler(handler)
        logger.propagate = propagate


def test_importing_the_branch_actor_installs_no_logging_handler():
    import awa_trio.branch  # noqa: F401

    assert [h for h in logging.getLogger("awa_trio").handlers if "awa_trio" in type(h).__module__] == []


async def test_a_body_returning_errors_counts_as_failed_with_nothing_logged():
    async def carried_on(ctx):
        return BodyResult(errors=["step one failed", "step two failed", "step three failed"])

    ctx = fake_context()
    outcome = await run_body(BranchSpec("carrying_on", 1.0, carried_on), ctx)
    assert outcome.error == "step one failed (and 2 more)"
    assert ctx.metrics.branch_errors == ["carrying_on"]


async def test_an_error_line_in_the_log_no_longer_marks_a_healthy_result_failed(caplog):
    async def only_logs(ctx):
        log.error("only_logs: something an application logged at ERROR")
        return BodyResult()

    ctx = fake_context()
    outcome = await run_body(BranchSpec("only_logs", 1.0, only_logs), ctx)
    assert "something an application logged" in caplog.text
    assert outcome.error is None and ctx.metrics.branch_errors == []


async def test_the_log_level_does_not_change_health():
    async def half_failing(ctx):
        result = BodyResult()
        result.log_error(log, "half_failing: one step failed: %s", "[25006] read-only")
        return result

    for silenced in (False, True):
        ctx = fake_context()
        with silenced_awa_trio_logging() if silenced else contextlib.nullcontext():
            outcome = await run_body(BranchSpec("half_failing", 1.0, half_failing), ctx)
        assert outcome.error == "half_failing: one step failed: [25006] read-only", silenced
        assert ctx.metrics.branch_errors == ["half_failing"], silenced


async def test_a_partly_failing_promotion_fails_its_pass_whatever_the_logging(db, monkeypatch):
    broken = dict(promote.PROMOTE_DUE_SQL, scheduled=Statement("SELECT queue FROM awa.no_such_table LIMIT :limit"))
    monkeypatch.setattr(promote, "PROMOTE_DUE_SQL", broken)
    await db.execute(
        "INSERT INTO awa.scheduled_jobs (kind, queue, state, run_at) "
        "VALUES ('health', 'health', 'scheduled', now() - interval '1 second')"
    )
    ctx = await make_context(db)
    with silenced_awa_trio_logging():
        outcome = await run_body(BranchSpec(promote.NAME, 1.0, promote.run_once), ctx)
    assert outcome.error is not None
    assert outcome.error.startswith("promote_scheduled: failed to promote scheduled jobs: [42P01]")
    assert errors_of(outcome.result) == [outcome.error]


def query_error(message):
    return QueryError(message, sqlstate="57014")


async def test_both_planes_carry_each_planes_errors_in_order():
    async def queue_storage(ctx):
        return BodyResult(errors=["qs: row skipped"])

    async def canonical(ctx):
        raise query_error("canceling statement due to lock timeout")

    with silenced_awa_trio_logging():
        result = await both_planes("rescue_stale_heartbeats", queue_storage, canonical)(None)
    assert isinstance(result, PlaneResults)
    assert result.errors == [
        "qs: row skipped",
        "rescue_stale_heartbeats: canonical plane failed: [57014] canceling statement due to lock timeout",
    ]


@pytest.mark.parametrize("result", [None, "carried on", 3, {"errors": ["not a result"]}])
def test_a_result_of_another_type_carries_no_errors(result):
    assert errors_of(result) == []


def test_errors_are_not_part_of_a_results_equality():
    assert BodyResult(errors=["x"]) == BodyResult()
    assert dataclasses.asdict(BodyResult(errors=["x"])) == {"errors": ["x"]}


# -- the interval a body runs for --------------------------------------------------


async def test_the_branch_actor_hands_the_body_its_specs_interval(db):
    from awa_trio.maintenance.rescue import rescue_budget

    ctx = await make_context(db, drain_time_budget=30)
    budgets = []

    async def body(ctx):
        budgets.append((ctx.interval, rescue_budget(ctx).seconds))
        return BodyResult()

    await run_body(BranchSpec("sized", 4.0, body), ctx)
    assert ctx.interval is None
    assert budgets == [(4.0, 2.0)], "a rescue spends at most half its branch's interval"
    await body(ctx)  # called on its own: the budget alone
    assert budgets[-1] == (None, 30.0)


def test_a_failing_in_flight_cancel_callback_is_one_of_the_rescues_errors():
    from test_hooks import job

    from awa_trio.hooks import Hooks

    hooks = Hooks()

    def broken():
        raise RuntimeError("callback bug")

    async def not_synchronous():
        pass

    hooks.in_flight.register(1, 2, broken)
    hooks.in_flight.register(3, 1, not_synchronous)
    errors: list[str] = []
    with silenced_awa_trio_logging():
        assert hooks.cancel_in_flight([job(1, run_lease=2), job(3, run_lease=1)], errors) == 2
    assert errors == [
        "hooks: cancel callback for job 1 (run_lease 2) failed",
        "hooks: cancel callback for job 3 (run_lease 1) is a coroutine function; "
        "cancel callbacks must be synchronous",
    ]
