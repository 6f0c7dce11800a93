"""terminal_count_rollup: fold sealed slots' terminal-count deltas into the
live counts.

Terminal rows written to ``done_entries`` (and deleted from it) append signed
rows to ``queue_terminal_count_deltas`` rather than updating a hot counter;
exact counts read live counts plus pending deltas. This branch keeps the
delta tables small: for up to four sealed queue slots per tick (oldest
generation first) it sums the slot's deltas into
``queue_terminal_live_counts`` and empties the slot's delta child.

Emptying uses TRUNCATE, which is not MVCC-safe: a reader whose snapshot
predates the commit would see the folded deltas in neither table. So the
rollup stands down while any other backend of this database
pins the MVCC horizon (holds a snapshot, or sits idle in a transaction with
an xid), and leaves alone the current slot and any slot that can still get
new terminal rows: pending ready rows at or past a lane's claim cursor,
active leases, claims not yet closed. It locks only the delta child, with a
short lock_timeout (a held lock means Blocked, retried next tick).

The horizon is checked again once the lock is held: a snapshot taken
during the lock wait and gates could still miss the folded rows. Only the
slot's current generation is folded, so the child is truncated only when it
holds nothing else (delta rows of another generation would vanish
unfolded); otherwise only the folded generation's rows are deleted
(docs/differences.md).

Concurrent writers: completions and rescues append deltas to the slot of
their attempt. A writer already in the delta child when the rollup asks
for its lock makes the rollup Blocked; one that comes after the TRUNCATE
writes into the emptied child and is folded next time. Rotation, prune and
a foreign leader's rollup meet it on the ring-state row (locked ``FOR
UPDATE``), and the gates and the horizon are read again after the locks,
READ COMMITTED.
"""

from __future__ import annotations

import dataclasses
import enum
import logging

from ...body import BodyResult
from ...context import MaintenanceContext
from ...db import LOCK_NOT_AVAILABLE, Connection, QueryError
from ...maintenance.lock_timeout import set_local_lock_timeout
from ...sql import Statement
from .layout import QueueStorageLayout, read_layout
from .queue_ring import UNCLOSED_CLAIMS

log = logging.getLogger(__name__)

NAME = "terminal_count_rollup"
MAX_SLOTS_PER_TICK = 4
#: How long the rollup waits for the delta child's lock (Awa's prune lock timeout).
ROLLUP_LOCK_TIMEOUT = 0.010

CURRENT_SLOT_SQL = Statement("SELECT current_slot FROM {schema}.queue_ring_state WHERE singleton")

# Sealed slots (initialised, not current) whose current generation has
# pending deltas, oldest generation first. One statement: the delta lookup
# prunes to the slot's partition at run time.
CANDIDATE_SLOTS_SQL = Statement("""
    SELECT slots.slot, slots.generation
    FROM {schema}.queue_ring_slots AS slots
    WHERE slots.generation >= 0
      AND slots.slot <> :current_slot
      AND EXISTS (
          SELECT 1
          FROM {schema}.queue_terminal_count_deltas AS deltas
          WHERE deltas.ready_slot = slots.slot
            AND deltas.ready_generation = slots.generation
      )
    ORDER BY slots.generation, slots.slot
""")

# Inside the slot's transaction: the ring cursor and the slot row, locked so
# a rotation cannot reuse the slot under us.
LOCK_RING_SQL = Statement("SELECT current_slot FROM {schema}.queue_ring_state WHERE singleton FOR UPDATE")
LOCK_SLOT_SQL = Statement("SELECT generation FROM {schema}.queue_ring_slots WHERE slot = :slot FOR UPDATE")

# Another client backend of this database holding back the xmin horizon.
MVCC_PINNED_SQL = Statement("""
    SELECT EXISTS (
        SELECT 1
        FROM pg_stat_activity
        WHERE datname = current_database()
          AND pid <> pg_backend_pid()
          AND backend_type = 'client backend'
          AND (backend_xmin IS NOT NULL
               OR (backend_xid IS NOT NULL AND state LIKE 'idle in transaction%'))
    )
""")

# Ready rows of this slot generation that a claimer has not reached yet.
PENDING_READY_SQL = Statement("""
    WITH cursors AS MATERIALIZED (
        SELECT queue, priority, enqueue_shard,
               {schema}.sequence_next_value(seq_name) AS claim_seq
        FROM {schema}.queue_claim_heads
    )
    SELECT EXISTS (
        SELECT 1
        FROM cursors
        WHERE EXISTS (
            SELECT 1
            FROM {schema}.ready_entries_{slot} AS ready
            WHERE ready.ready_generation = :generation
              AND ready.queue = cursors.queue
              AND ready.priority = cursors.priority
              AND ready.enqueue_shard = cursors.enqueue_shard
              AND ready.lane_seq >= cursors.claim_seq
        )
    )
""")

LOCK_DELTAS_SQL = Statement("LOCK TABLE {schema}.queue_terminal_count_deltas_{slot} IN ACCESS EXCLUSIVE MODE")

ACTIVE_LEASES_SQL = Statement("""
    SELECT EXISTS (
        SELECT 1 FROM {schema}.leases
        WHERE ready_slot = :slot AND ready_generation = :generation
    )
""")

# Some claim of this slot generation may still finish (the gate the prune
# uses too): the slot is skipped.
UNCLOSED_CLAIMS_SQL = Statement("SELECT {unclosed_claims}", unclosed_claims=UNCLOSED_CLAIMS())

DELTA_ROWS_SQL = Statement("""
    SELECT
        count(*) FILTER (WHERE ready_generation = :generation) AS this_generation,
        count(*) FILTER (WHERE ready_generation <> :generation) AS other_generations
    FROM {schema}.queue_terminal_count_deltas_{slot}
""")

# Sum the generation's deltas per counter key and add them to the live
# counts, never below zero (a negative sum for a key with no live row has
# nothing to subtract from). Returns the number of keys summed.
FOLD_DELTAS_SQL = Statement("""
    WITH grouped AS MATERIALIZED (
        SELECT ready_slot, queue, priority, enqueue_shard, counter_bucket,
               sum(terminal_delta)::bigint AS delta
        FROM {schema}.queue_terminal_count_deltas_{slot}
        WHERE ready_generation = :generation
        GROUP BY ready_slot, queue, priority, enqueue_shard, counter_bucket
        HAVING sum(terminal_delta) <> 0
    ),
    folded AS (
        INSERT INTO {schema}.queue_terminal_live_counts AS counts (
            ready_slot, queue, priority, enqueue_shard, counter_bucket, live_terminal_count
        )
        SELECT grouped.ready_slot, grouped.queue, grouped.priority, grouped.enqueue_shard,
               grouped.counter_bucket, grouped.delta
        FROM grouped
        WHERE grouped.delta > 0
           OR EXISTS (
               SELECT 1 FROM {schema}.queue_terminal_live_counts AS live
               WHERE live.ready_slot = grouped.ready_slot
                 AND live.queue = grouped.queue
                 AND live.priority = grouped.priority
                 AND live.enqueue_shard = grouped.enqueue_shard
                 AND live.counter_bucket = grouped.counter_bucket
           )
        ORDER BY grouped.ready_slot, grouped.queue, grouped.priority, grouped.enqueue_shard,
                 grouped.counter_bucket
        ON CONFLICT (ready_slot, queue, priority, enqueue_shard, counter_bucket) DO UPDATE
        SET live_terminal_count =
            GREATEST(0, counts.live_terminal_count + EXCLUDED.live_terminal_count)
        RETURNING 1
    )
    SELECT (SELECT count(*) FROM grouped) AS grouped_keys, (SELECT count(*) FROM folded) AS folded
""")

TRUNCATE_DELTAS_SQL = Statement("TRUNCATE TABLE {schema}.queue_terminal_count_deltas_{slot}")
DELETE_GENERATION_DELTAS_SQL = Statement("""
    DELETE FROM {schema}.queue_terminal_count_deltas_{slot} WHERE ready_generation = :generation
""")


class SlotOutcome(enum.Enum):
    EMPTY = "empty"
    ROLLED = "rolled"
    SKIPPED_ACTIVE = "skipped_active"
    SKIPPED_MVCC_PINNED = "skipped_mvcc_pinned"
    BLOCKED = "blocked"


@dataclasses.dataclass
class RollupResult(BodyResult):
    """Awa's outcome counts, plus what happened to each slot tried."""

    rolled_slots: int = 0
    delta_rows: int = 0
    grouped_keys: int = 0
    skipped_active_slots: int = 0
    blocked_slots: int = 0
    skipped_mvcc_pinned: bool = False
    #: (slot, generation, outcome, reason) per slot tried, in order.
    slots: list[tuple[int, int, SlotOutcome, str | None]] = dataclasses.field(default_factory=list)

    @property
    def did_anything(self) -> bool:
        return bool(
            self.rolled_slots or self.skipped_active_slots or self.blocked_slots or self.skipped_mvcc_pinned
        )


@dataclasses.dataclass(frozen=True)
class _Slot:
    outcome: SlotOutcome
    reason: str | None = None
    delta_rows: int = 0
    grouped_keys: int = 0


async def run_once(ctx: MaintenanceContext, max_slots: int = MAX_SLOTS_PER_TICK) -> RollupResult:
    layout = await read_layout(ctx)
    result = RollupResult()
    current_slot = await ctx.db.fetchval(*CURRENT_SLOT_SQL.bind(layout.schema))
    candidates = await ctx.db.fetch(*CANDIDATE_SLOTS_SQL.bind(layout.schema, current_slot=current_slot))
    for candidate in candidates:
        if result.rolled_slots >= max_slots:
            break
        slot, generation = candidate["slot"], candidate["generation"]
        outcome = await rollup_slot(ctx, layout, slot, generation)
        result.slots.append((slot, generation, outcome.outcome, outcome.reason))
        if outcome.outcome is SlotOutcome.ROLLED:
            result.rolled_slots += 1
            result.delta_rows += outcome.delta_rows
            result.grouped_keys += outcome.grouped_keys
        elif outcome.outcome is SlotOutcome.SKIPPED_ACTIVE:
            result.skipped_active_slots += 1
        elif outcome.outcome is SlotOutcome.BLOCKED:
            result.blocked_slots += 1
        elif outcome.outcome is SlotOutcome.SKIPPED_MVCC_PINNED:
            # The horizon is database-wide: no other slot would fare better.
            result.skipped_mvcc_pinned = True
            break
    if result.rolled_slots:
        log.info(
            "%s: folded %d delta rows (%d keys) of %d slots; skipped active %d, blocked %d, mvcc pinned %s",
            NAME,
            result.delta_rows,
            result.grouped_keys,
            result.rolled_slots,
            result.skipped_active_slots,
            result.blocked_slots,
            result.skipped_mvcc_pinned,
        )
    elif result.did_anything:
        log.debug(
            "%s: nothing folded; skipped active %d, blocked %d, mvcc pinned %s",
            NAME,
            result.skipped_active_slots,
            result.blocked_slots,
            result.skipped_mvcc_pinned,
        )
    return result


async def rollup_slot(
    ctx: MaintenanceContext, layout: QueueStorageLayout, slot: int, generation: int
) -> _Slot:
    """One slot in one transaction: re-check under the ring locks, then fold."""
    try:
        async with ctx.db.transaction() as conn:
            return await _rollup_slot_tx(conn, layout.schema, slot, generation)
    except QueryError as exc:
        if exc.sqlstate == LOCK_NOT_AVAILABLE:
            return _Slot(SlotOutcome.BLOCKED, "lock_timeout")
        raise


async def _rollup_slot_tx(conn: Connection, schema: str, slot: int, generation: int) -> _Slot:
    # The slot's delta and ready children are named by their slot number.
    child = str(int(slot))
    current_slot = await conn.fetchval(*LOCK_RING_SQL.bind(schema))
    slot_generation = await conn.fetchval(*LOCK_SLOT_SQL.bind(schema, slot=slot))
    if current_slot == slot:
        return _Slot(SlotOutcome.SKIPPED_ACTIVE, "current_slot")
    if slot_generation != generation:
        return _Slot(SlotOutcome.EMPTY, "rotated_meanwhile")
    if await conn.fetchval(*MVCC_PINNED_SQL.bind()):
        return _Slot(SlotOutcome.SKIPPED_MVCC_PINNED)
    if await conn.fetchval(*PENDING_READY_SQL.bind(schema, slot=child, generation=generation)):
        return _Slot(SlotOutcome.SKIPPED_ACTIVE, "pending_ready_rows")

    await set_local_lock_timeout(conn, ROLLUP_LOCK_TIMEOUT)
    await conn.execute(*LOCK_DELTAS_SQL.bind(schema, slot=child))
    if await conn.fetchval(*ACTIVE_LEASES_SQL.bind(schema, slot=slot, generation=generation)):
        return _Slot(SlotOutcome.SKIPPED_ACTIVE, "active_leases")
    if await conn.fetchval(*UNCLOSED_CLAIMS_SQL.bind(schema, slot=slot, generation=generation)):
        return _Slot(SlotOutcome.SKIPPED_ACTIVE, "unclosed_claims")
    # Again, now that the lock is ours: a snapshot taken during the lock wait
    # or the gates would miss the truncated rows just the same.
    if await conn.fetchval(*MVCC_PINNED_SQL.bind()):
        return _Slot(SlotOutcome.SKIPPED_MVCC_PINNED)

    rows = await conn.fetchone(*DELTA_ROWS_SQL.bind(schema, slot=child, generation=generation))
    if not rows["this_generation"]:
        return _Slot(SlotOutcome.EMPTY)
    grouped_keys = (await conn.fetchone(*FOLD_DELTAS_SQL.bind(schema, slot=child, generation=generation)))[
        "grouped_keys"
    ]
    if rows["other_generations"]:
        log.warning(
            "%s: delta child of slot %d holds %d rows of other generations; "
            "deleting only generation %d's rows",
            NAME,
            slot,
            rows["other_generations"],
            generation,
        )
        await conn.execute(*DELETE_GENERATION_DELTAS_SQL.bind(schema, slot=child, generation=generation))
    else:
        await conn.execute(*TRUNCATE_DELTAS_SQL.bind(schema, slot=child))
    return _Slot(SlotOutcome.ROLLED, delta_rows=rows["this_generation"], grouped_keys=grouped_keys)
