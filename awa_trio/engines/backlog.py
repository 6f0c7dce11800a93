"""The rescue-backlog read both engines' :class:`~awa_trio.engines.base.BacklogReads`
use, over the table or view that shows their running jobs."""

from __future__ import annotations

from ..sql import Statement

#: Jobs a rescue would take, counted (``{jobs}``: the engine's job table or view).
_RESCUE_BACKLOG = """
    SELECT
        count(*) FILTER (WHERE state = 'running' AND heartbeat_at < now() - make_interval(secs => :staleness))
            AS stale_heartbeats,
        count(*) FILTER (WHERE state = 'running' AND deadline_at < now()) AS past_deadline,
        count(*) FILTER (WHERE state = 'waiting_external' AND callback_timeout_at < now())
            AS callbacks_timed_out
    FROM {jobs}
    WHERE state IN ('running', 'waiting_external')
"""


def rescue_backlog(jobs: str) -> Statement:
    """The rescue backlog over ``jobs`` (a schema-qualified table or view)."""
    return Statement(_RESCUE_BACKLOG, jobs=jobs)
