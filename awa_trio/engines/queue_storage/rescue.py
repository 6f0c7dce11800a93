"""The control flow the three queue-storage rescues share: one batch in
one transaction (take, settle, notices), its row-by-row fallback, and the
receipt-claim steps. The drain, the outcome and the side effects are the
shared core's (:mod:`awa_trio.maintenance.rescue`, as on the canonical
engine); the statements, and why each is safe beside the writers it
meets, are in :mod:`.rescue_sql`.

If a batch fails (any ``QueryError``: a stray row in the way, a missing
ready entry), the batch is rolled back and redone row by row, each row
under its own savepoint; a row failing with 23505 becomes a cancelled
terminal row, any other failure leaves that row untouched, logged and
counted among the pass's errors. One row never aborts the sweep.

The batch's ``awa:cancel`` notices
(:data:`~.rescue_sql.QUEUE_STORAGE_NOTICES_SQL`, one statement after the
settle, under the same savepoint) commit with it: a batch or a row of the
fallback that rolls back takes its notices with it.

A sweep drains: it repeats batches of ``rescue_batch_size`` (resting
between full ones) until one comes back short or ``min(drain_time_budget,
interval / 2)`` is spent. Each batch commits on its own, and its side
effects (metrics, in-flight cancellation, follow-up jobs, events) run right
after its commit, so a cancellation leaves every batch applied or untouched
(a cancellation during a batch's side effects cuts them short, as a crash
would: follow-ups are best-effort).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from ...body import BodyResult
from ...context import MaintenanceContext
from ...db import Connection, ConnectionLost, LockTimeout, QueryError, UniqueViolation, describe_error
from ...jobs import QUEUE_STORAGE, JobRow
from ...maintenance.drain import BatchOutcome
from ...maintenance.rescue import (
    CALLBACK_TIMEOUT_DLQ_REASON,
    CANCEL_NOTICES_SQL,
    Rescue,
    RescueResult,
    attempts_to_cancel,
    drain_rescues,
    send_cancel_notices,
)
from ...schema import STATE_MIXED_TRANSITION
from ...sql import Statement
from .rescue_sql import CLOSE_RECEIPTS_SQL, NO_JIT_SQL, QUEUE_STORAGE_NOTICES_SQL, SETTLE_SQL, TAKEN_COLUMNS

log = logging.getLogger(__name__)


class SettleMismatch(Exception):
    """The settle statement did not account for every taken attempt (its
    ready entry is missing): the batch must not commit."""


#: ``take(conn, ctx, limit, job_ids)``: take up to ``limit`` attempts (only
#: these jobs when ``job_ids`` is not None), returning TAKEN_COLUMNS records.
Take = Callable[[Connection, MaintenanceContext, int, "list[int] | None"], Awaitable[list[Any]]]


@dataclasses.dataclass(frozen=True)
class QueueStorageRescue(Rescue):
    """One queue-storage rescue branch."""

    take: Take
    #: Exhausted attempts become failed (or dead-lettered) instead of retryable.
    exhausts_to_failed: bool = False


@dataclasses.dataclass
class _BatchOutcome(BodyResult):
    taken: int
    records: list[Any]
    skipped: list[int]
    row_by_row: bool = False
    cancel_notices: int = 0


async def run_rescue(ctx: MaintenanceContext, rescue: QueueStorageRescue) -> RescueResult:
    """One tick of a queue-storage rescue branch (the shared drain over this
    engine's batch)."""

    async def batch(part: RescueResult, batch_size: int) -> BatchOutcome | None:
        outcome = await rescue_batch(ctx, rescue, batch_size)
        part.row_by_row_batches = int(outcome.row_by_row)
        part.skipped = outcome.skipped
        part.cancel_notices = outcome.cancel_notices
        part.errors = outcome.errors
        for record in outcome.records:
            job = JobRow.from_record(record, engine=QUEUE_STORAGE)
            if record["outcome"] == "cancelled":
                part.duplicates_cancelled.append(job)
                continue
            part.rescued.append(job)
            if record["outcome"] == "dlq":
                part.dead_lettered.append(job)
        return BatchOutcome(outcome.taken, more=outcome.taken >= batch_size and bool(outcome.records))

    return await drain_rescues(ctx, rescue, batch)


async def rescue_batch(ctx: MaintenanceContext, rescue: QueueStorageRescue, limit: int) -> _BatchOutcome:
    """One batch in one transaction (the row-by-row fallback included)."""
    async with ctx.db.transaction() as conn:
        # The planner prices these statements (subplans over every ring
        # partition) above jit_above_cost; compiling them costs seconds,
        # running them milliseconds.
        await conn.execute(*NO_JIT_SQL.bind())
        taken: list[Any] = []
        try:
            async with conn.transaction():
                taken = await rescue.take(conn, ctx, limit, None)
                records = await settle(conn, ctx, rescue, taken) if taken else []
                notices = await send_notices(conn, ctx, rescue, records)
            return _BatchOutcome(len(taken), records, [], cancel_notices=notices)
        except (ConnectionLost, LockTimeout):
            raise  # LockTimeout: a yield, the branch retries at its next tick
        except (QueryError, SettleMismatch) as exc:
            if not taken:
                raise
            log.warning(
                "%s: batch of %d failed (%s); redoing it row by row",
                rescue.name,
                len(taken),
                _describe(exc),
            )
        outcome = _BatchOutcome(len(taken), [], [], row_by_row=True)
        await settle_row_by_row(conn, ctx, rescue, taken, outcome)
        return outcome


async def send_notices(
    conn: Connection, ctx: MaintenanceContext, rescue: QueueStorageRescue, records: Sequence[Any]
) -> int:
    """The ``awa:cancel`` notices of settled attempts (SETTLE_SQL records);
    only during a mixed transition can a canonical attempt share an
    ``(id, lease)`` with one of them (and only then may the role read the
    canonical tables), so only then are those left out."""
    rescued: list[JobRow] = []
    cancelled: list[JobRow] = []
    for record in records:
        job = JobRow.from_record(record, engine=QUEUE_STORAGE)
        (cancelled if record["outcome"] == "cancelled" else rescued).append(job)
    statement = (
        QUEUE_STORAGE_NOTICES_SQL if ctx.schema.state == STATE_MIXED_TRANSITION else CANCEL_NOTICES_SQL
    )
    return await send_cancel_notices(conn, statement, attempts_to_cancel(rescue, rescued, cancelled))


async def settle_row_by_row(
    conn: Connection,
    ctx: MaintenanceContext,
    rescue: QueueStorageRescue,
    taken: Sequence[Any],
    outcome: _BatchOutcome,
) -> None:
    """Each attempt of a failed batch under its own savepoint: a 23505 makes
    that row a cancelled terminal row; any other failure leaves it untouched.
    The settled records, skipped ids, notices sent and errors go into ``outcome``."""
    for job_id in dict.fromkeys(int(row["job_id"]) for row in taken):
        try:
            async with conn.transaction():
                one = await rescue.take(conn, ctx, 1, [job_id])
                settled = await settle(conn, ctx, rescue, one) if one else []
                outcome.cancel_notices += await send_notices(conn, ctx, rescue, settled)
            outcome.records += settled
            continue
        except (ConnectionLost, LockTimeout):
            raise  # LockTimeout: a yield, the branch retries at its next tick
        except UniqueViolation as exc:
            log.warning(
                "%s: rescuing job queue_storage:%d conflicts (%s); cancelling it as a superseded duplicate",
                rescue.name,
                job_id,
                _describe(exc),
            )
        except (QueryError, SettleMismatch) as exc:
            outcome.log_error(
                log,
                "%s: rescue of job queue_storage:%d failed; leaving it for the next tick: %s",
                rescue.name,
                job_id,
                _describe(exc),
            )
            outcome.skipped.append(job_id)
            continue
        try:
            async with conn.transaction():
                one = await rescue.take(conn, ctx, 1, [job_id])
                settled = await settle(conn, ctx, rescue, one, cancel=True) if one else []
                outcome.cancel_notices += await send_notices(conn, ctx, rescue, settled)
            outcome.records += settled
        except (ConnectionLost, LockTimeout):
            raise  # LockTimeout: a yield, the branch retries at its next tick
        except (QueryError, SettleMismatch) as exc:
            outcome.log_error(
                log,
                "%s: cannot rescue or cancel job queue_storage:%d; leaving it as it is (resolve by hand): %s",
                rescue.name,
                job_id,
                _describe(exc),
            )
            outcome.skipped.append(job_id)


async def settle(
    conn: Connection,
    ctx: MaintenanceContext,
    rescue: QueueStorageRescue,
    taken: Sequence[Any],
    *,
    cancel: bool = False,
) -> list[Any]:
    """Run :data:`SETTLE_SQL` over the taken attempts (``cancel``: all of them
    become cancelled terminal rows)."""
    columns = {name: [row[name] for row in taken] for name in TAKEN_COLUMNS}
    columns["state"] = [str(state) for state in columns["state"]]  # the enum travels as text
    dlq_queues = sorted(
        queue
        for queue in {row["queue"] for row in taken}
        if rescue.exhausts_to_failed and ctx.config.dlq_policy.enabled_for(queue)
    )
    records = await conn.fetch(
        *SETTLE_SQL.bind(
            ctx.schema.queue_storage_schema,
            **columns,
            exhausts_to_failed=rescue.exhausts_to_failed,
            dlq_queues=dlq_queues,
            cancel=cancel,
            duplicate_error=rescue.duplicate_error,
            dlq_reason=CALLBACK_TIMEOUT_DLQ_REASON,
        )
    )
    missing = {int(row["job_id"]) for row in taken} - {int(record["id"]) for record in records}
    if missing:
        raise SettleMismatch(f"no ready entry found for taken attempts of jobs {sorted(missing)[:20]}")
    return records


async def take_receipts(
    conn: Connection,
    ctx: MaintenanceContext,
    lock: Statement,
    lock_params: Mapping[str, Any],
    *,
    outcome: str,
    error: str,
) -> list[Any]:
    """Receipt side of a take: lock (statement given, with its parameters by
    name), then close (a fresh snapshot, after the locks)."""
    schema = ctx.schema.queue_storage_schema
    locked = await conn.fetch(*lock.bind(schema, **lock_params))
    if not locked:
        return []
    return await conn.fetch(
        *CLOSE_RECEIPTS_SQL.bind(
            schema,
            claim_slots=[row["claim_slot"] for row in locked],
            job_ids=[row["job_id"] for row in locked],
            run_leases=[row["run_lease"] for row in locked],
            outcome=outcome,
            error=error,
        )
    )


def _describe(exc: BaseException) -> str:
    return describe_error(exc) if isinstance(exc, QueryError) else str(exc)
