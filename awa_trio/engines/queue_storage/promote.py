"""promote_scheduled on queue storage: due deferred rows become ready entries.

Due ``scheduled`` rows, then due ``retryable`` rows, of queues that are not
paused leave ``deferred_jobs`` and enter the current queue slot of
``ready_entries``, with the bookkeeping a claimer needs to find them: lane
sequence numbers reserved from the lane's enqueue sequence (under the lane's
transaction lock, as every producer does), one ``ready_segments`` row per
lane, the unique claim moved to the ``available`` state, and one NOTIFY on
``awa:<queue>`` per queue so idle awa workers wake at once.

A batch shipped to the client and re-inserted with 18 bind parameters per
row would exceed PostgreSQL's 65,535-parameter limit above about 3,640 rows
(docs/differences.md). So a batch is three statements (pick, reserve, file:
see the lane-order invariant below) whose rows never leave the server (only
their ids and one row per lane do), so any burst promotes, 4096 rows at a
time, at most 32 batches per state per tick, stopping at the first short
batch.

Rows whose ``payload`` is NULL (awa-pg's ``enqueue_many_copy``) move as they
are; an empty payload is stored as NULL, as Awa stores it.

Unique claims: a job whose ``unique_states`` claim ``available`` but not its
waiting state holds no claim while it waits, and cannot be promoted while
another job holds the claim. Such a job is left out of the batch and stays
deferred until the holder releases the claim; a conflict that appears after
the check (a race, or two due jobs sharing a key in one batch) makes that
batch fall back to one statement per row, so one row never holds up the
others.

Concurrent writers, and what makes each pair safe:

* **Producers** (awa-pg's inserts and COPY, ``awa.insert_job_compat``) append
  to the same lanes: both sides reserve positions under the lane's
  transaction lock and read the ring in a later statement while holding it
  (the lane-order invariant, below). A producer waits for our lock for the
  one round trip of FILE and COMMIT.
* **Another promoter** (a foreign leader, our own row-by-row fallback): due
  rows are picked ``FOR UPDATE SKIP LOCKED``, so each row is moved once.
* **awa-pg admin updates of a deferred row** (cancel, move, set priority)
  lock the row; we skip it, or they wait for our commit and then find it
  gone from ``deferred_jobs``.
* **Unique claims**: the claim insert waits on a concurrent insert of the
  same key and then raises 23505 (the batch goes row by row), never a
  silent second holder.
* **Rotation** moves the cursor while we run: FILE reads the ring once, in
  its own snapshot taken with the lane locks held, and waits on nothing
  after that, so its rows land in the slot that was live when it read it
  (a prune never touches the live slot, and rotating a slot away and
  pruning it takes a lap of rotations).
* **Claimers** read only committed segments and entries; ours become
  visible with the commit, whole.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterable, Mapping
from typing import Any

import trio

from ...context import MaintenanceContext
from ...db import (
    QueryError,
    UniqueViolation,
)
from ...maintenance.promotion import (
    ASYNC_COMMIT,
    NEXT_IN_COLUMNS,
    PROMOTABLE_STATES,
    PROMOTE_BATCH_SIZE,
    PROMOTE_MAX_BATCHES_PER_TICK,
    STATE_LITERALS,
    PromotedBatch,
    PromoteResult,
    promote_batches,
    promote_due,
)
from ...maintenance.promotion import promote_row_by_row as shared_row_by_row
from ...sql import Fragment, Statement
from .layout import mask_claims, schema_name

log = logging.getLogger(__name__)

NAME = "promote_scheduled"
#: Due rows looked at when checking for lanes that do not exist yet.
LANE_CHECK_WINDOW = PROMOTE_BATCH_SIZE * PROMOTE_MAX_BATCHES_PER_TICK


# A row "gains a claim" when its mask claims `available` but not its waiting
# state, and "drops its claim" in the opposite case (as Awa's
# sync_unique_claim decides per row). {unique_key}: the row's key;
# {claims_available} / {claims_waiting}: layout.mask_claims of its mask for
# `available` / its waiting state.
_GAINS_CLAIM = Fragment("({unique_key} IS NOT NULL AND {claims_available} AND NOT {claims_waiting})")
_DROPS_CLAIM = Fragment("({unique_key} IS NOT NULL AND {claims_waiting} AND NOT {claims_available})")


def _claim_columns(row: str, state: str) -> dict[str, str]:
    """The columns of _GAINS_CLAIM / _DROPS_CLAIM for the row ``row``
    (``deferred`` or ``picked``) waiting in ``state``."""
    return {
        "unique_key": row + ".unique_key",
        "claims_available": mask_claims(row + ".unique_states", "available"),
        "claims_waiting": mask_claims(row + ".unique_states", state),
    }


# A batch is two statements in one transaction, in the order Awa's own
# producers take their steps (awa.insert_job_compat and Awa's
# promote_due: unique claim and lane reservation, then the ring read):
#
#   PICK  due rows of unpaused queues whose unique claim (if they need one)
#         is free, oldest first, locked SKIP LOCKED; their unique claims
#         moved; then per lane (queue, priority, enqueue shard) a block of
#         lane positions: reserve_enqueue_seq takes the lane's lock and holds
#         it until commit, in lane order like producers. This is where a
#         batch may wait for a producer. One row per lane comes back: its
#         row count, job ids and first position. The shard is one rotor value
#         (:shard_rotor) per batch modulo the queue's shard count (1 unless an operator
#         raised it), as Awa's promotion picks one rotor shard per (queue, priority)
#         for rows without an ordering key. A claim held by another job
#         raises 23505 here and the batch goes row by row.
#   FILE  the picked rows deleted from deferred_jobs and inserted as ready
#         entries numbered from their lane's block, one ready segment per
#         lane, all under the queue ring slot read by THIS statement; one
#         NOTIFY per queue.
#
# The lane-order invariant: within a lane, a higher lane position is never
# filed under an older ring slot. The claimer reads one slot at a time and
# moves the lane's claim cursor past the highest position it took there; a
# position filed under an older slot than a lower one makes the cursor jump
# over the lower one, whose job is then never claimed and is truncated by a
# later prune. Producers keep the invariant by reading the ring after their
# reservation, in the transaction that holds the lane lock. A statement's
# snapshot is taken when it starts, so a ring read in the statement that
# waits for the lane lock sees the ring as it was BEFORE the wait, while the
# producer it waited for may have filed lower positions under a newer slot
# (issue 15: 0.6-1.1 % of jobs lost under load). Hence FILE is a statement
# of its own, after PICK: its snapshot is taken with the lane locks held, so
# it sees every rotation the producers before us saw, and producers after us
# wait for our commit. It needs READ COMMITTED (a transaction snapshot would
# be PICK's again): every connection of ours sets it (db.open_database),
# whatever the database's default. FILE itself waits on nothing (append-only
# inserts and a delete of rows PICK locked), so the slot it reads is still
# the live one when its rows land.
#
# The state is a literal and the order is the index's, so the due rows come
# from idx_awa_deferred_due (state, run_at, queue, priority, job_id) in order
# and the scan stops after :limit of them; the paused queues are read once (an
# init plan), and the claim lookup runs only for rows with a unique key. The
# batch runs with PLANNER_SETTINGS: the planner underestimates the due
# rows badly (the claim subplan's cost, queue_meta's missing statistics) and
# would otherwise sort every due row on each batch (measured: 24 s for a
# 50,000-row burst instead of ~3 s), and JIT compiles it for ~100-400 ms.
_PICK_SQL_TEMPLATE = """
    WITH picked AS MATERIALIZED (
        SELECT deferred.job_id, deferred.queue, deferred.priority, deferred.run_at,
               deferred.unique_key, deferred.unique_states
        FROM {schema}.deferred_jobs AS deferred
        WHERE deferred.state = {state}::awa.job_state
          AND deferred.run_at <= now()
          AND deferred.queue <> ALL (ARRAY(SELECT meta.queue FROM awa.queue_meta AS meta
                                           WHERE meta.paused))
          AND NOT ({gains_claim} AND EXISTS (
              SELECT 1 FROM awa.job_unique_claims AS claim
              WHERE claim.unique_key = deferred.unique_key
                AND claim.job_id <> deferred.job_id
          ))
          {selection}
        ORDER BY deferred.run_at, deferred.queue, deferred.priority, deferred.job_id
        LIMIT :limit
        FOR UPDATE OF deferred SKIP LOCKED
    ),
    claimed AS (
        INSERT INTO awa.job_unique_claims (unique_key, job_id)
        SELECT picked.unique_key, picked.job_id
        FROM picked
        WHERE {gains_claim_picked}
          AND NOT EXISTS (
              SELECT 1 FROM awa.job_unique_claims AS own
              WHERE own.unique_key = picked.unique_key AND own.job_id = picked.job_id
          )
        RETURNING job_id
    ),
    released AS (
        DELETE FROM awa.job_unique_claims AS claim
        USING picked
        WHERE {drops_claim_picked}
          AND claim.unique_key = picked.unique_key
          AND claim.job_id = picked.job_id
        RETURNING claim.job_id
    ),
    lanes AS MATERIALIZED (
        SELECT
            per_lane.queue, per_lane.priority, per_lane.rows, per_lane.job_ids, per_lane.lateness,
            (:shard_rotor::bigint % COALESCE(
                (SELECT meta.enqueue_shards FROM awa.queue_meta AS meta
                 WHERE meta.queue = per_lane.queue), 1))::smallint AS enqueue_shard
        FROM (
            SELECT queue, priority, count(*)::bigint AS rows, array_agg(job_id) AS job_ids,
                   array_agg(EXTRACT(EPOCH FROM now() - run_at)::float8) AS lateness
            FROM picked
            GROUP BY queue, priority
        ) AS per_lane
    )
    SELECT
        lane.queue, lane.priority, lane.enqueue_shard, lane.rows, lane.job_ids, lane.lateness,
        {schema}.reserve_enqueue_seq(lane.queue, lane.priority, lane.enqueue_shard, lane.rows)
            AS first_seq
    FROM (SELECT * FROM lanes ORDER BY queue COLLATE "C", priority, enqueue_shard) AS lane
"""

# FILE is sent with the COMMIT in one simple-protocol round trip, so the lane
# locks PICK took are held for that one round trip only (a producer of the
# lane waits for them). The simple protocol takes no bind parameters, so this
# is the one statement written per batch rather than bound: the picked rows
# come as array literals of integers PICK returned ({job_ids}, and per job
# its lane's {first_seqs} and {shards}), placed by file_sql() together with
# {schema}. Named parameters would cost a second round trip with the lane
# locks held (FILE, then COMMIT), and a Statement would keep every batch's
# text.
# A row whose lane is missing gets a NULL lane_seq and fails the statement
# (ready_entries.lane_seq is NOT NULL), so a row is never deleted without
# being filed. A channel is an identifier: workers LISTEN on "awa:<queue>"
# cut to 63 bytes (at a character boundary), and pg_notify refuses a longer
# name, which would fail the whole batch, so the channel is cut the same way.
_FILE_SQL_TEMPLATE = Fragment("""
    WITH picked AS MATERIALIZED (
        SELECT *
        FROM unnest({job_ids}::bigint[], {first_seqs}::bigint[], {shards}::smallint[]) AS picked(job_id, first_seq, enqueue_shard)
    ),
    moved AS (
        DELETE FROM {schema}.deferred_jobs AS deferred
        USING picked
        WHERE deferred.job_id = picked.job_id
        RETURNING deferred.*, picked.first_seq AS lane_first_seq, picked.enqueue_shard AS lane_shard
    ),
    numbered AS (
        SELECT
            moved.*,
            moved.lane_first_seq - 1 + row_number() OVER (
                PARTITION BY moved.queue, moved.priority
                ORDER BY moved.run_at, moved.job_id
            ) AS lane_seq
        FROM moved
    ),
    -- Read with this statement's snapshot, taken after PICK got the lane
    -- locks: see the lane-order invariant above.
    ring AS (
        SELECT current_slot, generation FROM {schema}.queue_ring_state WHERE singleton
    ),
    segments AS (
        INSERT INTO {schema}.ready_segments (
            ready_slot, ready_generation, queue, priority, enqueue_shard,
            first_lane_seq, next_lane_seq, first_run_at
        )
        SELECT
            ring.current_slot, ring.generation, lane.queue, lane.priority,
            lane.lane_shard, lane.lane_first_seq, lane.lane_first_seq + lane.rows, now()
        FROM (
            SELECT queue, priority, lane_shard, lane_first_seq, count(*) AS rows
            FROM moved
            GROUP BY queue, priority, lane_shard, lane_first_seq
        ) AS lane
        CROSS JOIN ring
        ON CONFLICT (ready_slot, ready_generation, queue, priority, enqueue_shard, first_lane_seq)
            DO NOTHING
    ),
    inserted AS (
        INSERT INTO {schema}.ready_entries (
            ready_slot, ready_generation, job_id, kind, queue, args, priority, attempt,
            run_lease, max_attempts, lane_seq, enqueue_shard, run_at, attempted_at,
            created_at, unique_key, unique_states, payload
        )
        SELECT
            ring.current_slot, ring.generation, numbered.job_id, numbered.kind, numbered.queue,
            numbered.args, numbered.priority, numbered.attempt, numbered.run_lease,
            numbered.max_attempts, numbered.lane_seq, numbered.lane_shard, now(),
            numbered.attempted_at, numbered.created_at, numbered.unique_key,
            numbered.unique_states,
            CASE WHEN numbered.payload IN ('{}'::jsonb, 'null'::jsonb) THEN NULL
                 ELSE numbered.payload END
        FROM numbered CROSS JOIN ring
        RETURNING queue
    )
    SELECT pg_notify(
               CASE WHEN octet_length(channel) <= 63 THEN channel
                    ELSE (SELECT left(channel, length)
                          FROM generate_series(63, 1, -1) AS length
                          WHERE octet_length(left(channel, length)) <= 63
                          LIMIT 1)
               END, '')
    FROM (SELECT DISTINCT 'awa:' || queue AS channel FROM inserted) AS queues;
    COMMIT
""")


def _int_array(values: Iterable[Any]) -> str:
    """An array constructor of integers (int() keeps anything else out of the
    SQL); the statement casts it."""
    return "ARRAY[" + ",".join(str(int(value)) for value in values) + "]"


def file_sql(schema: str, lanes: Iterable[Mapping[str, Any]]) -> str:
    """FILE and COMMIT for PICK's lanes, as one simple-protocol query."""
    job_ids, first_seqs, shards = [], [], []
    for lane in lanes:
        for job_id in lane["job_ids"]:
            job_ids.append(job_id)
            first_seqs.append(lane["first_seq"])
            shards.append(lane["enqueue_shard"])
    return _FILE_SQL_TEMPLATE(
        schema=schema,
        job_ids=_int_array(job_ids),
        first_seqs=_int_array(first_seqs),
        shards=_int_array(shards),
    )


def _pick_sql(state: str, selection: str) -> Statement:
    return Statement(
        _PICK_SQL_TEMPLATE,
        state=STATE_LITERALS[state],
        selection=selection,
        gains_claim=_GAINS_CLAIM(**_claim_columns("deferred", state)),
        gains_claim_picked=_GAINS_CLAIM(**_claim_columns("picked", state)),
        drops_claim_picked=_DROPS_CLAIM(**_claim_columns("picked", state)),
    )


#: Settings of the batch's transaction (see above; JIT is off on every
#: connection of ours already), and its commit not waiting for the WAL
#: flush (maintenance.promotion.ASYNC_COMMIT).
PLANNER_SETTINGS = {"enable_sort": "off", **ASYNC_COMMIT}
#: The SQLSTATE reserve_enqueue_seq raises for a lane with no enqueue head.
MISSING_LANE_SQLSTATE = "55000"

#: PICK per state: :limit rows, :shard_rotor.
PICK_BATCH_SQL = {state: _pick_sql(state, "") for state in PROMOTABLE_STATES}
#: The row-by-row fallback: the same statement narrowed to one id (:job_id).
PICK_ONE_SQL = {
    state: _pick_sql(state, "AND deferred.job_id = :job_id::bigint") for state in PROMOTABLE_STATES
}
#: Ids the fallback walks: the due rows a batch would have taken.
_DUE_IDS_TEMPLATE = """
        SELECT deferred.job_id
        FROM {schema}.deferred_jobs AS deferred
        WHERE deferred.state = {state}::awa.job_state
          AND deferred.run_at <= now()
          AND NOT EXISTS (
              SELECT 1 FROM awa.queue_meta AS meta
              WHERE meta.queue = deferred.queue AND meta.paused
          )
        ORDER BY deferred.run_at, deferred.queue, deferred.priority, deferred.job_id
        LIMIT :limit
    """
DUE_IDS_SQL = {
    state: Statement(_DUE_IDS_TEMPLATE, state=STATE_LITERALS[state]) for state in PROMOTABLE_STATES
}

# Lanes (queue, priority, every shard of the queue) that due rows of unpaused
# queues need but that have no enqueue or claim head yet: a scheduled job of a
# queue or priority that never had a ready row. Usually returns nothing.
_MISSING_LANES_TEMPLATE = """
        WITH due AS (
            SELECT DISTINCT due_row.queue, due_row.priority
            FROM (
                SELECT deferred.queue, deferred.priority
                FROM {schema}.deferred_jobs AS deferred
                WHERE deferred.state = {state}::awa.job_state
                  AND deferred.run_at <= now()
                ORDER BY deferred.run_at
                LIMIT :limit
            ) AS due_row
            WHERE NOT EXISTS (
                SELECT 1 FROM awa.queue_meta AS meta
                WHERE meta.queue = due_row.queue AND meta.paused
            )
        )
        SELECT due.queue, due.priority, shard.enqueue_shard
        FROM due
        CROSS JOIN LATERAL generate_series(
            0,
            COALESCE(
                (SELECT meta.enqueue_shards FROM awa.queue_meta AS meta
                 WHERE meta.queue = due.queue), 1) - 1
        ) AS shard(enqueue_shard)
        WHERE NOT EXISTS (
                SELECT 1 FROM {schema}.queue_enqueue_heads AS head
                WHERE head.queue = due.queue AND head.priority = due.priority
                  AND head.enqueue_shard = shard.enqueue_shard
            )
           OR NOT EXISTS (
                SELECT 1 FROM {schema}.queue_claim_heads AS head
                WHERE head.queue = due.queue AND head.priority = due.priority
                  AND head.enqueue_shard = shard.enqueue_shard
            )
        ORDER BY due.queue COLLATE "C", due.priority, shard.enqueue_shard
    """
MISSING_LANES_SQL = {
    state: Statement(_MISSING_LANES_TEMPLATE, state=STATE_LITERALS[state]) for state in PROMOTABLE_STATES
}

# Creating a lane, as producers do: under the lane's transaction lock (same
# key as Awa's ensure_lane), the lane row, its enqueue and claim heads
# (their triggers create the lane sequences, never moving one backwards), then
# the sequence names. :queues, :priorities, :shards (parallel arrays). The
# lock key starts with the schema's name (:schema_name), as producers' does.
_LANE_INPUT = Fragment(
    "unnest(:queues::text[], :priorities::smallint[], :shards::smallint[]) AS lane(queue, priority, enqueue_shard)"
)
LOCK_LANES_SQL = Statement(
    """
    SELECT pg_advisory_xact_lock(hashtextextended(
        :schema_name::text || ':' || lane.queue || ':' || lane.priority || ':' || lane.enqueue_shard, 0))
    FROM {lanes}
""",
    lanes=_LANE_INPUT(),
)
INSERT_LANES_SQL = Statement(
    """
    INSERT INTO {schema}.queue_lanes (queue, priority)
    SELECT DISTINCT lane.queue, lane.priority FROM {lanes}
    ON CONFLICT (queue, priority) DO NOTHING
""",
    lanes=_LANE_INPUT(),
)
INSERT_ENQUEUE_HEADS_SQL = Statement(
    """
    INSERT INTO {schema}.queue_enqueue_heads (queue, priority, enqueue_shard)
    SELECT lane.queue, lane.priority, lane.enqueue_shard FROM {lanes}
    ON CONFLICT (queue, priority, enqueue_shard) DO NOTHING
""",
    lanes=_LANE_INPUT(),
)
INSERT_CLAIM_HEADS_SQL = Statement(
    """
    INSERT INTO {schema}.queue_claim_heads (queue, priority, enqueue_shard)
    SELECT lane.queue, lane.priority, lane.enqueue_shard FROM {lanes}
    ON CONFLICT (queue, priority, enqueue_shard) DO NOTHING
""",
    lanes=_LANE_INPUT(),
)
ENSURE_LANE_SEQUENCES_SQL = Statement(
    """
    SELECT {schema}.ensure_lane_sequences(lane.queue, lane.priority, lane.enqueue_shard)
    FROM {lanes}
""",
    lanes=_LANE_INPUT(),
)

# The due probe, in one round trip: per state, whether unpaused queues have
# due rows, and the seconds until the first row of an unpaused queue that is
# not due yet (NULL: none). An idle tick stops here instead of checking
# lanes and opening a batch transaction per state (eleven statements). Same
# predicate as the batch's, minus the unique-claim check: a state whose due
# rows all wait on a claim runs its batch, which then promotes nothing, as
# before. Each is an index probe of idx_awa_deferred_due (plans in
# docs/branches-queue-storage.md). The next row is looked for among the
# first NEXT_WINDOW rows ahead, the paused queues' left out afterwards: with
# the paused filter inside, the planner cannot tell how many rows pass it
# and reads every row ahead (measured: a parallel seq scan and a sort, 36 ms
# with 100,000 rows scheduled). When all of them belong to paused queues
# there is no early wake, and the next tick probes again.
#: Rows ahead the due probe reads for the next run_at of an unpaused queue.
NEXT_WINDOW = 64
_STATE_PROBE = Fragment("""EXISTS (
           SELECT 1 FROM {schema}.deferred_jobs AS deferred
           WHERE deferred.state = {state}::awa.job_state
             AND deferred.run_at <= now()
             AND deferred.queue <> ALL (ARRAY(SELECT meta.queue FROM awa.queue_meta AS meta
                                              WHERE meta.paused))
       ) AS {due},
       EXTRACT(EPOCH FROM (
           SELECT ahead.run_at
           FROM (
               SELECT deferred.run_at, deferred.queue FROM {schema}.deferred_jobs AS deferred
               WHERE deferred.state = {state}::awa.job_state AND deferred.run_at > now()
               ORDER BY deferred.run_at
               LIMIT {next_window}
           ) AS ahead
           WHERE ahead.queue <> ALL (ARRAY(SELECT meta.queue FROM awa.queue_meta AS meta
                                           WHERE meta.paused))
           ORDER BY ahead.run_at
           LIMIT 1
       ) - now())::float8 AS {next_in}""")
DUE_STATES_SQL = Statement(
    "SELECT "
    + ",\n       ".join(
        _STATE_PROBE(
            state=STATE_LITERALS[state],
            due=state,
            next_in=NEXT_IN_COLUMNS[state],
            next_window=str(NEXT_WINDOW),
        )
        for state in PROMOTABLE_STATES
    )
)

#: One rotor per process: successive batches spread over a queue's shards.
_shard_rotor = itertools.count()


async def run_once(ctx: MaintenanceContext) -> PromoteResult:
    schema = schema_name(ctx)

    async def promote_state(state: str, result: PromoteResult) -> None:
        await promote_due_state(ctx, schema, state, result)

    return await promote_due(ctx, NAME, DUE_STATES_SQL.render(schema), promote_state)


async def ensure_lanes(ctx: MaintenanceContext, missing_sql: Statement, result: PromoteResult) -> None:
    """Create the lanes due rows need, so the batch can reserve positions in
    them (a reservation in a missing lane is an error)."""
    schema = ctx.schema.queue_storage_schema
    missing = await ctx.db.fetch(*missing_sql.bind(schema, limit=LANE_CHECK_WINDOW))
    if not missing:
        return
    lanes = {
        "queues": [row["queue"] for row in missing],
        "priorities": [row["priority"] for row in missing],
        "shards": [row["enqueue_shard"] for row in missing],
    }
    async with ctx.db.transaction() as conn:
        await conn.execute(*LOCK_LANES_SQL.bind(None, schema_name=schema, **lanes))
        for statement in (
            INSERT_LANES_SQL,
            INSERT_ENQUEUE_HEADS_SQL,
            INSERT_CLAIM_HEADS_SQL,
            ENSURE_LANE_SEQUENCES_SQL,
        ):
            await conn.execute(*statement.bind(schema, **lanes))
    created = [(row["queue"], row["priority"], row["enqueue_shard"]) for row in missing]
    result.lanes_created.extend(created)
    log.info("%s: created %d lanes for due jobs: %s", NAME, len(created), created)


async def promote_due_state(ctx: MaintenanceContext, schema: str, state: str, result: PromoteResult) -> None:
    """Up to PROMOTE_MAX_BATCHES_PER_TICK batches; stop at the first short one.

    Lanes are not checked beforehand: a due row of a lane that has no
    enqueue head yet (a queue or priority that never had a ready row) makes
    the reservation fail with 55000; the lanes are then created and the
    batch tried again, once."""
    pick_sql = PICK_BATCH_SQL[state]
    lanes_created = False

    async def batch(limit: int) -> PromotedBatch | None:
        nonlocal lanes_created
        while True:
            started = trio.current_time()
            try:
                rows = await run_batch(ctx, schema, pick_sql, limit=limit, shard_rotor=next(_shard_rotor))
            except UniqueViolation as exc:
                log.warning(
                    "%s: a batch of %s jobs hit a unique-claim conflict (%s); promoting row by row",
                    NAME,
                    state,
                    exc,
                )
                await promote_row_by_row(ctx, schema, state, result)
                # What is left is due again next tick, batched once more.
                return None
            except QueryError as exc:
                if exc.sqlstate != MISSING_LANE_SQLSTATE or lanes_created:
                    raise
                lanes_created = True
                await ensure_lanes(ctx, MISSING_LANES_SQL[state], result)
                continue  # the same batch again, not counted twice
            return PromotedBatch(
                started,
                sum(row["rows"] for row in rows),
                queues=(row["queue"] for row in rows),
                lateness=(value for row in rows for value in row["lateness"]),
            )

    await promote_batches(
        ctx, state, result, batch, batch_size=PROMOTE_BATCH_SIZE, max_batches=PROMOTE_MAX_BATCHES_PER_TICK
    )


async def run_batch(
    ctx: MaintenanceContext, schema: str, pick_sql: Statement, **pick_values: Any
) -> list[Any]:
    """One batch in its own transaction, the planner setting sent with the
    BEGIN: PICK, then FILE with the COMMIT (FILE a statement of its own, so
    that it reads the ring with the lane locks held: see the lane-order
    invariant above). Returns PICK's lanes (queue, rows, ...)."""
    async with ctx.db.transaction(local_settings=PLANNER_SETTINGS) as conn:
        lanes = await conn.fetch(*pick_sql.bind(schema, **pick_values))
        if lanes:
            await conn.commit_with(file_sql(schema, lanes))
        return lanes


async def promote_row_by_row(ctx: MaintenanceContext, schema: str, state: str, result: PromoteResult) -> None:
    """The fallback for a refused batch: each due job in its own statement. A
    job whose claim is held elsewhere stays deferred (the next batch leaves it
    out until the claim is free)."""
    ids = [
        row["job_id"]
        for row in await ctx.db.fetch(*DUE_IDS_SQL[state].bind(schema, limit=PROMOTE_BATCH_SIZE))
    ]
    pick_sql = PICK_ONE_SQL[state]

    async def promote_one(job_id: int) -> list[tuple[str, int]]:
        # Nothing returned: promoted, deleted or paused meanwhile, or waiting on its claim.
        rows = await run_batch(ctx, schema, pick_sql, limit=1, shard_rotor=next(_shard_rotor), job_id=job_id)
        return [(row["queue"], row["rows"]) for row in rows]

    async def on_claim_conflict(job_id: int) -> None:
        log.warning(
            "%s: %s job %d is due but another job holds its unique claim; "
            "it stays deferred until the claim is released",
            NAME,
            state,
            job_id,
        )
        result.skipped.append(job_id)

    await shared_row_by_row(NAME, state, ids, promote_one, on_claim_conflict, result)
