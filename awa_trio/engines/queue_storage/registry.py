"""The queue-storage engine's branch set (upstream's queue-storage set).

:mod:`awa_trio.registry` picks the set per storage state, and imports this
module only when a term runs queue storage.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from ...branch import BranchSpec
from ...config import MaintenanceConfig
from ...context import MaintenanceContext
from ...cron import cron_branches
from ...maintenance.promotion import next_due_at
from . import batch_operations as qs_batch_operations
from . import cleanup as qs_cleanup
from . import promote as qs_promote
from . import queue_stats as qs_queue_stats
from . import rescue_callbacks as qs_rescue_callbacks
from . import rescue_deadlines as qs_rescue_deadlines
from . import rescue_heartbeats as qs_rescue_heartbeats
from . import rotate_claim, rotate_lease, rotate_queue, terminal_count_rollup

log = logging.getLogger(__name__)

RunOnce = Callable[[MaintenanceContext], Awaitable[Any]]


def queue_storage_branches(config: MaintenanceConfig) -> list[BranchSpec]:
    """Upstream's queue-storage set: no admin metadata, no priority aging, no
    row-by-row job cleanup (rings are pruned whole instead)."""
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
