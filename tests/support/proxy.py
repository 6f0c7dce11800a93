"""A TCP proxy in front of PostgreSQL that can freeze and cut the network,
to see what a leader does when its packets stop arriving.

``freeze()`` stops forwarding in both directions while every socket stays
open: to both ends it looks like a silent partition (no FIN, no RST).
``cut()`` closes every connection, as the server does once its TCP
keepalives give up on a vanished client. ``heal()`` forwards again; new
connections are refused while frozen.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import AsyncIterator

import trio

CHUNK = 65536


class PostgresProxy:
    def __init__(self, upstream_host: str, upstream_port: int):
        self.upstream = (upstream_host, upstream_port)
        self.port: int | None = None
        self._flowing = trio.Event()
        self._flowing.set()
        self._connections: list[trio.CancelScope] = []
        self.accepted = 0

    @property
    def frozen(self) -> bool:
        return not self._flowing.is_set()

    def freeze(self) -> None:
        if not self.frozen:
            self._flowing = trio.Event()

    def heal(self) -> None:
        self._flowing.set()

    def cut(self) -> None:
        """Close every open connection (both ends see the socket close)."""
        for scope in self._connections:
            scope.cancel()
        self._connections.clear()

    def dsn(self, database: str, user: str = "postgres") -> str:
        return f"postgresql://{user}@127.0.0.1:{self.port}/{database}"

    async def _serve(self, client: trio.SocketStream) -> None:
        if self.frozen:
            await client.aclose()
            return
        self.accepted += 1
        with trio.CancelScope() as scope:
            self._connections.append(scope)
            try:
                server = await trio.open_tcp_stream(*self.upstream)
            except OSError:
                await client.aclose()
                return
            async with client, server, trio.open_nursery() as nursery:
                nursery.start_soon(self._pump, client, server, nursery.cancel_scope)
                nursery.start_soon(self._pump, server, client, nursery.cancel_scope)
        with contextlib.suppress(ValueError):
            self._connections.remove(scope)

    async def _pump(self, source, sink, both: trio.CancelScope) -> None:
        try:
            while True:
                data = await source.receive_some(CHUNK)
                if not data:
                    break
                await self._flowing.wait()  # frozen: hold the bytes, keep the socket
                await sink.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        both.cancel()


@contextlib.asynccontextmanager
async def postgres_proxy(upstream_host: str = "127.0.0.1", upstream_port: int = 5432) -> AsyncIterator[PostgresProxy]:
    proxy = PostgresProxy(upstream_host, upstream_port)
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(
            functools.partial(trio.serve_tcp, proxy._serve, 0, host="127.0.0.1"))
        proxy.port = listeners[0].socket.getsockname()[1]
        try:
            yield proxy
        finally:
            proxy.heal()
            proxy.cut()
            nursery.cancel_scope.cancel()
