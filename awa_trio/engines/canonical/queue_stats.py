"""queue_stats: publish ``awa.queue.depth`` and ``awa.queue.lag`` so existing
Awa dashboards show the queues this leader maintains.

Semantics follow Awa's ``queue_overviews`` (the numbers Awa's own UI and
``Client.queue_stats()`` show), because dashboards and alerts are built on
them:

* the queues reported are those in the admin cache
  (``awa.queue_state_counts``) plus every declared queue (descriptors,
  ``awa.queue_meta``, the queue lists of runtime snapshots); a declared queue
  with no jobs reports depth 0 and no lag;
* depth per state comes from the admin cache, not from counting the job
  tables. Cost: one read of a table with a row per queue, however many
  millions of jobs there are. Price: the numbers are as fresh as the cache,
  which ``recompute_dirty_admin_metadata`` brings up to date every 2 s (and
  ``refresh_admin_metadata`` rebuilds every 60 s); a queue whose jobs were
  never recomputed is not reported yet;
* lag is live: seconds since the ``run_at`` of the queue's oldest
  ``available`` job in ``awa.jobs_hot`` (none when nothing is available).
  Each queue costs one index probe per priority level, not an aggregate
  over every available row; the minimum is the same.

A queue whose last available job was taken reports lag 0 (not its last
lag, forever), and a queue that leaves every source above reports depth 0
once, so alerts on these gauges clear.

Canonical engine only; queue storage reports its depth from its ring tables.
"""

from __future__ import annotations

import dataclasses
import logging

from ...body import BodyResult
from ...context import MaintenanceContext
from ...sql import Statement
from ..queue_info import DEPTH_STATES, publish_info

log = logging.getLogger(__name__)

__all__ = ["DEPTH_STATES", "NAME", "run_once"]

NAME = "queue_stats"

# all_queues: every source of queue names Awa's overview unions.
# Lag: the dequeue index is (queue, priority, run_at, id) WHERE available, so
# the oldest run_at of one queue is the least of the first entries of its
# priority levels. Priorities are 1..4 (CHECK jobs_hot_priority_in_range);
# probing each level reads 4 index entries per queue instead of every
# available row. now() is the statement's start, as in Awa's overview.
QUEUE_OVERVIEW_SQL = Statement("""
    WITH all_queues AS (
        SELECT queue FROM awa.queue_state_counts
        UNION
        SELECT queue FROM awa.queue_descriptors
        UNION
        SELECT queue FROM awa.queue_meta
        UNION
        SELECT descriptor.key
        FROM awa.runtime_instances AS runtime
        CROSS JOIN LATERAL jsonb_each_text(runtime.queue_descriptor_hashes)
            AS descriptor(key, value)
    )
    SELECT
        q.queue,
        COALESCE(counts.available, 0) AS available,
        COALESCE(counts.running, 0) AS running,
        COALESCE(counts.failed, 0) AS failed,
        COALESCE(counts.scheduled, 0) AS scheduled,
        COALESCE(counts.retryable, 0) AS retryable,
        COALESCE(counts.waiting_external, 0) AS waiting_external,
        lag.lag_seconds
    FROM all_queues AS q
    LEFT JOIN awa.queue_state_counts AS counts ON counts.queue = q.queue
    LEFT JOIN LATERAL (
        SELECT EXTRACT(EPOCH FROM (now() - min(oldest.run_at)))::float8 AS lag_seconds
        FROM generate_series(1, 4) AS level(priority)
        CROSS JOIN LATERAL (
            SELECT job.run_at
            FROM awa.jobs_hot AS job
            WHERE job.state = 'available'
              AND job.queue = q.queue
              AND job.priority = level.priority
            ORDER BY job.run_at
            LIMIT 1
        ) AS oldest
    ) AS lag ON true
    ORDER BY q.queue
""")


@dataclasses.dataclass(frozen=True)
class QueueStats:
    queue: str
    #: Job count per state in DEPTH_STATES.
    depth: dict[str, int]
    #: Seconds since the oldest available job's run_at; None when none is available.
    lag_seconds: float | None


@dataclasses.dataclass
class QueueStatsResult(BodyResult):
    #: What was published, one entry per queue, ordered by queue name.
    queues: list[QueueStats] = dataclasses.field(default_factory=list)


async def run_once(ctx: MaintenanceContext) -> QueueStatsResult:
    result = QueueStatsResult()
    for row in await ctx.db.fetch(*QUEUE_OVERVIEW_SQL.bind()):
        stats = QueueStats(
            queue=row["queue"],
            depth={state: int(row[state]) for state in DEPTH_STATES},
            lag_seconds=row["lag_seconds"],
        )
        ctx.metrics.record_queue_depth(stats.queue, stats.depth)
        ctx.metrics.record_queue_lag(stats.queue, stats.lag_seconds)
        result.queues.append(stats)
    ctx.metrics.zero_vanished_queues({stats.queue for stats in result.queues}, DEPTH_STATES)
    await publish_info(ctx)
    log.debug("%s: published depth and lag of %d queues", NAME, len(result.queues))
    return result
