"""The promotion skeleton both engines' ``promote_scheduled`` run: the due
check that spares an idle database the batch statements, one pass per
state with a failure in one never holding up the other, the one result
type, and the row-by-row fallback a refused batch falls back to. Each
engine supplies its statements: a state's batches, and how one row is
promoted or, on a unique-claim conflict, dealt with."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable, Sequence

import trio

from ..context import MaintenanceContext
from ..db import ConnectionLost, DatabaseError, LockTimeout, UniqueViolation, describe_error
from ..jobs import JobRow

log = logging.getLogger(__name__)

PROMOTABLE_STATES = ("scheduled", "retryable")
#: Each promotable state as the SQL literal the engines' statements place at
#: import: a literal, not a parameter, so the planner can use the partial
#: index per state (a generic plan cannot prove it applies to a parameter).
STATE_LITERALS = {state: f"'{state}'" for state in PROMOTABLE_STATES}


@dataclasses.dataclass
class PromoteResult:
    """One promotion tick, on either engine."""

    #: Jobs promoted per state this tick.
    promoted: dict[str, int] = dataclasses.field(default_factory=dict)
    #: Distinct queues that received jobs (each was notified).
    queues: set[str] = dataclasses.field(default_factory=set)
    batches: int = 0
    #: States whose batch was refused over one row and went row by row.
    row_by_row: list[str] = dataclasses.field(default_factory=list)
    #: Due jobs cancelled because another job holds their unique claim (canonical).
    duplicates_cancelled: list[JobRow] = dataclasses.field(default_factory=list)
    #: Due jobs left in place: a claim held elsewhere, or their statement failed.
    skipped: list[int] = dataclasses.field(default_factory=list)
    #: Lanes (queue, priority, shard) created for due rows that had none (queue storage).
    lanes_created: list[tuple[str, int, int]] = dataclasses.field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(self.promoted.values())


#: One state's batches into the result (DatabaseError: that state failed).
PromoteState = Callable[[str, PromoteResult], Awaitable[None]]
#: One due job promoted on its own: the (queue, rows) it filed, empty if
#: it had gone meanwhile.
PromoteOne = Callable[[int], Awaitable[Sequence[tuple[str, int]]]]
#: What to do with a due job whose promotion hit a unique claim held elsewhere.
OnClaimConflict = Callable[[int], Awaitable[None]]


async def promote_due(
    ctx: MaintenanceContext, name: str, due_check_sql: str, promote_state: PromoteState
) -> PromoteResult:
    """One tick: the due check (one row of a boolean per state), then each
    due state's batches; a state with nothing due records an empty batch."""
    result = PromoteResult()
    started = trio.current_time()
    try:
        due = await ctx.db.fetchone(due_check_sql)
    except LockTimeout:
        raise  # a yield: the branch retries at its next tick
    except DatabaseError as exc:
        log.error("%s: failed to promote due jobs (due check): %s", name, describe_error(exc))
        return result
    for state in PROMOTABLE_STATES:
        if not due[state]:
            record_empty_pass(ctx, state, result, trio.current_time() - started)
            continue
        try:
            await promote_state(state, result)
        except LockTimeout:
            raise  # a yield: the branch retries at its next tick
        except DatabaseError as exc:
            # A failure for one state must not keep the other one waiting.
            log.error("%s: failed to promote %s jobs: %s", name, state, describe_error(exc))
        count = result.promoted.get(state, 0)
        if count:
            log.debug("%s: promoted %d %s jobs (%d queues)", name, count, state, len(result.queues))
    return result


def record_empty_pass(ctx: MaintenanceContext, state: str, result: PromoteResult, seconds: float) -> None:
    """The due check stands in for the empty batch a state would have run,
    so batch metrics and counts read as they did before the check."""
    ctx.metrics.record_promotion_batch(state, 0, seconds)
    result.batches += 1
    result.promoted.setdefault(state, 0)


async def promote_row_by_row(
    name: str,
    state: str,
    ids: Sequence[int],
    promote_one: PromoteOne,
    on_claim_conflict: OnClaimConflict,
    result: PromoteResult,
) -> None:
    """The fallback for a refused batch: each due job in its own statement,
    so only the row at fault waits; a lost connection leaves the rest for
    the next tick."""
    result.row_by_row.append(state)
    promoted = 0
    for position, job_id in enumerate(ids):
        try:
            filed = await promote_one(job_id)
        except UniqueViolation:
            await on_claim_conflict(job_id)
            continue
        except ConnectionLost as exc:
            log.error(
                "%s: connection lost during row-by-row promotion; %d %s jobs left for the next tick: %s",
                name,
                len(ids) - position,
                state,
                exc,
            )
            break
        except LockTimeout:
            raise  # a yield: the branch retries at its next tick
        except DatabaseError as exc:
            log.error(
                "%s: promoting %s job %d failed; skipping it: %s", name, state, job_id, describe_error(exc)
            )
            result.skipped.append(job_id)
            continue
        for queue, rows in filed:
            promoted += rows
            result.queues.add(queue)
    result.promoted[state] = result.promoted.get(state, 0) + promoted
