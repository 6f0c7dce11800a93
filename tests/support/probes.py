"""Probe branches: record when bodies run, to check what ran while leading."""

from __future__ import annotations

import math

import trio

from awa_trio.branch import BranchSpec


class BodyRecorder:
    """A branch whose body records trio.current_time() at each start."""

    def __init__(self, name: str = "probe", interval: float = 0.02, body=None):
        self.starts: list[float] = []
        self._body = body
        self.spec = BranchSpec(name, interval, self._run_once)

    async def _run_once(self, ctx):
        self.starts.append(trio.current_time())
        if self._body is not None:
            return await self._body(ctx, len(self.starts))
        return None


def leadership_intervals(history: list[tuple[float, bool]]) -> list[tuple[float, float]]:
    intervals, began = [], None
    for when, leading in history:
        if leading:
            began = when
        elif began is not None:
            intervals.append((began, when))
            began = None
    if began is not None:
        intervals.append((began, math.inf))
    return intervals


def assert_bodies_ran_only_while_leading(service, recorder: BodyRecorder) -> None:
    intervals = leadership_intervals(service.leadership_history)
    outside = [t for t in recorder.starts if not any(a <= t <= b for a, b in intervals)]
    assert not outside, f"bodies started without the lock at {outside}; leading {intervals}"


async def wait_for_any_leader(*services, timeout: float = 10.0):
    with trio.fail_after(timeout):
        while True:
            leaders = [s for s in services if s.is_leader]
            if leaders:
                return leaders[0]
            await trio.sleep(0.01)
