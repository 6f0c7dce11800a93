"""The queue-storage engine's branch sets (Awa's queue-storage set, and
the same set during a staged transition with the previous engine's drain
folded in).

Imported by :mod:`awa_trio.engines.queue_storage.engine` only when a term
runs queue storage.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from ...branch import BranchSpec
from ...config import MaintenanceConfig
from ...context import MaintenanceContext
from ...cron import cron_branches
from ...maintenance.promotion import next_due_at
from ..base import DrainPasses
from . import batch_operations as qs_batch_operations
from . import cleanup as qs_cleanup
from . import promote as qs_promote
from . import queue_stats as qs_queue_stats
from . import rescue_callbacks as qs_rescue_callbacks
from . import rescue_deadlines as qs_rescue_deadlines
from . import rescue_heartbeats as qs_rescue_heartbeats
from . import rotate_claim, rotate_lease, rotate_queue, terminal_count_rollup
from .planes import both_planes

log = logging.getLogger(__name__)

RunOnce = Callable[[MaintenanceContext], Awaitable[Any]]


def queue_storage_branches(config: MaintenanceConfig) -> list[BranchSpec]:
    """The queue-storage set, the branches Awa's own leader runs there: no
    admin metadata, no priority aging, no row-by-row job cleanup (rings are
    pruned whole instead)."""
    return [
        BranchSpec(
            qs_rescue_heartbeats.NAME,
            config.heartbeat_rescue_interval,
            qs_rescue_heartbeats.run_once,
        ),
        BranchSpec(qs_rescue_deadlines.NAME, config.deadline_rescue_interval, qs_rescue_deadlines.run_once),
        BranchSpec(qs_rescue_callbacks.NAME, config.callback_rescue_interval, qs_rescue_callbacks.run_once),
        BranchSpec(
            qs_promote.NAME,
            config.promote_interval,
            qs_promote.run_once,
            run_immediately=True,
            # Wakes when the next job falls due, not only every interval.
            next_wake=next_due_at,
            min_wake_gap=config.promote_min_gap,
        ),
        BranchSpec(qs_cleanup.NAME, config.cleanup_interval, qs_cleanup.run_once),
        BranchSpec(qs_queue_stats.NAME, config.queue_stats_interval, qs_queue_stats.run_once),
        BranchSpec(qs_batch_operations.NAME, config.batch_operations_interval, qs_batch_operations.run_once),
        BranchSpec(
            terminal_count_rollup.NAME,
            config.terminal_count_rollup_interval,
            terminal_count_rollup.run_once,
            cooldown=False,
        ),
        BranchSpec(rotate_queue.NAME, config.queue_rotate_interval, rotate_queue.run_once),
        BranchSpec(rotate_lease.NAME, config.lease_rotate_interval, rotate_lease.run_once),
        BranchSpec(rotate_claim.NAME, config.effective_claim_rotate_interval, rotate_claim.run_once),
        *cron_branches(config),
    ]


#: Which drain pass each queue-storage branch serves beside its own body
#: while the previous engine's rows drain (the other branches run as they are).
DRAIN_FOLDED_INTO: dict[str, Callable[[DrainPasses], RunOnce]] = {
    qs_promote.NAME: lambda drain: drain.promote,
    qs_rescue_heartbeats.NAME: lambda drain: drain.rescue_heartbeats,
    qs_rescue_deadlines.NAME: lambda drain: drain.rescue_deadlines,
    qs_rescue_callbacks.NAME: lambda drain: drain.rescue_callbacks,
    qs_cleanup.NAME: lambda drain: drain.cleanup,
}


def mixed_transition_branches(config: MaintenanceConfig, drain: DrainPasses) -> list[BranchSpec]:
    """Queue storage is live but the previous engine's rows still drain: the
    queue-storage set, with ``drain`` folded into promotion, the rescues and
    cleanup, plus the drain's report."""
    branches = []
    for spec in queue_storage_branches(config):
        drain_pass = DRAIN_FOLDED_INTO.get(spec.name)
        if drain_pass is not None:
            spec = dataclasses.replace(
                spec, run_once=both_planes(spec.name, spec.run_once, drain_pass(drain))
            )
        branches.append(spec)
    branches.append(drain.report(config))
    return branches
