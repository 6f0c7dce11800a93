"""Which branches run on which storage engine, at which interval.

The only place that knows about engines: branch modules never ask which
engine they run on. ``default_branches`` picks the canonical set, the
queue-storage set, or (during a staged transition) the queue-storage set
with the canonical drain folded into its promotion, rescues and cleanup
(:mod:`awa_trio.engines.canonical.canonical_drain` says why, and what upstream
does).

The queue-storage sets are built by :mod:`awa_trio.engines.queue_storage.registry`,
imported only when a term needs them: a canonical leader never loads the
queue-storage modules (start-up CPU is part of the idle cost).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from .branch import BranchSpec
from .config import MaintenanceConfig
from .context import MaintenanceContext
from .engines.canonical import (
    canonical_drain,
    cleanup,
    promote,
    rescue_callbacks,
    rescue_deadlines,
    rescue_heartbeats,
)
from .engines.canonical.registry import canonical_branches
from .maintenance.planes import both_planes
from .schema import SchemaInfo

log = logging.getLogger(__name__)

RunOnce = Callable[[MaintenanceContext], Awaitable[Any]]


def default_branches(config: MaintenanceConfig, schema: SchemaInfo) -> list[BranchSpec]:
    if not schema.runs_queue_storage and not schema.in_mixed_transition:
        return canonical_branches(config)
    if schema.in_mixed_transition:
        return mixed_transition_branches(config)
    from .engines.queue_storage.registry import queue_storage_branches

    return queue_storage_branches(config)


def every_branch_name(config: MaintenanceConfig) -> frozenset[str]:
    """Every branch name on any engine and transition state: what
    ``disabled_branches`` and pause accept (the set a leader runs changes
    with the storage state while it runs)."""
    from .engines.queue_storage.registry import queue_storage_branches

    names = {spec.name for spec in canonical_branches(config)}
    names |= {spec.name for spec in queue_storage_branches(config)}
    names |= {spec.name for spec in mixed_transition_branches(config)}
    return frozenset(names)


#: What the canonical plane still needs while it drains (branch name,
#: the same on both engines -> canonical pass folded into it): promotion and the three rescues
#: (otherwise rows are stranded, as in upstream 0.6.1; the heartbeat and
#: deadline rescues fail exhausted attempts there), and the deletion of
#: finished canonical rows. See awa_trio.engines.canonical.canonical_drain.
CANONICAL_DRAIN: dict[str, RunOnce] = {
    promote.NAME: canonical_drain.drain_pass(promote.NAME, promote.run_once),
    rescue_heartbeats.NAME: canonical_drain.drain_pass(
        rescue_heartbeats.NAME, canonical_drain.rescue_stale_heartbeats
    ),
    rescue_deadlines.NAME: canonical_drain.drain_pass(
        rescue_deadlines.NAME, canonical_drain.rescue_expired_deadlines
    ),
    rescue_callbacks.NAME: canonical_drain.drain_pass(rescue_callbacks.NAME, rescue_callbacks.run_once),
    cleanup.NAME: canonical_drain.delete_finished_canonical_jobs,
}


def mixed_transition_branches(config: MaintenanceConfig) -> list[BranchSpec]:
    """Queue storage is live but canonical rows still drain: the queue-storage
    set, with the canonical drain folded into promotion, the rescues and
    cleanup, plus the ``canonical_drain`` report."""
    from .engines.queue_storage.registry import queue_storage_branches

    branches = []
    for spec in queue_storage_branches(config):
        canonical_pass = CANONICAL_DRAIN.get(spec.name)
        if canonical_pass is not None:
            spec = dataclasses.replace(spec, run_once=both_planes(spec.name, spec.run_once, canonical_pass))
        branches.append(spec)
    # Read-only, so it shares the queue-stats cadence (a report, like them).
    branches.append(
        BranchSpec(
            canonical_drain.NAME,
            config.queue_stats_interval,
            canonical_drain.make_report(),
            run_immediately=True,
        )
    )
    return branches
