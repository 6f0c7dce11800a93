"""Why a leadership term ended, as what the elector does next.

A term runs until the lock is lost, or until it ends by itself with an
exception group. Only the errors a term raises on purpose have an outcome:

* a branch kept crashing (:class:`~awa_trio.errors.LeadershipAbandoned`):
  the node gave up leadership, and stays out two election intervals so
  another node can take over;
* no schema awa_trio can maintain (:class:`~awa_trio.errors.UnsupportedSchema`:
  dropped, migrated past what awa_trio supports): step down and follow until
  a supported schema is back, checking every second;
* a database error: branch bodies handle their own, so this is the term's
  start-up (the schema check) failing, a connection lost, a server
  restarting; leading half-started is not an option, so the lock is
  released and the node stands again after the error backoff.

Anything else is a bug and propagates.
"""

from __future__ import annotations

import functools

from .config import MaintenanceConfig
from .context import MaintenanceContext
from .db import DatabaseError, sole_exception
from .errors import LeadershipAbandoned, UnsupportedSchema
from .leadership import HoldOff, RetryAfterError, TermOutcome, WaitUntil
from .term import read_supported_schema

#: How often a node that stepped down for its schema looks again.
SCHEMA_RECHECK_INTERVAL = 1.0
#: After giving up leadership on purpose, stay out this many election intervals.
ABANDON_PENALTY_INTERVALS = 2


def term_outcome(
    group: BaseExceptionGroup[BaseException], ctx: MaintenanceContext, config: MaintenanceConfig
) -> TermOutcome | None:
    """What the elector does after a term that ended with ``group`` (None:
    the group holds something no outcome covers, and propagates). An
    unsupported schema wins over a crashing branch, which wins over a
    database error."""
    abandoned, rest = group.split(LeadershipAbandoned)
    unfit, rest = rest.split(UnsupportedSchema) if rest is not None else (None, None)
    failed, rest = rest.split(DatabaseError) if rest is not None else (None, None)
    if rest is not None:
        return None
    if unfit is not None:
        return WaitUntil(
            reason=str(sole_exception(unfit) or unfit),
            check=functools.partial(schema_problem, ctx),
            every=SCHEMA_RECHECK_INTERVAL,
            check_name="schema check",
            passed="a supported awa schema is back",
        )
    if abandoned is not None:
        return HoldOff(
            ABANDON_PENALTY_INTERVALS * config.leader_election_interval,
            reason=str(sole_exception(abandoned) or abandoned),
        )
    assert failed is not None  # the group is not empty
    return RetryAfterError(str(sole_exception(failed) or failed))


async def schema_problem(ctx: MaintenanceContext) -> str | None:
    """Why the database cannot be led now for its schema, or None."""
    try:
        await read_supported_schema(ctx)
    except UnsupportedSchema as exc:
        return str(exc)
    return None
