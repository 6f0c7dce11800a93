"""Naming the table a lock timeout waited for when the server's report did
not (:func:`find_lock_holder`)."""

from __future__ import annotations

import re

import trio

from ..sql import Statement
from .database import Database
from .errors import DatabaseError, LockTimeout

#: Tables another session holds ACCESS EXCLUSIVE (the lock DDL takes).
EXCLUSIVE_HOLDERS_SQL = Statement("""
    SELECT DISTINCT n.nspname, c.relname
    FROM pg_locks l
    JOIN pg_class c ON c.oid = l.relation
    JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE l.locktype = 'relation' AND l.granted AND l.mode = 'AccessExclusiveLock'
      AND l.pid <> pg_backend_pid()
      AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
    ORDER BY 1, 2
""")


async def find_lock_holder(db: Database, exc: LockTimeout) -> str | None:
    """The table a lock timeout waited for, when the server's report did not
    say (a prepared statement takes its table locks without a text position):
    the tables named in the statement that another session holds ACCESS
    EXCLUSIVE now. One query, only for the first yield of an episode."""
    if exc.relation is not None or not exc.sql:
        return exc.relation
    words = set(re.findall(r"[A-Za-z_][A-Za-z0-9_$]*", exc.sql))
    with trio.move_on_after(1.0):
        try:
            rows = await db.fetch(*EXCLUSIVE_HOLDERS_SQL.bind())
        except DatabaseError:
            return None
        named = [f"{row[0]}.{row[1]}" for row in rows if row[1] in words]
        return ", ".join(named) or None
    return None
