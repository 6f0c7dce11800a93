"""The tracker actor: the one owner of overrun and prune-backoff state.

Branch actors never share mutable state; they ask this actor, over a memory
channel, whether to run this tick, tell it how long the body took, and (queue
storage) whether to skip a prune and how the prune went. Requests that need
an answer carry a one-shot reply channel. The state machines themselves live
in :mod:`awa_trio.tracker`; this module adds the channel, logs and metrics.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

import trio

from .metrics import MaintenanceMetrics
from .tracker import (
    OverrunTracker,
    PruneBackoffTracker,
    PruneOutcome,
    TickDecision,
    Transition,
)

log = logging.getLogger(__name__)

#: Requests waiting for the tracker; each branch has at most one in flight.
REQUEST_BUFFER = 64


@dataclasses.dataclass(frozen=True)
class _BeginTick:
    branch: str
    interval: float
    cooldown: bool
    reply: trio.MemorySendChannel


@dataclasses.dataclass(frozen=True)
class _FinishTick:
    branch: str
    duration: float
    error: str | None = None


@dataclasses.dataclass(frozen=True)
class _Snapshot:
    reply: trio.MemorySendChannel


@dataclasses.dataclass
class BranchActivity:
    """What /status shows of one branch (wall-clock times, for people)."""

    interval: float | None = None
    last_run_at: float | None = None
    last_duration: float | None = None
    last_error: str | None = None
    last_error_at: float | None = None
    runs: int = 0
    skipped_ticks: int = 0


@dataclasses.dataclass(frozen=True)
class _PruneGate:
    branch: str
    reply: trio.MemorySendChannel


@dataclasses.dataclass(frozen=True)
class _PruneReport:
    branch: str
    outcome: PruneOutcome


class PruneGate(Protocol):
    """What a branch body asks of the tracker: whether to back off a prune,
    and how the prune went (the TrackerClient of a term answers)."""

    async def should_skip_prune(self, branch: str) -> bool: ...
    async def report_prune(self, branch: str, outcome: PruneOutcome) -> None: ...


class NoPruneBackoff:
    """The gate of a body run outside a leadership term (a test, a bench, a
    one-off call): every prune is tried, nothing is remembered."""

    async def should_skip_prune(self, branch: str) -> bool:
        return False

    async def report_prune(self, branch: str, outcome: PruneOutcome) -> None:
        return None


NO_PRUNE_BACKOFF = NoPruneBackoff()


class TrackerClient:
    """What a branch actor holds: a way to talk to the tracker actor."""

    def __init__(self, send_channel: trio.MemorySendChannel):
        self._send = send_channel

    async def _post(self, request: object) -> None:
        """Queue ``request`` without a checkpoint of its own while the buffer
        has room: the tracker then runs when this task next waits, in the
        same pass of Trio's scheduler, instead of costing one more (each
        branch tick talks to the tracker, and an idle leader's CPU is spent
        per scheduler pass). A full buffer still pushes back."""
        try:
            self._send.send_nowait(request)
        except trio.WouldBlock:
            await self._send.send(request)
        except trio.BrokenResourceError:
            # The tracker has gone: its term is ending and this branch is
            # being cancelled with it. Say so (Cancelled), as send() would,
            # rather than look like a broken branch.
            await trio.lowlevel.checkpoint_if_cancelled()
            raise

    async def _ask(self, make_request: Callable[[trio.MemorySendChannel[Any]], object]) -> Any:
        reply_send, reply_receive = trio.open_memory_channel(1)
        with reply_receive:
            await self._post(make_request(reply_send))
            return await reply_receive.receive()

    async def begin_tick(self, branch: str, interval: float, *, cooldown: bool = True) -> TickDecision:
        decision: TickDecision = await self._ask(lambda reply: _BeginTick(branch, interval, cooldown, reply))
        return decision

    async def finish_tick(self, branch: str, duration: float, *, error: str | None = None) -> None:
        await self._post(_FinishTick(branch, duration, error))

    async def snapshot(self) -> dict[str, dict[str, Any]]:
        """Per branch: interval, last run, last duration, last error, cooldown
        and prune backoff, as the tracker sees them now."""
        snapshot: dict[str, dict[str, Any]] = await self._ask(_Snapshot)
        return snapshot

    async def should_skip_prune(self, branch: str) -> bool:
        skip: bool = await self._ask(lambda reply: _PruneGate(branch, reply))
        return skip

    async def report_prune(self, branch: str, outcome: PruneOutcome) -> None:
        await self._post(_PruneReport(branch, outcome))


async def run_tracker(
    metrics: MaintenanceMetrics, *, task_status: trio.TaskStatus[TrackerClient] = trio.TASK_STATUS_IGNORED
) -> None:
    """Serve tracker requests until cancelled. State starts empty, so every
    leadership term begins without inherited backoff or cooldown."""
    overrun = OverrunTracker()
    prune = PruneBackoffTracker()
    activity: dict[str, BranchActivity] = {}
    send, receive = trio.open_memory_channel(REQUEST_BUFFER)
    # Only the receiving end is closed on the way out: the branches share
    # ``send``, and closing it under them would turn their last report into
    # ClosedResourceError (a crash) instead of BrokenResourceError, which a
    # branch being cancelled with its term reads as Cancelled.
    with receive:
        task_status.started(TrackerClient(send))
        async for request in receive:
            if isinstance(request, _BeginTick):
                decision = overrun.begin(request.branch, request.interval, cooldown=request.cooldown)
                _report_transition(metrics, request.branch, request.interval, decision)
                seen = activity.setdefault(request.branch, BranchActivity())
                seen.interval = request.interval
                if not decision.run:
                    seen.skipped_ticks += 1
                _reply(request.reply, decision)
            elif isinstance(request, _FinishTick):
                metrics.record_branch_duration(request.branch, request.duration)
                overrun.finish(request.branch, request.duration)
                seen = activity.setdefault(request.branch, BranchActivity())
                seen.last_run_at = time.time()
                seen.last_duration = request.duration
                seen.runs += 1
                if request.error is not None:
                    seen.last_error, seen.last_error_at = request.error, seen.last_run_at
            elif isinstance(request, _Snapshot):
                _reply(request.reply, _snapshot(activity, overrun, prune))
            elif isinstance(request, _PruneGate):
                skip = prune.should_skip(request.branch)
                if skip:
                    log.debug("%s: prune backed off this tick", request.branch)
                _reply(request.reply, skip)
            elif isinstance(request, _PruneReport):
                prune.record_outcome(request.branch, request.outcome)
            else:  # pragma: no cover - programming error
                raise TypeError(f"unknown tracker request {request!r}")


def _reply(reply: trio.MemorySendChannel[Any], value: object) -> None:
    """Answer an asker that may have gone: a branch cancelled with its term
    after its request was already handed to this actor has closed its reply
    channel, and that is no fault of the tracker's."""
    try:
        reply.send_nowait(value)
    except trio.BrokenResourceError:
        pass


def _snapshot(
    activity: dict[str, BranchActivity], overrun: OverrunTracker, prune: PruneBackoffTracker
) -> dict[str, dict[str, Any]]:
    report = {}
    for branch, seen in sorted(activity.items()):
        state = overrun.state(branch)
        backoff = prune.state(branch)
        report[branch] = {
            **dataclasses.asdict(seen),
            "delayed": bool(state and state.is_delayed),
            "in_cooldown": bool(state and state.cooldown_ticks_remaining > 0),
            "cooldown_ticks_remaining": state.cooldown_ticks_remaining if state else 0,
            "prune_backoff_level": backoff.backoff_level if backoff else None,
            "prune_skips_remaining": backoff.skip_remaining if backoff else None,
        }
    return report


def _report_transition(
    metrics: MaintenanceMetrics, branch: str, interval: float, decision: TickDecision
) -> None:
    if decision.transition is Transition.BECAME_DELAYED:
        metrics.record_branch_overrun(branch)
        log.warning(
            "%s: maintenance branch overran its tick interval "
            "(last body %.3fs, interval %.3fs, %d consecutive overruns); "
            "skipping the next %d ticks",
            branch,
            decision.sample,
            interval,
            decision.consecutive_overrun,
            decision.cooldown_ticks,
        )
    elif decision.transition is Transition.RECOVERED:
        log.warning(
            "%s: maintenance branch recovered to on-time (last body %.3fs, interval %.3fs)",
            branch,
            decision.sample,
            interval,
        )
