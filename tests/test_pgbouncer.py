"""Behind a real PgBouncer (Debian's, its defaults otherwise; see
support/pgbouncer.py), in session and in transaction mode.

- Session mode works with PgBouncer's default configuration: only
  application_name goes in the startup packet, the rest are SET after
  connecting (PgBouncer 1.18 refuses jit, tcp_keepalives_idle, ... there).
- Transaction mode: a session-level advisory lock taken through it would
  stay on whichever server session PgBouncer lent, so the leader refuses
  with one line unless lock_database_url reaches the server directly; with
  it, the lock (and the batch runner's) goes there and the branches run
  through the pooler without server-side prepared statements or session
  state. Never two leaders.
"""

from __future__ import annotations

import logging

import pytest
import trio
from conftest import SERVER_DSN
from support.helpers import leader_lock_holders
from support.pgbouncer import pgbouncer, pgbouncer_binary

from awa_trio import MaintenanceConfig, MaintenanceService
from awa_trio.errors import ConfigError
from awa_trio.status import collect_status

pytestmark = pytest.mark.skipif(pgbouncer_binary() is None, reason="pgbouncer is not installed (apt-get install pgbouncer)")

CONFIG = MaintenanceConfig(
    leader_election_interval=0.5, leader_check_interval=0.3, takeover_poll_interval=0.1, promote_interval=0.05
)
DUE_JOBS_SQL = """
    INSERT INTO awa.scheduled_jobs (kind, queue, state, run_at)
    SELECT 'pooled', 'pooled_q', 'scheduled', now() - interval '1 second' FROM generate_series(1, $1)
    RETURNING id
"""


@pytest.fixture
def session_pooler():
    with pgbouncer(SERVER_DSN, "session") as pooler:
        yield pooler


@pytest.fixture
def transaction_pooler():
    with pgbouncer(SERVER_DSN, "transaction") as pooler:
        yield pooler


async def promotes_due_jobs(db, count: int = 50) -> None:
    ids = [row["id"] for row in await db.fetch(DUE_JOBS_SQL, count)]
    with trio.fail_after(15):
        while await db.fetchval(
            "SELECT count(*) FROM awa.jobs WHERE id = ANY($1::bigint[]) AND state::text = 'available'", ids
        ) < count:
            await trio.sleep(0.05)


async def test_session_mode_with_pgbouncer_defaults_leads_and_promotes(database_url, db, session_pooler, caplog):
    service = MaintenanceService(session_pooler.url(database_url), CONFIG)
    with caplog.at_level(logging.INFO, logger="awa_trio"):
        async with trio.open_nursery() as nursery:
            await nursery.start(service.run)
            await service.wait_until_leader()
            await promotes_due_jobs(db)
            holders = await leader_lock_holders(db)
            assert holders == [service.lock_backend_pid]
            nursery.cancel_scope.cancel()
    assert "transaction-mode pooler" not in caplog.text
    assert "unsupported startup parameter" not in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_transaction_mode_without_a_direct_lock_url_is_refused_in_one_line(
    database_url, db, transaction_pooler
):
    service = MaintenanceService(transaction_pooler.url(database_url), CONFIG)
    with pytest.raises(ConfigError) as refused:
        await service.run()
    assert "transaction-mode pooler" in str(refused.value)
    assert "lock_database_url" in str(refused.value)
    assert await leader_lock_holders(db) == []


async def test_a_lock_url_through_a_transaction_pooler_is_refused(database_url, db, transaction_pooler):
    pooled = transaction_pooler.url(database_url)
    with pytest.raises(ConfigError, match="lock_database_url leads to a transaction-mode pooler"):
        await MaintenanceService(pooled, CONFIG, lock_database_url=pooled).run()
    assert await leader_lock_holders(db) == []


async def test_transaction_mode_leads_through_the_direct_lock_url_and_never_twice(
    database_url, db, transaction_pooler, caplog
):
    pooled = transaction_pooler.url(database_url)
    behind_pooler = MaintenanceService(pooled, CONFIG, lock_database_url=database_url)
    direct = MaintenanceService(database_url, CONFIG)
    with caplog.at_level(logging.INFO, logger="awa_trio"):
        async with trio.open_nursery() as nursery:
            await nursery.start(behind_pooler.run)
            await behind_pooler.wait_until_leader()
            assert "leads to a transaction-mode pooler" in caplog.text
            await nursery.start(direct.run)
            # Busy branches through the pooler, several connections at once.
            for _ in range(3):
                await promotes_due_jobs(db, 200)
            assert await leader_lock_holders(db) == [behind_pooler.lock_backend_pid]
            assert not direct.is_leader
            report = await collect_status(db)
            assert report["lock_holder"]["pid"] == behind_pooler.lock_backend_pid

            # Its lock is a real session on the server: ending it hands over.
            old_pid = behind_pooler.lock_backend_pid
            await db.execute("SELECT pg_terminate_backend($1)", old_pid)
            with trio.fail_after(10):
                while True:
                    holders = await leader_lock_holders(db)
                    leaders = [s.lock_backend_pid for s in (behind_pooler, direct) if s.is_leader]
                    if holders and holders != [old_pid] and leaders == holders:
                        break
                    await trio.sleep(0.02)
            nursery.cancel_scope.cancel()
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, errors
    assert "prepared statement" not in caplog.text


async def test_the_cli_refuses_a_transaction_pooler_in_one_line_and_leads_with_a_direct_lock_url(
    database_url, db, transaction_pooler
):
    import subprocess
    import sys

    pooled = transaction_pooler.url(database_url)
    refused = await trio.run_process(
        [sys.executable, "-m", "awa_trio", "--database-url", pooled],
        capture_stdout=True, capture_stderr=True, check=False,
    )
    errors = [line for line in refused.stderr.decode().splitlines() if line.startswith("awa_trio:")]
    assert refused.returncode == 2, refused.stderr.decode()
    assert len(errors) == 1 and "--lock-database-url" in errors[0]
    assert "Traceback" not in refused.stderr.decode()

    process = await trio.lowlevel.open_process(
        [sys.executable, "-m", "awa_trio", "--database-url", pooled, "--lock-database-url", database_url,
         "--promote-interval", "50ms"],
        stderr=subprocess.PIPE,
    )
    logs = b""

    async def collect() -> None:
        nonlocal logs
        async for chunk in process.stderr:
            logs += chunk

    async with trio.open_nursery() as nursery:
        nursery.start_soon(collect)
        try:
            await promotes_due_jobs(db, 20)
            assert len(await leader_lock_holders(db)) == 1
        finally:
            process.terminate()
            with trio.fail_after(10):
                await process.wait()
    assert process.returncode == 0, logs.decode()
    assert "released maintenance leader lock" in logs.decode()


async def test_statement_lock_timeout_holds_per_transaction_behind_a_transaction_pooler(
    database_url, db, transaction_pooler
):
    """Behind a transaction-mode pooler no session setting stays with us:
    every transaction, and every statement outside one, sets lock_timeout
    for itself, in its BEGIN's round trip; a session-level SET by another
    client of the pooler changes nothing."""
    from awa_trio.db import LockTimeout, open_database

    pooled = transaction_pooler.url(database_url)
    async with open_database(pooled, pool_size=2, statement_lock_timeout=0.07) as maintenance:
        assert maintenance.transaction_pooled
        assert await maintenance.fetchval("SHOW lock_timeout") == "70ms"
        async with maintenance.transaction() as conn:
            assert await conn.fetchval("SHOW lock_timeout") == "70ms"
            async with conn.transaction():  # a savepoint inside our own BEGIN
                assert await conn.fetchval("SHOW lock_timeout") == "70ms"
        async with maintenance.acquire() as conn:
            assert await conn.fetchval("SHOW lock_timeout") == "70ms"
        async with db.transaction() as ddl:
            await ddl.execute("LOCK TABLE awa.scheduled_jobs IN ACCESS EXCLUSIVE MODE")
            started = trio.current_time()
            with pytest.raises(LockTimeout) as waited:
                await maintenance.fetchval("SELECT count(*) FROM awa.scheduled_jobs")
            assert trio.current_time() - started < 1.0
        assert waited.value.relation == "awa.scheduled_jobs"
