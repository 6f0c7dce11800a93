"""A :class:`Database` (one trio-asyncio loop and one pool of connections)
and :func:`open_database`, which opens it, probes for a transaction-mode
pooler, and closes it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
import trio
import trio_asyncio

from ..logs import redact_url
from ..sql import Statement
from .bridge import _bridge, _log_orphaned_error, _run_wakes_inline
from .connection import APPLICATION_NAME, CLEANUP_TIMEOUT, Connection, _connect, _the_row
from .errors import (
    CLOSED_MESSAGE,
    ConnectionLost,
    DatabaseClosed,
    DatabaseError,
    InvalidDatabaseURL,
    QueryError,
    sole_exception,
)
from .pool import IDLE_CONNECTION_LIFETIME, _Pool

DEFAULT_CONNECT_TIMEOUT = 10.0


PID_SQL = Statement("SELECT pg_backend_pid()")


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
            first_pid = await first.fetchval(*PID_SQL.bind())
            second_pid = await second.fetchval(*PID_SQL.bind())
            first_pid_again = await first.fetchval(*PID_SQL.bind())
        finally:
            await second.close()
    finally:
        await first.close()
    return bool(first_pid == second_pid or first_pid != first_pid_again)


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
