"""What the queue-storage engine's branches need of the leading role: a few
objects in the awa schema, and its rings, lanes and sequences in the
queue-storage schema (the grants machinery is :mod:`awa_trio.grants`).

Two grants are wider than one table, because the database leaves no
narrower one: ``CREATE`` on the queue-storage schema (promotion reserves lane
positions through Awa's ``ensure_lane_sequences``, which runs ``CREATE
SEQUENCE IF NOT EXISTS`` for every batch, and PostgreSQL checks ``CREATE`` even
when the sequence exists), and ``pg_read_all_stats`` (the terminal-count
rollup may only TRUNCATE while no other session of the database holds a
snapshot, and without it the ``pg_stat_activity`` columns that say so are
hidden for other roles' sessions, so the check would always pass).
"""

from __future__ import annotations

from ..base import (
    CREATE,
    DELETE,
    INSERT,
    SELECT,
    TRUNCATE,
    UPDATE,
    USAGE,
    FunctionNeed,
    GrantNeeds,
    SequenceNeed,
    StorageSchemaNeeds,
    TableNeed,
)

#: In the awa schema: what queue storage adds there.
QUEUE_STORAGE_AWA_TABLES = (
    TableNeed(
        "job_unique_claims",
        (UPDATE,),
        "a rescue takes a unique claim back (INSERT ... ON CONFLICT DO UPDATE)",
    ),
    TableNeed("jobs", (SELECT,), "status: the rescue backlog reads the awa.jobs view"),
)

QUEUE_STORAGE_AWA_FUNCTIONS = (
    FunctionNeed("jobs_compat", "behind the awa.jobs view (status)"),
    FunctionNeed("queue_storage_payload_tags", "batch operations' tag filter; awa.jobs"),
    FunctionNeed("queue_storage_payload_errors", "awa.jobs"),
)

_RING_CHILD = (SELECT, TRUNCATE)
_QUEUE_RING_WHY = "queue ring: rotation checks it, prune reads and truncates each slot's child"
_CLAIM_RING_WHY = "claim ring: rotation and prune"
_ROW_LOCK_WHY = "UPDATE only for the row locks (SELECT ... FOR UPDATE)"

#: In the queue-storage schema (``awa`` unless the installation chose another).
QUEUE_STORAGE_TABLES = (
    TableNeed("queue_ring_state", (SELECT, UPDATE), "queue ring cursor (rotation, prune, rollup, promotion)"),
    TableNeed("queue_ring_slots", (SELECT, UPDATE), "queue ring slot generations"),
    TableNeed("lease_ring_state", (SELECT, UPDATE), "lease ring cursor"),
    TableNeed("lease_ring_slots", (SELECT, UPDATE), "lease ring slot generations"),
    TableNeed("claim_ring_state", (SELECT, UPDATE), "claim ring cursor"),
    TableNeed("claim_ring_slots", (SELECT, UPDATE), "claim ring slots and their rescue cursors"),
    TableNeed(
        "ready_entries",
        (SELECT, INSERT, UPDATE),
        "promotion and batch operations file entries (UPDATE for row locks); " + _QUEUE_RING_WHY,
        _RING_CHILD,
    ),
    TableNeed(
        "ready_segments", (SELECT, INSERT), "promotion and batch operations; " + _QUEUE_RING_WHY, _RING_CHILD
    ),
    TableNeed("ready_tombstones", (SELECT, INSERT), "batch operations; " + _QUEUE_RING_WHY, _RING_CHILD),
    TableNeed("ready_claim_attempt_batches", (SELECT,), _QUEUE_RING_WHY, _RING_CHILD),
    TableNeed(
        "done_entries",
        (SELECT, INSERT),
        "rescues; prune carries failed rows; " + _QUEUE_RING_WHY,
        _RING_CHILD,
    ),
    TableNeed("receipt_completion_batches", (SELECT,), _QUEUE_RING_WHY, _RING_CHILD),
    TableNeed("receipt_completion_tombstones", (SELECT,), _QUEUE_RING_WHY, _RING_CHILD),
    TableNeed(
        "queue_terminal_count_deltas",
        (SELECT, INSERT),
        "rescues and prune add deltas; the rollup folds, deletes and truncates each slot's child",
        (SELECT, DELETE, TRUNCATE),
    ),
    TableNeed("queue_terminal_live_counts", (SELECT, INSERT, UPDATE, DELETE), "terminal_count_rollup; prune"),
    TableNeed(
        "queue_terminal_rollups", (SELECT, INSERT, UPDATE), "prune folds pruned slots' terminal counts"
    ),
    TableNeed(
        "deferred_jobs",
        (SELECT, INSERT, UPDATE, DELETE),
        "promotion, rescues (retryable rows), batch operations; status",
    ),
    TableNeed(
        "dlq_entries",
        (SELECT, INSERT, UPDATE, DELETE),
        "callback rescues dead-letter, cleanup purges; " + _ROW_LOCK_WHY,
    ),
    TableNeed(
        "leases",
        (SELECT, UPDATE, DELETE),
        "rescues take leases; lease ring rotation and prune; " + _ROW_LOCK_WHY,
        _RING_CHILD,
    ),
    TableNeed(
        "lease_claims", (SELECT, UPDATE), "rescues close receipt claims; " + _CLAIM_RING_WHY, _RING_CHILD
    ),
    TableNeed(
        "lease_claim_batches",
        (SELECT, UPDATE),
        "rescues; " + _CLAIM_RING_WHY + "; " + _ROW_LOCK_WHY,
        _RING_CHILD,
    ),
    TableNeed(
        "lease_claim_closures", (SELECT, INSERT), "rescues write closures; " + _CLAIM_RING_WHY, _RING_CHILD
    ),
    TableNeed(
        "lease_claim_closure_batches",
        (SELECT, INSERT),
        "rescues write closures; " + _CLAIM_RING_WHY,
        _RING_CHILD,
    ),
    TableNeed("attempt_state", (SELECT, DELETE), "heartbeats read and dropped by rescues"),
    TableNeed(
        "queue_lanes",
        (SELECT, INSERT),
        "promotion and batch operations create lanes (ON CONFLICT (...) reads)",
    ),
    TableNeed(
        "queue_enqueue_heads", (SELECT, INSERT, UPDATE), "lane creation and position reservation; queue_stats"
    ),
    TableNeed(
        "queue_claim_heads",
        (SELECT, INSERT, UPDATE),
        "lane creation; claim cursors read by prune, rollup, queue_stats; row locks",
    ),
    TableNeed("terminal_jobs", (SELECT,), "read by awa.jobs_compat() (status)"),
)

QUEUE_STORAGE_SEQUENCES = (
    SequenceNeed("job_id_seq", (USAGE,), "ids of jobs insert_job_compat inserts (cron, follow-ups)"),
    SequenceNeed("lease_claim_closure_batch_id_seq", (USAGE,), "rescues closing compact claims"),
)

#: Lane sequences (one enqueue and one claim sequence per queue, priority and
#: shard): read for every claim cursor, moved when positions are reserved.
LANE_SEQUENCE_PREFIXES = ("queue_enqueue_seq_", "queue_claim_seq_")
LANE_SEQUENCE_PRIVILEGES = (SELECT, UPDATE)

QUEUE_STORAGE_FUNCTIONS = (
    FunctionNeed("sequence_next_value", "claim cursors (prune, rollup, queue_stats, batch operations)"),
    FunctionNeed("reserve_enqueue_seq", "promotion and batch operations reserve lane positions"),
    FunctionNeed("ensure_lane_sequences", "lane creation"),
    FunctionNeed("set_sequence_next", "called by the lane-head triggers"),
    FunctionNeed("queue_lane_sequence_name", "called by the lane functions and triggers"),
)


#: The predefined role that shows other roles' sessions in pg_stat_activity.
READ_ALL_STATS = "pg_read_all_stats"

GRANTS = GrantNeeds(
    awa_tables=QUEUE_STORAGE_AWA_TABLES,
    awa_sequences=(),
    awa_functions=QUEUE_STORAGE_AWA_FUNCTIONS,
    storage_schema=StorageSchemaNeeds(
        schema_label="queue-storage schema",
        schema_privileges=(USAGE, CREATE),
        schema_why="CREATE: promotion reserves lane positions through ensure_lane_sequences "
        "(CREATE SEQUENCE IF NOT EXISTS)",
        tables=QUEUE_STORAGE_TABLES,
        sequences=QUEUE_STORAGE_SEQUENCES,
        functions=QUEUE_STORAGE_FUNCTIONS,
        sequence_prefixes=LANE_SEQUENCE_PREFIXES,
        prefix_privileges=LANE_SEQUENCE_PRIVILEGES,
        prefix_why="lane sequences: claim cursors are read, reservations move them",
        prefix_label="lane sequences",
        member_of=(
            (READ_ALL_STATS, "terminal_count_rollup must see other roles' snapshots before it truncates"),
        ),
    ),
)
