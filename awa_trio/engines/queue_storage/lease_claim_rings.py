"""What the lease ring and the claim ring share: the cursor compare-and-set,
the choice of the oldest sealed slot, and the prune transaction.

Both rings are a cursor row (``<ring>_ring_state``: current slot, generation,
slot count) over per-slot child partitions. Writers put new rows in the
current slot; the leader moves the cursor onto the next slot once that slot
is empty, and truncates the oldest sealed slot once nothing in it is live::

    rotate:  read cursor (slot s, generation g) and count rows in the
             children of s+1, one statement         -> busy: SkippedBusy
             UPDATE cursor := (s+1, g+1) WHERE cursor = (s, g)
                                                    -> 0 rows: lost the CAS
    prune:   (after a rotation: o from its cursor; nothing to reclaim in o,
              as the rotation's statement found -> Noop, no statement)
             cursor FOR UPDATE, oldest sealed slot o, slot row FOR UPDATE
             nothing to reclaim in o                -> Noop
             live rows in o (gate)                  -> SkippedActive
             LOCK o's children ACCESS EXCLUSIVE, short lock_timeout
                                                    -> 55P03: Blocked
             o became current, or gate again        -> SkippedActive
             TRUNCATE o's children (+ reset slot)   -> Pruned

The rotation reads the cursor without a lock and lets the conditional UPDATE
decide: a rotator that lost the race changes nothing and says so. Its
statements hold no child-table lock while it waits for the cursor row, so it
can never wedge a prune that holds the cursor and waits for those children.
The prune holds the cursor row throughout, so no rotation can make its slot
current under it; the gate runs before the exclusive lock (a doomed prune
must not queue an ACCESS EXCLUSIVE in front of the hot path) and again after
it (a writer that read the old cursor may commit while the lock waits).

Concurrent writers: workers write leases and claims into the current slot
and delete or close them in whatever slot they live; rescues delete leases
and close claims. The live gates do not depend on generations (any lease
left in a lease slot, each claim looked up in the closure ledgers), so a
writer that read a stale cursor can only keep a slot busy, never lose a row
to the TRUNCATE; a writer inside a child when the prune asks for its lock
makes the prune Blocked. A foreign leader's rotation and prune meet ours on
the cursor row, as above.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable
from typing import Any

from ...context import MaintenanceContext
from ...db import LOCK_NOT_AVAILABLE, QueryError
from ...maintenance.lock_timeout import set_local_lock_timeout
from ...sql import Fragment, Statement
from ...tracker import PruneOutcome
from .layout import PRUNE_LOCK_TIMEOUT, schema_literal, schema_name
from .queue_ring import READ_COMMITTED
from .rings import PruneResult, RingCursor, RotateResult

# Busy and live-row counts stop at 1000 rows per child (LIMIT 1000 in the
# two fragments below): enough to tell "one straggler" from "a backlog",
# never a full scan of a big partition.

#: Rows in ``{table}``, counted up to 1000.
BOUNDED_ROW_COUNT = Fragment("(SELECT count(*) FROM (SELECT 1 FROM {table} LIMIT 1000) AS capped)")

#: For ROTATE_SQL's ``{busy_columns}``: rows of the slot about to become
#: current in ``{parent}`` (whose slot column is ``{slot_column}``), counted
#: up to 1000.
BOUNDED_ROWS_IN_NEXT_SLOT = Fragment(
    "(SELECT count(*) FROM (SELECT 1 FROM {schema}.{parent} WHERE {slot_column} = next.slot "
    "LIMIT 1000) AS capped)"
)

#: Total heap size of the children named ``{child_names}`` (a list of SQL
#: text expressions, e.g. ``'leases_' || (oldest.slot)``; 0 = nothing to
#: reclaim). Looked up by name in pg_class, so the slot may be an
#: expression: ROTATE_SQL asks it of a slot that only the statement itself
#: knows (:data:`OLDEST_SLOT`). ``{schema_literal}`` is left to the statement.
HEAP_PAGES = Fragment(
    "(SELECT coalesce(sum(pg_relation_size(child.oid)), 0) FROM pg_class AS child "
    "WHERE child.relnamespace = {schema_literal}::regnamespace AND child.relname IN ({child_names}))",
    identifiers=("schema_literal",),
)


def heap_pages(parents: Iterable[str], slot: str) -> str:
    """:data:`HEAP_PAGES` over the children of ``parents`` in ``slot`` (an SQL
    expression: ``{slot}`` for the statement's identifier, or
    :data:`OLDEST_SLOT`). A parent's name sits inside a string literal, where
    no slot is filled, so the names are written out here."""
    return HEAP_PAGES(child_names=", ".join("'" + parent + "_' || (" + slot + ")" for parent in parents))


#: The slot ROTATE_SQL's ``{oldest_clean}`` is asked of (its ``oldest`` CTE).
OLDEST_SLOT = "oldest.slot"

# One round trip per tick: read the cursor, count what the slot after it still
# holds ({busy_columns}, read from the parent tables for `next.slot`, so
# run-time partition pruning scans only that slot's children), and move the
# cursor only if that slot is empty and nobody moved the cursor since it was
# read (the compare-and-set on slot and generation). The moved cursor stamps
# its slot row with the generation it now holds, as the queue ring does.
# Each ring places it once, at import (:func:`rotate_statement`).
#
# The cursor row is locked SKIP LOCKED: a prune holding it (ours runs after
# the rotation, a foreign leader's at any time) makes the tick a lost
# compare-and-set, tried again next tick, so the statement never waits on
# that row while holding the children's share locks. Rows committed while it
# ran went into the slot their writer read as current; only a writer whose
# read is a whole lap old could write to the one it checks (and the live gates
# would then keep that slot busy, not lose the row).
#
# The prune that follows wants to know whether the slot that will then be the
# oldest sealed one has anything to reclaim ({oldest_clean}, over
# `oldest.slot`): asked here, it costs the idle tick no statement of its own.
ROTATE_SQL = Fragment("""
    WITH cursor AS (
        SELECT current_slot, generation, slot_count, (current_slot + 1) % slot_count AS next_slot
        FROM {schema}.{ring}_ring_state
        WHERE singleton
    ),
    busy AS (
        SELECT {busy_columns}
        FROM (SELECT next_slot AS slot FROM cursor) AS next
    ),
    locked AS (
        SELECT singleton FROM {schema}.{ring}_ring_state WHERE singleton FOR UPDATE SKIP LOCKED
    ),
    moved AS (
        UPDATE {schema}.{ring}_ring_state AS state
        SET current_slot = cursor.next_slot, generation = cursor.generation + 1
        FROM cursor, busy, locked
        WHERE state.singleton
          AND state.current_slot = cursor.current_slot
          AND state.generation = cursor.generation
          AND {slot_is_empty}
        RETURNING state.current_slot, state.generation, state.slot_count
    ),
    stamped AS (
        UPDATE {schema}.{ring}_ring_slots AS slots
        SET generation = moved.generation
        FROM moved
        WHERE slots.slot = moved.current_slot
    ),
    oldest AS (
        -- The oldest slot that has been current and is not now, once moved
        -- (oldest_sealed_slot, in SQL).
        SELECT ((moved.current_slot - (least(moved.generation + 1, moved.slot_count) - 1))
                % moved.slot_count + moved.slot_count) % moved.slot_count AS slot
        FROM moved
        WHERE least(moved.generation + 1, moved.slot_count) > 1
    )
    SELECT coalesce(moved.current_slot, cursor.current_slot) AS current_slot,
           coalesce(moved.generation, cursor.generation) AS generation,
           cursor.slot_count,
           moved.current_slot IS NOT NULL AS moved,
           (SELECT ({oldest_clean}) FROM oldest) AS oldest_clean,
           busy.*
    FROM cursor CROSS JOIN busy LEFT JOIN moved ON true
""")


def rotate_statement(*, ring: str, busy_columns: str, slot_is_empty: str, oldest_clean: str) -> Statement:
    """ROTATE_SQL for one ring: its blocker columns, the condition that they
    are all 0, and its clean condition asked of :data:`OLDEST_SLOT`."""
    return Statement(
        ROTATE_SQL(
            ring=ring, busy_columns=busy_columns, slot_is_empty=slot_is_empty, oldest_clean=oldest_clean
        )
    )


# Serialises the prune with rotation (and any other prune) for its whole
# transaction.
LOCK_CURSOR_SQL = Statement("""
    SELECT current_slot, generation, slot_count
    FROM {schema}.{ring}_ring_state
    WHERE singleton
    FOR UPDATE
""")

LOCK_SLOT_ROW_SQL = Statement("""
    SELECT slot FROM {schema}.{ring}_ring_slots WHERE slot = :slot FOR UPDATE
""")

CURRENT_SLOT_SQL = Statement("""
    SELECT current_slot FROM {schema}.{ring}_ring_state WHERE singleton
""")

LOCK_CHILDREN_SQL = Statement("LOCK TABLE {children} IN ACCESS EXCLUSIVE MODE")

TRUNCATE_CHILDREN_SQL = Statement("TRUNCATE TABLE {children}")


@dataclasses.dataclass(frozen=True)
class RingTables:
    """One ring's tables, statements and labels. The slot statements take
    ``{schema}``, ``{schema_literal}``, ``{slot}`` and one identifier slot per
    child (its parent name), filled with the child partition of that slot
    (:meth:`bind`)."""

    #: ``awa.ring`` value and table prefix (``lease``, ``claim``).
    ring: str
    #: Parent tables whose ``<parent>_<slot>`` children make up one slot.
    children: tuple[str, ...]
    #: Columns named by Awa's blocker labels, each the rows found in the
    #: slot about to become current (ROTATE_SQL's ``{busy_columns}``).
    busy_columns: str
    #: Those labels: the slot is empty when every one of them is 0.
    busy_labels: tuple[str, ...]
    #: That condition, over ROTATE_SQL's ``busy`` (its ``{slot_is_empty}``).
    slot_is_empty: str
    #: Live rows that make truncating the slot unsafe (0 = safe).
    live_sql: Statement
    #: The SELECT that is true when slot ``slot`` (an SQL expression) holds
    #: nothing to reclaim (prune is then a Noop).
    clean: Callable[[str], str]
    #: SkipReason labels: slot is the current one / slot still holds live rows.
    current_reason: str
    live_reason: str
    #: Run after TRUNCATE, in the same transaction, if any.
    after_truncate_sql: Statement | None = None
    #: ``clean`` of the ``{slot}`` identifier, and ROTATE_SQL placed for this
    #: ring from the fields above (at import; ``dataclasses.replace`` places
    #: them again).
    clean_sql: Statement = dataclasses.field(init=False, repr=False, compare=False)
    rotate_sql: Statement = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "clean_sql", Statement(self.clean("{slot}")))
        rotate_sql = rotate_statement(
            ring=self.ring,
            busy_columns=self.busy_columns,
            slot_is_empty=self.slot_is_empty,
            oldest_clean=self.clean(OLDEST_SLOT).strip(),
        )
        object.__setattr__(self, "rotate_sql", rotate_sql)

    def bind(self, statement: Statement, schema: str, slot: int, **values: Any) -> tuple[Any, ...]:
        """``statement`` bound for ``slot``: the identifiers it has slots for."""
        identifiers = {
            "slot": str(int(slot)),
            "schema_literal": schema_literal(schema),
            **{parent: f"{schema}.{parent}_{int(slot)}" for parent in self.children},
        }
        used = {name: value for name, value in identifiers.items() if name in statement.slots}
        return statement.bind(schema if "schema" in statement.slots else None, **used, **values)

    def child_tables(self, schema: str, slot: int) -> list[str]:
        return [f"{schema}.{parent}_{slot}" for parent in self.children]


def oldest_sealed_slot(current_slot: int, generation: int, slot_count: int) -> tuple[int, int] | None:
    """(slot, generation) of the oldest slot that has been current and is not
    now, or None while only the current slot was ever handed out."""
    if slot_count <= 1:
        return None
    used_slots = min(generation + 1, slot_count)
    if used_slots <= 1:
        return None
    age = used_slots - 1
    return (current_slot - age) % slot_count, generation - age


async def rotate_ring(ctx: MaintenanceContext, tables: RingTables) -> RotateResult:
    """Advance the ring's cursor onto the next slot if that slot is empty."""
    schema = schema_name(ctx)
    [row] = await ctx.db.fetch(*tables.rotate_sql.bind(schema, schema_literal=schema_literal(schema)))
    current, generation, slot_count = int(row["current_slot"]), int(row["generation"]), int(row["slot_count"])
    if row["moved"]:
        cursor = RingCursor(current, generation, slot_count, oldest_clean=row["oldest_clean"])
        return RotateResult(rotated=True, slot=current, generation=generation, cursor=cursor)
    next_slot = (current + 1) % slot_count
    blockers = {label: int(row[label]) for label in tables.busy_labels}
    if any(blockers.values()):
        return RotateResult(
            rotated=False,
            slot=next_slot,
            blockers=blockers,
            cursor=RingCursor(current, generation, slot_count),
        )
    # Another rotator moved the cursor since we read it.
    return RotateResult(rotated=False, slot=next_slot, blockers={})


async def prune_oldest(
    ctx: MaintenanceContext,
    tables: RingTables,
    cursor: RingCursor | None = None,
    *,
    lock_timeout: float = PRUNE_LOCK_TIMEOUT,
) -> PruneResult:
    """Truncate the oldest sealed slot of the ring if nothing in it is live.

    With the ``cursor`` a rotation just saw, a slot with nothing to reclaim
    (an idle ring's every tick) is a Noop without a transaction: after no
    statement at all when the rotation already checked it, else after one.
    A Noop is always safe; anything else takes the locked path, which reads
    the cursor again under its lock."""
    schema = schema_name(ctx)
    if cursor is not None:
        oldest = oldest_sealed_slot(cursor.slot, cursor.generation, cursor.slot_count)
        if oldest is None:
            return PruneResult(outcome=PruneOutcome.NOOP)
        clean = cursor.oldest_clean
        if clean is None:
            clean = await ctx.db.fetchval(*tables.bind(tables.clean_sql, schema, oldest[0]))
        if clean:
            return PruneResult(outcome=PruneOutcome.NOOP, slot=oldest[0], details={"empty": True})
    slot: int | None = None
    phase_seconds: dict[str, float] = {}
    try:
        # Read committed whatever the database default, as the queue ring:
        # the gates after the lock wait must see what committed during it.
        async with ctx.db.transaction(isolation=READ_COMMITTED) as conn:
            locked = await conn.fetchone(*LOCK_CURSOR_SQL.bind(schema, ring=tables.ring))
            oldest = oldest_sealed_slot(
                int(locked["current_slot"]), int(locked["generation"]), int(locked["slot_count"])
            )
            if oldest is None:
                return PruneResult(outcome=PruneOutcome.NOOP)
            slot = oldest[0]
            if await conn.fetchval(*LOCK_SLOT_ROW_SQL.bind(schema, ring=tables.ring, slot=slot)) is None:
                return PruneResult(outcome=PruneOutcome.NOOP, slot=slot)
            if await conn.fetchval(*tables.bind(tables.clean_sql, schema, slot)):
                return PruneResult(outcome=PruneOutcome.NOOP, slot=slot, details={"empty": True})

            live_sql = tables.bind(tables.live_sql, schema, slot)
            live = int(await conn.fetchval(*live_sql))
            if live:
                return _skipped(slot, tables.live_reason, live, after_lock=False)

            await set_local_lock_timeout(conn, lock_timeout)
            children = ", ".join(tables.child_tables(schema, slot))
            locking = time.perf_counter()
            await conn.execute(*LOCK_CHILDREN_SQL.bind(children=children))
            phase_seconds["lock"] = time.perf_counter() - locking

            if int(await conn.fetchval(*CURRENT_SLOT_SQL.bind(schema, ring=tables.ring))) == slot:
                return _skipped(slot, tables.current_reason, 0, after_lock=True)
            live = int(await conn.fetchval(*live_sql))
            if live:
                return _skipped(slot, tables.live_reason, live, after_lock=True)

            truncating = time.perf_counter()
            await conn.execute(*TRUNCATE_CHILDREN_SQL.bind(children=children))
            phase_seconds["truncate"] = time.perf_counter() - truncating
            if tables.after_truncate_sql is not None:
                await conn.execute(*tables.bind(tables.after_truncate_sql, schema, slot))
            committing = time.perf_counter()
    except QueryError as exc:
        if exc.sqlstate == LOCK_NOT_AVAILABLE:
            return PruneResult(outcome=PruneOutcome.BLOCKED, slot=slot)
        raise
    phase_seconds["commit"] = time.perf_counter() - committing
    return PruneResult(outcome=PruneOutcome.PRUNED, slot=slot, phase_seconds=phase_seconds)


def _skipped(slot: int, reason: str, count: int, *, after_lock: bool) -> PruneResult:
    return PruneResult(
        outcome=PruneOutcome.SKIPPED_ACTIVE,
        slot=slot,
        reason=reason,
        count=count,
        details={"after_lock": after_lock},
    )
