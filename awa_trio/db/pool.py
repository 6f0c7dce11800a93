"""The connection pool, on the Trio side.

Borrowing and returning a connection is a list operation, not a crossing of
the bridge. asyncpg's own pool cost about 170 us of CPU per statement under
trio-asyncio (a shielded release task and an idle timer re-armed on every
release), about as much as the statement itself; an idle leader sends tens
of statements a second.
"""

from __future__ import annotations

import math
from typing import Any

import asyncpg
import trio
import trio_asyncio

from .bridge import _terminate
from .connection import Connection, _connect
from .errors import CLOSED_MESSAGE, DatabaseClosed

#: A pooled connection idle this long is closed. Longer than any default
#: branch interval (60 s): the branches that tick together every 30 or 60 s
#: reuse their connections instead of opening new ones each time (with 10 s,
#: an idle leader opened a connection every 7.5 s). A service that is not
#: leading drops its idle connections at once (Database.drop_idle_connections),
#: so a follower holds only its election connection.
IDLE_CONNECTION_LIFETIME = 300.0


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
    finally), so nothing is reset on return (asyncpg's default reset would
    be one statement in five on an idle leader)."""

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
