"""The canonical engine (``awa.jobs_hot`` and ``awa.scheduled_jobs``) as an
:class:`~awa_trio.engines.base.Engine`. Light on purpose: the branch
modules load only when a term asks for the branch specs."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from ...sql import Statement
from ..backlog import rescue_backlog
from ..base import BacklogReads, DrainPasses, Engine, Wording
from .grant_needs import GRANTS

if TYPE_CHECKING:
    from ...branch import BranchSpec
    from ...config import MaintenanceConfig

NAME = "canonical"

#: Due jobs not yet promoted: the scheduled table holds both due states.
DUE_COUNTS_SQL = Statement("""
    SELECT state::text AS state, count(*) AS jobs,
           extract(epoch FROM now() - min(run_at))::float8 AS oldest_seconds
    FROM awa.scheduled_jobs
    WHERE state IN ('scheduled', 'retryable') AND run_at <= now()
    GROUP BY state ORDER BY state
""")
#: Running and waiting jobs live in the hot table.
RESCUE_BACKLOG_SQL = rescue_backlog("awa.jobs_hot")


def _branches(config: MaintenanceConfig) -> list[BranchSpec]:
    from .registry import canonical_branches

    return canonical_branches(config)


@functools.cache
def _drain_passes() -> DrainPasses:
    """Built once, so every transition term folds in the same bodies."""
    from . import canonical_drain

    return canonical_drain.drain_passes()


def _rescue_reasons() -> dict[str, str]:
    from . import rescue_callbacks, rescue_deadlines, rescue_heartbeats

    return {
        rescue_heartbeats.RESCUE_ERROR: "heartbeat",
        rescue_deadlines.RESCUE_ERROR: "deadline",
        rescue_callbacks.RESCUE_ERROR: "callback",
    }


#: Every branch it may run (checked against the specs by the tests).
BRANCH_NAMES = frozenset({
    "rescue_stale_heartbeats", "rescue_expired_deadlines", "rescue_expired_callbacks",
    "promote_scheduled", "cleanup", "priority_aging", "recompute_dirty_admin_metadata",
    "refresh_admin_metadata", "queue_stats", "batch_operations", "cron_sync", "cron_eval",
    # The drain's report, run beside the next engine's set during a transition.
    "canonical_drain",
})  # fmt: skip


ENGINE = Engine(
    name=NAME,
    title="the canonical engine",
    branch_names=BRANCH_NAMES,
    branches=_branches,
    # Nothing moves into the canonical engine.
    transition_branches=None,
    drain_passes=_drain_passes,
    grants=GRANTS,
    backlog=BacklogReads(due_counts=DUE_COUNTS_SQL, rescue_backlog=RESCUE_BACKLOG_SQL),
    uses_storage_schema=False,
    # A fresh install starts on it.
    install=None,
    worker_role="canonical_drain",
    wording=Wording(
        migrated=(
            "it is on the canonical engine (state {state}). The first awa-pg runtime started "
            "with the default storage_transition_role='auto' switches a fresh install to queue "
            "storage, Awa 0.6's default; `migrate --engine queue_storage` switches it now"
        ),
        demo=(
            "the database runs on the canonical engine (awa.storage_status(): engine "
            "{engine}, state {state}); awa_trio leads it with its canonical branches"
        ),
    ),
    rescue_reasons=_rescue_reasons,
    # No statement of its names a ring partition.
    sql_examples=None,
    # Nothing transitions into the canonical engine in this release.
    prepared_schema_ready=None,
)
