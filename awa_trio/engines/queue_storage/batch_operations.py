"""batch_operations (queue storage): run awa-pg's admin batch operations
(``set_priority``, ``move_queue``) on the queue-storage tables.

The runner is the shared one (:mod:`awa_trio.maintenance.batch_operations`:
runner lock, claim, scan into items, 100 items per tick, finalisation,
cancellation, retention); this module supplies what differs on this engine,
following upstream ``awa_model::batch_operations`` with
``QueueStorage::{set_priority_tx, move_queue_tx}`` (v0.6.1):

* **Which jobs match.** Available jobs are the live ready entries: at or
  ahead of their lane's claim cursor and not tombstoned. Scheduled jobs are
  ``deferred_jobs`` rows in state ``scheduled``. Tags come from the stored
  payload (``awa.queue_storage_payload_tags``).
* **A scheduled job** is updated in place (queue, priority, stamped
  metadata); promotion later files it under its new lane.
* **An available job** cannot change lane in place: its position is its
  ``(queue, priority, shard, lane_seq)``. Its entry is tombstoned and the job
  re-entered as a new ready entry at the tail of the target lane in the live
  ring slot (lane rows and sequences created if new, a lane sequence
  reserved under the lane's lock, a ready segment, a NOTIFY of the queue),
  keeping its id, attempt, run lease, run_at, unique key and payload.
* Metadata is stamped as on canonical: ``_awa_original_priority`` (first
  time only) when a priority is set, ``_awa_original_queue`` (first time
  only) by move_queue. A NULL payload (``enqueue_many_copy``) becomes the
  standard empty one.

Each item is one short transaction. Unlike upstream, an available job's
claim head is locked (``FOR UPDATE``, as the claimer locks it) before its
entry is read and tombstoned: the claimer reads tombstones without locking
the entry, so without it a worker could claim the old entry while the job is
being re-entered, and the job would run twice. The claimer locks heads with
SKIP LOCKED, so it never waits on us; at worst one lane is passed over for
the few milliseconds of one item. A lock we cannot get within the pool's
``lock_timeout`` leaves the item pending for the next tick.

Concurrent writers, and what makes each pair safe:

* **Claimers** (awa-pg's ``claim_ready_runtime``) lock the lane's claim
  head ``SKIP LOCKED``, so while we hold it none claims in that lane. A
  claim that committed just before we got the head may not have moved the
  lane's cursor yet (the runtime moves it in a later transaction): the live
  check reads the claim evidence the claimer reads itself (compact claim
  batches, claims, closures, completions, leases and successor rows of the
  next run lease), in a statement after the lock, so a claimed job is never
  re-entered and run twice.
* **awa-pg's cancel, move and priority aging** tombstone entries: our
  tombstone insert says whether it inserted; if another transaction's
  tombstone won (we may have waited for its row lock), nothing is moved. A
  job that changed lanes while we waited for the heads we chose is left for
  the next tick (SQLSTATE 40001).
* **Producers and promotion** append to the target lane: the position is
  reserved under the lane's transaction lock in a statement of its own and
  the ring is read in the next one (the lane-order invariant in
  :mod:`.promote`).
* **Promotion of a scheduled job** being updated in place: both lock the
  deferred row; whoever comes second sees the other's committed result.
* **Rotation and prune**: the old entry is never truncated while unclaimed
  (the prune's pending-ready gate), and the new one lands in the live slot.

Not covered (as in upstream's default configuration): striped logical
queues, whose stripe choice needs the runtime's queue config.
"""

from __future__ import annotations

import functools
import uuid
from typing import Any

from ...context import MaintenanceContext
from ...db import Connection, QueryError
from ...maintenance import batch_operations as runner
from ...maintenance.batch_operations import (
    CLAIM_OPERATION_TEMPLATE,
    MATCHING_JOBS_TEMPLATE,
    NAME,
    OP_SET_PRIORITY,
    SCAN_BOUNDS_TEMPLATE,
    SCAN_PAGE_TEMPLATE,
    BatchOperationsResult,
    BatchOperationStorage,
    OperationPlan,
)
from .layout import schema_name

__all__ = ["NAME", "run_once", "storage_for"]

ENGINE_GUARD = "awa.active_storage_engine() = 'queue_storage'"

# Every available or scheduled job, in the runner's candidate shape.
CANDIDATES_SQL = """
        SELECT ready.job_id AS id, ready.kind, ready.queue,
               'available'::awa.job_state AS state,
               awa.queue_storage_payload_tags(ready.payload) AS tags, ready.created_at
        FROM {schema}.ready_entries AS ready
        JOIN {schema}.queue_claim_heads AS claims
          ON claims.queue = ready.queue
         AND claims.priority = ready.priority
         AND claims.enqueue_shard = ready.enqueue_shard
        WHERE ready.lane_seq >= {schema}.sequence_next_value(claims.seq_name)
          AND NOT EXISTS (
              SELECT 1 FROM {schema}.ready_tombstones AS tomb
              WHERE tomb.ready_slot = ready.ready_slot
                AND tomb.ready_generation = ready.ready_generation
                AND tomb.queue = ready.queue
                AND tomb.priority = ready.priority
                AND tomb.enqueue_shard = ready.enqueue_shard
                AND tomb.lane_seq = ready.lane_seq
          )
        UNION ALL
        SELECT job_id AS id, kind, queue, state,
               awa.queue_storage_payload_tags(payload) AS tags, created_at
        FROM {schema}.deferred_jobs
        WHERE state = 'scheduled'
"""

# The payload with its metadata stamped. {payload}, {queue}, {priority}: the
# job's current values; {stamp_queue} / {stamp_priority}: conditions. Filled
# in first, then the statement's {schema}, hence the doubled braces.
_STAMPED_PAYLOAD = """
    jsonb_set(
        COALESCE({payload}, '{{{{"metadata": {{{{}}}}, "tags": [], "errors": [], "progress": null}}}}'),
        '{{{{metadata}}}}',
        COALESCE(NULLIF({payload} -> 'metadata', 'null'), '{{{{}}}}')
            || CASE WHEN {stamp_queue}
                     AND NOT COALESCE(NULLIF({payload} -> 'metadata', 'null'), '{{{{}}}}')
                             ? '_awa_original_queue'
                    THEN jsonb_build_object('_awa_original_queue', {queue})
                    ELSE '{{{{}}}}' END
            || CASE WHEN {stamp_priority}
                     AND NOT COALESCE(NULLIF({payload} -> 'metadata', 'null'), '{{{{}}}}')
                             ? '_awa_original_priority'
                    THEN jsonb_build_object('_awa_original_priority', {priority})
                    ELSE '{{{{}}}}' END,
        true
    )
"""

# A scheduled job, in place. $1 job, $2 queue or NULL (keep), $3 priority or
# NULL (keep), $4 stamp the original queue.
UPDATE_SCHEDULED_SQL = (
    """
    UPDATE {schema}.deferred_jobs AS job
    SET queue = COALESCE($2::text, job.queue),
        priority = COALESCE($3::smallint, job.priority),
        payload = """
    + _STAMPED_PAYLOAD.format(
        payload="job.payload",
        queue="job.queue",
        priority="job.priority",
        stamp_queue="$4::boolean",
        stamp_priority="$3::smallint IS NOT NULL",
    )
    + """
    WHERE job.job_id = $1
      AND job.state = 'scheduled'
      AND (job.queue <> COALESCE($2::text, job.queue)
           OR job.priority <> COALESCE($3::smallint, job.priority))
    RETURNING job.job_id
"""
)

# Hold the claim heads of every lane with an entry of job $1, so no claimer
# takes the entry while it is tombstoned and re-entered. The lanes are chosen
# with this statement's snapshot, before the wait: LIVE_READY_ENTRY_SQL's
# lane is checked against them afterwards.
LOCK_SOURCE_LANES_SQL = """
    SELECT claims.queue, claims.priority, claims.enqueue_shard
    FROM {schema}.queue_claim_heads AS claims
    WHERE (claims.queue, claims.priority, claims.enqueue_shard) IN (
        SELECT queue, priority, enqueue_shard FROM {schema}.ready_entries WHERE job_id = $1
    )
    ORDER BY claims.queue, claims.priority, claims.enqueue_shard
    FOR UPDATE OF claims
"""

# Evidence that the attempt of ready entry ``ready`` was already claimed,
# as claim_ready_runtime reads it for a lane's head: a tombstone, a compact
# claim batch covering the position, or any row of the next run lease. A
# claimer commits its claim first and moves the lane's claim cursor in a
# later transaction (which waits behind our lock on the claim head), so the
# cursor alone would call a just-claimed job available, and re-entering it
# would run it twice.
_ATTEMPT_SPENT = """(
    EXISTS (
        SELECT 1 FROM {schema}.ready_tombstones AS tomb
        WHERE tomb.ready_slot = ready.ready_slot
          AND tomb.ready_generation = ready.ready_generation
          AND tomb.queue = ready.queue
          AND tomb.priority = ready.priority
          AND tomb.enqueue_shard = ready.enqueue_shard
          AND tomb.lane_seq = ready.lane_seq
    )
    OR EXISTS (
        SELECT 1 FROM {schema}.ready_claim_attempt_batches AS attempts
        WHERE attempts.ready_slot = ready.ready_slot
          AND attempts.ready_generation = ready.ready_generation
          AND attempts.queue = ready.queue
          AND attempts.priority = ready.priority
          AND attempts.enqueue_shard = ready.enqueue_shard
          AND attempts.first_lane_seq <= ready.lane_seq
          AND attempts.next_lane_seq > ready.lane_seq
          AND attempts.lane_ranges @> int8range(ready.lane_seq, ready.lane_seq + 1, '[)')
    )
    OR EXISTS (SELECT 1 FROM {schema}.lease_claims AS claim
               WHERE claim.job_id = ready.job_id AND claim.run_lease = ready.run_lease + 1)
    OR EXISTS (SELECT 1 FROM {schema}.lease_claim_closures AS closure
               WHERE closure.job_id = ready.job_id AND closure.run_lease = ready.run_lease + 1)
    OR EXISTS (SELECT 1 FROM {schema}.receipt_completion_batches AS receipts
               CROSS JOIN LATERAL unnest(receipts.job_ids, receipts.run_leases) AS done(job_id, run_lease)
               WHERE receipts.job_ids @> ARRAY[ready.job_id]
                 AND done.job_id = ready.job_id AND done.run_lease = ready.run_lease + 1)
    OR EXISTS (SELECT 1 FROM {schema}.leases AS lease
               WHERE lease.job_id = ready.job_id AND lease.run_lease = ready.run_lease + 1)
    OR EXISTS (SELECT 1 FROM {schema}.done_entries AS done
               WHERE done.job_id = ready.job_id AND done.run_lease = ready.run_lease + 1)
    OR EXISTS (SELECT 1 FROM {schema}.deferred_jobs AS deferred
               WHERE deferred.job_id = ready.job_id AND deferred.run_lease = ready.run_lease + 1)
    OR EXISTS (SELECT 1 FROM {schema}.dlq_entries AS dlq
               WHERE dlq.job_id = ready.job_id AND dlq.run_lease = ready.run_lease + 1)
    OR EXISTS (SELECT 1 FROM {schema}.ready_entries AS later
               WHERE later.job_id = ready.job_id AND later.run_lease = ready.run_lease + 1)
)"""

# Job $1's live ready entry (read after its lane's head is held, in a
# statement of its own, so it sees every claim committed before the lock).
LIVE_READY_ENTRY_SQL = (
    """
    SELECT ready.ready_slot, ready.ready_generation, ready.queue, ready.priority,
           ready.enqueue_shard, ready.lane_seq
    FROM {schema}.ready_entries AS ready
    JOIN {schema}.queue_claim_heads AS claims
      ON claims.queue = ready.queue
     AND claims.priority = ready.priority
     AND claims.enqueue_shard = ready.enqueue_shard
    WHERE ready.job_id = $1
      AND ready.lane_seq >= {schema}.sequence_next_value(claims.seq_name)
      AND NOT """
    + _ATTEMPT_SPENT
    + """
    ORDER BY ready.lane_seq DESC
    LIMIT 1
    FOR UPDATE OF ready
"""
)

ENQUEUE_SHARDS_SQL = """
    SELECT COALESCE(max(enqueue_shards), 1)::int FROM awa.queue_meta WHERE queue = $1
"""

# Same lane lock key as upstream's lane creation.
LANE_LOCK_SQL = "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))"

# Tombstone the old entry ($1-$7) and make sure the target lane ($8 queue,
# $9 priority, $10 shard) exists. ``tombstoned`` is 0 when another
# transaction (awa-pg's cancel, move or priority aging) tombstoned the entry
# first: LIVE_READY_ENTRY_SQL may have waited for that transaction's row
# lock, and a row that was locked but not updated is not re-checked, so its
# answer predates that tombstone; the insert's conflict check does not.
TOMBSTONE_AND_ENSURE_LANE_SQL = """
    WITH tombstone AS (
        INSERT INTO {schema}.ready_tombstones (
            ready_slot, ready_generation, queue, priority, enqueue_shard, lane_seq, job_id
        )
        VALUES ($1, $2, $3, $4, $5, $6, $7)
        ON CONFLICT DO NOTHING
        RETURNING 1
    ), lane AS (
        INSERT INTO {schema}.queue_lanes (queue, priority)
        VALUES ($8, $9)
        ON CONFLICT DO NOTHING
    ), enqueue_head AS (
        INSERT INTO {schema}.queue_enqueue_heads (queue, priority, enqueue_shard)
        VALUES ($8, $9, $10)
        ON CONFLICT DO NOTHING
    ), claim_head AS (
        INSERT INTO {schema}.queue_claim_heads (queue, priority, enqueue_shard)
        VALUES ($8, $9, $10)
        ON CONFLICT DO NOTHING
    )
    SELECT count(*) AS tombstoned FROM tombstone
"""

ENSURE_LANE_SEQUENCES_SQL = "SELECT {schema}.ensure_lane_sequences($1, $2, $3)"

# A lane position at the tail of lane ($1 queue, $2 priority, $3 shard):
# reserve_enqueue_seq takes the lane's lock until commit, waiting for any
# producer that holds it. A statement of its own, so that REENTER_READY_SQL
# reads the ring with the lock held (the lane-order invariant in
# queue_storage/promote.py: a ring read in the statement that waits would
# see the ring as it was before the wait).
RESERVE_POSITION_SQL = "SELECT {schema}.reserve_enqueue_seq($1, $2, $3, 1)"

# Re-enter the old entry ($1-$6) at position $12 of lane ($7 queue, $8
# priority, $9 shard) in the live ring slot; $10 / $11 stamp the original
# queue / priority. One NOTIFY wakes the target queue's workers.
REENTER_READY_SQL = (
    """
    WITH ring AS (
        SELECT current_slot, generation FROM {schema}.queue_ring_state WHERE singleton
    ), moved AS (
        INSERT INTO {schema}.ready_entries (
            ready_slot, ready_generation, job_id, kind, queue, args, priority, attempt,
            run_lease, max_attempts, lane_seq, enqueue_shard, run_at, attempted_at,
            created_at, unique_key, unique_states, payload
        )
        SELECT ring.current_slot, ring.generation, old.job_id, old.kind, $7, old.args, $8,
               old.attempt, old.run_lease, old.max_attempts, $12::bigint, $9, old.run_at,
               old.attempted_at, old.created_at, old.unique_key, old.unique_states,
               """
    + _STAMPED_PAYLOAD.format(
        payload="old.payload",
        queue="old.queue",
        priority="old.priority",
        stamp_queue="$10::boolean",
        stamp_priority="$11::boolean",
    )
    + """
        FROM ring, {schema}.ready_entries AS old
        WHERE old.ready_slot = $1 AND old.ready_generation = $2 AND old.queue = $3
          AND old.priority = $4 AND old.enqueue_shard = $5 AND old.lane_seq = $6
        RETURNING ready_slot, ready_generation, queue, priority, enqueue_shard, lane_seq, run_at
    ), segment AS (
        INSERT INTO {schema}.ready_segments (
            ready_slot, ready_generation, queue, priority, enqueue_shard,
            first_lane_seq, next_lane_seq, first_run_at
        )
        SELECT ready_slot, ready_generation, queue, priority, enqueue_shard,
               lane_seq, lane_seq + 1, run_at
        FROM moved
        ON CONFLICT DO NOTHING
    )
    SELECT count(*) AS moved, pg_notify('awa:' || $7, '') AS notified
    FROM moved
"""
)

OPERATION_STATE_SQL = "SELECT state FROM awa.batch_operations WHERE id = $1"

# The item's outcome ($3) and the operation's counters, as on canonical.
RECORD_OUTCOME_SQL = """
    WITH item AS (
        UPDATE awa.batch_operation_items
        SET state = $3, error = NULL, processed_at = clock_timestamp()
        WHERE operation_id = $1 AND job_id = $2 AND state = 'pending'
        RETURNING state
    )
    UPDATE awa.batch_operations AS op
    SET processed = op.processed + (SELECT count(*) FROM item WHERE state = 'processed'),
        skipped = op.skipped + (SELECT count(*) FROM item WHERE state = 'skipped'),
        updated_at = clock_timestamp()
    WHERE op.id = $1
    RETURNING op.state AS operation_state
"""


@functools.lru_cache(maxsize=8)
def storage_for(schema: str) -> BatchOperationStorage:
    """The runner's statements for queue storage in ``schema``."""
    matching = MATCHING_JOBS_TEMPLATE.format(candidates=CANDIDATES_SQL.format(schema=schema))
    update_scheduled = UPDATE_SCHEDULED_SQL.format(schema=schema)
    statements = {
        "lock_source_lanes": LOCK_SOURCE_LANES_SQL.format(schema=schema),
        "live_ready_entry": LIVE_READY_ENTRY_SQL.format(schema=schema),
        "tombstone_and_ensure_lane": TOMBSTONE_AND_ENSURE_LANE_SQL.format(schema=schema),
        "ensure_lane_sequences": ENSURE_LANE_SEQUENCES_SQL.format(schema=schema),
        "reserve_position": RESERVE_POSITION_SQL.format(schema=schema),
        "reenter_ready": REENTER_READY_SQL.format(schema=schema),
    }

    async def apply_job(
        conn: Connection, plan: OperationPlan, operation_id: uuid.UUID, job_id: int
    ) -> dict[str, Any]:
        queue, priority = _targets(plan)
        async with conn.transaction():
            outcome = "skipped"
            if await conn.fetchval(OPERATION_STATE_SQL, operation_id) == "running":
                changed = await conn.fetchval(plan.apply_sql, job_id, queue, priority, queue is not None)
                if changed is None:
                    changed = await _reenter_available(conn, schema, statements, job_id, queue, priority)
                if changed:
                    outcome = "processed"
            state = await conn.fetchval(RECORD_OUTCOME_SQL, operation_id, job_id, outcome)
        return {"outcome": outcome, "operation_state": state}

    return BatchOperationStorage(
        claim_operation_sql=CLAIM_OPERATION_TEMPLATE.format(engine_guard=ENGINE_GUARD),
        scan_bounds_sql=SCAN_BOUNDS_TEMPLATE.format(matching=matching),
        scan_page_sql=SCAN_PAGE_TEMPLATE.format(matching=matching),
        set_priority_sql=update_scheduled,
        move_queue_sql=update_scheduled,
        apply_job=apply_job,
    )


def _targets(plan: OperationPlan) -> tuple[str | None, int | None]:
    """(queue or None to keep, priority or None to keep)."""
    if plan.op_kind == OP_SET_PRIORITY:
        return None, plan.apply_args[0]
    return plan.apply_args[0], plan.apply_args[1]


async def _reenter_available(
    conn: Connection,
    schema: str,
    sql: dict[str, str],
    job_id: int,
    queue: str | None,
    priority: int | None,
) -> bool:
    """Move an available job to the tail of its target lane; False when it
    is not available (any more) or already there."""
    locked = {tuple(row) for row in await conn.fetch(sql["lock_source_lanes"], job_id)}
    entry = await conn.fetchrow(sql["live_ready_entry"], job_id)
    if entry is None:
        return False
    if (entry["queue"], entry["priority"], entry["enqueue_shard"]) not in locked:
        # The job changed lanes while we waited for the heads we chose: try
        # the item again next tick (a serialization failure, as the runner
        # reads it), rather than move an entry whose lane no one holds.
        raise QueryError(f"job {job_id} changed lanes while its lane was being locked", sqlstate="40001")
    target_queue = queue if queue is not None else entry["queue"]
    target_priority = priority if priority is not None else entry["priority"]
    if (target_queue, target_priority) == (entry["queue"], entry["priority"]):
        return False
    shards = await conn.fetchval(ENQUEUE_SHARDS_SQL, target_queue)
    shard = conn.backend_pid % shards if shards > 1 else 0
    old_key = (
        entry["ready_slot"],
        entry["ready_generation"],
        entry["queue"],
        entry["priority"],
        entry["enqueue_shard"],
        entry["lane_seq"],
    )
    await conn.execute(LANE_LOCK_SQL, f"{schema}:{target_queue}:{target_priority}:{shard}")
    tombstoned = await conn.fetchval(
        sql["tombstone_and_ensure_lane"], *old_key, job_id, target_queue, target_priority, shard
    )
    if not tombstoned:
        return False
    await conn.execute(sql["ensure_lane_sequences"], target_queue, target_priority, shard)
    position = await conn.fetchval(sql["reserve_position"], target_queue, target_priority, shard)
    row = await conn.fetchone(
        sql["reenter_ready"],
        *old_key,
        target_queue,
        target_priority,
        shard,
        queue is not None,
        priority is not None,
        position,
    )
    return bool(row["moved"] == 1)


async def run_once(
    ctx: MaintenanceContext,
    *,
    chunk_size: int = runner.CHUNK_SIZE,
    scan_page_size: int = runner.SCAN_PAGE_SIZE,
) -> BatchOperationsResult:
    return await runner.run_batch_operations(
        ctx, storage_for(schema_name(ctx)), chunk_size=chunk_size, scan_page_size=scan_page_size
    )
