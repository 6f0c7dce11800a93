"""The canonical engine's branch set (the branches Awa's canonical leader runs);
:mod:`awa_trio.registry` picks the set per storage state."""

from __future__ import annotations

from ...branch import BranchSpec
from ...config import MaintenanceConfig
from ...cron import cron_branches
from ...maintenance.promotion import next_due_at
from . import (
    admin_metadata,
    batch_operations,
    cleanup,
    priority_aging,
    promote,
    queue_stats,
    rescue_callbacks,
    rescue_deadlines,
    rescue_heartbeats,
)


def canonical_branches(config: MaintenanceConfig) -> list[BranchSpec]:
    return [
        BranchSpec(rescue_heartbeats.NAME, config.heartbeat_rescue_interval, rescue_heartbeats.run_once),
        BranchSpec(rescue_deadlines.NAME, config.deadline_rescue_interval, rescue_deadlines.run_once),
        BranchSpec(rescue_callbacks.NAME, config.callback_rescue_interval, rescue_callbacks.run_once),
        BranchSpec(
            promote.NAME,
            config.promote_interval,
            promote.run_once,
            run_immediately=True,
            # Wakes when the next job falls due, not only every interval.
            next_wake=next_due_at,
            min_wake_gap=config.promote_min_gap,
        ),
        BranchSpec(cleanup.NAME, config.cleanup_interval, cleanup.run_once),
        BranchSpec(priority_aging.NAME, config.priority_aging_interval, priority_aging.run_once),
        BranchSpec(
            admin_metadata.RECOMPUTE_DIRTY_NAME,
            config.dirty_key_recompute_interval,
            admin_metadata.run_recompute_dirty,
        ),
        BranchSpec(
            admin_metadata.REFRESH_NAME,
            config.metadata_reconciliation_interval,
            admin_metadata.run_refresh,
        ),
        BranchSpec(queue_stats.NAME, config.queue_stats_interval, queue_stats.run_once),
        BranchSpec(batch_operations.NAME, config.batch_operations_interval, batch_operations.run_once),
        # cron_sync (runs at once on election) and cron_eval (never skipped by
        # overrun cooldown). Cron inserts through awa.insert_job_compat, so
        # these two are engine-independent.
        *cron_branches(config),
    ]
