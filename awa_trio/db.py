"""asyncpg, driven from Trio through trio-asyncio.

This is the only module that touches asyncpg or asyncio. It owns one
trio-asyncio loop and one pool of asyncpg connections per :class:`Database`.
A statement's driver coroutine is stepped from the calling Trio task itself
(:func:`_drive`), without an asyncio task; connecting, closing and LISTEN run
as asyncio tasks (``loop.run_aio_coroutine``). Either way a Trio cancel scope
that fires mid-query cancels what the driver waits on, and asyncpg then
sends a cancel request to the server (the query stops there too, not just
here).

The pool lives on the Trio side: borrowing and returning a connection is a
list operation, not a crossing. asyncpg's own pool cost about 170 us of CPU
per statement under trio-asyncio (a shielded release task and an idle timer
re-armed on every release), about as much as the statement itself; an idle
leader sends tens of statements a second.

Errors come out as :class:`DatabaseError` subclasses that keep the SQLSTATE.

Errors nobody awaits (asyncpg finishing a connection release in a task of
its own after a cancel, a connection attempt dying with the network) reach
the loop's exception handler. trio-asyncio's default handler re-raises them
into the loop's nursery, which would end the whole service over a socket
that was already lost; here they are logged instead (at debug level when
they are the echo of a lost connection that its user reports anyway).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
import trio
import trio_asyncio

from .errors import ConfigError
from .logs import redact_url

log = logging.getLogger(__name__)

#: How long shielded cleanup (rollback, release, close) may take after a cancel.
CLEANUP_TIMEOUT = 5.0
DEFAULT_CONNECT_TIMEOUT = 10.0
#: A pooled connection idle this long is closed. Longer than any default
#: branch interval (60 s): the branches that tick together every 30 or 60 s
#: reuse their connections instead of opening new ones each time (with 10 s,
#: an idle leader opened a connection every 7.5 s). A service that is not
#: leading drops its idle connections at once (Database.drop_idle_connections),
#: so a follower holds only its election connection.
IDLE_CONNECTION_LIFETIME = 300.0


def _process_identity() -> str:
    """``<host>:<pid>``, so pg_stat_activity (and ``status``) can tell which
    awa_trio process a session belongs to. PostgreSQL keeps 63 bytes of an
    application_name: the host is cut to leave room for the rest."""
    import os
    import socket

    return f"{socket.gethostname()[:32]}:{os.getpid()}"


#: Pool connections: ``awa_trio <host>:<pid>``.
APPLICATION_NAME = f"awa_trio {_process_identity()}"

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


#: Tables another session holds ACCESS EXCLUSIVE (the lock DDL takes).
EXCLUSIVE_HOLDERS_SQL = """
    SELECT DISTINCT n.nspname, c.relname
    FROM pg_locks l
    JOIN pg_class c ON c.oid = l.relation
    JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE l.locktype = 'relation' AND l.granted AND l.mode = 'AccessExclusiveLock'
      AND l.pid <> pg_backend_pid()
      AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
    ORDER BY 1, 2
"""


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
            rows = await db.fetch(EXCLUSIVE_HOLDERS_SQL)
        except DatabaseError:
            return None
        named = [f"{row[0]}.{row[1]}" for row in rows if row[1] in words]
        return ", ".join(named) or None
    return None


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


def rows_affected(command_tag: str) -> int:
    """The row count of a command tag such as ``DELETE 12`` or ``INSERT 0 3``."""
    return int(command_tag.rsplit(" ", 1)[-1])


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


#: Startup parameters every pooler passes on. PgBouncer refuses any other
#: in the startup packet unless listed in its ignore_startup_parameters
#: (jit, tcp_keepalives_idle, ...), so the rest are SET after connecting.
STARTUP_PARAMETERS = frozenset({"application_name"})

PID_SQL = "SELECT pg_backend_pid()"


def _session_settings_sql(settings: dict[str, str]) -> str:
    """One simple-protocol round trip of SETs (our own names and constants)."""
    return "; ".join(
        f"SET {_setting_name(name)} = '{value.replace(chr(39), chr(39) * 2)}'"
        for name, value in settings.items()
    )


async def _connect(
    loop: trio_asyncio.TrioEventLoop, dsn: str, connect_kwargs: dict[str, Any], *, transaction_pooled: bool
) -> asyncpg.Connection:
    """A connection with our session settings: the startup packet carries
    only STARTUP_PARAMETERS, the rest follow as SETs, or, through a
    transaction-mode pooler, nothing (a SET would land on whichever server
    session the pooler lends and stay there for other clients); there the
    statement cache is off too (a named prepared statement lives on one
    server session)."""
    kwargs = dict(connect_kwargs)
    settings = dict(kwargs.pop("server_settings", {}))
    startup = {name: value for name, value in settings.items() if name in STARTUP_PARAMETERS}
    session = {name: value for name, value in settings.items() if name not in STARTUP_PARAMETERS}
    if transaction_pooled:
        kwargs["statement_cache_size"] = 0
        session = {}
    raw = await _bridge(loop, asyncpg.connect, dsn, server_settings=startup, **kwargs)
    try:
        await _bridge(loop, _init_connection, raw, session)
    except BaseException:
        _terminate(raw)
        raise
    return raw


async def _init_connection(conn: asyncpg.Connection, session_settings: dict[str, str]) -> None:
    if session_settings:
        await conn.execute(_session_settings_sql(session_settings))
    # jsonb/json as Python objects; arrays of jsonb (awa's errors column) follow.
    for type_name in ("jsonb", "json"):
        await conn.set_type_codec(type_name, encoder=json.dumps, decoder=json.loads, schema="pg_catalog")


class _Pool:
    """Up to ``max_size`` pooled connections, the most recently returned
    lent first; one idle for ``idle_lifetime`` is closed (by
    :meth:`close_idle_connections`), so a follower, which uses the pool for
    nothing, ends up holding none.

    A returned connection is kept only when its session is known to be
    clean: the borrower finished, or the server refused a statement (the
    driver has read the whole reply by then), and no transaction is open.
    Anything else (a cancel mid-statement, a lost connection, an unexpected
    error) is handed to :meth:`close_discarded_connections`, a task of the
    database's nursery, which closes it (asyncpg first finishes sending the
    cancel request, so the statement stops on the server too): a later
    borrower never inherits a half-cancelled statement or an open
    transaction. awa_trio leaves no other session state
    on pooled connections (settings are SET LOCAL, LISTEN uses dedicated
    connections, the batch runner unlocks its session lock in a shielded
    finally), so nothing is reset on return (asyncpg's default reset was
    one statement in five on an idle leader)."""

    def __init__(
        self,
        loop: trio_asyncio.TrioEventLoop,
        dsn: str,
        connect_kwargs: dict[str, Any],
        max_size: int,
        idle_lifetime: float,
        statement_lock_timeout: str | None = None,
    ):
        self._loop = loop
        self._dsn = dsn
        self._connect_kwargs = connect_kwargs
        self.statement_lock_timeout = statement_lock_timeout
        self._free_slots = trio.Semaphore(max(1, max_size))
        #: (connection, trio time it came back), oldest first.
        self._idle: list[tuple[asyncpg.Connection, float]] = []
        self._idle_lifetime = idle_lifetime
        self._returned = trio.Event()
        self._closed = False
        #: The URL leads to a transaction-mode pooler (see Database.use_transaction_pooling).
        self.transaction_pooled = False
        # Connections to close: release() runs in finally blocks of cancelled
        # tasks, so it only queues them; closing takes round trips.
        self._discard, self._discarded = trio.open_memory_channel[asyncpg.Connection](math.inf)

    async def connect(self) -> asyncpg.Connection:
        kwargs = self._connect_kwargs
        if self.statement_lock_timeout is not None:
            # A session setting here (no round trip per statement); behind a
            # transaction-mode pooler, per transaction (transaction_lock_timeout).
            settings = dict(kwargs.get("server_settings", {}), lock_timeout=self.statement_lock_timeout)
            kwargs = dict(kwargs, server_settings=settings)
        return await _connect(self._loop, self._dsn, kwargs, transaction_pooled=self.transaction_pooled)

    @property
    def transaction_lock_timeout(self) -> str | None:
        """The ``lock_timeout`` each transaction sets for itself: behind a
        transaction-mode pooler a session setting would not stay with us."""
        return self.statement_lock_timeout if self.transaction_pooled else None

    async def acquire(self) -> asyncpg.Connection:
        if self._closed:
            raise DatabaseClosed(CLOSED_MESSAGE)
        try:
            # No checkpoint of its own when a slot is free (the statement that
            # follows checkpoints): one scheduler pass less per statement.
            self._free_slots.acquire_nowait()
        except trio.WouldBlock:
            await self._free_slots.acquire()
        try:
            while self._idle:
                raw, _returned_at = self._idle.pop()
                if not raw.is_closed():
                    return raw
            return await self.connect()
        except BaseException:
            self._free_slots.release()
            raise

    @property
    def closed(self) -> bool:
        return self._closed

    def release(self, raw: asyncpg.Connection, *, clean: bool) -> None:
        self._free_slots.release()
        if clean and not self._closed and not raw.is_closed() and not raw.is_in_transaction():
            self._idle.append((raw, trio.current_time()))
            self._returned.set()
        elif raw.is_closed() or self._closed:
            _terminate(raw)  # a socket that is gone, or nobody left to close it politely
        else:
            self._discard.send_nowait(raw)

    def drop_idle_connections(self) -> None:
        """Close every idle connection now (through the discard task)."""
        idle, self._idle = self._idle, []
        for raw, _returned_at in idle:
            self._discard.send_nowait(raw)

    async def close_discarded_connections(self) -> None:
        """Close each discarded connection politely, bounded, concurrently
        (until cancelled; what is left then is aborted by :meth:`close`)."""

        async def close_one(raw: asyncpg.Connection) -> None:
            await Connection(raw, self._loop).close()

        async with trio.open_nursery() as nursery:
            async for raw in self._discarded:
                nursery.start_soon(close_one, raw)

    async def close_idle_connections(self) -> None:
        """Close each connection once it has been idle for the lifetime
        (until cancelled). Wakes about once per lifetime, not per release."""
        while True:
            if not self._idle:
                self._returned = trio.Event()
                await self._returned.wait()
                continue
            raw, returned_at = self._idle[0]
            expires = returned_at + self._idle_lifetime
            if trio.current_time() < expires:
                await trio.sleep_until(expires)
                continue
            self._idle.pop(0)
            await Connection(raw, self._loop).close()

    async def close(self) -> None:
        """Close every idle connection (a borrowed one is aborted when it
        comes back)."""
        self._closed = True
        idle, self._idle = self._idle, []
        for raw, _returned_at in idle:
            await Connection(raw, self._loop).close()
        while True:
            try:
                _terminate(self._discarded.receive_nowait())
            except trio.WouldBlock:
                break


#: asyncpg's isolation names, as SQL.
_ISOLATION_SQL = {
    "read_committed": "READ COMMITTED",
    "read_uncommitted": "READ UNCOMMITTED",
    "repeatable_read": "REPEATABLE READ",
    "serializable": "SERIALIZABLE",
}


def _setting_name(name: str) -> str:
    if not name.replace("_", "").isalnum():
        raise ValueError(f"not a setting name: {name!r}")
    return name


def _setting_value(value: str) -> str:
    if not value.replace("_", "").replace(".", "").isalnum():
        raise ValueError(f"not a plain setting value: {value!r}")
    return value


class Connection:
    """One asyncpg connection; every call crosses the bridge."""

    def __init__(
        self,
        raw: asyncpg.Connection,
        loop: trio_asyncio.TrioEventLoop,
        *,
        transaction_lock_timeout: str | None = None,
    ):
        self._raw = raw
        self._loop = loop
        self._manual_transaction = False
        self._committed = False
        self._backend_pid: int | None = None
        self._savepoints = 0
        #: SET LOCAL in every outermost transaction (with its BEGIN, no round
        #: trip of its own); a statement outside one gets a transaction of its own.
        self._transaction_lock_timeout = transaction_lock_timeout

    async def _call(self, func: Callable[..., Awaitable[Any]], *args: Any, **kwargs: Any) -> Any:
        try:
            # A statement sent while the driver still waits for an earlier
            # cancel to settle waits inside asyncio.timeout, which needs a Task.
            direct = not self._raw._protocol._is_cancelling()
            return await _bridge(self._loop, func, *args, direct=direct, **kwargs)
        except ConnectionLost as exc:
            if _protocol_state_unknown(exc):
                # Never send another statement into a confused protocol: the
                # connection reports closed from now on, so callers reconnect.
                _terminate(self._raw)
            raise

    async def _statement(self, func: Callable[..., Awaitable[Any]], sql: str, *args: Any) -> Any:
        if self._transaction_lock_timeout is not None and not self._raw.is_in_transaction():
            async with self.transaction():
                return await self._call(func, sql, *args)
        return await self._call(func, sql, *args)

    async def fetch(self, sql: str, *args: Any) -> list[asyncpg.Record]:
        result: list[asyncpg.Record] = await self._statement(self._raw.fetch, sql, *args)
        return result

    async def fetchrow(self, sql: str, *args: Any) -> asyncpg.Record | None:
        return await self._statement(self._raw.fetchrow, sql, *args)

    async def fetchone(self, sql: str, *args: Any) -> asyncpg.Record:
        """The row of a statement that always returns exactly one (an
        aggregate, a singleton table): none is a ``QueryError``, so callers
        index it without a None check."""
        return _the_row(await self.fetchrow(sql, *args), sql)

    async def fetchval(self, sql: str, *args: Any) -> Any:
        return await self._statement(self._raw.fetchval, sql, *args)

    async def execute(self, sql: str, *args: Any) -> str:
        result: str = await self._statement(self._raw.execute, sql, *args)
        return result

    @property
    def backend_pid(self) -> int:
        """The server backend's pid: as read by :meth:`note_backend_pid`, else
        from the startup reply (which a pooler fakes: PgBouncer's is its own)."""
        if self._backend_pid is not None:
            return self._backend_pid
        pid: int = self._raw.get_server_pid()
        return pid

    def note_backend_pid(self, pid: int) -> None:
        """Record ``pg_backend_pid()`` as read through this connection."""
        self._backend_pid = pid

    @property
    def server_address(self) -> str:
        """``host:port`` (or the socket path) this connection reached: with a
        multi-host URL, the host that answered."""
        address = getattr(self._raw, "_addr", None)
        if isinstance(address, tuple) and len(address) >= 2:
            return f"{address[0]}:{address[1]}"
        return str(address) if address else "the server"

    def is_closed(self) -> bool:
        closed: bool = self._raw.is_closed()
        return closed

    async def listen(self, channel: str, callback: Callable[[str], None]) -> None:
        """LISTEN on ``channel``; ``callback(payload)`` runs in Trio (soon
        after) for every notification that arrives while the connection is idle."""
        token = trio.lowlevel.current_trio_token()

        def on_notification(_conn: Any, _pid: int, _channel: str, payload: str) -> None:
            try:
                token.run_sync_soon(callback, payload)
            except trio.RunFinishedError:
                pass

        await _bridge(self._loop, self._raw.add_listener, channel, on_notification)

    def on_termination(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (in Trio, soon after) when the connection closes
        for any reason: server terminated it, socket reset, or close()."""
        token = trio.lowlevel.current_trio_token()
        self._raw.add_termination_listener(lambda _conn: token.run_sync_soon(callback))

    @asynccontextmanager
    async def transaction(
        self, *, isolation: str | None = None, local_settings: dict[str, str] | None = None
    ) -> AsyncIterator[Connection]:
        """Commit on success; roll back (shielded, bounded) on any error or cancel.
        ``isolation`` (asyncpg's names, e.g. ``read_committed``) goes into the
        BEGIN itself, so it costs no statement of its own; so do
        ``local_settings`` (``SET LOCAL`` for this transaction only; names and
        values are our own constants, never user input), sent with the BEGIN
        in one simple-protocol round trip. Such a transaction may end with
        :meth:`commit_with`. Nested inside one, it is a savepoint."""
        if self._manual_transaction:
            async with self._savepoint():
                yield self
            return
        if self._transaction_lock_timeout is not None and not self._raw.is_in_transaction():
            local_settings = {"lock_timeout": self._transaction_lock_timeout, **(local_settings or {})}
        self._committed = False
        if local_settings:
            begin = "BEGIN" + (f" ISOLATION LEVEL {_ISOLATION_SQL[isolation]}" if isolation else "")
            begin += "".join(
                f"; SET LOCAL {_setting_name(name)} = '{_setting_value(value)}'"
                for name, value in local_settings.items()
            )
            start, commit, rollback = (
                lambda: self._raw.execute(begin),
                lambda: self._raw.execute("COMMIT"),
                lambda: self._raw.execute("ROLLBACK"),
            )
            self._manual_transaction = True
        else:
            tx = self._raw.transaction(isolation=isolation)
            start, commit, rollback = tx.start, tx.commit, tx.rollback
        try:
            await self._call(start)
            try:
                yield self
            except BaseException:
                with trio.move_on_after(CLEANUP_TIMEOUT, shield=True):
                    try:
                        await self._call(rollback)
                    except DatabaseError as exc:
                        log.debug("rollback failed: %s", exc)
                raise
            else:
                if not self._committed:
                    await self._call(commit)
        finally:
            self._manual_transaction = False

    @asynccontextmanager
    async def _savepoint(self) -> AsyncIterator[None]:
        """A nested transaction inside one opened with our own BEGIN
        (asyncpg's own nesting only works under its own)."""
        self._savepoints += 1
        name = f"awa_trio_savepoint_{self._savepoints}"
        try:
            await self._call(self._raw.execute, f"SAVEPOINT {name}")
            try:
                yield
            except BaseException:
                with trio.move_on_after(CLEANUP_TIMEOUT, shield=True):
                    try:
                        await self._call(self._raw.execute, f"ROLLBACK TO SAVEPOINT {name}")
                    except DatabaseError as exc:
                        log.debug("rollback to savepoint failed: %s", exc)
                raise
            else:
                await self._call(self._raw.execute, f"RELEASE SAVEPOINT {name}")
        finally:
            self._savepoints -= 1

    async def commit_with(self, sql: str) -> None:
        """Send ``sql`` (statements without parameters, ending in COMMIT) in
        one simple-protocol round trip: the transaction's last statement and
        its commit cost one round trip, not two. Only inside a transaction
        opened with ``local_settings``; its results are not returned."""
        if not self._manual_transaction:
            raise RuntimeError("commit_with needs a transaction opened with local_settings")
        await self._call(self._raw.execute, sql)
        self._committed = True

    async def close(self) -> None:
        """Close politely, bounded and shielded; terminate if that fails."""
        with trio.move_on_after(CLEANUP_TIMEOUT, shield=True):
            try:
                await _bridge(self._loop, self._raw.close, timeout=CLEANUP_TIMEOUT)
                return
            except DatabaseError:
                pass
        _terminate(self._raw)


async def _drive(coro: Any) -> Any:
    """Step an asyncio coroutine from the calling Trio task, as an
    ``asyncio.Task`` would, without creating one.

    A statement is one driver coroutine that waits on one protocol future at
    a time. Wrapping it in a Task (``run_aio_coroutine``) costs a task
    object and three extra trips through trio-asyncio's callback queue per
    statement; an idle leader's cost is almost all such per-statement
    overhead (README, idle cost). A Trio cancel cancels the future being
    waited on, which is what ``Task.cancel`` does: the driver sees
    ``CancelledError`` where it awaits, asks the server to cancel the query,
    and the caller gets ``trio.Cancelled``. Later waits of the same call
    (the driver's own cleanup) are not cancelled again, as in asyncio."""
    task = trio.lowlevel.current_task()
    raise_cancel: Callable[[], Any] | None = None

    aborting = False

    def wake(_future: Any) -> None:
        if aborting:  # inside abort() below: Trio wants the reschedule after it
            trio.lowlevel.current_trio_token().run_sync_soon(trio.lowlevel.reschedule, task)
        else:
            trio.lowlevel.reschedule(task)

    wake.runs_inline = True  # type: ignore[attr-defined]  # see _run_wakes_inline

    # The first step sends the statement: a task already cancelled must not
    # send it (this yields only when cancelled).
    try:
        await trio.lowlevel.checkpoint_if_cancelled()
    except BaseException:
        coro.close()
        raise
    while True:
        try:
            future = coro.send(None)
        except StopIteration as done:
            if raise_cancel is not None:
                raise_cancel()
            return done.value
        except asyncio.CancelledError:
            if raise_cancel is not None:
                raise_cancel()
            raise
        if future is None:  # a bare yield (asyncio.sleep(0))
            await trio.lowlevel.cancel_shielded_checkpoint()
            continue
        future._asyncio_future_blocking = False
        future.add_done_callback(wake)

        def abort(raise_cancel_arg: Callable[[], Any], future: Any = future) -> trio.lowlevel.Abort:
            # Runs inside Trio's cancel delivery: it must never raise, or the
            # cancel is lost for the whole scope (and a stop never stops).
            nonlocal raise_cancel, aborting
            if raise_cancel is None:
                raise_cancel = raise_cancel_arg
                aborting = True
                try:
                    future.cancel()
                except Exception as exc:
                    # The asyncio loop is closed (its open_database block has
                    # exited under us): no callback will ever settle the
                    # future, so the cancel is delivered here and now.
                    log.debug("cancelling a statement on a closed loop: %s: %s", type(exc).__name__, exc)
                    return trio.lowlevel.Abort.SUCCEEDED
                finally:
                    aborting = False
            return trio.lowlevel.Abort.FAILED  # wait for the future to settle

        try:
            await trio.lowlevel.wait_task_rescheduled(abort)
        except BaseException:
            coro.close()
            raise


async def _bridge(
    loop: trio_asyncio.TrioEventLoop,
    func: Callable[..., Awaitable[Any]],
    *args: Any,
    direct: bool = False,
    **kwargs: Any,
) -> Any:
    """Run one driver call; whatever the driver raises comes out as a
    :class:`DatabaseError` (see :func:`translate_error`), so no driver error
    can end the service or look like a bug in a branch. ``direct`` steps the
    call from this Trio task (:func:`_drive`): for statements, which await
    nothing but the connection's own futures. Connecting, closing and
    listening run as asyncio tasks (they use timeouts and task identity)."""
    if loop.is_closed():
        raise DatabaseClosed(CLOSED_MESSAGE)
    try:
        if direct:
            return await _drive(func(*args, **kwargs))
        return await loop.run_aio_coroutine(func(*args, **kwargs))
    except (trio.Cancelled, KeyboardInterrupt, SystemExit):
        raise
    except (Exception, asyncio.CancelledError) as exc:
        translated = translate_error(exc, args[0] if args and isinstance(args[0], str) else None)
        if translated is None or translated is exc:
            raise
        if not isinstance(exc, (asyncpg.PostgresError, asyncpg.InterfaceError, OSError)):
            log.debug(
                "database driver raised %s, treated as %s",
                type(exc).__name__,
                type(translated).__name__,
                exc_info=exc,
            )
        raise translated from exc


def _protocol_state_unknown(exc: ConnectionLost) -> bool:
    """True when the driver's protocol state, not the socket or the server,
    is what failed (the connection may look open but must not be reused)."""
    cause = exc.__cause__
    return cause is not None and not isinstance(
        cause, (asyncpg.PostgresError, asyncpg.InterfaceError, OSError, TimeoutError, EOFError)
    )


def _the_row(row: asyncpg.Record | None, sql: str) -> asyncpg.Record:
    """See ``fetchone``."""
    if row is None:
        first_line = sql.strip().splitlines()[0] if sql.strip() else sql
        raise QueryError(f"a statement that always returns one row returned none: {first_line}")
    return row


def _terminate(raw: Any) -> None:
    """Abort a connection or pool at once (no round trip); never raises."""
    try:
        raw.terminate()
    except Exception as exc:  # the socket may already be gone, the loop closing
        log.debug("terminating a database connection failed: %s: %s", type(exc).__name__, exc)


class Database:
    """A pool of connections to one database, usable from any Trio task
    inside :func:`open_database`."""

    def __init__(
        self,
        pool: _Pool,
        loop: trio_asyncio.TrioEventLoop,
        dsn: str,
        connect_kwargs: dict[str, Any],
    ):
        self._pool = pool
        self._loop = loop
        self.dsn = dsn
        self._connect_kwargs = connect_kwargs
        self._session_dsn: str | None = None

    async def _call(self, func: Callable[..., Awaitable[Any]], *args: Any, **kwargs: Any) -> Any:
        return await _bridge(self._loop, func, *args, **kwargs)

    def drop_idle_connections(self) -> None:
        """Close the pool's idle connections now, not when they idle out: a
        service calls this whenever it is not leading, so that a follower
        holds no connection but its election one."""
        self._pool.drop_idle_connections()

    async def _pooled(self, method: str, sql: str, args: tuple[Any, ...]) -> Any:
        """One statement on a borrowed connection (``acquire`` without the
        context manager: the path every single-statement pass takes)."""
        raw = await self._pool.acquire()
        clean = False
        try:
            conn = Connection(raw, self._loop, transaction_lock_timeout=self._pool.transaction_lock_timeout)
            result = await conn._statement(getattr(raw, method), sql, *args)
            clean = True
            return result
        except QueryError:
            clean = True
            raise
        finally:
            self._pool.release(raw, clean=clean)

    async def fetch(self, sql: str, *args: Any) -> list[asyncpg.Record]:
        result: list[asyncpg.Record] = await self._pooled("fetch", sql, args)
        return result

    async def fetchrow(self, sql: str, *args: Any) -> asyncpg.Record | None:
        return await self._pooled("fetchrow", sql, args)

    async def fetchone(self, sql: str, *args: Any) -> asyncpg.Record:
        """See ``Connection.fetchone``."""
        return _the_row(await self.fetchrow(sql, *args), sql)

    async def fetchval(self, sql: str, *args: Any) -> Any:
        return await self._pooled("fetchval", sql, args)

    async def execute(self, sql: str, *args: Any) -> str:
        result: str = await self._pooled("execute", sql, args)
        return result

    @asynccontextmanager
    async def acquire(self) -> AsyncIterator[Connection]:
        """Borrow a pooled connection for several statements.

        It goes back to the pool after the borrower finished, after the
        server refused a statement, and after an exception of the borrower's
        own (not a database error, not a cancel): statements only return or
        raise once the driver has read the whole reply, so the session is
        idle then (a transaction left open is caught by the pool's check).
        A blocked prune raises its own exception every few ticks under load;
        closing its connection each time cost a reconnect (TLS negotiation
        included) each time."""
        raw = await self._pool.acquire()
        clean = False
        try:
            yield Connection(raw, self._loop, transaction_lock_timeout=self._pool.transaction_lock_timeout)
            clean = True
        except QueryError:
            clean = True
            raise
        except Exception as exc:
            clean = not isinstance(exc, DatabaseError)
            raise
        finally:
            self._pool.release(raw, clean=clean)

    @asynccontextmanager
    async def transaction(
        self, *, isolation: str | None = None, local_settings: dict[str, str] | None = None
    ) -> AsyncIterator[Connection]:
        """A pooled connection inside one transaction."""
        async with (
            self.acquire() as conn,
            conn.transaction(isolation=isolation, local_settings=local_settings),
        ):
            yield conn

    async def connect_dedicated(
        self,
        *,
        application_name: str = APPLICATION_NAME,
        server_settings: dict[str, str] | None = None,
        dsn: str | None = None,
    ) -> Connection:
        """A connection outside the pool (the leader lock lives on one), with
        extra session settings, to ``dsn`` (a direct URL beside a pooled
        one) or the pool's URL. The caller must ``close()`` it."""
        if self._pool.closed:
            raise DatabaseClosed(CLOSED_MESSAGE)
        kwargs = dict(self._connect_kwargs)
        settings = dict(kwargs.pop("server_settings", {}))
        settings.update(server_settings or {})
        settings["application_name"] = application_name
        kwargs["server_settings"] = settings
        raw = await _connect(
            self._loop, dsn or self.dsn, kwargs, transaction_pooled=dsn is None and self.transaction_pooled
        )
        return Connection(raw, self._loop)

    @property
    def transaction_pooled(self) -> bool:
        """Whether the pool's URL leads to a transaction-mode pooler (probed
        at open: then pooled connections carry no session settings and no
        statement cache)."""
        return self._pool.transaction_pooled

    def use_session_dsn(self, session_dsn: str | None) -> None:
        """Behind a transaction-mode pooler, :meth:`acquire_session`
        connects to ``session_dsn``, a direct URL."""
        self._session_dsn = session_dsn

    @asynccontextmanager
    async def acquire_session(self, application_name: str = APPLICATION_NAME) -> AsyncIterator[Connection]:
        """A connection whose server session stays the same from statement
        to statement (for a session-level advisory lock): a pooled one, or,
        behind a transaction-mode pooler, a dedicated one to the direct URL."""
        if not self.transaction_pooled:
            async with self.acquire() as conn:
                yield conn
            return
        if self._session_dsn is None:
            raise ConnectionLost(
                "no direct URL for a session behind a transaction-mode pooler (set lock_database_url)"
            )
        lock_timeout = self._pool.statement_lock_timeout
        conn = await self.connect_dedicated(
            application_name=application_name,
            dsn=self._session_dsn,
            server_settings=None if lock_timeout is None else {"lock_timeout": lock_timeout},
        )
        try:
            yield conn
        finally:
            with trio.move_on_after(CLEANUP_TIMEOUT, shield=True):
                await conn.close()

    async def shares_server_sessions(self, dsn: str | None = None) -> bool:
        """See :func:`_shares_server_sessions` (default: the pool's URL)."""
        return await _shares_server_sessions(self._loop, dsn or self.dsn, self._connect_kwargs)


@asynccontextmanager
async def open_database(
    dsn: str,
    *,
    pool_size: int = 8,
    lock_timeout: float | None = None,
    statement_lock_timeout: float | None = None,
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
    application_name: str = APPLICATION_NAME,
    idle_connection_lifetime: float = IDLE_CONNECTION_LIFETIME,
) -> AsyncIterator[Database]:
    """Open the trio-asyncio loop and an asyncpg pool; close both on exit.
    A pooled connection left idle for ``idle_connection_lifetime`` is closed.

    ``lock_timeout`` is the session setting of every connection;
    ``statement_lock_timeout`` replaces it for the pool's (the statements
    maintenance runs): a session setting on a direct connection, set per
    transaction behind a transaction-mode pooler.

    Raises :class:`ConnectionLost` for an unreachable server and
    :class:`QueryError` for a server that refuses us (bad database, role).
    A malformed DSN raises :class:`ConnectionLost` too, with asyncpg's reason.
    """
    # JIT off: maintenance statements are short OLTP queries, but one over
    # every partition of the queue-storage rings is costed high enough to be
    # JIT-compiled, which took 11 s per pass here (uninterruptible, so a
    # cancelled pass took as long).
    # READ COMMITTED whatever the database's default: statements that wait for
    # a lock and then rely on a fresh snapshot in the next statement (the
    # lane-order invariant in queue_storage/promote.py, every lock-then-re-check
    # of prunes and rescues) would otherwise see the transaction's first
    # snapshot again under a REPEATABLE READ default.
    settings = {
        "application_name": application_name,
        "jit": "off",
        "default_transaction_isolation": "read committed",
    }
    if lock_timeout is not None:
        settings["lock_timeout"] = f"{int(lock_timeout * 1000)}ms"
    connect_kwargs: dict[str, Any] = {"timeout": connect_timeout, "server_settings": settings}
    pool_lock_timeout = None if statement_lock_timeout is None else milliseconds(statement_lock_timeout)
    try:
        async with _open_database(
            dsn, pool_size, idle_connection_lifetime, connect_kwargs, pool_lock_timeout
        ) as database:
            yield database
    except BaseExceptionGroup as group:
        # trio-asyncio's loop runs in a nursery of its own, which wraps whatever
        # the body raised; that nursery is our implementation detail, so a
        # lone exception leaves here unwrapped.
        sole = sole_exception(group)
        if sole is None:
            raise
        raise sole from sole.__cause__


def milliseconds(seconds: float) -> str:
    """A duration as a PostgreSQL setting value, at least 1 ms (0 would mean none)."""
    return f"{max(1, round(seconds * 1000))}ms"


def _log_orphaned_error(loop: Any, context: dict[str, Any]) -> None:
    """asyncio exception handler: log what no caller awaited (see module doc)."""
    exception = context.get("exception")
    message = context.get("message") or "unhandled error in the asyncio loop"
    # A lost connection echoes here (asyncpg's own release or close task);
    # whoever used the connection has already reported the loss.
    echo = exception is not None and isinstance(translate_error(exception), ConnectionLost)
    log.log(
        logging.DEBUG if echo else logging.WARNING,
        "database driver: %s: %s",
        message,
        f"{type(exception).__name__}: {exception}" if exception is not None else "(no exception)",
    )


def sole_exception(group: BaseExceptionGroup) -> BaseException | None:
    """The only leaf of a (possibly nested) exception group, or None."""
    exc: BaseException = group
    while isinstance(exc, BaseExceptionGroup):
        if len(exc.exceptions) != 1:
            return None
        exc = exc.exceptions[0]
    return exc


async def _shares_server_sessions(
    loop: trio_asyncio.TrioEventLoop, dsn: str, connect_kwargs: dict[str, Any]
) -> bool:
    """True when two open sessions of ``dsn`` share one server backend, or
    one session moves between backends: the URL leads to a transaction- or
    statement-mode pooler (directly, or through a session-mode pooler,
    neither can happen). Two probe connections without a statement cache
    (a named statement left on a pooled server session by an earlier client
    would collide), three statements."""
    kwargs = dict(connect_kwargs, statement_cache_size=0)
    kwargs["server_settings"] = {"application_name": f"{APPLICATION_NAME} pooler probe"}
    first = Connection(await _bridge(loop, asyncpg.connect, dsn, **kwargs), loop)
    try:
        second = Connection(await _bridge(loop, asyncpg.connect, dsn, **kwargs), loop)
        try:
            first_pid = await first.fetchval(PID_SQL)
            second_pid = await second.fetchval(PID_SQL)
            first_pid_again = await first.fetchval(PID_SQL)
        finally:
            await second.close()
    finally:
        await first.close()
    return bool(first_pid == second_pid or first_pid != first_pid_again)


def _run_wakes_inline(loop: trio_asyncio.TrioEventLoop) -> None:
    """A settled future schedules its callbacks with ``loop.call_soon``; on
    trio-asyncio each is one more pass of Trio's scheduler before it runs.
    :func:`_drive`'s callback only reschedules a Trio task (no asyncio code
    runs in it, so nothing can re-enter), so it runs at once instead: one
    scheduler pass less per statement."""
    queue_soon = loop.call_soon

    def call_soon(callback: Callable[..., Any], *args: Any, context: Any = None) -> Any:
        if getattr(callback, "runs_inline", False):
            callback(*args)
            return None
        return queue_soon(callback, *args, context=context)

    loop.call_soon = call_soon


@asynccontextmanager
async def _open_database(
    dsn: str,
    pool_size: int,
    idle_connection_lifetime: float,
    connect_kwargs: dict[str, Any],
    statement_lock_timeout: str | None = None,
) -> AsyncIterator[Database]:
    async with trio_asyncio.open_loop() as loop:
        loop.set_exception_handler(_log_orphaned_error)
        _run_wakes_inline(loop)
        pool = _Pool(loop, dsn, connect_kwargs, pool_size, idle_connection_lifetime, statement_lock_timeout)
        try:
            # Before any statement of the pool's: behind a transaction-mode
            # pooler even the first must go without a statement cache. The
            # probe's connections also show a bad server at once.
            pool.transaction_pooled = await _shares_server_sessions(loop, dsn, connect_kwargs)
            # One connection at start (a service drops it once it knows it
            # is following).
            pool.release(await pool.acquire(), clean=True)
        except ConnectionLost as exc:
            # asyncpg's DSN parser reports a malformed URL as a ValueError
            # (ClientConfigurationError is one too): a usage error, not an
            # outage. A refused certificate is a ValueError too, but an OSError.
            if isinstance(exc.__cause__, ValueError) and not isinstance(exc.__cause__, OSError):
                raise InvalidDatabaseURL(f"invalid database URL {redact_url(dsn)}: {exc.__cause__}") from exc
            raise
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(pool.close_idle_connections)
                nursery.start_soon(pool.close_discarded_connections)
                yield Database(pool, loop, dsn, connect_kwargs)
                nursery.cancel_scope.cancel()
        finally:
            await pool.close()
