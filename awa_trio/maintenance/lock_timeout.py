"""A transaction's own ``lock_timeout``: the ring steps that take an
exclusive lock (a prune, a rollup, a ring reading its slots) give up a
wait after this long instead of queueing behind a worker, and try again
next tick."""

from __future__ import annotations

from ..db import Connection, milliseconds
from ..sql import Statement

#: ``lock_timeout`` until the end of the open transaction (``:lock_timeout``
#: as a setting value, e.g. ``100ms``).
SET_LOCAL_LOCK_TIMEOUT_SQL = Statement("SELECT set_config('lock_timeout', :lock_timeout, true)")


async def set_local_lock_timeout(conn: Connection, seconds: float) -> None:
    """Lock waits in ``conn``'s open transaction end after ``seconds`` (at least 1 ms)."""
    await conn.execute(*SET_LOCAL_LOCK_TIMEOUT_SQL.bind(lock_timeout=milliseconds(seconds)))
