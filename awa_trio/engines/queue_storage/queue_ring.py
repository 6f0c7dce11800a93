"""SQL of the queue ring (rotate and prune), kept in one place.

The queue ring partitions eight tables by ``ready_slot``; each has one child
per slot (``{schema}.ready_entries_3`` ...). Statements take ``{schema}``
and, where the children of one slot are meant, one identifier slot per child
(``{ready_child}`` ..., see :func:`child_placeholders`) or the list of them
(``{children}``): all come from the database (the validated schema name, a
slot number read from the ring state), never from user input. The catalog
lookups by name take the schema as a string literal too
(``{schema_literal}``, :func:`.layout.schema_literal`). Everything else is a
named parameter.
"""

from __future__ import annotations

from typing import Any

from ...sql import Fragment, Statement
from .layout import TERMINAL_COUNTER_BUCKETS, schema_literal

#: (Awa's blocker label, partitioned table) for every child of a queue
#: slot, in Awa's order. The label is ``awa.ring.blocker`` when that
#: child keeps the rotation from moving on.
QUEUE_SLOT_CHILDREN: tuple[tuple[str, str], ...] = (
    ("queue.ready_rows", "ready_entries"),
    ("queue.claim_attempt_batches", "ready_claim_attempt_batches"),
    ("queue.done_rows", "done_entries"),
    ("queue.tombstone_rows", "ready_tombstones"),
    ("queue.ready_segments", "ready_segments"),
    ("queue.receipt_completion_batch_rows", "receipt_completion_batches"),
    ("queue.receipt_completion_tombstone_rows", "receipt_completion_tombstones"),
    ("queue.terminal_delta_rows", "queue_terminal_count_deltas"),
)

#: ``awa.ring.reason`` labels of Awa's queue prune gates, checked in this order.
REASON_ACTIVE_LEASES = "queue.active_leases"
REASON_PENDING_READY = "queue.pending_ready"
REASON_UNCLOSED_CLAIM_REFS = "queue.unclosed_claim_refs"


def child(schema: str, table: str, slot: int) -> str:
    """The child of ``table`` holding ``slot`` (slot numbers come from the ring state)."""
    return f"{schema}.{table}_{int(slot)}"


def slot_children(schema: str, slot: int) -> list[str]:
    return [child(schema, table, slot) for _label, table in QUEUE_SLOT_CHILDREN]


#: Identifier slot of each child in the prune statements below.
CHILD_PLACEHOLDERS = {
    "ready_child": "ready_entries",
    "claim_attempt_child": "ready_claim_attempt_batches",
    "done_child": "done_entries",
    "tombstone_child": "ready_tombstones",
    "segment_child": "ready_segments",
    "receipt_batch_child": "receipt_completion_batches",
    "receipt_tombstone_child": "receipt_completion_tombstones",
    "delta_child": "queue_terminal_count_deltas",
}


def child_placeholders(schema: str, slot: int) -> dict[str, str]:
    """``{ready_child: awa.ready_entries_3, ...}``: the child slots of the
    statements below, for :meth:`Statement.bind`."""
    return {key: child(schema, table, slot) for key, table in CHILD_PLACEHOLDERS.items()}


def bind_slot(statement: Statement, schema: str, ring_slot: int, **values: Any) -> tuple[Any, ...]:
    """``statement`` bound for the children of ``ring_slot``: the child slots
    it has (:func:`child_placeholders`), ``{schema}`` if it has that, and the
    parameters ``values``."""
    children = child_placeholders(schema, ring_slot)
    identifiers = {key: name for key, name in children.items() if key in statement.slots}
    return statement.bind(schema if "schema" in statement.slots else None, **identifiers, **values)


#: One row, one boolean per child of the slot: does it hold any row?
#: Presence only (``EXISTS``): counting a hot child would cost a
#: scan per tick for a number nobody needs.
CHILDREN_BUSY_SQL = Statement("""SELECT
        EXISTS (SELECT 1 FROM {ready_child}) AS "queue.ready_rows",
        EXISTS (SELECT 1 FROM {claim_attempt_child}) AS "queue.claim_attempt_batches",
        EXISTS (SELECT 1 FROM {done_child}) AS "queue.done_rows",
        EXISTS (SELECT 1 FROM {tombstone_child}) AS "queue.tombstone_rows",
        EXISTS (SELECT 1 FROM {segment_child}) AS "queue.ready_segments",
        EXISTS (SELECT 1 FROM {receipt_batch_child}) AS "queue.receipt_completion_batch_rows",
        EXISTS (SELECT 1 FROM {receipt_tombstone_child}) AS "queue.receipt_completion_tombstone_rows",
        EXISTS (SELECT 1 FROM {delta_child}) AS "queue.terminal_delta_rows\"""")


# Read committed, always: the post-lock gates and the carry must see rows that
# committed while the prune waited for its locks. A repeatable-read snapshot
# (say, a database-wide default_transaction_isolation) would be taken before
# the lock and TRUNCATE would then drop rows that snapshot never saw.
#: asyncpg's name for it, given to the BEGIN (no statement of its own).
READ_COMMITTED = "read_committed"

# The ring-state row lock serialises rotate and prune with each other and
# with any awa-pg leader doing the same (it takes the same row lock).
LOCK_RING_STATE_SQL = Statement("""
    SELECT current_slot, generation, slot_count
    FROM {schema}.queue_ring_state
    WHERE singleton
    FOR UPDATE
""")


# One round trip per tick: read the cursor, ask whether each child of the
# slot after it holds a row (presence only, through the parent tables with
# the slot as partition key, so only that slot's children are read), and move
# the cursor if none does: a compare-and-set on (slot, generation) that also
# stamps the slot row with its new generation.
#
# The ring-state row is locked SKIP LOCKED: a prune or rollup holding it (ours
# run in other actors, a foreign leader's anywhere) makes this tick a lost
# compare-and-set, tried again next tick, so the statement never waits on
# that row while it holds the children's share locks. One snapshot is enough
# for the check: writers file rows under the slot they read as current after
# reserving their lane position (the lane-order invariant in
# queue_storage/promote.py), and prune carries rows into the current slot, so
# a row can reach the slot checked here only from a writer whose ring read is
# a whole lap old.
#
# Once moved, it also finds the oldest sealed slot (as OLDEST_SEALED_SLOT_SQL:
# the slot rows it reads are those before its own stamp, and the new current
# slot is excluded anyway) and whether that slot's children are without a
# heap page, for the prune that follows.
#
# A correlated scalar subquery, not EXISTS: the planner may turn an EXISTS
# into a hashed subplan that reads every row of every slot (the whole live
# slot each tick: 18 ms a rotation under load), where this one is run for the
# one cursor row and pruned to the slot's children at run time.
ROTATE_SQL = Statement("""
    WITH cursor AS (
        SELECT current_slot, generation, slot_count, (current_slot + 1) % slot_count AS next_slot
        FROM {schema}.queue_ring_state
        WHERE singleton
    ),
    busy AS (
        SELECT (SELECT true FROM {schema}.ready_entries WHERE ready_slot = cursor.next_slot LIMIT 1) IS NOT NULL AS "queue.ready_rows",
               (SELECT true FROM {schema}.ready_claim_attempt_batches WHERE ready_slot = cursor.next_slot LIMIT 1) IS NOT NULL AS "queue.claim_attempt_batches",
               (SELECT true FROM {schema}.done_entries WHERE ready_slot = cursor.next_slot LIMIT 1) IS NOT NULL AS "queue.done_rows",
               (SELECT true FROM {schema}.ready_tombstones WHERE ready_slot = cursor.next_slot LIMIT 1) IS NOT NULL AS "queue.tombstone_rows",
               (SELECT true FROM {schema}.ready_segments WHERE ready_slot = cursor.next_slot LIMIT 1) IS NOT NULL AS "queue.ready_segments",
               (SELECT true FROM {schema}.receipt_completion_batches WHERE ready_slot = cursor.next_slot LIMIT 1) IS NOT NULL AS "queue.receipt_completion_batch_rows",
               (SELECT true FROM {schema}.receipt_completion_tombstones WHERE ready_slot = cursor.next_slot LIMIT 1) IS NOT NULL AS "queue.receipt_completion_tombstone_rows",
               (SELECT true FROM {schema}.queue_terminal_count_deltas WHERE ready_slot = cursor.next_slot LIMIT 1) IS NOT NULL AS "queue.terminal_delta_rows"
        FROM cursor
    ),
    locked AS (
        SELECT singleton FROM {schema}.queue_ring_state WHERE singleton FOR UPDATE SKIP LOCKED
    ),
    moved AS (
        UPDATE {schema}.queue_ring_state AS state
        SET current_slot = cursor.next_slot, generation = cursor.generation + 1
        FROM cursor, busy, locked
        WHERE state.singleton
          AND state.current_slot = cursor.current_slot
          AND state.generation = cursor.generation
          AND NOT (busy."queue.ready_rows" OR busy."queue.claim_attempt_batches" OR busy."queue.done_rows" OR busy."queue.tombstone_rows" OR busy."queue.ready_segments" OR busy."queue.receipt_completion_batch_rows" OR busy."queue.receipt_completion_tombstone_rows" OR busy."queue.terminal_delta_rows")
        RETURNING state.current_slot, state.generation
    ),
    stamped AS (
        UPDATE {schema}.queue_ring_slots AS slots
        SET generation = moved.generation
        FROM moved
        WHERE slots.slot = moved.current_slot
    ),
    oldest AS (
        SELECT slots.slot
        FROM {schema}.queue_ring_slots AS slots, moved
        WHERE slots.generation >= 0 AND slots.slot <> moved.current_slot
        ORDER BY slots.generation, slots.slot
        LIMIT 1
    )
    SELECT cursor.current_slot, cursor.generation, cursor.slot_count,
           moved.current_slot IS NOT NULL AS moved,
           oldest.slot AS oldest_slot,
           (SELECT coalesce(sum(pg_relation_size(child.oid)), 0) FROM pg_class AS child WHERE child.relnamespace = {schema_literal}::regnamespace AND child.relname = 'ready_entries_' || oldest.slot)
             + (SELECT coalesce(sum(pg_relation_size(child.oid)), 0) FROM pg_class AS child WHERE child.relnamespace = {schema_literal}::regnamespace AND child.relname = 'ready_claim_attempt_batches_' || oldest.slot)
             + (SELECT coalesce(sum(pg_relation_size(child.oid)), 0) FROM pg_class AS child WHERE child.relnamespace = {schema_literal}::regnamespace AND child.relname = 'done_entries_' || oldest.slot)
             + (SELECT coalesce(sum(pg_relation_size(child.oid)), 0) FROM pg_class AS child WHERE child.relnamespace = {schema_literal}::regnamespace AND child.relname = 'ready_tombstones_' || oldest.slot)
             + (SELECT coalesce(sum(pg_relation_size(child.oid)), 0) FROM pg_class AS child WHERE child.relnamespace = {schema_literal}::regnamespace AND child.relname = 'ready_segments_' || oldest.slot)
             + (SELECT coalesce(sum(pg_relation_size(child.oid)), 0) FROM pg_class AS child WHERE child.relnamespace = {schema_literal}::regnamespace AND child.relname = 'receipt_completion_batches_' || oldest.slot)
             + (SELECT coalesce(sum(pg_relation_size(child.oid)), 0) FROM pg_class AS child WHERE child.relnamespace = {schema_literal}::regnamespace AND child.relname = 'receipt_completion_tombstones_' || oldest.slot)
             + (SELECT coalesce(sum(pg_relation_size(child.oid)), 0) FROM pg_class AS child WHERE child.relnamespace = {schema_literal}::regnamespace AND child.relname = 'queue_terminal_count_deltas_' || oldest.slot) = 0 AS oldest_clean,
           busy.*
    FROM cursor
    CROSS JOIN busy
    LEFT JOIN moved ON true
    LEFT JOIN oldest ON true
""")


def rotate_sql(schema: str) -> str:
    """ROTATE_SQL's text for ``schema`` (tests run it directly)."""
    return ROTATE_SQL.render(schema, schema_literal=schema_literal(schema))


# The oldest sealed slot: every initialised slot but the current one, by age.
OLDEST_SEALED_SLOT_SQL = Statement("""
    SELECT slot, generation
    FROM {schema}.queue_ring_slots
    WHERE generation >= 0 AND slot <> :current_slot
    ORDER BY generation, slot
    LIMIT 1
    FOR UPDATE
""")


# The oldest sealed slot (as OLDEST_SEALED_SLOT_SQL, without its lock) and
# whether every child of it is without a heap page, in one statement. A slot
# with no page holds no row; one with pages may hold none either, which the
# locked path then finds out.
OLDEST_SLOT_CLEAN_SQL = Statement("""
    SELECT oldest.slot,
           pg_relation_size(({schema_literal} || '.ready_entries_' || oldest.slot)::regclass)
             + pg_relation_size(({schema_literal} || '.ready_claim_attempt_batches_' || oldest.slot)::regclass)
             + pg_relation_size(({schema_literal} || '.done_entries_' || oldest.slot)::regclass)
             + pg_relation_size(({schema_literal} || '.ready_tombstones_' || oldest.slot)::regclass)
             + pg_relation_size(({schema_literal} || '.ready_segments_' || oldest.slot)::regclass)
             + pg_relation_size(({schema_literal} || '.receipt_completion_batches_' || oldest.slot)::regclass)
             + pg_relation_size(({schema_literal} || '.receipt_completion_tombstones_' || oldest.slot)::regclass)
             + pg_relation_size(({schema_literal} || '.queue_terminal_count_deltas_' || oldest.slot)::regclass) = 0 AS clean
    FROM (
        SELECT slot
        FROM {schema}.queue_ring_slots
        WHERE generation >= 0 AND slot <> :current_slot
        ORDER BY generation, slot
        LIMIT 1
    ) AS oldest
""")


SLOT_GENERATION_SQL = Statement("SELECT generation FROM {schema}.queue_ring_slots WHERE slot = :slot")

# The unclosed-claim gate of a slot generation (:slot, :generation),
# shared by the prune and the terminal-count rollup: true while its receipt
# claims (row claims plus compact batches) outnumber their closure evidence
# (row closures plus compact closure batches), i.e. some claim may still
# finish. Counted, not anti-joined: a mismatch is enough, and the counts stay
# cheap under a pinned MVCC horizon.
UNCLOSED_CLAIMS = Fragment("""(
            (SELECT count(*) FROM {schema}.lease_claims
             WHERE ready_slot = :slot AND ready_generation = :generation)
          + (SELECT COALESCE(sum(claimed_count), 0) FROM {schema}.lease_claim_batches
             WHERE ready_slot = :slot AND ready_generation = :generation)
        ) <> (
            (SELECT count(*)
             FROM {schema}.lease_claims AS claims
             JOIN {schema}.lease_claim_closures AS closures
               ON closures.claim_slot = claims.claim_slot
              AND closures.job_id = claims.job_id
              AND closures.run_lease = claims.run_lease
             WHERE claims.ready_slot = :slot AND claims.ready_generation = :generation)
          + (SELECT COALESCE(sum(closed_count), 0) FROM {schema}.lease_claim_closure_batches
             WHERE ready_slot = :slot AND ready_generation = :generation)
        )""")

# Awa's three skip gates, in one round trip (:slot, :generation):
# - leases still pointing at the slot's generation;
# - ready rows at or ahead of their lane's claim cursor (not yet claimed), of
#   any generation: TRUNCATE empties the whole child, so a row filed under
#   another generation of this slot (only a writer that read the ring a lap
#   ago could leave one) must block the prune, not vanish with it;
# - receipt claims of the generation without as much closure evidence as
#   claims (counted, not anti-joined: a mismatch is enough to make TRUNCATE
#   unsafe, and the count stays cheap under a pinned MVCC horizon).
PRUNE_GATES_SQL = Statement(
    """
    WITH claim_cursors AS MATERIALIZED (
        SELECT queue, priority, enqueue_shard,
               {schema}.sequence_next_value(seq_name) AS claim_seq
        FROM {schema}.queue_claim_heads
    )
    SELECT
        EXISTS (
            SELECT 1 FROM {schema}.leases
            WHERE ready_slot = :slot AND ready_generation = :generation
        ) AS active_leases,
        EXISTS (
            SELECT 1
            FROM claim_cursors AS cursors
            CROSS JOIN LATERAL (
                SELECT 1 FROM {ready_child} AS ready
                WHERE ready.queue = cursors.queue
                  AND ready.priority = cursors.priority
                  AND ready.enqueue_shard = cursors.enqueue_shard
                  AND ready.lane_seq >= cursors.claim_seq
                LIMIT 1
            ) AS unclaimed
        ) AS pending_ready,
        {unclosed_claims} AS unclosed_claim_refs
""",
    unclosed_claims=UNCLOSED_CLAIMS(),
)

# Can the carry of this slot wait? True when the slot holds nothing but
# failed done rows inside the retention floor (plus their count deltas) and
# none of them is past the floor by more than the grace (:grace seconds):
# then a prune would drop nothing and only copy every row into the live slot.
# (:floor = failed retention in seconds.)
ONLY_RETAINED_FAILED_ROWS_SQL = Statement("""
    SELECT
        NOT EXISTS (
            SELECT 1 FROM {done_child}
            WHERE state <> 'failed'
               OR finalized_at < now() - make_interval(secs => :floor::double precision + :grace::double precision)
        )
        AND NOT EXISTS (SELECT 1 FROM {ready_child})
        AND NOT EXISTS (SELECT 1 FROM {claim_attempt_child})
        AND NOT EXISTS (SELECT 1 FROM {tombstone_child})
        AND NOT EXISTS (SELECT 1 FROM {segment_child})
        AND NOT EXISTS (SELECT 1 FROM {receipt_batch_child})
        AND NOT EXISTS (SELECT 1 FROM {receipt_tombstone_child})
""")

# Has the live slot received work since it became current? Ready rows are
# only ever appended to the current slot, so an empty ready child means the
# ring has had no traffic since the last rotation.
CURRENT_SLOT_HAS_TRAFFIC_SQL = Statement("SELECT EXISTS (SELECT 1 FROM {ready_child})")

LOCK_SLOT_SQL = Statement("LOCK TABLE {children} IN ACCESS EXCLUSIVE MODE")

# Re-home failed rows inside the retention floor (:floor seconds) into the
# live slot (:live_slot, generation :live_generation), widened to a self-contained row: the ready rows
# they would otherwise borrow args/payload/timestamps from are truncated with
# this slot. No ON CONFLICT: lane_seq never repeats, so a collision means
# corrupt terminal state and must fail the prune rather than lose a row.
CARRY_FAILED_ROWS_SQL = Statement("""
    INSERT INTO {schema}.done_entries (
        ready_slot, ready_generation, job_id, kind, queue, args, state, priority,
        attempt, run_lease, max_attempts, lane_seq, enqueue_shard, run_at,
        attempted_at, finalized_at, created_at, unique_key, unique_states, payload
    )
    SELECT
        :live_slot, :live_generation, done.job_id, done.kind, done.queue,
        COALESCE(done.args, ready.args, '{}'::jsonb),
        done.state, done.priority, done.attempt, done.run_lease,
        COALESCE(done.max_attempts, ready.max_attempts, 25::smallint),
        done.lane_seq, done.enqueue_shard,
        COALESCE(done.run_at, ready.run_at, done.finalized_at),
        COALESCE(done.attempted_at, ready.attempted_at),
        done.finalized_at,
        COALESCE(done.created_at, ready.created_at, done.finalized_at),
        COALESCE(done.unique_key, ready.unique_key),
        COALESCE(done.unique_states, ready.unique_states),
        COALESCE(done.payload, ready.payload, '{}'::jsonb)
    FROM {done_child} AS done
    LEFT JOIN {ready_child} AS ready
      ON ready.ready_slot = done.ready_slot
     AND ready.ready_generation = done.ready_generation
     AND ready.queue = done.queue
     AND ready.priority = done.priority
     AND ready.enqueue_shard = done.enqueue_shard
     AND ready.lane_seq = done.lane_seq
    WHERE done.state = 'failed'
      AND done.finalized_at >= now() - make_interval(secs => :floor::double precision)
""")

# The carried rows' count evidence moves with them: positive deltas under the
# live slot, grouped as the completion path groups them (this slot's live
# counters and deltas are wiped below).
CARRY_COUNT_DELTAS_SQL = Statement(
    """
    INSERT INTO {schema}.queue_terminal_count_deltas (
        ready_slot, ready_generation, queue, priority, enqueue_shard,
        counter_bucket, terminal_delta
    )
    SELECT :live_slot, :live_generation, queue, priority, enqueue_shard,
           mod(mod(job_id, {buckets}) + {buckets}, {buckets})::smallint AS bucket,
           count(*)
    FROM {done_child}
    WHERE state = 'failed'
      AND finalized_at >= now() - make_interval(secs => :floor::double precision)
    GROUP BY queue, priority, enqueue_shard, bucket
    ORDER BY queue, priority, enqueue_shard, bucket
""",
    buckets=str(TERMINAL_COUNTER_BUCKETS),
)

# Fold the slot's terminal rows into the permanent rollups, from ground truth
# (the children about to be truncated, every generation in them), not from
# the live counters. Carried failed rows are still live, so they are left
# out. Completed = done rows that are not failed (cancelled included, as
# Awa counts them) plus receipt completions without a tombstone. :floor = floor
# seconds, :floor_on = whether the floor is on.
FOLD_INTO_ROLLUPS_SQL = Statement("""
    WITH done_counts AS (
        SELECT queue, priority,
               count(*) FILTER (WHERE state <> 'failed') AS completed,
               count(*) FILTER (
                   WHERE state = 'failed'
                     AND (NOT :floor_on::boolean
                          OR finalized_at < now() - make_interval(secs => :floor::double precision))
               ) AS failed
        FROM {done_child}
        GROUP BY queue, priority
    ),
    receipt_counts AS (
        SELECT batch.queue, batch.priority, count(*) AS completed
        FROM {receipt_batch_child} AS batch
        CROSS JOIN LATERAL unnest(batch.job_ids, batch.run_leases) AS item(job_id, run_lease)
        WHERE NOT EXISTS (
            SELECT 1 FROM {receipt_tombstone_child} AS tomb
            WHERE tomb.ready_generation = batch.ready_generation
              AND tomb.job_id = item.job_id
              AND tomb.run_lease = item.run_lease
        )
        GROUP BY batch.queue, batch.priority
    ),
    folded AS (
        SELECT queue, priority,
               (COALESCE(done_counts.completed, 0) + COALESCE(receipt_counts.completed, 0))::bigint
                   AS completed,
               COALESCE(done_counts.failed, 0)::bigint AS failed
        FROM done_counts
        FULL JOIN receipt_counts USING (queue, priority)
    ),
    upserted AS (
        INSERT INTO {schema}.queue_terminal_rollups AS rollups (
            queue, priority, pruned_completed_count, pruned_failed_count
        )
        SELECT queue, priority, completed, failed
        FROM folded
        WHERE completed <> 0 OR failed <> 0
        ORDER BY queue, priority
        ON CONFLICT (queue, priority) DO UPDATE
        SET pruned_completed_count =
                GREATEST(0, rollups.pruned_completed_count + EXCLUDED.pruned_completed_count),
            pruned_failed_count =
                GREATEST(0, rollups.pruned_failed_count + EXCLUDED.pruned_failed_count)
        RETURNING 1
    )
    SELECT COALESCE(sum(completed), 0)::bigint AS completed,
           COALESCE(sum(failed), 0)::bigint AS failed
    FROM folded
""")

TRUNCATE_SLOT_SQL = Statement("TRUNCATE TABLE {children}")

# The slot's folded counters describe rows that are gone now.
DELETE_SLOT_LIVE_COUNTS_SQL = Statement(
    "DELETE FROM {schema}.queue_terminal_live_counts WHERE ready_slot = :slot"
)


def _check_children_named() -> None:
    """The statements that spell out every child of a slot name each one
    under its label (:data:`QUEUE_SLOT_CHILDREN` is what the callers read)."""
    placeholder = {table: key for key, table in CHILD_PLACEHOLDERS.items()}
    for label, table in QUEUE_SLOT_CHILDREN:
        expected = {
            CHILDREN_BUSY_SQL: [f'EXISTS (SELECT 1 FROM {{{placeholder[table]}}}) AS "{label}"'],
            ROTATE_SQL: [
                f'{{schema}}.{table} WHERE ready_slot = cursor.next_slot LIMIT 1) IS NOT NULL AS "{label}"',
                f'busy."{label}"',
                f"'{table}_' || oldest.slot",
            ],
            OLDEST_SLOT_CLEAN_SQL: [f"'.{table}_' || oldest.slot"],
        }
        for statement, parts in expected.items():
            if not all(part in statement.text for part in parts):
                raise RuntimeError(f"queue_ring: a statement does not name {table} as {label}")


_check_children_named()
