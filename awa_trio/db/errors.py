"""Database errors: the types callers catch, and the one mapping of
whatever the driver raises onto them (:func:`translate_error`).

Errors come out as :class:`DatabaseError` subclasses that keep the SQLSTATE.
"""

from __future__ import annotations

import asyncio
import re

import asyncpg

from ..errors import ConfigError

# SQLSTATEs that mean the session is gone rather than that a statement failed.
_CONNECTION_SQLSTATES = {"57P01", "57P02", "57P03"}
UNIQUE_VIOLATION = "23505"
#: SQLSTATE lock_not_available: a lock wait ran into lock_timeout.
LOCK_NOT_AVAILABLE = "55P03"


class DatabaseError(Exception):
    """A database operation failed. ``sqlstate`` is the server's code when
    the server reported one."""

    def __init__(self, message: str, *, sqlstate: str | None = None, constraint: str | None = None):
        super().__init__(message)
        self.sqlstate = sqlstate
        self.constraint = constraint


class ConnectionLost(DatabaseError):
    """The connection is closed, reset, terminated, or could not be opened."""


class InvalidDatabaseURL(ConnectionLost, ConfigError):
    """The URL itself is malformed: a configuration error (the CLI exits 2),
    still a ConnectionLost for callers that catch database errors."""


class DatabaseClosed(ConnectionLost):
    """A statement on a :class:`Database` whose ``open_database`` block has
    exited: it fails at once (a task that outlived the block)."""


CLOSED_MESSAGE = "the database is closed: its open_database block has exited"


class QueryError(DatabaseError):
    """The server rejected a statement (the session itself is still usable)."""


class UniqueViolation(QueryError):
    """SQLSTATE 23505: a unique constraint (or Awa's unique-claim check) refused a row."""


class LockTimeout(QueryError):
    """SQLSTATE 55P03: a lock wait ran into ``lock_timeout`` and the statement
    gave up (its transaction rolled back, so it holds nothing). For a
    maintenance branch this is a yield, not a failure: someone else (an
    operator's DDL, a long transaction) holds the lock, and the branch tries
    again at its next tick. ``relation`` is the table it waited for, when the
    server's report names it (None otherwise)."""

    def __init__(
        self,
        message: str,
        *,
        sqlstate: str | None = None,
        relation: str | None = None,
        sql: str | None = None,
    ):
        super().__init__(message, sqlstate=sqlstate)
        self.relation = relation
        #: The statement that waited (for :func:`find_lock_holder`).
        self.sql = sql


# A row-lock wait names its table in the error context ('while locking tuple
# (0,1) in relation "jobs_hot"'); a table-lock wait points at it in the text.
_CONTEXT_RELATION = re.compile(r'relation "([^"]+)"')
_NAME_AT = re.compile(r'(?:"[^"]+"|[A-Za-z_][A-Za-z0-9_$]*)(?:\.(?:"[^"]+"|[A-Za-z_][A-Za-z0-9_$]*))?')


def _waited_relation(exc: BaseException, sql: str | None) -> str | None:
    """The table a lock timeout waited for, from the server's report."""
    match = _CONTEXT_RELATION.search(getattr(exc, "context", None) or "")
    if match:
        return match.group(1)
    position = getattr(exc, "position", None)
    if sql and position and str(position).isdigit():
        name = _NAME_AT.match(sql, int(position) - 1)
        if name:
            return name.group().replace('"', "")
    return None


#: SQLSTATE classes of a statement refused because of the rows it touched
#: (data exceptions, integrity constraints, errors raised by triggers), as
#: opposed to the statement, the session or a lock.
_ROW_DATA_SQLSTATE_CLASSES = ("22", "23", "P0")


def is_row_data_error(exc: DatabaseError) -> bool:
    """Whether the statement failed because of some row's data: redone row
    by row, the other rows would pass."""
    return isinstance(exc, QueryError) and (exc.sqlstate or "")[:2] in _ROW_DATA_SQLSTATE_CLASSES


def row_level_refusal(exc: DatabaseError) -> str | None:
    """Why a batched statement failed over one of its rows, for the log line
    of the row-by-row retry (a unique-claim conflict, a row's data); None
    when the error is not about a row and a retry row by row would not help."""
    if isinstance(exc, UniqueViolation):
        return "hit a unique-claim conflict"
    if is_row_data_error(exc):
        return "failed on a row's data"
    return None


def describe_error(exc: DatabaseError) -> str:
    """``[SQLSTATE] message`` for log lines (just the message without one)."""
    return f"[{exc.sqlstate}] {exc}" if exc.sqlstate else str(exc)


def translate_error(exc: BaseException, sql: str | None = None) -> DatabaseError | None:
    """Map an error raised inside the driver to our types; None for what is
    not a driver error (trio's cancellation, KeyboardInterrupt, SystemExit).

    The rule: a server error keeps its SQLSTATE (class 08 and 57P0x mean the
    session is gone); a client-side error on a statement whose session is
    still fine (an argument asyncpg cannot encode, a stale type cache, a
    driver warning raised as an error) is a :class:`QueryError`; everything
    else asyncpg, the socket or the asyncio side of the bridge can raise
    means the session's state is unknown, and is a :class:`ConnectionLost`:
    the caller drops that connection, which is always safe. The case that
    forced this rule: a statement sent in the few milliseconds between the
    server's "terminating connection" message and the socket closing gets
    asyncpg's ``InternalClientError`` ("cannot switch to state 12; another
    operation (2) is in progress"), which derives from neither
    ``PostgresError`` nor ``InterfaceError``.
    """
    if isinstance(exc, DatabaseError):
        return exc
    if isinstance(exc, asyncpg.PostgresError):
        sqlstate = getattr(exc, "sqlstate", None)
        constraint = getattr(exc, "constraint_name", None)
        message = str(exc) or type(exc).__name__
        if sqlstate and (sqlstate.startswith("08") or sqlstate in _CONNECTION_SQLSTATES):
            return ConnectionLost(message, sqlstate=sqlstate)
        if sqlstate == UNIQUE_VIOLATION:
            return UniqueViolation(message, sqlstate=sqlstate, constraint=constraint)
        if sqlstate == LOCK_NOT_AVAILABLE:
            return LockTimeout(message, sqlstate=sqlstate, relation=_waited_relation(exc, sql), sql=sql)
        return QueryError(message, sqlstate=sqlstate, constraint=constraint)
    if isinstance(exc, asyncpg.exceptions.DataError):
        # Client-side: an argument asyncpg could not encode. The session is fine.
        return QueryError(f"invalid query argument: {exc}")
    if isinstance(exc, asyncpg.exceptions.OutdatedSchemaCacheError):
        # A type changed under a prepared statement; the next attempt re-reads it.
        return QueryError(f"stale type cache: {exc}")
    if isinstance(exc, Warning):
        # asyncpg's InterfaceWarning, a server PostgresWarning: only raised
        # when a warnings filter turns them into errors; the session is fine.
        return QueryError(f"{type(exc).__name__}: {exc}", sqlstate=getattr(exc, "sqlstate", None))
    if isinstance(exc, asyncpg.InterfaceError):
        return ConnectionLost(str(exc) or type(exc).__name__)
    if isinstance(exc, asyncpg.exceptions.InternalClientError):
        # ProtocolError, TargetServerAttributeNotMatched and the bare class
        # (a protocol state switch refused, a malformed message): the
        # protocol state of this connection can no longer be trusted.
        return ConnectionLost(f"driver protocol error ({type(exc).__name__}): {exc}")
    if isinstance(exc, asyncio.CancelledError):
        # Under trio-asyncio this only reaches us when the asyncio side
        # cancelled the operation and no Trio scope did (a pool closing, a
        # connection aborted under a pending call).
        return ConnectionLost("operation cancelled inside the database driver")
    if isinstance(exc, (OSError, TimeoutError, EOFError)):
        return ConnectionLost(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
    if isinstance(exc, Exception):
        # Anything else from inside the driver (a BufferError on a torn
        # message, an asyncio RuntimeError, an AssertionError in asyncpg).
        return ConnectionLost(f"unexpected database driver error {type(exc).__name__}: {exc}")
    return None


def _protocol_state_unknown(exc: ConnectionLost) -> bool:
    """True when the driver's protocol state, not the socket or the server,
    is what failed (the connection may look open but must not be reused)."""
    cause = exc.__cause__
    return cause is not None and not isinstance(
        cause, (asyncpg.PostgresError, asyncpg.InterfaceError, OSError, TimeoutError, EOFError)
    )


def sole_exception(group: BaseExceptionGroup) -> BaseException | None:
    """The only leaf of a (possibly nested) exception group, or None."""
    exc: BaseException = group
    while isinstance(exc, BaseExceptionGroup):
        if len(exc.exceptions) != 1:
            return None
        exc = exc.exceptions[0]
    return exc
