"""The queue-storage engine (rings, lanes and deferred rows in the schema
``awa.storage_status()`` names) as an :class:`~awa_trio.engines.base.Engine`.
Light on purpose: the branch modules load only when a term asks for the
branch specs, so checking a configured branch name on a canonical leader
loads none of them."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...sql import Statement
from ..backlog import rescue_backlog
from ..base import BacklogReads, DrainPasses, Engine, Wording
from .grant_needs import GRANTS

if TYPE_CHECKING:
    from ...branch import BranchSpec
    from ...config import MaintenanceConfig

NAME = "queue_storage"

#: Due jobs not yet promoted: every deferred row is scheduled or retryable.
DUE_COUNTS_SQL = Statement("""
    SELECT state::text AS state, count(*) AS jobs,
           extract(epoch FROM now() - min(run_at))::float8 AS oldest_seconds
    FROM {schema}.deferred_jobs
    WHERE run_at <= now()
    GROUP BY state ORDER BY state
""")
#: Running and waiting jobs, through the awa.jobs view (a union over the
#: queue-storage tables, fine for a command a person runs).
RESCUE_BACKLOG_SQL = rescue_backlog("awa.jobs")


#: Whether its schema (``:storage_schema``), prepared for a staged transition, is
#: complete enough for routing to flip (Awa's own readiness list): the
#: sequences and tables its runtimes use, the columns of the latest layout,
#: and the claim function runtimes call with the columns its result must
#: name. The catalogs only (no privilege on the objects is needed, not even
#: USAGE on their schema); the storage report runs it only while a
#: transition into queue storage is prepared. Each list is a "none of these
#: is missing" test, so it holds no count to keep in step.
PREPARED_SCHEMA_READY_SQL = Statement("""
    SELECT (
        NOT EXISTS (
            SELECT 1
            FROM unnest(ARRAY[
                'job_id_seq', 'lease_claim_receipt_id_seq', 'lease_claim_batch_id_seq',
                'queue_ring_state', 'ready_entries', 'ready_claim_attempt_batches',
                'ready_tombstones', 'ready_segments', 'done_entries',
                'receipt_completion_batches', 'receipt_completion_tombstones',
                'queue_terminal_count_deltas', 'leases', 'deferred_jobs', 'lease_claims',
                'lease_claim_batches', 'lease_claim_closures', 'lease_claim_closure_batches'
            ]::name[]) AS wanted(relation_name)
            WHERE NOT EXISTS (
                SELECT 1 FROM pg_class AS rel
                JOIN pg_namespace AS nsp ON nsp.oid = rel.relnamespace
                WHERE nsp.nspname = :storage_schema
                  AND rel.relname = wanted.relation_name
            )
        )
        AND NOT EXISTS (
            SELECT 1
            FROM (VALUES
                ('lease_claim_closure_batches', 'receipt_ranges'),
                ('queue_claim_heads', 'ready_segment_slot'),
                ('queue_claim_heads', 'ready_segment_generation'),
                ('queue_claim_heads', 'ready_segment_next_lane_seq')
            ) AS wanted(table_name, column_name)
            WHERE NOT EXISTS (
                SELECT 1 FROM pg_attribute AS att
                JOIN pg_class AS rel ON rel.oid = att.attrelid
                JOIN pg_namespace AS nsp ON nsp.oid = rel.relnamespace
                WHERE nsp.nspname = :storage_schema
                  AND rel.relname = wanted.table_name
                  AND att.attname = wanted.column_name
                  AND att.attnum > 0 AND NOT att.attisdropped
            )
        )
        AND EXISTS (
            SELECT 1 FROM pg_proc AS proc
            JOIN pg_namespace AS nsp ON nsp.oid = proc.pronamespace
            WHERE nsp.nspname = :storage_schema
              AND proc.proname = 'claim_ready_runtime'
              AND proc.proargtypes = array_to_string(ARRAY['text', 'int8', 'float8', 'float8']::regtype[]::oid[], ' ')::oidvector
              AND strpos(pg_get_function_result(proc.oid), 'receipt_id') > 0
              AND strpos(pg_get_function_result(proc.oid), 'claim_batch_id') > 0
              AND strpos(pg_get_function_result(proc.oid), 'claim_batch_index') > 0
        )
    ) AS ready
""")


def _branches(config: MaintenanceConfig) -> list[BranchSpec]:
    from .registry import queue_storage_branches

    return queue_storage_branches(config)


def _transition_branches(config: MaintenanceConfig, drain: DrainPasses) -> list[BranchSpec]:
    from .registry import mixed_transition_branches

    return mixed_transition_branches(config, drain)


def _install(database_url: str) -> None:
    from ...schema import install_queue_storage

    install_queue_storage(database_url)


def _rescue_reasons() -> dict[str, str]:
    from . import rescue_callbacks, rescue_deadlines, rescue_heartbeats

    return {
        rescue_heartbeats.LEASE_ERROR: "heartbeat",
        rescue_heartbeats.RECEIPT_ERROR: "heartbeat",
        rescue_deadlines.RESCUE_ERROR: "deadline",
        rescue_callbacks.RESCUE_ERROR: "callback",
    }


def _sql_examples(schema: str, slot: int) -> dict[str, dict[str, str]]:
    """Slot ``slot``'s partitions, as the ring code binds them, and the lease
    ring's where a statement serves both the lease and the claim ring."""
    from . import queue_ring
    from .layout import schema_literal
    from .rotate_claim import CLAIM_RING_TABLES
    from .rotate_lease import LEASE_RING_TABLES

    common = {
        "schema_literal": schema_literal(schema),
        "slot": str(slot),
        "ring": LEASE_RING_TABLES.ring,
    }
    common.update(queue_ring.child_placeholders(schema, slot))
    for tables in (LEASE_RING_TABLES, CLAIM_RING_TABLES):
        common.update(zip(tables.children, tables.child_tables(schema, slot), strict=True))
    return {
        "": common,
        queue_ring.__name__: {"children": ", ".join(queue_ring.slot_children(schema, slot))},
        LEASE_RING_TABLES.__module__: {"children": ", ".join(LEASE_RING_TABLES.child_tables(schema, slot))},
    }


#: Every branch it may run (checked against the specs by the tests).
BRANCH_NAMES = frozenset({
    "rescue_stale_heartbeats", "rescue_expired_deadlines", "rescue_expired_callbacks",
    "promote_scheduled", "cleanup", "queue_stats", "batch_operations", "terminal_count_rollup",
    "rotate_queue", "rotate_lease", "rotate_claim", "cron_sync", "cron_eval",
})  # fmt: skip


ENGINE = Engine(
    name=NAME,
    title="queue storage",
    branch_names=BRANCH_NAMES,
    branches=_branches,
    transition_branches=_transition_branches,
    # Nothing drains out of queue storage in this release.
    drain_passes=None,
    grants=GRANTS,
    backlog=BacklogReads(due_counts=DUE_COUNTS_SQL, rescue_backlog=RESCUE_BACKLOG_SQL),
    uses_storage_schema=True,
    install=_install,
    worker_role="auto",
    wording=Wording(
        migrated="queue storage is live (awa.storage_status(): engine {engine}, state {state})",
        demo=(
            "the database runs on queue storage, Awa 0.6's default engine (awa.storage_status(): "
            "engine {engine}, state {state}); awa_trio leads it with its queue-storage branches"
        ),
    ),
    rescue_reasons=_rescue_reasons,
    sql_examples=_sql_examples,
    prepared_schema_ready=PREPARED_SCHEMA_READY_SQL,
)
