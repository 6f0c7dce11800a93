"""One asyncpg connection: how it is opened (session settings), its
statements, transactions and savepoints, LISTEN and termination callbacks."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
import trio
import trio_asyncio

from .bridge import _bridge, _terminate
from .errors import ConnectionLost, DatabaseError, QueryError, _protocol_state_unknown

# The whole database layer logs as awa_trio.db, the name logging configs use.
log = logging.getLogger("awa_trio.db")

#: How long shielded cleanup (rollback, release, close) may take after a cancel.
CLEANUP_TIMEOUT = 5.0


def _process_identity() -> str:
    """``<host>:<pid>``, so pg_stat_activity (and ``status``) can tell which
    awa_trio process a session belongs to. PostgreSQL keeps 63 bytes of an
    application_name: the host is cut to leave room for the rest."""
    import os
    import socket

    return f"{socket.gethostname()[:32]}:{os.getpid()}"


#: Pool connections: ``awa_trio <host>:<pid>``.
APPLICATION_NAME = f"awa_trio {_process_identity()}"


#: Startup parameters every pooler passes on. PgBouncer refuses any other
#: in the startup packet unless listed in its ignore_startup_parameters
#: (jit, tcp_keepalives_idle, ...), so the rest are SET after connecting.
STARTUP_PARAMETERS = frozenset({"application_name"})


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


def _the_row(row: asyncpg.Record | None, sql: str) -> asyncpg.Record:
    """See ``fetchone``."""
    if row is None:
        first_line = sql.strip().splitlines()[0] if sql.strip() else sql
        raise QueryError(f"a statement that always returns one row returned none: {first_line}")
    return row


def rows_affected(command_tag: str) -> int:
    """The row count of a command tag such as ``DELETE 12`` or ``INSERT 0 3``."""
    return int(command_tag.rsplit(" ", 1)[-1])
