"""Where the queue-storage tables live and how big its rings are.

The schema name comes from ``awa.storage_status()`` details (see
:class:`awa_trio.schema.SchemaInfo`); ring sizes come from the ring-state
tables, never from constants, since an installation chooses them.
"""

from __future__ import annotations

import dataclasses

from ...context import MaintenanceContext
from ...sql import Fragment, Statement

#: How long a prune waits for a slot's exclusive locks before it gives way to
#: the readers holding them and reports Blocked (Awa's prune lock timeout).
PRUNE_LOCK_TIMEOUT = 0.010
#: Terminal counters are striped by ``job_id % TERMINAL_COUNTER_BUCKETS``
#: (Awa's TERMINAL_COUNTER_BUCKETS: its writers stripe the same counters).
TERMINAL_COUNTER_BUCKETS = 256

#: awa.job_state in enum order: the text form of a job's ``unique_states``
#: (awa's bit(8) mask) has one character per state, in this order.
JOB_STATE_ORDER = (
    "scheduled", "available", "running", "completed", "retryable", "failed", "cancelled", "waiting_external",
)  # fmt: skip


#: Does the unique-state mask ``{mask}`` (awa's bit(8) as text) claim the
#: state at 1-based ``{position}``? The one place the mask is decoded.
MASK_CLAIMS = Fragment("COALESCE(substr({mask}, {position}, 1) = '1', false)")
#: The 1-based enum position of ``{state}``, an SQL expression of type awa.job_state.
STATE_POSITION = Fragment("array_position(enum_range(NULL::awa.job_state), ({state})::awa.job_state)")


def mask_claims(mask: str, state: str) -> str:
    """SQL: does the unique-state mask ``mask`` claim ``state``? ``state`` is a
    state name (its position is known here, so the predicate is constant
    per row) or an SQL expression of type awa.job_state (looked up in the
    enum). Both arguments are SQL text written by the callers' modules."""
    if state in JOB_STATE_ORDER:
        position = str(JOB_STATE_ORDER.index(state) + 1)
    else:
        position = STATE_POSITION(state=state)
    return MASK_CLAIMS(mask=mask, position=position)


def schema_literal(schema: str) -> str:
    """``schema`` (a validated plain identifier) as an SQL string literal
    (``'awa'``): the ``{schema_literal}`` identifier of the statements that
    look a relation up by name in the catalog."""
    return "'" + schema.replace("'", "''") + "'"


RING_SIZES_SQL = Statement("""
    SELECT
        (SELECT slot_count FROM {schema}.queue_ring_state WHERE singleton) AS queue_slots,
        (SELECT slot_count FROM {schema}.lease_ring_state WHERE singleton) AS lease_slots,
        (SELECT slot_count FROM {schema}.claim_ring_state WHERE singleton) AS claim_slots
""")


@dataclasses.dataclass(frozen=True)
class QueueStorageLayout:
    #: Schema of the queue-storage tables (a validated plain identifier).
    schema: str
    queue_slots: int
    lease_slots: int
    claim_slots: int


def schema_name(ctx: MaintenanceContext) -> str:
    return ctx.schema.queue_storage_schema


async def read_layout(ctx: MaintenanceContext) -> QueueStorageLayout:
    """Ring sizes, read per call (a single-row lookup; rings are resized only
    by a migration, but reading keeps no stale copy across terms)."""
    schema = schema_name(ctx)
    row = await ctx.db.fetchone(*RING_SIZES_SQL.bind(schema))
    return QueueStorageLayout(
        schema=schema,
        queue_slots=int(row["queue_slots"]),
        lease_slots=int(row["lease_slots"]),
        claim_slots=int(row["claim_slots"]),
    )
