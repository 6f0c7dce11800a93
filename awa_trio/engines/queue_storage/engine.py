"""The queue-storage engine (rings, lanes and deferred rows in the schema
``awa.storage_status()`` names) as an :class:`~awa_trio.engines.base.Engine`.
Light on purpose: the branch modules load only when a term asks for the
branch specs, so checking a configured branch name on a canonical leader
loads none of them."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...sql import Statement
from ..backlog import rescue_backlog
from ..base import BacklogReads, DrainPasses, Engine
from .grant_needs import GRANTS

if TYPE_CHECKING:
    from ...branch import BranchSpec
    from ...config import MaintenanceConfig

NAME = "queue_storage"

#: Due jobs not yet promoted: every deferred row is scheduled or retryable.
DUE_COUNTS_SQL = Statement("""
    SELECT state::text AS state, count(*) AS jobs,
           extract(epoch FROM now() - min(run_at))::float8 AS oldest_seconds
    FROM {schema}.deferred_jobs
    WHERE run_at <= now()
    GROUP BY state ORDER BY state
""")
#: Running and waiting jobs, through the awa.jobs view (a union over the
#: queue-storage tables, fine for a command a person runs).
RESCUE_BACKLOG_SQL = rescue_backlog("awa.jobs")


def _branches(config: MaintenanceConfig) -> list[BranchSpec]:
    from .registry import queue_storage_branches

    return queue_storage_branches(config)


def _transition_branches(config: MaintenanceConfig, drain: DrainPasses) -> list[BranchSpec]:
    from .registry import mixed_transition_branches

    return mixed_transition_branches(config, drain)


def _install(database_url: str) -> None:
    from ...schema import install_queue_storage

    install_queue_storage(database_url)


#: Every branch it may run (checked against the specs by the tests).
BRANCH_NAMES = frozenset({
    "rescue_stale_heartbeats", "rescue_expired_deadlines", "rescue_expired_callbacks",
    "promote_scheduled", "cleanup", "queue_stats", "batch_operations", "terminal_count_rollup",
    "rotate_queue", "rotate_lease", "rotate_claim", "cron_sync", "cron_eval",
})  # fmt: skip


ENGINE = Engine(
    name=NAME,
    title="queue storage",
    branch_names=BRANCH_NAMES,
    branches=_branches,
    transition_branches=_transition_branches,
    # Nothing drains out of queue storage in this release.
    drain_passes=None,
    grants=GRANTS,
    backlog=BacklogReads(due_counts=DUE_COUNTS_SQL, rescue_backlog=RESCUE_BACKLOG_SQL),
    uses_storage_schema=True,
    install=_install,
    worker_role="auto",
)
