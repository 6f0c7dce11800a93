"""Which branches run on which storage engine, at which interval.

The only place that knows about engines: branch modules never ask which
engine they run on. ``default_branches`` picks the canonical set, the
queue-storage set, or (during a staged transition) the queue-storage set
with the canonical drain folded into its promotion and rescues.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from ..branch import BranchSpec
from ..config import MaintenanceConfig
from ..context import MaintenanceContext
from ..cron import cron_branches
from ..db import DatabaseError
from ..queue_storage import cleanup as qs_cleanup
from ..queue_storage import promote as qs_promote
from ..queue_storage import queue_stats as qs_queue_stats
from ..queue_storage import rescue_callbacks as qs_rescue_callbacks
from ..queue_storage import rescue_deadlines as qs_rescue_deadlines
from ..queue_storage import rescue_heartbeats as qs_rescue_heartbeats
from ..queue_storage import rotate_claim, rotate_lease, rotate_queue, terminal_count_rollup
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

log = logging.getLogger(__name__)

RunOnce = Callable[[MaintenanceContext], Awaitable[Any]]


def canonical_branches(config: MaintenanceConfig) -> list[BranchSpec]:
    return [
        BranchSpec(
            rescue_heartbeats.NAME, config.heartbeat_rescue_interval, rescue_heartbeats.run_once
        ),
        BranchSpec(
            rescue_deadlines.NAME, config.deadline_rescue_interval, rescue_deadlines.run_once
        ),
        BranchSpec(
            rescue_callbacks.NAME, config.callback_rescue_interval, rescue_callbacks.run_once
        ),
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
        BranchSpec(
            batch_operations.NAME, config.batch_operations_interval, batch_operations.run_once
        ),
        # cron_sync (runs at once on election) and cron_eval (never skipped by
        # overrun cooldown). Cron inserts through awa.insert_job_compat, so
        # these two are engine-independent.
        *cron_branches(config),
    ]


def queue_storage_branches(config: MaintenanceConfig) -> list[BranchSpec]:
    """Upstream's queue-storage set: no admin metadata, no priority aging, no
    row-by-row job cleanup (rings are pruned whole instead)."""
    return [
        BranchSpec(
            qs_rescue_heartbeats.NAME, config.heartbeat_rescue_interval,
            qs_rescue_heartbeats.run_once,
        ),
        BranchSpec(
            qs_rescue_deadlines.NAME, config.deadline_rescue_interval, qs_rescue_deadlines.run_once
        ),
        BranchSpec(
            qs_rescue_callbacks.NAME, config.callback_rescue_interval, qs_rescue_callbacks.run_once
        ),
        BranchSpec(
            qs_promote.NAME, config.promote_interval, qs_promote.run_once, run_immediately=True
        ),
        BranchSpec(qs_cleanup.NAME, config.cleanup_interval, qs_cleanup.run_once),
        BranchSpec(qs_queue_stats.NAME, config.queue_stats_interval, qs_queue_stats.run_once),
        BranchSpec(
            batch_operations.NAME, config.batch_operations_interval, batch_operations.run_once
        ),
        BranchSpec(
            terminal_count_rollup.NAME, config.terminal_count_rollup_interval,
            terminal_count_rollup.run_once, cooldown=False,
        ),
        BranchSpec(rotate_queue.NAME, config.queue_rotate_interval, rotate_queue.run_once),
        BranchSpec(rotate_lease.NAME, config.lease_rotate_interval, rotate_lease.run_once),
        BranchSpec(
            rotate_claim.NAME, config.effective_claim_rotate_interval, rotate_claim.run_once
        ),
        *cron_branches(config),
    ]


#: Canonical branches whose rows can still be draining during a transition.
CANONICAL_DRAIN = {
    promote.NAME: promote.run_once,
    rescue_heartbeats.NAME: rescue_heartbeats.run_once,
    rescue_deadlines.NAME: rescue_deadlines.run_once,
    rescue_callbacks.NAME: rescue_callbacks.run_once,
}


def both_planes(name: str, queue_storage_pass: RunOnce, canonical_pass: RunOnce) -> RunOnce:
    """One body that serves both planes: a database error on one plane is
    logged and the other still runs (then the error is raised for the
    branch's usual logging)."""

    async def run_once(ctx: MaintenanceContext) -> tuple[Any, Any]:
        results: list[Any] = []
        errors: list[DatabaseError] = []
        for plane, body in (("queue_storage", queue_storage_pass), ("canonical", canonical_pass)):
            try:
                results.append(await body(ctx))
            except DatabaseError as exc:
                log.error("%s: %s plane failed: %s", name, plane, exc)
                results.append(None)
                errors.append(exc)
        if len(errors) == 2:
            raise errors[0]
        return results[0], results[1]

    return run_once


def mixed_transition_branches(config: MaintenanceConfig) -> list[BranchSpec]:
    """Queue storage is live but canonical rows still drain: promotion and the
    three rescues serve both planes, written straight on the canonical tables
    (``awa.jobs`` then shows only queue storage)."""
    branches = []
    for spec in queue_storage_branches(config):
        canonical_pass = CANONICAL_DRAIN.get(spec.name)
        if canonical_pass is not None:
            spec = BranchSpec(
                spec.name, spec.interval, both_planes(spec.name, spec.run_once, canonical_pass),
                cooldown=spec.cooldown, run_immediately=spec.run_immediately,
            )
        branches.append(spec)
    return branches


def default_branches(config: MaintenanceConfig, schema: SchemaInfo) -> list[BranchSpec]:
    if schema.in_mixed_transition:
        return mixed_transition_branches(config)
    if schema.runs_queue_storage:
        return queue_storage_branches(config)
    return canonical_branches(config)
