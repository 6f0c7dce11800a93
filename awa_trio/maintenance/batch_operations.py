"""The batch-operation runner: admin batch operations (``set_priority``,
``move_queue``) that operators submit through awa-pg, one chunk per tick.

Same contract as Awa's ``awa_model::batch_operations`` (v0.6.1), so an
operation can be submitted, watched and cancelled with awa-pg
(``Client.set_priority``, ``move_queue``, ``get_batch_operation``,
``cancel_batch_operation``) while awa_trio or an awa-pg leader runs it:

1. Take the runner lock (see below); if another runner holds it, do nothing.
2. Claim the oldest unfinished operation (FIFO by ``submitted_at``) with a
   fresh ``runner_instance``; ``pending`` becomes ``scanning``.
3. ``cancelling``: the operation ends ``cancelled``, pending items ``skipped``.
4. ``scanning``: snapshot the ids of the matching ``available``/``scheduled``
   jobs (up to the highest id matching now) into ``batch_operation_items``,
   10 000 per page, then ``running`` with ``total_matched`` and the cursor
   ``{"after_job_id": 0, "max_job_id": N}``. Re-scanning is idempotent.
5. ``running``: apply up to 100 pending items in ascending job id, each in
   its own statement: ``processed`` when the job changed, ``skipped`` when it
   is no longer ``available``/``scheduled`` or already has the target value,
   ``errored`` (``job_id=N: <error>``, also in ``last_error``) when the
   statement failed. Only state and no-op-ness are re-checked at apply time,
   as awa-pg's runner does; the rest of the filter was decided by the scan.
6. No pending item left: the operation ends ``completed`` with
   ``finalized_at`` and ``retention_until = finalized_at + N days``
   (``AWA_BATCH_OP_RETENTION_DAYS``, default 90, read at each finalisation).

``set_priority`` stamps ``metadata._awa_original_priority`` (old priority)
the first time only; ``move_queue`` stamps ``_awa_original_queue`` the first
time, and ``_awa_original_priority`` when it also sets a priority.

The runner lock is the session-level advisory lock 4708303812828419139
("AWA_BATC"), the one awa-pg's runner takes with ``pg_try_advisory_lock``.
A chunk is many short transactions (a whole-chunk transaction would hold row
locks on jobs and on the operation row, blocking worker claims and
``cancel_batch_operation``), so a transaction-level lock cannot cover it; the
lock is taken on one pooled connection, every statement of the chunk runs on
that connection (if it dies, the lock and the work stop together), and it is
released there. Session and transaction advisory locks on one key exclude
each other in PostgreSQL, so either kind held elsewhere keeps us out.

Beyond awa-pg's runner (docs/differences.md; each choice keeps the tables
exactly as awa-pg reads them):

* A cancel is never overwritten. A final status update without a state
  check would turn a cancel landing just before it into ``completed``; the
  final update locks the row, turns a requested cancel into ``cancelled``,
  and never touches an operation that already finished.
* Cancellation is honoured per item, not per chunk: each item's statement
  applies only while the operation is still ``running`` and returns its
  state, so a cancel stops the chunk at the next item; a cancel seen during
  the scan finishes the operation at once instead of on the next tick.
* Jobs are changed in ``awa.jobs_hot`` / ``awa.scheduled_jobs`` by id, and the
  scan reads those tables directly, instead of through the ``awa.jobs`` view
  (a function scan over every job, terminal ones included, per item). The
  table triggers still run (admin dirty keys on a queue change, unique
  claims); a job moved to another queue while available wakes that queue's
  workers with the same ``awa:<queue>`` notification the view's re-insert
  would send. A priority-only change sends none (the job was already ready).
* An operation whose stored spec or filter cannot be interpreted (only a
  hand-written row can be: awa-pg validates on submit) ends ``failed`` with
  the reason in ``last_error``, instead of failing every tick and blocking
  every operation behind it.
* Lock timeouts, deadlocks and serialisation failures leave the item pending
  for the next tick (the branch logs the error) instead of marking it
  ``errored`` for good.
* ``skipped`` in the result also counts items skipped because of a cancel.

The runner is engine-neutral: what differs per engine (which operations it
may claim, how it finds matching jobs, how it changes one job) is a
:class:`BatchOperationStorage`, built by each engine's ``batch_operations``
module with its statements.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import uuid
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

import trio

from ..body import BodyResult
from ..context import MaintenanceContext
from ..db import CLEANUP_TIMEOUT, Connection, DatabaseError, QueryError
from ..sql import Fragment, Statement

log = logging.getLogger(__name__)

NAME = "batch_operations"
#: "AWA_BATC": the runner lock of every Awa batch-operation runner.
RUNNER_LOCK_KEY = 0x4157_415F_4241_5443
#: Items applied per tick (Awa's DEFAULT_CHUNK_SIZE).
CHUNK_SIZE = 100
#: Job ids snapshotted per scan statement (Awa's SCAN_PAGE_SIZE).
SCAN_PAGE_SIZE = 10_000
#: Days a finished operation is kept before cleanup deletes it.
DEFAULT_RETENTION_DAYS = 90
RETENTION_DAYS_ENV = "AWA_BATCH_OP_RETENTION_DAYS"
#: Errors that say "try again later", not "this job cannot be changed".
RETRY_LATER_SQLSTATES = frozenset(
    {
        "40001",  # serialization_failure
        "40P01",  # deadlock_detected
        "55P03",  # lock_not_available (lock_timeout)
        "57014",  # query_canceled (statement_timeout)
    }
)

OP_SET_PRIORITY = "set_priority"
OP_MOVE_QUEUE = "move_queue"
FILTERABLE_JOB_STATES = ("available", "scheduled")
MAX_QUEUE_NAME_BYTES = 200

# Is any operation unfinished? Without one a tick has nothing to claim, and
# stops after this one statement instead of taking and releasing the runner
# lock around an empty claim (three statements on a pooled connection).
UNFINISHED_OPERATION_SQL = Statement("""
    SELECT EXISTS (
        SELECT 1 FROM awa.batch_operations
        WHERE state IN ('pending', 'scanning', 'running', 'cancelling')
    )
""")
TRY_RUNNER_LOCK_SQL = Statement("SELECT pg_try_advisory_lock(:lock_key)")
RELEASE_RUNNER_LOCK_SQL = Statement("SELECT pg_advisory_unlock(:lock_key)")

# The texts below that end in _TEMPLATE are completed by each engine's
# batch_operations module at import (their slots placed) into the Statements
# of its BatchOperationStorage; MATCHING_JOBS_TEMPLATE is the filter both scan
# statements place as their {matching}.

# Oldest unfinished operation first; strictly one at a time. The live engine
# is re-checked ({engine_guard}) because items are applied straight to that
# engine's tables.
CLAIM_OPERATION_TEMPLATE = """
    WITH target AS (
        SELECT id, state
        FROM awa.batch_operations
        WHERE state IN ('pending', 'scanning', 'running', 'cancelling')
          AND {engine_guard}
        ORDER BY submitted_at, id
        LIMIT 1
        FOR UPDATE SKIP LOCKED
    )
    UPDATE awa.batch_operations AS op
    SET state = CASE WHEN target.state = 'pending' THEN 'scanning' ELSE op.state END,
        started_at = COALESCE(op.started_at, clock_timestamp()),
        runner_instance = :runner_instance,
        updated_at = clock_timestamp()
    FROM target
    WHERE op.id = target.id
    RETURNING op.id, op.op_kind, op.state, op.spec, op.filter
"""
# The jobs a filter selects among {candidates}, a relation of every available
# or scheduled job (id, kind, queue, state, tags, created_at). Its parameters
# are the filter's fields, each NULL when the filter leaves it open.
MATCHING_JOBS_TEMPLATE = Fragment("""
    SELECT job.id
    FROM ({candidates}) AS job
    WHERE (:state::awa.job_state IS NULL OR job.state = :state::awa.job_state)
      AND (:kind::text IS NULL OR job.kind = :kind::text)
      AND (:queue::text IS NULL OR job.queue = :queue::text)
      AND (:tag::text IS NULL OR job.tags @> ARRAY[:tag::text])
      AND (:ids::bigint[] IS NULL OR job.id = ANY(:ids::bigint[]))
      AND (:created_at_gte::timestamptz IS NULL OR job.created_at >= :created_at_gte::timestamptz)
      AND (:created_at_lt::timestamptz IS NULL OR job.created_at < :created_at_lt::timestamptz)
""")

# The scan's upper bound and total_matched, from one snapshot.
SCAN_BOUNDS_TEMPLATE = """
    SELECT COALESCE(max(matching.id), 0) AS max_job_id, count(*) AS total_matched
    FROM ({matching}) AS matching
"""
# One page of the snapshot (ids in (:after_job_id, :max_job_id], at most
# :page_size of them, for operation :operation_id). Also returns the
# operation's state so a cancel ends the scan early.
SCAN_PAGE_TEMPLATE = """
    WITH page AS (
        SELECT matching.id
        FROM ({matching}) AS matching
        WHERE matching.id > :after_job_id AND matching.id <= :max_job_id
        ORDER BY matching.id
        LIMIT :page_size
    ), inserted AS (
        INSERT INTO awa.batch_operation_items (operation_id, job_id)
        SELECT :operation_id, page.id FROM page
        ON CONFLICT (operation_id, job_id) DO NOTHING
    )
    SELECT (SELECT max(page.id) FROM page) AS last_job_id,
           (SELECT count(*) FROM page) AS page_jobs,
           (SELECT state FROM awa.batch_operations WHERE id = :operation_id) AS operation_state
"""
# The cursor is written once; the item states carry the progress.
MARK_SCANNED_SQL = Statement("""
    UPDATE awa.batch_operations
    SET state = 'running',
        total_matched = :total_matched,
        cursor = :cursor,
        updated_at = clock_timestamp()
    WHERE id = :operation_id AND state = 'scanning'
    RETURNING state
""")

OPERATION_STATE_SQL = Statement("SELECT state FROM awa.batch_operations WHERE id = :operation_id")

PENDING_ITEMS_SQL = Statement("""
    SELECT job_id
    FROM awa.batch_operation_items
    WHERE operation_id = :operation_id AND state = 'pending'
    ORDER BY job_id
    LIMIT :limit
""")

HAS_PENDING_ITEMS_SQL = Statement("""
    SELECT EXISTS (
        SELECT 1 FROM awa.batch_operation_items
        WHERE operation_id = :operation_id AND state = 'pending'
    )
""")

# The job's statement failed as a whole (nothing changed); record why.
RECORD_ITEM_ERROR_SQL = Statement("""
    WITH item AS (
        UPDATE awa.batch_operation_items
        SET state = 'errored', error = :error, processed_at = clock_timestamp()
        WHERE operation_id = :operation_id AND job_id = :job_id AND state = 'pending'
        RETURNING 1
    )
    UPDATE awa.batch_operations
    SET errored = errored + (SELECT count(*) FROM item),
        last_error = :error,
        updated_at = clock_timestamp()
    WHERE id = :operation_id
    RETURNING state
""")

# Finish an operation: :state is the intended final state, but a requested
# cancel (seen under the row lock, so a concurrent cancel_batch_operation is
# either seen here or refused by awa-pg afterwards) always ends `cancelled`,
# and an operation that already finished is left alone. Items still pending
# are skipped. :retention_days, :last_error (error text or NULL).
FINALIZE_OPERATION_SQL = Statement("""
    WITH target AS (
        SELECT id, state
        FROM awa.batch_operations
        WHERE id = :operation_id AND state IN ('scanning', 'running', 'cancelling')
        FOR UPDATE
    ), decided AS (
        SELECT id, CASE WHEN state = 'cancelling' THEN 'cancelled' ELSE :state::text END AS state
        FROM target
    ), skipped AS (
        UPDATE awa.batch_operation_items AS item
        SET state = 'skipped', processed_at = clock_timestamp()
        FROM decided
        WHERE item.operation_id = decided.id AND item.state = 'pending'
        RETURNING 1
    )
    UPDATE awa.batch_operations AS op
    SET state = decided.state,
        skipped = op.skipped + (SELECT count(*) FROM skipped),
        finalized_at = COALESCE(op.finalized_at, clock_timestamp()),
        retention_until = COALESCE(
            op.retention_until, clock_timestamp() + :retention_days::bigint * interval '1 day'
        ),
        last_error = COALESCE(:last_error::text, op.last_error),
        updated_at = clock_timestamp()
    FROM decided
    WHERE op.id = decided.id
    RETURNING op.state, (SELECT count(*) FROM skipped) AS skipped_now
""")


class InvalidBatchOperation(ValueError):
    """A stored operation whose spec or filter cannot be run."""


@dataclasses.dataclass(frozen=True)
class OperationPlan:
    """What a decoded operation does: the per-item statement and its binds."""

    apply_sql: Statement
    #: The spec's values by name: ``priority`` (set_priority), ``queue`` and
    #: ``priority`` (move_queue).
    apply_args: dict[str, Any]
    #: The parameters of MATCHING_JOBS_TEMPLATE by name.
    filter_args: dict[str, Any]
    op_kind: str = ""


#: Changes one job for the plan and records its item's outcome, atomically;
#: returns a row with ``outcome`` (processed or skipped) and
#: ``operation_state`` (the operation's state afterwards).
ApplyJob = Callable[[Connection, OperationPlan, uuid.UUID, int], Awaitable[Any]]


@dataclasses.dataclass(frozen=True)
class BatchOperationStorage:
    """What differs between storage engines; the runner around it is shared
    (the queue-storage engine builds its own in
    :mod:`awa_trio.engines.queue_storage.batch_operations`)."""

    #: CLAIM_OPERATION_TEMPLATE, SCAN_BOUNDS_TEMPLATE and SCAN_PAGE_TEMPLATE
    #: with the engine's slots placed.
    claim_operation_sql: Statement
    scan_bounds_sql: Statement
    scan_page_sql: Statement
    #: Per-item statements a decoded plan carries as ``apply_sql``.
    set_priority_sql: Statement
    move_queue_sql: Statement
    apply_job: ApplyJob
    #: The queue-storage schema the runner binds the scan statements with
    #: (None when they have no ``{schema}``; the claim never has one).
    schema: str | None = None


@dataclasses.dataclass
class BatchOperationsResult(BodyResult):
    #: An operation was claimed (and advanced) by this call.
    claimed: bool = False
    #: Another runner (awa-pg or awa_trio) held the runner lock.
    runner_lock_busy: bool = False
    operation_id: uuid.UUID | None = None
    op_kind: str | None = None
    #: This call's runner_instance (fresh per call, as awa-pg's runner makes it).
    runner_instance: uuid.UUID | None = None
    #: Items handled by this call.
    processed: int = 0
    skipped: int = 0
    errored: int = 0
    #: Job ids snapshotted by a scan in this call.
    scanned: int = 0
    #: completed, cancelled or failed when this call finished the operation.
    finalized_state: str | None = None


async def run_batch_operations(
    ctx: MaintenanceContext,
    storage: BatchOperationStorage,
    *,
    chunk_size: int = CHUNK_SIZE,
    scan_page_size: int = SCAN_PAGE_SIZE,
) -> BatchOperationsResult:
    """One tick of the runner against ``storage``'s tables."""
    if not await ctx.db.fetchval(*UNFINISHED_OPERATION_SQL.bind()):
        return BatchOperationsResult()
    runner_instance = uuid.uuid4()
    # A session lock: behind a transaction-mode pooler, on a direct session.
    async with ctx.db.acquire_session() as conn:
        if not await conn.fetchval(*TRY_RUNNER_LOCK_SQL.bind(lock_key=RUNNER_LOCK_KEY)):
            log.debug("%s: runner lock held by another runner; skipping this tick", NAME)
            return BatchOperationsResult(runner_lock_busy=True)
        try:
            result = await run_locked_chunk(
                conn, runner_instance, max(chunk_size, 1), max(scan_page_size, 1), storage
            )
        finally:
            await release_runner_lock(conn)
    if result.claimed:
        log.info(
            "%s: operation %s (%s): processed %d, skipped %d, errored %d%s%s",
            NAME,
            result.operation_id,
            result.op_kind,
            result.processed,
            result.skipped,
            result.errored,
            f", scanned {result.scanned} jobs" if result.scanned else "",
            f", finished {result.finalized_state}" if result.finalized_state else "",
        )
    return result


async def release_runner_lock(conn: Connection) -> None:
    """Unlock on the connection that locked, even after a cancel. If this
    fails, the pool's reset (pg_advisory_unlock_all) or closing the broken
    connection releases it."""
    with trio.move_on_after(CLEANUP_TIMEOUT, shield=True):
        try:
            await conn.fetchval(*RELEASE_RUNNER_LOCK_SQL.bind(lock_key=RUNNER_LOCK_KEY))
        except DatabaseError as exc:
            log.debug("%s: releasing the runner lock failed: %s", NAME, exc)


async def run_locked_chunk(
    conn: Connection,
    runner_instance: uuid.UUID,
    chunk_size: int,
    scan_page_size: int,
    storage: BatchOperationStorage,
) -> BatchOperationsResult:
    """Steps 2-6 of the module docstring, under the runner lock."""
    result = BatchOperationsResult(runner_instance=runner_instance)
    row = await conn.fetchrow(*storage.claim_operation_sql.bind(runner_instance=runner_instance))
    if row is None:
        return result
    result.claimed = True
    result.operation_id = row["id"]
    result.op_kind = row["op_kind"]
    state = row["state"]

    if state != "cancelling":
        try:
            plan = decode_operation(row["spec"], row["filter"], storage)
        except InvalidBatchOperation as exc:
            result.log_error(
                log, "%s: operation %s cannot run and is marked failed: %s", NAME, result.operation_id, exc
            )
            await finalize_operation(conn, result, "failed", last_error=str(exc))
            return result
        if state == "scanning":
            state = await scan_operation(conn, result, plan, scan_page_size, storage)
        if state == "running":
            state = await apply_chunk(conn, result, plan, chunk_size, storage)
            if state == "running" and await conn.fetchval(
                *HAS_PENDING_ITEMS_SQL.bind(operation_id=result.operation_id)
            ):
                return result

    if state == "cancelling":
        await finalize_operation(conn, result, "cancelled")
    elif state == "running":
        await finalize_operation(conn, result, "completed")
    return result


async def scan_operation(
    conn: Connection,
    result: BatchOperationsResult,
    plan: OperationPlan,
    page_size: int,
    storage: BatchOperationStorage,
) -> str | None:
    """Snapshot the matching job ids into items; returns the operation state
    (``running`` once the snapshot is complete, ``cancelling`` if a cancel
    arrived first)."""
    operation_id = result.operation_id
    bounds = await conn.fetchone(*storage.scan_bounds_sql.bind(storage.schema, **plan.filter_args))
    max_job_id = bounds["max_job_id"]
    after_job_id = 0
    while after_job_id < max_job_id:
        page = await conn.fetchone(
            *storage.scan_page_sql.bind(
                storage.schema,
                **plan.filter_args,
                operation_id=operation_id,
                after_job_id=after_job_id,
                max_job_id=max_job_id,
                page_size=page_size,
            )
        )
        if page["last_job_id"] is None:
            break
        result.scanned += page["page_jobs"]
        after_job_id = page["last_job_id"]
        if page["operation_state"] != "scanning":
            scan_stopped_by: str = page["operation_state"]
            return scan_stopped_by
    cursor = {"after_job_id": 0, "max_job_id": max_job_id}
    state: str | None = await conn.fetchval(
        *MARK_SCANNED_SQL.bind(
            operation_id=operation_id, total_matched=bounds["total_matched"], cursor=cursor
        )
    )
    if state is None:
        state = await conn.fetchval(*OPERATION_STATE_SQL.bind(operation_id=operation_id))
    return state


async def apply_chunk(
    conn: Connection,
    result: BatchOperationsResult,
    plan: OperationPlan,
    chunk_size: int,
    storage: BatchOperationStorage,
) -> str | None:
    """Apply up to chunk_size pending items, stopping at a cancel; returns
    the operation state after the last one."""
    rows = await conn.fetch(*PENDING_ITEMS_SQL.bind(operation_id=result.operation_id, limit=chunk_size))
    state: str | None = "running"
    for row in rows:
        state = await apply_item(conn, result, plan, row["job_id"], storage)
        if state != "running":
            break
    return state


async def apply_item(
    conn: Connection,
    result: BatchOperationsResult,
    plan: OperationPlan,
    job_id: int,
    storage: BatchOperationStorage,
) -> str | None:
    """One job, applied atomically; returns the operation state after it."""
    operation_id = result.operation_id
    assert operation_id is not None  # claimed before any item is applied
    try:
        row = await storage.apply_job(conn, plan, operation_id, job_id)
    except QueryError as exc:
        if exc.sqlstate in RETRY_LATER_SQLSTATES:
            raise
        message = f"job_id={job_id}: {exc}"
        log.warning("%s: operation %s: %s", NAME, operation_id, message)
        result.errored += 1
        state_after_error: str | None = await conn.fetchval(
            *RECORD_ITEM_ERROR_SQL.bind(operation_id=operation_id, job_id=job_id, error=message)
        )
        return state_after_error
    if row["outcome"] == "processed":
        result.processed += 1
    else:
        result.skipped += 1
    state_after: str | None = row["operation_state"]
    return state_after


async def finalize_operation(
    conn: Connection,
    result: BatchOperationsResult,
    state: str,
    *,
    last_error: str | None = None,
) -> None:
    """End the operation as ``state`` (a requested cancel wins)."""
    row = await conn.fetchrow(
        *FINALIZE_OPERATION_SQL.bind(
            operation_id=result.operation_id,
            state=state,
            retention_days=retention_days(),
            last_error=last_error,
        )
    )
    if row is not None:
        result.finalized_state = row["state"]
        result.skipped += row["skipped_now"]


def retention_days() -> int:
    """AWA_BATCH_OP_RETENTION_DAYS when it is a positive integer, else 90
    (read at every finalisation, as awa-pg's runner reads it)."""
    raw = os.environ.get(RETENTION_DAYS_ENV)
    if raw is not None and re.fullmatch(r"[+-]?[0-9]+", raw):
        days = int(raw)
        if 0 < days < 2**63:
            return days
    return DEFAULT_RETENTION_DAYS


def decode_operation(spec: Any, job_filter: Any, storage: BatchOperationStorage) -> OperationPlan:
    """Read a stored spec and filter as awa's serde types would, with the
    same validation as awa-pg's submit; raise InvalidBatchOperation otherwise.
    ``apply_args``: ``priority`` for set_priority, ``queue`` and ``priority``
    (or None) for move_queue."""
    if not isinstance(spec, dict):
        raise InvalidBatchOperation("spec must be a JSON object")
    op_kind = spec.get("op_kind")
    if op_kind == OP_SET_PRIORITY:
        plan_sql = storage.set_priority_sql
        apply_args: dict[str, Any] = {"priority": _priority(spec.get("priority"), required=True)}
    elif op_kind == OP_MOVE_QUEUE:
        queue = spec.get("queue")
        if not isinstance(queue, str) or not 0 < len(queue.encode()) <= MAX_QUEUE_NAME_BYTES:
            raise InvalidBatchOperation("destination queue must be 1..=200 characters")
        plan_sql = storage.move_queue_sql
        apply_args = {"queue": queue, "priority": _priority(spec.get("priority"), required=False)}
    else:
        raise InvalidBatchOperation(f"unknown batch operation kind: {op_kind!r}")
    return OperationPlan(plan_sql, apply_args, _filter_args(op_kind, job_filter), op_kind)


def _priority(value: Any, *, required: bool) -> int | None:
    if value is None and not required:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 4:
        raise InvalidBatchOperation("priority must be between 1 and 4")
    return value


def _filter_args(op_kind: str, job_filter: Any) -> dict[str, Any]:
    if job_filter is None:
        job_filter = {}
    if not isinstance(job_filter, dict):
        raise InvalidBatchOperation("filter must be a JSON object")

    def text(key: str) -> str | None:
        value = job_filter.get(key)
        if value is not None and not isinstance(value, str):
            raise InvalidBatchOperation(f"filter.{key} must be a string")
        return value

    def timestamp(key: str) -> datetime | None:
        value = text(key)
        if value is None:
            return None
        try:
            parsed = datetime.fromisoformat(value)
        except ValueError:
            raise InvalidBatchOperation(f"filter.{key} is not an RFC 3339 timestamp") from None
        if parsed.tzinfo is None:
            raise InvalidBatchOperation(f"filter.{key} has no UTC offset")
        return parsed

    state = text("state")
    if state is not None and state not in FILTERABLE_JOB_STATES:
        raise InvalidBatchOperation(f"{op_kind} only supports available or scheduled state filters")
    ids = job_filter.get("ids")
    if ids is not None and (
        not isinstance(ids, list)
        or not all(isinstance(i, int) and not isinstance(i, bool) and -(2**63) <= i < 2**63 for i in ids)
    ):
        raise InvalidBatchOperation("filter.ids must be a list of job ids")
    return {
        "state": state,
        "kind": text("kind"),
        "queue": text("queue"),
        "tag": text("tag"),
        "ids": ids,
        "created_at_gte": timestamp("created_at_gte"),
        "created_at_lt": timestamp("created_at_lt"),
    }
