"""Which branches run on which storage engine, at which interval.

The only place that knows about engines: branch modules never ask which
engine they run on. ``default_branches`` picks the canonical set, the
queue-storage set, or (during a staged transition) the queue-storage set
with the canonical drain folded into its promotion, rescues and cleanup
(:mod:`awa_trio.queue_storage.canonical_drain` says why, and what upstream
does).

The queue-storage sets are built by :mod:`awa_trio.queue_storage.registry`,
imported only when a term needs them: a canonical leader never loads the
queue-storage modules (start-up CPU is part of the idle cost).
"""

from __future__ import annotations

from ..branch import BranchSpec
from ..config import MaintenanceConfig
from ..cron import cron_branches
from ..schema import SchemaInfo
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
        BranchSpec(promote.NAME, config.promote_interval, promote.run_once, run_immediately=True),
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


def default_branches(config: MaintenanceConfig, schema: SchemaInfo) -> list[BranchSpec]:
    if not schema.runs_queue_storage and not schema.in_mixed_transition:
        return canonical_branches(config)
    from ..queue_storage import registry

    if schema.in_mixed_transition:
        return registry.mixed_transition_branches(config)
    return registry.queue_storage_branches(config)


def every_branch_name(config: MaintenanceConfig) -> frozenset[str]:
    """Every branch name on any engine and transition state: what
    ``disabled_branches`` and pause accept (the set a leader runs changes
    with the storage state while it runs)."""
    from ..queue_storage import registry

    names = {spec.name for spec in canonical_branches(config)}
    names |= {spec.name for spec in registry.queue_storage_branches(config)}
    names |= {spec.name for spec in registry.mixed_transition_branches(config)}
    return frozenset(names)
