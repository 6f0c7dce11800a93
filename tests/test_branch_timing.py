"""Branch actor timing under trio.testing.MockClock (no database): grid ticks,
the skipped first tick, dropped missed ticks, and the tracker's cooldown in time."""

import dataclasses
import itertools
import types

import pytest
import trio

from awa_trio.branch import BranchSpec, next_tick_after, run_branch
from awa_trio.config import MaintenanceConfig
from awa_trio.metrics import MaintenanceMetrics
from awa_trio.tracker import TickDecision
from awa_trio.tracker_actor import run_tracker

CTX = types.SimpleNamespace(config=MaintenanceConfig())


class AlwaysRun:
    async def begin_tick(self, branch, interval, *, cooldown=True):
        return TickDecision(run=True)

    async def finish_tick(self, branch, duration, error=None):
        pass


def recording_spec(interval, body_seconds=0.0, **kwargs):
    starts = []

    async def run_once(ctx):
        starts.append(trio.current_time())
        await trio.sleep(body_seconds)

    return BranchSpec("timed", interval, run_once, **kwargs), starts


async def run_for(seconds, spec, tracker):
    with trio.move_on_after(seconds):
        await run_branch(spec, CTX, tracker)


def test_next_tick_after_drops_missed_grid_points():
    assert next_tick_after(10.0, 1.0, now=10.5) == 11.0
    assert next_tick_after(10.0, 1.0, now=11.0) == 11.0
    assert next_tick_after(10.0, 1.0, now=13.2) == 14.0


async def test_first_tick_is_skipped_and_ticks_follow_the_grid(autojump_clock):
    spec, starts = recording_spec(1.0)
    began = trio.current_time()
    await run_for(5.5, spec, AlwaysRun())
    assert [round(t - began, 6) for t in starts] == [1, 2, 3, 4, 5]


async def test_run_immediately_fires_at_start(autojump_clock):
    spec, starts = recording_spec(1.0, run_immediately=True)
    began = trio.current_time()
    await run_for(2.5, spec, AlwaysRun())
    assert [round(t - began, 6) for t in starts] == [0, 1, 2]


async def test_ticks_missed_during_a_slow_body_are_dropped(autojump_clock):
    spec, starts = recording_spec(1.0, body_seconds=2.5)
    began = trio.current_time()
    await run_for(10.5, spec, AlwaysRun())
    # Bodies end at 3.5, 6.5, 9.5: the next grid point still ahead is taken.
    assert [round(t - began, 6) for t in starts] == [1, 4, 7, 10]


@pytest.mark.parametrize("body_seconds", [0.26, 0.5, 1.3])
async def test_tracker_cooldown_keeps_a_slow_branch_running(autojump_clock, body_seconds):
    """Every body overruns 3/2 of the 0.1s interval. The branch still runs
    regularly (paced cooldown), never falling silent for 120 ticks."""
    interval = 0.1
    spec, starts = recording_spec(interval, body_seconds=body_seconds)
    async with trio.open_nursery() as nursery:
        tracker = await nursery.start(run_tracker, MaintenanceMetrics())
        await run_for(60, spec, tracker)
        nursery.cancel_scope.cancel()
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    # A body spans ceil(d/i) ticks; cooldown is at most 2*ceil(d/i) quiet ticks.
    spanned = -(-round(body_seconds * 1000) // round(interval * 1000))
    worst_gap = (spanned + 2 * spanned + 1) * interval
    assert max(gaps) <= worst_gap + 1e-6
    assert len(starts) >= 60 / worst_gap - 1


async def test_tracker_records_duration_and_one_overrun_episode(autojump_clock, meter_provider, metric_reader):
    from support.helpers import metric_points

    spec, starts = recording_spec(0.1, body_seconds=0.3)
    async with trio.open_nursery() as nursery:
        tracker = await nursery.start(run_tracker, MaintenanceMetrics(meter_provider))
        await run_for(20, spec, tracker)
        nursery.cancel_scope.cancel()

    durations = metric_points(metric_reader, "awa.maintenance.branch.duration")
    assert [attrs for attrs, _ in durations] == [{"awa.maintenance.branch": "timed"}]
    assert durations[0][1].count == len(starts)
    assert durations[0][1].sum == pytest.approx(0.3 * len(starts))
    overruns = metric_points(metric_reader, "awa.maintenance.branch.overrun")
    assert [(attrs, point.value) for attrs, point in overruns] == [
        ({"awa.maintenance.branch": "timed"}, 1)
    ], "one episode, however many ticks overran"


async def test_a_slot_update_moves_the_next_tick_to_the_new_interval_without_a_burst(autojump_clock):
    """A reload changing the interval re-plans the next tick on the new grid
    from the last one; one that keeps it adds no body."""
    from awa_trio.branch import BranchSlot

    spec, starts = recording_spec(10.0)
    slot = BranchSlot(spec, CTX)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(run_branch, spec, CTX, AlwaysRun(), slot)
        await trio.sleep(25)  # bodies at 10 and 20
        slot.update(spec, CTX)
        await trio.sleep(1)
        assert starts == [10.0, 20.0]
        slot.update(dataclasses.replace(spec, interval=2.0), CTX)  # at 26, on the 2 s grid from 20
        await trio.sleep(3.5)
        slot.update(dataclasses.replace(spec, interval=60.0), CTX)  # next at 28 + 60
        await trio.sleep(30)
        nursery.cancel_scope.cancel()
    assert starts == [10.0, 20.0, 26.0, 28.0]


async def test_no_body_starts_once_the_scope_is_cancelled_while_the_tracker_answers(autojump_clock):
    """The lock lost while the tracker replies (the leader scope cancelled in
    the same scheduler pass): the body must not start."""
    spec, starts = recording_spec(1.0)

    class CancelsWhileAnswering(AlwaysRun):
        async def begin_tick(self, branch, interval, *, cooldown=True):
            scope.cancel()  # what losing the lock does, just before the reply arrives
            return TickDecision(run=True)

    with trio.CancelScope() as scope:
        await run_branch(spec, CTX, CancelsWhileAnswering())
    assert starts == []
