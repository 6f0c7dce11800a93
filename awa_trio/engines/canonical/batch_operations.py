"""batch_operations on the canonical engine: the runner
(:mod:`awa_trio.maintenance.batch_operations`) over ``awa.jobs_hot`` and
``awa.scheduled_jobs``: the operations it may claim, the candidate jobs a
filter selects from, and the per-item statements that change one job and
record its outcome in the same statement."""

from __future__ import annotations

import uuid
from typing import Any

from ...context import MaintenanceContext
from ...db import Connection
from ...maintenance.batch_operations import (
    CHUNK_SIZE,
    CLAIM_OPERATION_TEMPLATE,
    MATCHING_JOBS_TEMPLATE,
    NAME,
    RUNNER_LOCK_KEY,
    SCAN_BOUNDS_TEMPLATE,
    SCAN_PAGE_SIZE,
    SCAN_PAGE_TEMPLATE,
    BatchOperationsResult,
    BatchOperationStorage,
    OperationPlan,
    run_batch_operations,
)
from ...sql import Fragment, Statement

__all__ = ["CANONICAL_STORAGE", "NAME", "RUNNER_LOCK_KEY", "run_once"]

CLAIM_OPERATION_SQL = Statement(
    CLAIM_OPERATION_TEMPLATE, engine_guard="awa.active_storage_engine() = 'canonical'"
)

# Canonical candidates: what the awa.jobs view shows as available or
# scheduled, read from the two tables that hold those states.
CANONICAL_CANDIDATES = """
        SELECT id, kind, queue, state, tags, created_at
        FROM awa.jobs_hot
        WHERE state = 'available'
        UNION ALL
        SELECT id, kind, queue, state, tags, created_at
        FROM awa.scheduled_jobs
        WHERE state = 'scheduled'
"""

_MATCHING_JOBS = MATCHING_JOBS_TEMPLATE(candidates=CANONICAL_CANDIDATES)

SCAN_BOUNDS_SQL = Statement(SCAN_BOUNDS_TEMPLATE, matching=_MATCHING_JOBS)

SCAN_PAGE_SQL = Statement(SCAN_PAGE_TEMPLATE, matching=_MATCHING_JOBS)

# Per-item statements: change the job (in whichever table holds it), record
# the item's outcome and bump the operation's counters, atomically. Binds:
# :operation_id, :job_id, then the spec's values (the plan's apply_args).
# `live` stops the change once a cancel has been requested; the caller then
# sees the operation state.
_ITEM_OUTCOME_TAIL = Fragment("""
    outcome AS (
        SELECT CASE WHEN EXISTS (SELECT 1 FROM changed) THEN 'processed' ELSE 'skipped' END
            AS state
    ), item AS (
        UPDATE awa.batch_operation_items AS item
        SET state = outcome.state, error = NULL, processed_at = clock_timestamp()
        FROM outcome
        WHERE item.operation_id = :operation_id AND item.job_id = :job_id AND item.state = 'pending'
        RETURNING item.state
    ), counted AS (
        UPDATE awa.batch_operations AS op
        SET processed = op.processed
                + (SELECT count(*) FROM item WHERE item.state = 'processed'),
            skipped = op.skipped + (SELECT count(*) FROM item WHERE item.state = 'skipped'),
            updated_at = clock_timestamp()
        WHERE op.id = :operation_id
        RETURNING op.state
    )
    SELECT (SELECT state FROM outcome) AS outcome,
           (SELECT state FROM counted) AS operation_state{extra_columns}
""")

_LIVE_OPERATION = """live AS (
        SELECT 1 FROM awa.batch_operations WHERE id = :operation_id AND state = 'running'
    )"""

# :priority. The first original priority wins (priority aging uses the key
# too). {table} holds the jobs of state {state} (an SQL literal).
_SET_PRIORITY_TEMPLATE = Fragment("""
        UPDATE {table} AS job
        SET priority = :priority::smallint,
            metadata = CASE
                WHEN job.metadata ? '_awa_original_priority' THEN job.metadata
                ELSE jsonb_set(job.metadata, '{_awa_original_priority}',
                               to_jsonb(job.priority), true)
            END
        WHERE job.id = :job_id AND job.state = {state}
          AND job.priority <> :priority::smallint
          AND EXISTS (SELECT 1 FROM live)
        RETURNING job.id
""")
APPLY_SET_PRIORITY_SQL = Statement(
    """
    WITH {live},
    hot AS ({hot}),
    deferred AS ({deferred}),
    changed AS (SELECT id FROM hot UNION ALL SELECT id FROM deferred),
    {outcome}
""",
    live=_LIVE_OPERATION,
    hot=_SET_PRIORITY_TEMPLATE(table="awa.jobs_hot", state="'available'"),
    deferred=_SET_PRIORITY_TEMPLATE(table="awa.scheduled_jobs", state="'scheduled'"),
    outcome=_ITEM_OUTCOME_TAIL(extra_columns=""),
)

# :queue, :priority or NULL (keep). A job qualifies when its queue or the
# requested priority differs. Original priority is stamped only when a
# priority was requested (even if unchanged); original queue always.
_MOVE_QUEUE_TEMPLATE = Fragment("""
        UPDATE {table} AS job
        SET queue = :queue::text,
            priority = COALESCE(:priority::smallint, job.priority),
            metadata = (
                SELECT CASE
                    WHEN with_priority ? '_awa_original_queue' THEN with_priority
                    ELSE jsonb_set(with_priority, '{_awa_original_queue}',
                                   to_jsonb(job.queue), true)
                END
                FROM (
                    SELECT CASE
                        WHEN :priority::smallint IS NULL
                             OR job.metadata ? '_awa_original_priority' THEN job.metadata
                        ELSE jsonb_set(job.metadata, '{_awa_original_priority}',
                                       to_jsonb(job.priority), true)
                    END AS with_priority
                ) AS stamped
            )
        WHERE job.id = :job_id AND job.state = {state}
          AND (job.queue <> :queue::text
               OR (:priority::smallint IS NOT NULL AND job.priority <> :priority::smallint))
          AND EXISTS (SELECT 1 FROM live)
        RETURNING job.id, job.queue, job.run_at
""")
# A moved available job wakes its new queue's workers, as the awa.jobs view's
# delete-and-reinsert (trigger trg_awa_notify) would.
APPLY_MOVE_QUEUE_SQL = Statement(
    """
    WITH {live},
    hot AS ({hot}),
    deferred AS ({deferred}),
    changed AS (SELECT id FROM hot UNION ALL SELECT id FROM deferred),
    woken AS (
        SELECT hot.id
        FROM hot, LATERAL pg_notify('awa:' || hot.queue, '') AS notified
        WHERE hot.run_at <= now()
    ),
    {outcome}
""",
    live=_LIVE_OPERATION,
    hot=_MOVE_QUEUE_TEMPLATE(table="awa.jobs_hot", state="'available'"),
    deferred=_MOVE_QUEUE_TEMPLATE(table="awa.scheduled_jobs", state="'scheduled'"),
    outcome=_ITEM_OUTCOME_TAIL(extra_columns=", (SELECT count(*) FROM woken) AS woken"),
)


async def apply_job_statement(
    conn: Connection, plan: OperationPlan, operation_id: uuid.UUID, job_id: int
) -> Any:
    """The canonical engine: the plan's one statement does it all."""
    return await conn.fetchrow(
        *plan.apply_sql.bind(operation_id=operation_id, job_id=job_id, **plan.apply_args)
    )


CANONICAL_STORAGE = BatchOperationStorage(
    claim_operation_sql=CLAIM_OPERATION_SQL,
    scan_bounds_sql=SCAN_BOUNDS_SQL,
    scan_page_sql=SCAN_PAGE_SQL,
    set_priority_sql=APPLY_SET_PRIORITY_SQL,
    move_queue_sql=APPLY_MOVE_QUEUE_SQL,
    apply_job=apply_job_statement,
)


async def run_once(
    ctx: MaintenanceContext,
    *,
    chunk_size: int = CHUNK_SIZE,
    scan_page_size: int = SCAN_PAGE_SIZE,
) -> BatchOperationsResult:
    return await run_batch_operations(
        ctx, CANONICAL_STORAGE, chunk_size=chunk_size, scan_page_size=scan_page_size
    )
