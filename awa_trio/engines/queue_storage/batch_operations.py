"""batch_operations (queue storage): run awa-pg's admin batch operations
(``set_priority``, ``move_queue``) on the queue-storage tables.

The runner is the shared one (:mod:`awa_trio.maintenance.batch_operations`:
runner lock, claim, scan into items, 100 items per tick, finalisation,
cancellation, retention); this module supplies what differs on this engine,
following Awa's ``awa_model::batch_operations`` with
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

Each item is one short transaction. An available job's claim head is
locked (``FOR UPDATE``, as the claimer locks it) before its
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

Not covered: striped logical queues (off in Awa's default configuration),
whose stripe choice needs the runtime's queue config.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Mapping
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
from ...sql import Fragment, Statement
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
# job's current values; {stamp_queue} / {stamp_priority}: conditions.
_STAMPED_PAYLOAD = Fragment("""
    jsonb_set(
        COALESCE({payload}, '{"metadata": {}, "tags": [], "errors": [], "progress": null}'),
        '{metadata}',
        COALESCE(NULLIF({payload} -> 'metadata', 'null'), '{}')
            || CASE WHEN {stamp_queue}
                     AND NOT COALESCE(NULLIF({payload} -> 'metadata', 'null'), '{}')
                             ? '_awa_original_queue'
                    THEN jsonb_build_object('_awa_original_queue', {queue})
                    ELSE '{}' END
            || CASE WHEN {stamp_priority}
                     AND NOT COALESCE(NULLIF({payload} -> 'metadata', 'null'), '{}')
                             ? '_awa_original_priority'
                    THEN jsonb_build_object('_awa_original_priority', {priority})
                    ELSE '{}' END,
        true
    )
""")

# A scheduled job, in place: :job_id, :queue or NULL (keep), :priority or
# NULL (keep), :stamp_queue (stamp the original queue).
UPDATE_SCHEDULED_SQL = Statement(
    """
    UPDATE {schema}.deferred_jobs AS job
    SET queue = COALESCE(:queue::text, job.queue),
        priority = COALESCE(:priority::smallint, job.priority),
        payload = {stamped_payload}
    WHERE job.job_id = :job_id
      AND job.state = 'scheduled'
      AND (job.queue <> COALESCE(:queue::text, job.queue)
           OR job.priority <> COALESCE(:priority::smallint, job.priority))
    RETURNING job.job_id
""",
    stamped_payload=_STAMPED_PAYLOAD(
        payload="job.payload",
        queue="job.queue",
        priority="job.priority",
        stamp_queue=":stamp_queue::boolean",
        stamp_priority=":priority::smallint IS NOT NULL",
    ),
)

# Hold the claim heads of every lane with an entry of job :job_id, so no claimer
# takes the entry while it is tombstoned and re-entered. The lanes are chosen
# with this statement's snapshot, before the wait: LIVE_READY_ENTRY_SQL's
# lane is checked against them afterwards.
LOCK_SOURCE_LANES_SQL = Statement("""
    SELECT claims.queue, claims.priority, claims.enqueue_shard
    FROM {schema}.queue_claim_heads AS claims
    WHERE (claims.queue, claims.priority, claims.enqueue_shard) IN (
        SELECT queue, priority, enqueue_shard FROM {schema}.ready_entries WHERE job_id = :job_id
    )
    ORDER BY claims.queue, claims.priority, claims.enqueue_shard
    FOR UPDATE OF claims
""")

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

# Job :job_id's live ready entry (read after its lane's head is held, in a
# statement of its own, so it sees every claim committed before the lock).
LIVE_READY_ENTRY_SQL = Statement(
    """
    SELECT ready.ready_slot, ready.ready_generation, ready.queue, ready.priority,
           ready.enqueue_shard, ready.lane_seq
    FROM {schema}.ready_entries AS ready
    JOIN {schema}.queue_claim_heads AS claims
      ON claims.queue = ready.queue
     AND claims.priority = ready.priority
     AND claims.enqueue_shard = ready.enqueue_shard
    WHERE ready.job_id = :job_id
      AND ready.lane_seq >= {schema}.sequence_next_value(claims.seq_name)
      AND NOT {attempt_spent}
    ORDER BY ready.lane_seq DESC
    LIMIT 1
    FOR UPDATE OF ready
""",
    attempt_spent=_ATTEMPT_SPENT,
)

ENQUEUE_SHARDS_SQL = Statement("""
    SELECT COALESCE(max(enqueue_shards), 1)::int FROM awa.queue_meta WHERE queue = :queue
""")

# Same lane lock key as Awa's lane creation, so the two exclude each other.
LANE_LOCK_SQL = Statement("SELECT pg_advisory_xact_lock(hashtextextended(:lock_key, 0))")

# Tombstone the old entry (OLD_ENTRY_COLUMNS, :job_id) and make sure the
# target lane (:queue, :priority, :shard) exists. ``tombstoned`` is 0 when another
# transaction (awa-pg's cancel, move or priority aging) tombstoned the entry
# first: LIVE_READY_ENTRY_SQL may have waited for that transaction's row
# lock, and a row that was locked but not updated is not re-checked, so its
# answer predates that tombstone; the insert's conflict check does not.
TOMBSTONE_AND_ENSURE_LANE_SQL = Statement("""
    WITH tombstone AS (
        INSERT INTO {schema}.ready_tombstones (
            ready_slot, ready_generation, queue, priority, enqueue_shard, lane_seq, job_id
        )
        VALUES (:ready_slot, :ready_generation, :old_queue, :old_priority, :old_shard, :lane_seq, :job_id)
        ON CONFLICT DO NOTHING
        RETURNING 1
    ), lane AS (
        INSERT INTO {schema}.queue_lanes (queue, priority)
        VALUES (:queue, :priority)
        ON CONFLICT DO NOTHING
    ), enqueue_head AS (
        INSERT INTO {schema}.queue_enqueue_heads (queue, priority, enqueue_shard)
        VALUES (:queue, :priority, :shard)
        ON CONFLICT DO NOTHING
    ), claim_head AS (
        INSERT INTO {schema}.queue_claim_heads (queue, priority, enqueue_shard)
        VALUES (:queue, :priority, :shard)
        ON CONFLICT DO NOTHING
    )
    SELECT count(*) AS tombstoned FROM tombstone
""")

ENSURE_LANE_SEQUENCES_SQL = Statement("SELECT {schema}.ensure_lane_sequences(:queue, :priority, :shard)")

# A lane position at the tail of lane (:queue, :priority, :shard):
# reserve_enqueue_seq takes the lane's lock until commit, waiting for any
# producer that holds it. A statement of its own, so that REENTER_READY_SQL
# reads the ring with the lock held (the lane-order invariant in
# queue_storage/promote.py: a ring read in the statement that waits would
# see the ring as it was before the wait).
RESERVE_POSITION_SQL = Statement("SELECT {schema}.reserve_enqueue_seq(:queue, :priority, :shard, 1)")

# Re-enter the old entry (OLD_ENTRY_COLUMNS) at position :lane_position of
# lane (:queue, :priority, :shard) in the live ring slot; :stamp_queue /
# :stamp_priority stamp the original queue / priority. One NOTIFY wakes the
# target queue's workers.
REENTER_READY_SQL = Statement(
    """
    WITH ring AS (
        SELECT current_slot, generation FROM {schema}.queue_ring_state WHERE singleton
    ), moved AS (
        INSERT INTO {schema}.ready_entries (
            ready_slot, ready_generation, job_id, kind, queue, args, priority, attempt,
            run_lease, max_attempts, lane_seq, enqueue_shard, run_at, attempted_at,
            created_at, unique_key, unique_states, payload
        )
        SELECT ring.current_slot, ring.generation, old.job_id, old.kind, :queue, old.args, :priority,
               old.attempt, old.run_lease, old.max_attempts, :lane_position::bigint, :shard, old.run_at,
               old.attempted_at, old.created_at, old.unique_key, old.unique_states,
               {stamped_payload}
        FROM ring, {schema}.ready_entries AS old
        WHERE old.ready_slot = :ready_slot AND old.ready_generation = :ready_generation AND old.queue = :old_queue
          AND old.priority = :old_priority AND old.enqueue_shard = :old_shard AND old.lane_seq = :lane_seq
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
    SELECT count(*) AS moved, pg_notify('awa:' || :queue, '') AS notified
    FROM moved
""",
    stamped_payload=_STAMPED_PAYLOAD(
        payload="old.payload",
        queue="old.queue",
        priority="old.priority",
        stamp_queue=":stamp_queue::boolean",
        stamp_priority=":stamp_priority::boolean",
    ),
)

#: The old entry's key, as TOMBSTONE_AND_ENSURE_LANE_SQL and REENTER_READY_SQL
#: name it: parameter name -> column of LIVE_READY_ENTRY_SQL's row.
OLD_ENTRY_COLUMNS = {
    "ready_slot": "ready_slot",
    "ready_generation": "ready_generation",
    "old_queue": "queue",
    "old_priority": "priority",
    "old_shard": "enqueue_shard",
    "lane_seq": "lane_seq",
}

OPERATION_STATE_SQL = Statement("SELECT state FROM awa.batch_operations WHERE id = :operation_id")

# The item's :outcome and the operation's counters, as on canonical.
RECORD_OUTCOME_SQL = Statement("""
    WITH item AS (
        UPDATE awa.batch_operation_items
        SET state = :outcome, error = NULL, processed_at = clock_timestamp()
        WHERE operation_id = :operation_id AND job_id = :job_id AND state = 'pending'
        RETURNING state
    )
    UPDATE awa.batch_operations AS op
    SET processed = op.processed + (SELECT count(*) FROM item WHERE state = 'processed'),
        skipped = op.skipped + (SELECT count(*) FROM item WHERE state = 'skipped'),
        updated_at = clock_timestamp()
    WHERE op.id = :operation_id
    RETURNING op.state AS operation_state
""")

# The runner's statements for this engine ({schema} filled by the runner,
# from BatchOperationStorage.schema).
_MATCHING_JOBS = MATCHING_JOBS_TEMPLATE(candidates=CANDIDATES_SQL)
CLAIM_OPERATION_SQL = Statement(CLAIM_OPERATION_TEMPLATE, engine_guard=ENGINE_GUARD)
SCAN_BOUNDS_SQL = Statement(SCAN_BOUNDS_TEMPLATE, matching=_MATCHING_JOBS)
SCAN_PAGE_SQL = Statement(SCAN_PAGE_TEMPLATE, matching=_MATCHING_JOBS)


@functools.lru_cache(maxsize=8)
def storage_for(schema: str) -> BatchOperationStorage:
    """The runner's statements for queue storage in ``schema``."""

    async def apply_job(
        conn: Connection, plan: OperationPlan, operation_id: uuid.UUID, job_id: int
    ) -> dict[str, Any]:
        queue, priority = _targets(plan)
        async with conn.transaction():
            outcome = "skipped"
            if await conn.fetchval(*OPERATION_STATE_SQL.bind(operation_id=operation_id)) == "running":
                changed = await conn.fetchval(
                    *plan.apply_sql.bind(
                        schema, job_id=job_id, queue=queue, priority=priority, stamp_queue=queue is not None
                    )
                )
                if changed is None:
                    changed = await _reenter_available(conn, schema, job_id, queue, priority)
                if changed:
                    outcome = "processed"
            state = await conn.fetchval(
                *RECORD_OUTCOME_SQL.bind(operation_id=operation_id, job_id=job_id, outcome=outcome)
            )
        return {"outcome": outcome, "operation_state": state}

    return BatchOperationStorage(
        claim_operation_sql=CLAIM_OPERATION_SQL,
        scan_bounds_sql=SCAN_BOUNDS_SQL,
        scan_page_sql=SCAN_PAGE_SQL,
        set_priority_sql=UPDATE_SCHEDULED_SQL,
        move_queue_sql=UPDATE_SCHEDULED_SQL,
        apply_job=apply_job,
        schema=schema,
    )


def _targets(plan: OperationPlan) -> tuple[str | None, int | None]:
    """(queue or None to keep, priority or None to keep)."""
    if plan.op_kind == OP_SET_PRIORITY:
        return None, plan.apply_args["priority"]
    return plan.apply_args["queue"], plan.apply_args["priority"]


def _old_entry(entry: Mapping[str, Any]) -> dict[str, Any]:
    """The parameters OLD_ENTRY_COLUMNS names, from LIVE_READY_ENTRY_SQL's row."""
    return {parameter: entry[column] for parameter, column in OLD_ENTRY_COLUMNS.items()}


async def _reenter_available(
    conn: Connection,
    schema: str,
    job_id: int,
    queue: str | None,
    priority: int | None,
) -> bool:
    """Move an available job to the tail of its target lane; False when it
    is not available (any more) or already there."""
    locked = {tuple(row) for row in await conn.fetch(*LOCK_SOURCE_LANES_SQL.bind(schema, job_id=job_id))}
    entry = await conn.fetchrow(*LIVE_READY_ENTRY_SQL.bind(schema, job_id=job_id))
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
    shards = await conn.fetchval(*ENQUEUE_SHARDS_SQL.bind(queue=target_queue))
    shard = conn.backend_pid % shards if shards > 1 else 0
    old_entry = _old_entry(entry)
    lane = {"queue": target_queue, "priority": target_priority, "shard": shard}
    await conn.execute(*LANE_LOCK_SQL.bind(lock_key=f"{schema}:{target_queue}:{target_priority}:{shard}"))
    tombstoned = await conn.fetchval(
        *TOMBSTONE_AND_ENSURE_LANE_SQL.bind(schema, **old_entry, job_id=job_id, **lane)
    )
    if not tombstoned:
        return False
    await conn.execute(*ENSURE_LANE_SEQUENCES_SQL.bind(schema, **lane))
    position = await conn.fetchval(*RESERVE_POSITION_SQL.bind(schema, **lane))
    row = await conn.fetchone(
        *REENTER_READY_SQL.bind(
            schema,
            **old_entry,
            **lane,
            stamp_queue=queue is not None,
            stamp_priority=priority is not None,
            lane_position=position,
        )
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
