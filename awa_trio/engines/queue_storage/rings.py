"""What every ring branch (queue, lease, claim) shares: outcome types and the
tick shape "rotate, then prune, the prune gated by the tracker's backoff".

Each ring module supplies ``rotate(ctx) -> RotateResult`` and
``prune(ctx) -> PruneResult``; :func:`run_ring_tick` records Awa's ring
metrics, reports prune outcomes to the tracker actor (which owns the backoff)
and logs.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from ...body import BodyResult
from ...context import MaintenanceContext
from ...db import DatabaseError, LockTimeout, describe_error
from ...tracker import PruneOutcome

log = logging.getLogger(__name__)

#: ``awa.ring`` attribute values.
QUEUE_RING = "queue"
LEASE_RING = "lease"
CLAIM_RING = "claim"


@dataclasses.dataclass(frozen=True)
class RingCursor:
    """Where a ring's cursor stood as a rotation left it."""

    slot: int
    generation: int
    slot_count: int
    #: Whether the oldest sealed slot of this cursor held nothing to reclaim,
    #: when the rotation's statement checked it on the way (None: not checked).
    oldest_clean: bool | None = None
    #: That slot, where the ring finds it by age (the queue ring) rather
    #: than from the cursor alone (None: not looked up).
    oldest_slot: int | None = None


@dataclasses.dataclass(frozen=True)
class RotateResult:
    """``rotated``: the cursor moved to ``slot`` at ``generation``. Otherwise
    the next slot was still busy (``blockers``: Awa's blocker label, e.g.
    ``queue.ready_rows``, to the row count found) or the compare-and-set lost
    a race (all counts zero)."""

    rotated: bool
    slot: int
    generation: int | None = None
    blockers: dict[str, int] = dataclasses.field(default_factory=dict)
    #: The cursor after this attempt (None after a lost compare-and-set): the
    #: prune that follows finds its slot from it without another read.
    cursor: RingCursor | None = None


@dataclasses.dataclass(frozen=True)
class PruneResult:
    """One prune attempt. ``reason``/``count`` only for SKIPPED_ACTIVE (e.g.
    ``active_leases``, 3); ``slot`` is the slot considered, if any."""

    outcome: PruneOutcome
    slot: int | None = None
    reason: str | None = None
    count: int | None = None
    #: Extra figures for logs and tests (rows carried forward, deltas folded, ...).
    details: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: Seconds of a PRUNED attempt's lock, truncate and commit statements
    #: (``awa.maintenance.prune.duration``; filled in as each one ends).
    phase_seconds: dict[str, float] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class RingTickResult(BodyResult):
    rotate: RotateResult | None = None
    prune: PruneResult | None = None
    #: True when the tracker's backoff skipped this tick's prune.
    prune_backed_off: bool = False


async def run_ring_tick(
    ctx: MaintenanceContext,
    *,
    branch: str,
    ring: str,
    rotate: Callable[[MaintenanceContext], Awaitable[RotateResult]],
    prune: Callable[[MaintenanceContext, RingCursor | None], Awaitable[PruneResult]],
) -> RingTickResult:
    """Rotate, then prune unless backed off (never while rotation is waiting
    for that prune). A database error in rotate is logged and the prune still
    runs. The prune gets the cursor the rotation saw, so that an
    idle ring's prune is one cheap statement."""
    result = RingTickResult()
    try:
        result.rotate = await rotate(ctx)
    except LockTimeout:
        raise  # a yield: the branch retries at its next tick
    except DatabaseError as exc:
        result.log_error(log, "%s: rotate failed: %s", branch, describe_error(exc))
    else:
        record_rotate(ctx, ring, result.rotate, branch)

    if await ctx.tracker.should_skip_prune(branch):
        # Once the ring has lapped, the slot rotation needs next is the one
        # the prune empties: backing off the prune then stalls the ring for
        # up to 2**5 ticks (12-18 s stalls under load). The prune
        # asks its gates before any exclusive lock, so trying it is cheap.
        if result.rotate is None or result.rotate.rotated:
            result.prune_backed_off = True
            return result
        log.debug("%s: rotation is waiting for the prune; pruning despite the backoff", branch)
    try:
        result.prune = await prune(ctx, result.rotate.cursor if result.rotate is not None else None)
    except LockTimeout:
        raise  # a yield: the branch retries at its next tick
    except DatabaseError as exc:
        result.log_error(log, "%s: prune failed: %s", branch, describe_error(exc))
        return result
    record_prune(ctx, ring, result.prune, branch)
    await ctx.tracker.report_prune(branch, result.prune.outcome)
    return result


def record_rotate(ctx: MaintenanceContext, ring: str, outcome: RotateResult, branch: str) -> None:
    if outcome.rotated:
        ctx.metrics.record_rotate_rotated(ring, outcome.slot, outcome.generation or 0)
        log.debug(
            "%s: rotated %s ring to slot %d (generation %s)", branch, ring, outcome.slot, outcome.generation
        )
    else:
        ctx.metrics.record_rotate_skipped_busy(ring, outcome.blockers)
        busy = ", ".join(f"{name}={count}" for name, count in outcome.blockers.items() if count)
        log.debug(
            "%s: %s ring rotation skipped, slot %d busy (%s)",
            branch,
            ring,
            outcome.slot,
            busy or "lost compare-and-set",
        )


def record_prune(ctx: MaintenanceContext, ring: str, outcome: PruneResult, branch: str) -> None:
    ctx.metrics.record_prune(
        ring, outcome.outcome.value, outcome.reason, outcome.count, outcome.phase_seconds
    )
    if outcome.outcome is PruneOutcome.PRUNED:
        log.debug("%s: pruned %s ring slot %s %s", branch, ring, outcome.slot, outcome.details or "")
    elif outcome.outcome is PruneOutcome.BLOCKED:
        log.debug("%s: prune of %s ring slot %s blocked by a lock", branch, ring, outcome.slot)
    elif outcome.outcome is PruneOutcome.SKIPPED_ACTIVE:
        log.debug(
            "%s: prune of %s ring slot %s skipped: %s (%s)",
            branch,
            ring,
            outcome.slot,
            outcome.reason,
            outcome.count,
        )
