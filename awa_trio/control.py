"""``python -m awa_trio resign``: ask whichever awa_trio node leads to hand
over at once, from any host that can reach the database.

It NOTIFYs ``resign <backend pid>`` on the control channel, naming the
backend that holds the maintenance lock (only that leader acts on it), then
watches ``pg_locks`` until another session holds the lock. The leader takes
the graceful path (unlock and release NOTIFY, about 10 ms to a follower)
and stays a follower for its ``resign_hold_off``.
"""

from __future__ import annotations

import sys
from typing import Any

import trio

from .db import Database, open_database
from .leadership import CONTROL_CHANNEL, LOCK_KEY
from .sql import Statement
from .status import EXIT_NO_LEADER, LOCK_SESSIONS_SQL

EXIT_OK, EXIT_FAILURE = 0, 1
POLL_INTERVAL = 0.02

#: Only the leader whose lock backend pid the payload names acts on it.
RESIGN_NOTICE_SQL = Statement("SELECT pg_notify(:channel, 'resign ' || :holder_pid::integer)")


async def lock_holder(db: Database) -> dict[str, Any] | None:
    rows = await db.fetch(*LOCK_SESSIONS_SQL.bind(lock_key=LOCK_KEY))
    return next((dict(row) for row in rows if row["holds_lock"]), None)


def describe(session: dict[str, Any]) -> str:
    name = session["application_name"] or "no application_name"
    return f"backend pid {session['pid']} ({name!r})"


async def request_resign(database_url: str, timeout: float) -> int:
    """Exit 0 once another session holds the lock; 3 if nothing leads; 1 if
    the holder did not let go (not an awa_trio node) or no follower took over."""
    async with open_database(database_url, pool_size=1, application_name="awa_trio resign") as db:
        old = await lock_holder(db)
        if old is None:
            print("no node holds the maintenance lock: nothing to resign", file=sys.stderr)
            return EXIT_NO_LEADER
        started = trio.current_time()
        await db.execute(*RESIGN_NOTICE_SQL.bind(channel=CONTROL_CHANNEL, holder_pid=old["pid"]))
        released = False
        with trio.move_on_after(timeout):
            while True:
                holder = await lock_holder(db)
                if holder is None:
                    released = True
                elif holder["pid"] != old["pid"]:
                    elapsed_ms = (trio.current_time() - started) * 1000
                    print(
                        f"leadership moved from {describe(old)} to {describe(holder)} in {elapsed_ms:.0f} ms"
                    )
                    return EXIT_OK
                await trio.sleep(POLL_INTERVAL)
    if released:
        print(
            f"{describe(old)} released the lock but no follower took it within {timeout:g}s "
            "(the resigner competes again after its resign_hold_off)",
            file=sys.stderr,
        )
    else:
        print(
            f"{describe(old)} did not resign within {timeout:g}s: only awa_trio nodes listen for "
            f"resign on {CONTROL_CHANNEL} (awa-pg and Rust runtimes do not)",
            file=sys.stderr,
        )
    return EXIT_FAILURE
