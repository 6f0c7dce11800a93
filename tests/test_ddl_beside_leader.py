"""An operator's DDL always wins against a busy leader (issue 28).

Each test runs real DDL (awa-pg's installer with ``reset=True``, awa-pg's
migrator on a dropped schema, the staged-transition commands, ``ALTER TABLE
... ADD COLUMN`` on every table) while awa_trio leads with every branch due
(rescues, promotion, rings rotating) and an awa-pg worker takes jobs. The
DDL must never fail (before statement_lock_timeout, the installer lost about
one reset in twenty to ``deadlock detected``), and maintenance must resume
afterwards: a job that comes due is promoted.
"""

from __future__ import annotations

import asyncio
import random

import pytest
import trio
from support.ddl import INSERT_TARGET_RUNTIME_SQL, YieldLog, busy_leader, promotion_lag

from awa_trio.db import open_database

RESETS = 20
ALTER_ROUNDS = 3

TABLES_SQL = """
    SELECT format('%I.%I', n.nspname, c.relname)
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE n.nspname = ANY($1::text[]) AND c.relkind IN ('r', 'p') AND NOT c.relispartition
    ORDER BY 1
"""
STORAGE_SQL = "SELECT active_engine, state, details->>'schema' FROM awa.storage_status()"


async def in_thread(fn, *args, **kwargs):
    return await trio.to_thread.run_sync(lambda: fn(*args, **kwargs))


@pytest.fixture(params=["canonical", "queue_storage"])
def engine_url(request):
    """A fresh database on either engine."""
    return request.getfixturevalue("database_url" if request.param == "canonical" else "qs_database_url")


@pytest.fixture
def engine_client(engine_url):
    import awa

    client = awa.Client(engine_url)
    yield client
    del client


async def wait_for_engine(service, engine: str, timeout: float = 20.0) -> None:
    with trio.fail_after(timeout):
        while not (service.is_leader and service.schema is not None and service.schema.engine == engine):
            await trio.sleep(0.05)


async def test_installer_reset_20_times_beside_a_busy_leader(database_url, db, awa_client):
    """awa-pg's ``install_queue_storage(reset=True)``: abort, DROP SCHEMA
    CASCADE, migrations, CREATE, TRUNCATE of every queue-storage table and
    activation. The first switches the canonical database to queue storage
    under the leader; the other 19 reset the schema it leads."""
    async with YieldLog().attached() as yields, busy_leader(database_url, awa_client) as busy:
        for _ in range(RESETS):
            async with busy.producer.paused():
                await in_thread(awa_client.install_queue_storage, schema="awa_ddl", reset=True)
            await trio.sleep(random.uniform(0.1, 0.3))
        assert tuple(await db.fetchrow(STORAGE_SQL)) == ("queue_storage", "active", "awa_ddl")
        await wait_for_engine(busy.service, "queue_storage")
        await promotion_lag(awa_client, db)
    assert not [e for e in yields.errors if "40P01" in e], yields.errors


async def test_migrate_from_nothing_beside_a_leader(engine_url, engine_client):
    """The awa schema dropped (CASCADE) under a busy leader and migrated
    again from nothing by awa-pg's migrator: neither fails, the leader steps
    down while the schema is gone and leads the new one. The migrator and
    the check afterwards use clients of their own, as an operator's
    ``awa migrate`` would: a client that knew the old schema keeps type ids
    of the dropped one ("cache lookup failed for type")."""
    import awa

    async with open_database(engine_url) as db, busy_leader(engine_url, engine_client) as busy:
        await trio.sleep(0.5)
        schemas = {"awa"} | {(await db.fetchrow(STORAGE_SQL))[2] or "awa"}
        async with busy.producer.paused():
            for schema in sorted(schemas):
                await db.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
            await in_thread(lambda: awa.Client(engine_url).migrate())
        await wait_for_engine(busy.service, "canonical", timeout=30)
        await promotion_lag(awa.Client(engine_url), db)


async def test_staged_transition_beside_a_busy_leader(database_url, db, awa_client):
    """prepare (awa-pg's schema preparation, then storage_prepare), enter
    and finalize while the leader maintains the canonical engine, then the
    queue-storage engine."""
    import awa

    async with busy_leader(database_url, awa_client) as busy:
        await trio.sleep(0.5)
        async with busy.producer.paused():
            await trio.to_thread.run_sync(
                lambda: asyncio.run(awa.AsyncClient(database_url).prepare_queue_storage_schema(schema="awa"))
            )
            assert await db.fetchval(PREPARE_SQL) == "prepared"
        await db.execute(INSERT_TARGET_RUNTIME_SQL)
        await trio.sleep(0.5)
    # The canonical worker is gone (a live canonical runtime blocks both
    # commands); the leader keeps running through them.
    await db.execute("DELETE FROM awa.runtime_instances WHERE transition_role <> 'queue_storage_target'")
    async with busy_leader(database_url, awa_client, worker=False) as busy:
        async with busy.producer.paused():
            await db.execute("DELETE FROM awa.jobs_hot; DELETE FROM awa.scheduled_jobs")
            assert await db.fetchval(ENTER_MIXED_SQL) == "mixed_transition"
        await wait_for_engine(busy.service, "queue_storage")
        await trio.sleep(0.5)
        with trio.fail_after(20):
            while await db.fetchval("SELECT awa.canonical_live_backlog()") != 0:
                await trio.sleep(0.1)
        async with busy.producer.paused():
            assert await db.fetchval(FINALIZE_SQL) == "active"
        await promotion_lag(awa_client, db)


async def test_alter_table_add_column_on_every_table_beside_a_busy_leader(engine_url, engine_client):
    """``ALTER TABLE ... ADD COLUMN`` on every table of the awa schemas, all
    in one transaction as a migration would (ACCESS EXCLUSIVE taken table
    by table, in an order of its own), three rounds in three orders."""
    async with (
        open_database(engine_url) as db,
        YieldLog().attached() as yields,
        busy_leader(engine_url, engine_client) as busy,
    ):
        await trio.sleep(0.5)
        schemas = sorted({"awa", (await db.fetchrow(STORAGE_SQL))[2] or "awa"})
        tables = [row[0] for row in await db.fetch(TABLES_SQL, schemas)]
        assert len(tables) > 20, tables
        for round_ in range(ALTER_ROUNDS):
            order = tables[::-1] if round_ == 1 else random.sample(tables, len(tables))
            async with busy.producer.paused(), db.transaction() as conn:
                for table in order:
                    await conn.execute(f"ALTER TABLE {table} ADD COLUMN ddl_probe_{round_} integer")
        await promotion_lag(engine_client, db)
    assert not [e for e in yields.errors if "40P01" in e], yields.errors


PREPARE_SQL = "SELECT state FROM awa.storage_prepare('queue_storage', '{\"schema\": \"awa\"}')"
ENTER_MIXED_SQL = "SELECT state FROM awa.storage_enter_mixed_transition()"
FINALIZE_SQL = "SELECT state FROM awa.storage_finalize()"
