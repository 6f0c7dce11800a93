"""Pure state machines behind the tracker actor: overrun hysteresis and prune
backoff. No Trio, no clock: callers pass durations in, so tests need no event
loop.

Overrun hysteresis (awa-worker #242/#316, v0.6.1 semantics)::

    sample = duration of the previous body run (consumed once)
    sample > 3/2 interval  -> overrun   (ontime counter := 0)
    sample < 7/10 interval -> on time   (overrun counter := 0)
    otherwise              -> deadband, nothing changes

    K = 3 consecutive overruns while on time  -> delayed; the flipping tick
                                                 skips its body; cooldown armed
    K (or more) overruns while delayed         -> cooldown re-armed, body skipped
    K consecutive on-time samples while delayed -> recovered
    tick while cooldown > 0                    -> cooldown -= 1, body skipped,
                                                 no sample recorded

The cooldown is ``C = min(120, 2 * ceil(sample / interval))`` ticks, not
v0.6.1's fixed 120 (docs/differences.md): a fixed 120 re-armed on every
overrun starves a slow branch to 1/120 of its ticks. The C quiet
ticks include the tick that flips or re-arms the cooldown, so a branch whose
every body is slow still runs at least once every C + 1 ticks (about a third
of its ticks at most durations, never less than 1/121).
"""

from __future__ import annotations

import dataclasses
import enum

OVERRUN_HYSTERESIS_K = 3
OVERRUN_UPPER_NUM, OVERRUN_UPPER_DEN = 3, 2
OVERRUN_LOWER_NUM, OVERRUN_LOWER_DEN = 7, 10
MAX_COOLDOWN_TICKS = 120
MAX_PRUNE_BACKOFF_LEVEL = 5
NANOS_PER_SECOND = 1_000_000_000


def to_nanos(seconds: float) -> int:
    """Durations are compared in integer nanoseconds, as awa-worker does, so a
    sample exactly on a threshold lands on the same side every time."""
    return round(seconds * NANOS_PER_SECOND)


def cooldown_ticks_for(sample_ns: int, interval_ns: int) -> int:
    """Ticks to stay quiet after an overrun: twice the ticks the slow body
    spanned, capped at MAX_COOLDOWN_TICKS."""
    interval_ns = max(interval_ns, 1)
    spanned = -(-sample_ns // interval_ns)  # ceil
    return max(1, min(MAX_COOLDOWN_TICKS, 2 * spanned))


class Transition(enum.Enum):
    NONE = "none"
    BECAME_DELAYED = "became_delayed"
    RECOVERED = "recovered"


@dataclasses.dataclass
class BranchOverrunState:
    """Hysteresis state of one branch."""

    #: Duration of the last body, not yet evaluated.
    last_duration_ns: int | None = None
    is_delayed: bool = False
    consecutive_overrun: int = 0
    consecutive_ontime: int = 0
    cooldown_ticks_remaining: int = 0


@dataclasses.dataclass(frozen=True)
class TickDecision:
    """The tracker's answer to "may this branch run its body now?"."""

    run: bool
    transition: Transition = Transition.NONE
    #: The sample evaluated on this tick, if any (seconds).
    sample: float | None = None
    cooldown_ticks: int = 0
    consecutive_overrun: int = 0
    consecutive_ontime: int = 0


class OverrunTracker:
    """Per-branch overrun hysteresis; one instance per leadership term."""

    def __init__(self) -> None:
        self._branches: dict[str, BranchOverrunState] = {}

    def begin(self, branch: str, interval: float, *, cooldown: bool = True) -> TickDecision:
        """Call when the branch's tick fires, before its body. ``cooldown=False``
        tracks overruns without ever skipping (terminal_count_rollup)."""
        state = self._branches.setdefault(branch, BranchOverrunState())

        if state.cooldown_ticks_remaining > 0:
            state.cooldown_ticks_remaining -= 1
            return TickDecision(run=False, cooldown_ticks=state.cooldown_ticks_remaining)

        sample_ns, state.last_duration_ns = state.last_duration_ns, None
        if sample_ns is None:
            return TickDecision(run=True)

        interval_ns = to_nanos(interval)
        upper_ns = interval_ns * OVERRUN_UPPER_NUM // OVERRUN_UPPER_DEN
        lower_ns = interval_ns * OVERRUN_LOWER_NUM // OVERRUN_LOWER_DEN
        sample = sample_ns / NANOS_PER_SECOND

        if sample_ns > upper_ns:
            state.consecutive_overrun += 1
            state.consecutive_ontime = 0
            crossed = state.consecutive_overrun >= OVERRUN_HYSTERESIS_K
            quiet_ticks = cooldown_ticks_for(sample_ns, interval_ns) if cooldown else 0
            if crossed and not state.is_delayed:
                state.is_delayed = True
                # This tick is the first quiet one.
                state.cooldown_ticks_remaining = max(quiet_ticks - 1, 0)
                return self._decision(
                    state, run=quiet_ticks == 0, sample=sample, transition=Transition.BECAME_DELAYED
                )
            if crossed and state.is_delayed and quiet_ticks > 0:
                state.cooldown_ticks_remaining = quiet_ticks - 1
                return self._decision(state, run=False, sample=sample)
        elif sample_ns < lower_ns:
            state.consecutive_ontime += 1
            state.consecutive_overrun = 0
            if state.consecutive_ontime >= OVERRUN_HYSTERESIS_K and state.is_delayed:
                state.is_delayed = False
                return self._decision(state, run=True, sample=sample, transition=Transition.RECOVERED)
        # else: deadband, neither counter moves.
        return self._decision(state, run=True, sample=sample)

    def finish(self, branch: str, duration: float) -> None:
        """Record how long the body took; evaluated at the branch's next tick."""
        state = self._branches.setdefault(branch, BranchOverrunState())
        state.last_duration_ns = to_nanos(duration)

    def state(self, branch: str) -> BranchOverrunState | None:
        """A copy of one branch's state (None if the branch never ticked)."""
        state = self._branches.get(branch)
        return dataclasses.replace(state) if state is not None else None

    @staticmethod
    def _decision(
        state: BranchOverrunState,
        *,
        run: bool,
        sample: float | None,
        transition: Transition = Transition.NONE,
    ) -> TickDecision:
        return TickDecision(
            run=run,
            transition=transition,
            sample=sample,
            cooldown_ticks=state.cooldown_ticks_remaining,
            consecutive_overrun=state.consecutive_overrun,
            consecutive_ontime=state.consecutive_ontime,
        )


class PruneOutcome(enum.Enum):
    """What a ring-partition prune attempt reported."""

    PRUNED = "pruned"
    SKIPPED_ACTIVE = "skipped_active"
    BLOCKED = "blocked"
    NOOP = "noop"


@dataclasses.dataclass
class PruneBackoffState:
    #: Prune calls still to skip.
    skip_remaining: int = 0
    #: Exponent of the last backoff (skip 2**level calls after a failure).
    backoff_level: int = 0


class PruneBackoffTracker:
    """Exponential backoff of the prune step per ring (queue, lease, claim):
    under a pinned MVCC snapshot prune cannot succeed, so stop hammering."""

    def __init__(self) -> None:
        self._branches: dict[str, PruneBackoffState] = {}

    def should_skip(self, branch: str) -> bool:
        """True if this tick's prune call should be skipped (counts it down)."""
        state = self._branches.setdefault(branch, PruneBackoffState())
        if state.skip_remaining > 0:
            state.skip_remaining -= 1
            return True
        return False

    def record_outcome(self, branch: str, outcome: PruneOutcome) -> None:
        state = self._branches.setdefault(branch, PruneBackoffState())
        if outcome is PruneOutcome.PRUNED:
            state.skip_remaining = 0
            state.backoff_level = 0
        elif outcome in (PruneOutcome.SKIPPED_ACTIVE, PruneOutcome.BLOCKED):
            state.backoff_level = min(state.backoff_level + 1, MAX_PRUNE_BACKOFF_LEVEL)
            state.skip_remaining = 1 << state.backoff_level
        # NOOP: nothing to do is not a failure; state unchanged.

    def state(self, branch: str) -> PruneBackoffState | None:
        state = self._branches.get(branch)
        return dataclasses.replace(state) if state is not None else None
