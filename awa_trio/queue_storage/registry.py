"""The queue-storage branch sets: upstream's queue-storage set, and the same
set with the canonical drain folded in during a staged transition.

:mod:`awa_trio.branches.registry` picks the set per engine and imports this
module only when a term runs queue storage.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from ..branch import BranchSpec
from ..branches import batch_operations, promote, rescue_callbacks, rescue_deadlines, rescue_heartbeats
from ..config import MaintenanceConfig
from ..context import MaintenanceContext
from ..cron import cron_branches
from ..db import DatabaseError, describe_error
from . import batch_operations as qs_batch_operations
from . import canonical_drain, rotate_claim, rotate_lease, rotate_queue, terminal_count_rollup
from . import cleanup as qs_cleanup
from . import promote as qs_promote
from . import queue_stats as qs_queue_stats
from . import rescue_callbacks as qs_rescue_callbacks
from . import rescue_deadlines as qs_rescue_deadlines
from . import rescue_heartbeats as qs_rescue_heartbeats

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
        BranchSpec(qs_promote.NAME, config.promote_interval, qs_promote.run_once, run_immediately=True),
        BranchSpec(qs_cleanup.NAME, config.cleanup_interval, qs_cleanup.run_once),
        BranchSpec(qs_queue_stats.NAME, config.queue_stats_interval, qs_queue_stats.run_once),
        BranchSpec(batch_operations.NAME, config.batch_operations_interval, qs_batch_operations.run_once),
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


#: What the canonical plane still needs while it drains (queue-storage branch
#: name -> canonical pass folded into it): promotion and the three rescues
#: (otherwise rows are stranded, as in upstream 0.6.1; the heartbeat and
#: deadline rescues fail exhausted attempts there), and the deletion of
#: finished canonical rows. See awa_trio.queue_storage.canonical_drain.
CANONICAL_DRAIN: dict[str, RunOnce] = {
    qs_promote.NAME: canonical_drain.drain_pass(promote.NAME, promote.run_once),
    qs_rescue_heartbeats.NAME: canonical_drain.drain_pass(
        rescue_heartbeats.NAME, canonical_drain.rescue_stale_heartbeats
    ),
    qs_rescue_deadlines.NAME: canonical_drain.drain_pass(
        rescue_deadlines.NAME, canonical_drain.rescue_expired_deadlines
    ),
    qs_rescue_callbacks.NAME: canonical_drain.drain_pass(rescue_callbacks.NAME, rescue_callbacks.run_once),
    qs_cleanup.NAME: canonical_drain.delete_finished_canonical_jobs,
}


@dataclasses.dataclass(frozen=True)
class PlaneResults:
    """What one both-planes pass did on each plane (None: that plane failed)."""

    queue_storage: Any
    canonical: Any


def both_planes(name: str, queue_storage_pass: RunOnce, canonical_pass: RunOnce) -> RunOnce:
    """One body that serves both planes. Each plane gets its pass whatever
    the other one did: a database error is logged with the plane and the
    branch goes on (raised only when both planes failed); any other exception
    (a bug) is raised after the other plane has run, for the supervisor."""

    async def run_once(ctx: MaintenanceContext) -> PlaneResults:
        results: dict[str, Any] = {}
        database_errors: list[DatabaseError] = []
        bug: Exception | None = None
        for plane, body in (("queue_storage", queue_storage_pass), ("canonical", canonical_pass)):
            results[plane] = None
            try:
                results[plane] = await body(ctx)
            except DatabaseError as exc:
                log.error("%s: %s plane failed: %s", name, plane, describe_error(exc))
                database_errors.append(exc)
            except Exception as exc:
                bug = bug or exc
        if bug is not None:
            raise bug
        if len(database_errors) == 2:
            raise database_errors[0]
        return PlaneResults(queue_storage=results["queue_storage"], canonical=results["canonical"])

    run_once.__name__ = f"{name}_both_planes"
    run_once.__qualname__ = run_once.__name__
    return run_once


def mixed_transition_branches(config: MaintenanceConfig) -> list[BranchSpec]:
    """Queue storage is live but canonical rows still drain: the queue-storage
    set, with the canonical drain folded into promotion, the rescues and
    cleanup, plus the ``canonical_drain`` report."""
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
