"""queue_stats (queue storage): ``awa.queue.depth`` per state, ``awa.queue.lag``
and ``awa.job.dlq_depth`` from Awa's bounded head-signal reading.

Numbers as awa-worker's observability path computes them (awa-worker 0.6.1,
``publish_queue_storage_health_metrics``), so Awa dashboards read the same:

* ``available``: the dispatcher's claim signal, ``sum(enqueue_seq -
  claim_seq)`` over each queue's lanes (two sequence reads per lane, no scan
  of ready rows; an upper bound, since tombstoned or aborted reservations
  still count until claims move past them);
* ``running``: lease rows plus open receipt claims that never materialised a
  lease. awa-pg's workers claim on the fast receipt path, which writes no
  lease row: lease rows alone show 0 running while a Python fleet is busy
  (docs/differences.md). (Zero-deadline compact claim
  batches, which awa-pg 0.6.1 does not write, are not expanded);
* ``waiting_external``: lease rows;
* ``scheduled`` / ``retryable``: ``deferred_jobs``;
* ``failed``: failed rows in ``done_entries`` plus the DLQ, and the DLQ alone
  as ``awa.job.dlq_depth``;
* lag: seconds since the ``run_at`` of the first live ready row at each
  lane's claim cursor (one index probe per lane), none when nothing is ready.

**Never waiting on a prune.** A ring prune holds ACCESS EXCLUSIVE on one
slot's child tables for its TRUNCATE (and queues for it behind readers).
Reading the ready, done and lease partitioned tables in one statement
without a lock timeout would take ACCESS SHARE on every child while
planning, so the metrics would wait behind every prune, and readers queued
behind that wait too. So the reading is four statements, each in its own
transaction with ``lock_timeout`` = :data:`RING_LOCK_TIMEOUT`:

1. control tables a prune never locks (heads, ``queue_meta``,
   ``deferred_jobs``, terminal counters, ``dlq_entries``): the queue list,
   available, scheduled, retryable, DLQ depth;
2. the lease ring: running leases, waiting_external;
3. the claim ring: open receipt claims (running);
4. the queue ring: failed done rows and lag.

A statement that meets a prune's lock gives up after that timeout, and only
its gauges keep last tick's value; the rest are published as usual.

Like the canonical branch, a queue that drains reports lag 0 once, and a queue
that leaves every source reports depth (and DLQ depth) 0 once.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from ...body import BodyResult
from ...context import MaintenanceContext
from ...db import LOCK_NOT_AVAILABLE, Connection, QueryError, describe_error, milliseconds
from ...sql import Fragment, Statement
from ..queue_info import DEPTH_STATES, publish_info
from .layout import schema_name

log = logging.getLogger(__name__)

NAME = "queue_stats"
#: Longest any statement of this branch waits for a table lock (seconds).
RING_LOCK_TIMEOUT = 0.1

CONTROL_PART = "control"
LEASE_RING_PART = "lease_ring"
CLAIM_RING_PART = "claim_ring"
QUEUE_RING_PART = "queue_ring"

# Per-lane cursors: the claim signal of every (queue, priority, shard).
_HEAD_SIGNAL = Fragment("""
    head_signal AS (
        SELECT
            enqueues.queue,
            enqueues.priority,
            enqueues.enqueue_shard,
            {schema}.sequence_next_value(enqueues.seq_name) AS next_seq,
            {schema}.sequence_next_value(claims.seq_name) AS claim_seq
        FROM {schema}.queue_enqueue_heads AS enqueues
        JOIN {schema}.queue_claim_heads AS claims
          ON claims.queue = enqueues.queue
         AND claims.priority = enqueues.priority
         AND claims.enqueue_shard = enqueues.enqueue_shard
        WHERE enqueues.seq_name IS NOT NULL AND claims.seq_name IS NOT NULL
    )
""")

# Part 1: only tables no prune ever locks.
CONTROL_SQL = Statement(
    """
    WITH {head_signal},
    queues AS (
        SELECT queue FROM awa.queue_meta
        UNION SELECT queue FROM head_signal
        UNION SELECT queue FROM {schema}.deferred_jobs
        UNION SELECT queue FROM {schema}.queue_terminal_live_counts
        UNION SELECT queue FROM {schema}.queue_terminal_rollups
        UNION SELECT queue FROM {schema}.dlq_entries
    ),
    ready AS (
        SELECT queue, sum(GREATEST(next_seq - claim_seq, 0))::bigint AS available
        FROM head_signal
        GROUP BY queue
    ),
    deferred AS (
        SELECT
            queue,
            count(*) FILTER (WHERE state = 'scheduled')::bigint AS scheduled,
            count(*) FILTER (WHERE state = 'retryable')::bigint AS retryable
        FROM {schema}.deferred_jobs
        GROUP BY queue
    ),
    dlq AS (
        SELECT queue, count(*)::bigint AS dlq_depth
        FROM {schema}.dlq_entries
        GROUP BY queue
    )
    SELECT
        queues.queue,
        COALESCE(ready.available, 0) AS available,
        COALESCE(deferred.scheduled, 0) AS scheduled,
        COALESCE(deferred.retryable, 0) AS retryable,
        COALESCE(dlq.dlq_depth, 0) AS dlq_depth
    FROM queues
    LEFT JOIN ready ON ready.queue = queues.queue
    LEFT JOIN deferred ON deferred.queue = queues.queue
    LEFT JOIN dlq ON dlq.queue = queues.queue
    ORDER BY queues.queue
""",
    head_signal=_HEAD_SIGNAL(),
)

# Part 2: the lease ring's partitions.
LEASE_RING_SQL = Statement("""
    SELECT
        queue,
        count(*) FILTER (WHERE state = 'running')::bigint AS running,
        count(*) FILTER (WHERE state = 'waiting_external')::bigint AS waiting_external
    FROM {schema}.leases
    GROUP BY queue
""")

# Part 3: the claim ring's partitions. On the fast claim path (awa-pg's
# workers) a running job has no lease row, only an open receipt claim: one
# not closed, with no closure row or closure batch, never materialised into a
# lease (a materialised one is counted by its lease row).
CLAIM_RING_SQL = Statement("""
    SELECT claims.queue, count(*)::bigint AS running_claims
    FROM {schema}.lease_claims AS claims
    WHERE claims.closed_at IS NULL
      AND claims.materialized_at IS NULL
      AND NOT EXISTS (
          SELECT 1 FROM {schema}.lease_claim_closures AS closures
          WHERE closures.claim_slot = claims.claim_slot
            AND closures.job_id = claims.job_id
            AND closures.run_lease = claims.run_lease
      )
      AND NOT EXISTS (
          SELECT 1 FROM {schema}.lease_claim_closure_batches AS closure_batches
          WHERE closure_batches.claim_slot = claims.claim_slot
            AND closure_batches.receipt_ranges @> claims.receipt_id
      )
    GROUP BY claims.queue
""")

# Part 4: the queue ring's partitions. Lag probes each lane at its claim
# cursor along the ready primary key, skipping tombstoned entries.
QUEUE_RING_SQL = Statement(
    """
    WITH {head_signal},
    failed_done AS (
        SELECT queue, count(*)::bigint AS failed_done
        FROM {schema}.done_entries
        WHERE state = 'failed'
        GROUP BY queue
    ),
    lag AS (
        SELECT
            head_signal.queue,
            EXTRACT(EPOCH FROM clock_timestamp() - min(next_ready.run_at))::float8 AS lag_seconds
        FROM head_signal
        CROSS JOIN LATERAL (
            SELECT ready.run_at
            FROM {schema}.ready_entries AS ready
            WHERE ready.queue = head_signal.queue
              AND ready.priority = head_signal.priority
              AND ready.enqueue_shard = head_signal.enqueue_shard
              AND ready.lane_seq >= head_signal.claim_seq
              AND NOT EXISTS (
                  SELECT 1
                  FROM {schema}.ready_tombstones AS tomb
                  WHERE tomb.ready_slot = ready.ready_slot
                    AND tomb.ready_generation = ready.ready_generation
                    AND tomb.queue = ready.queue
                    AND tomb.priority = ready.priority
                    AND tomb.enqueue_shard = ready.enqueue_shard
                    AND tomb.lane_seq = ready.lane_seq
              )
            ORDER BY ready.lane_seq
            LIMIT 1
        ) AS next_ready
        WHERE head_signal.next_seq > head_signal.claim_seq
        GROUP BY head_signal.queue
    )
    SELECT
        COALESCE(failed_done.queue, lag.queue) AS queue,
        COALESCE(failed_done.failed_done, 0) AS failed_done,
        lag.lag_seconds
    FROM failed_done
    FULL JOIN lag ON lag.queue = failed_done.queue
""",
    head_signal=_HEAD_SIGNAL(),
)


@dataclasses.dataclass(frozen=True)
class QueueStats:
    queue: str
    #: Job count per state published this tick (a state is missing when its
    #: part met a prune's lock).
    depth: dict[str, int]
    #: Seconds since the oldest ready job's run_at; None when none is ready
    #: (or when the queue-ring part was skipped).
    lag_seconds: float | None
    dlq_depth: int


@dataclasses.dataclass
class QueueStatsResult(BodyResult):
    #: What was published, one entry per queue, ordered by queue name.
    queues: list[QueueStats] = dataclasses.field(default_factory=list)
    #: Parts that gave up on a lock this tick (their gauges kept last values).
    skipped_parts: list[str] = dataclasses.field(default_factory=list)
    #: Queues set to zero because they left every source.
    vanished: set[str] = dataclasses.field(default_factory=set)


async def run_once(ctx: MaintenanceContext) -> QueueStatsResult:
    schema = schema_name(ctx)
    result = QueueStatsResult()
    async with ctx.db.acquire() as conn:
        control = await _read_part(conn, result, CONTROL_PART, CONTROL_SQL.render(schema))
        if control is None:
            return result
        leases = await _read_part(conn, result, LEASE_RING_PART, LEASE_RING_SQL.render(schema))
        claims = await _read_part(conn, result, CLAIM_RING_PART, CLAIM_RING_SQL.render(schema))
        queue_ring = await _read_part(conn, result, QUEUE_RING_PART, QUEUE_RING_SQL.render(schema))

    lease_rows = {row["queue"]: row for row in leases or ()}
    claim_rows = {row["queue"]: int(row["running_claims"]) for row in claims or ()}
    ring_rows = {row["queue"]: row for row in queue_ring or ()}
    control_rows = {row["queue"]: row for row in control}
    for queue in sorted(control_rows.keys() | lease_rows.keys() | claim_rows.keys() | ring_rows.keys()):
        row = control_rows.get(queue)
        dlq_depth = int(row["dlq_depth"]) if row else 0
        depth = {
            "available": int(row["available"]) if row else 0,
            "scheduled": int(row["scheduled"]) if row else 0,
            "retryable": int(row["retryable"]) if row else 0,
        }
        if leases is not None:
            lease = lease_rows.get(queue)
            depth["waiting_external"] = int(lease["waiting_external"]) if lease else 0
            if claims is not None:
                running_leases = int(lease["running"]) if lease else 0
                depth["running"] = running_leases + claim_rows.get(queue, 0)
        lag_seconds = None
        if queue_ring is not None:
            ring = ring_rows.get(queue)
            depth["failed"] = (int(ring["failed_done"]) if ring else 0) + dlq_depth
            lag_seconds = ring["lag_seconds"] if ring else None
            ctx.metrics.record_queue_lag(queue, lag_seconds)
        ctx.metrics.record_queue_depth(queue, depth)
        ctx.metrics.record_dlq_depth(queue, dlq_depth)
        result.queues.append(QueueStats(queue, depth, lag_seconds, dlq_depth))

    if not result.skipped_parts:
        # Only a complete reading may declare a queue gone.
        result.vanished = ctx.metrics.zero_vanished_queues(
            {stats.queue for stats in result.queues}, DEPTH_STATES
        )
        for queue in result.vanished:
            ctx.metrics.record_dlq_depth(queue, 0)
    await publish_info(ctx)
    log.debug("%s: published depth and lag of %d queues", NAME, len(result.queues))
    return result


async def _read_part(conn: Connection, result: QueueStatsResult, part: str, sql: str) -> list[Any] | None:
    """One part's rows, or None when a lock held it up past RING_LOCK_TIMEOUT."""
    try:
        # The timeout goes with the BEGIN: no round trip of its own.
        async with conn.transaction(local_settings={"lock_timeout": milliseconds(RING_LOCK_TIMEOUT)}):
            return await conn.fetch(sql)
    except QueryError as exc:
        if exc.sqlstate != LOCK_NOT_AVAILABLE:
            raise
        log.info(
            "%s: %s tables are locked (a prune?); keeping their last values this tick: %s",
            NAME,
            part,
            describe_error(exc),
        )
        result.skipped_parts.append(part)
        return None
