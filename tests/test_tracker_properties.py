"""Property-based checks of the tracker state machines against small models."""

import math
from fractions import Fraction

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from awa_trio.tracker import (
    MAX_COOLDOWN_TICKS,
    OverrunTracker,
    PruneBackoffTracker,
    PruneOutcome,
    to_nanos,
)

BRANCHES = ("promote_scheduled", "cleanup", "terminal_count_rollup")
intervals_ms = st.integers(min_value=1, max_value=60_000)


def duration_for(kind, interval_ms, fraction):
    """A body duration (seconds) in a given band relative to the interval."""
    interval = Fraction(interval_ms, 1000)
    if kind == "ontime":
        value = interval * Fraction(7, 10) * fraction
    elif kind == "deadband":
        value = interval * (Fraction(7, 10) + Fraction(8, 10) * fraction)
    elif kind == "overrun":
        value = interval * (Fraction(3, 2) + 300 * fraction) + Fraction(1, 10**6)
    else:  # exact thresholds
        value = interval * (Fraction(3, 2) if fraction > Fraction(1, 2) else Fraction(7, 10))
    return float(value)


class OverrunModel:
    """Plain restatement of the spec, with exact rationals and a dict."""

    def __init__(self):
        self.branches = {}

    def tick(self, branch, interval_ms, duration, cooldown):
        s = self.branches.setdefault(
            branch, {"sample": None, "delayed": False, "over": 0, "ok": 0, "cool": 0}
        )
        if s["cool"]:
            s["cool"] -= 1
            return False
        sample, s["sample"] = s["sample"], None
        run = True
        if sample is not None:
            interval_ns = interval_ms * 1_000_000
            if sample > interval_ns * 3 // 2:
                s["over"] += 1
                s["ok"] = 0
                if s["over"] >= 3:
                    quiet = min(MAX_COOLDOWN_TICKS, 2 * math.ceil(Fraction(sample, interval_ns)))
                    if not s["delayed"]:
                        s["delayed"] = True
                        if cooldown:
                            s["cool"], run = quiet - 1, False
                    elif cooldown:
                        s["cool"], run = quiet - 1, False
            elif sample < interval_ns * 7 // 10:
                s["ok"] += 1
                s["over"] = 0
                if s["ok"] >= 3 and s["delayed"]:
                    s["delayed"] = False
        if run:
            s["sample"] = to_nanos(duration)
        return run


class OverrunMachine(RuleBasedStateMachine):
    @initialize(intervals=st.lists(intervals_ms, min_size=len(BRANCHES), max_size=len(BRANCHES)))
    def setup(self, intervals):
        self.tracker = OverrunTracker()
        self.model = OverrunModel()
        self.intervals = dict(zip(BRANCHES, intervals, strict=True))

    @rule(
        branch=st.sampled_from(BRANCHES),
        kind=st.sampled_from(["ontime", "deadband", "overrun", "threshold"]),
        fraction=st.fractions(min_value=0, max_value=1),
    )
    def tick(self, branch, kind, fraction):
        interval_ms = self.intervals[branch]
        duration = duration_for(kind, interval_ms, fraction)
        cooldown = branch != "terminal_count_rollup"
        decision = self.tracker.begin(branch, interval_ms / 1000, cooldown=cooldown)
        if decision.run:
            self.tracker.finish(branch, duration)
        assert decision.run == self.model.tick(branch, interval_ms, duration, cooldown)

    @invariant()
    def agrees_with_model(self):
        for branch, s in self.model.branches.items():
            state = self.tracker.state(branch)
            assert (
                state.last_duration_ns,
                state.is_delayed,
                state.consecutive_overrun,
                state.consecutive_ontime,
                state.cooldown_ticks_remaining,
            ) == (s["sample"], s["delayed"], s["over"], s["ok"], s["cool"])

    @invariant()
    def counters_are_exclusive_and_bounded(self):
        for branch in self.model.branches:
            state = self.tracker.state(branch)
            assert not (state.consecutive_overrun and state.consecutive_ontime)
            assert 0 <= state.cooldown_ticks_remaining < MAX_COOLDOWN_TICKS


TestOverrunTracker = OverrunMachine.TestCase


class PruneMachine(RuleBasedStateMachine):
    """Drives the prune protocol: each tick asks should_skip; a tick that is
    not skipped runs prune and reports its outcome."""

    def __init__(self):
        super().__init__()
        self.tracker = PruneBackoffTracker()
        self.model = {}
        self.skip_run = {}

    @rule(branch=st.sampled_from(("queue", "lease", "claim")), outcome=st.sampled_from(PruneOutcome))
    def tick(self, branch, outcome):
        skip, level = self.model.get(branch, (0, 0))
        expected_skip = skip > 0
        assert self.tracker.should_skip(branch) == expected_skip
        if expected_skip:
            self.model[branch] = (skip - 1, level)
            self.skip_run[branch] = self.skip_run.get(branch, 0) + 1
            return
        self.skip_run[branch] = 0
        self.tracker.record_outcome(branch, outcome)
        if outcome is PruneOutcome.PRUNED:
            self.model[branch] = (0, 0)
        elif outcome is PruneOutcome.NOOP:
            self.model[branch] = (skip, level)
        else:
            level = min(level + 1, 5)
            self.model[branch] = (2**level, level)

    @invariant()
    def agrees_with_model(self):
        for branch, (skip, level) in self.model.items():
            state = self.tracker.state(branch)
            assert (state.skip_remaining, state.backoff_level) == (skip, level)

    @invariant()
    def skip_run_never_exceeds_32(self):
        assert all(run <= 32 for run in self.skip_run.values())


TestPruneBackoff = PruneMachine.TestCase


@given(
    interval_ms=intervals_ms,
    fractions=st.lists(st.fractions(min_value=0, max_value=Fraction(999, 1000)), min_size=1, max_size=200),
)
def test_always_on_time_samples_never_skip_a_body(interval_ms, fractions):
    tracker = OverrunTracker()
    for fraction in fractions:
        decision = tracker.begin("b", interval_ms / 1000)
        assert decision.run
        tracker.finish("b", duration_for("ontime", interval_ms, fraction))
    assert not tracker.state("b").is_delayed


@given(
    interval_ms=intervals_ms,
    fractions=st.lists(st.fractions(min_value=0, max_value=1), min_size=1, max_size=200),
)
def test_deadband_samples_never_move_counters(interval_ms, fractions):
    tracker = OverrunTracker()
    for fraction in fractions:
        assert tracker.begin("b", interval_ms / 1000).run
        tracker.finish("b", duration_for("deadband", interval_ms, fraction))
        state = tracker.state("b")
        assert (state.consecutive_overrun, state.consecutive_ontime, state.cooldown_ticks_remaining) == (0, 0, 0)


@settings(max_examples=300)
@given(
    interval_ms=intervals_ms,
    slowness=st.fractions(min_value=Fraction(3, 2), max_value=400).filter(lambda f: f > Fraction(3, 2)),
    ticks=st.integers(min_value=10, max_value=600),
)
def test_slow_branch_runs_at_least_once_per_paced_window(interval_ms, slowness, ticks):
    """Every body takes d > 3/2 interval: gaps between runs stay within
    2 * ceil(d / interval) + 1 ticks (and the 120-tick cap)."""
    interval = interval_ms / 1000
    duration = float(Fraction(interval_ms, 1000) * slowness)
    tracker = OverrunTracker()
    limit = min(MAX_COOLDOWN_TICKS, 2 * math.ceil(to_nanos(duration) / to_nanos(interval))) + 1
    last_run = None
    for tick in range(ticks):
        decision = tracker.begin("slow", interval)
        if decision.run:
            if last_run is not None:
                assert tick - last_run <= limit
            last_run = tick
            tracker.finish("slow", duration)
    assert last_run is not None and ticks - 1 - last_run < limit
