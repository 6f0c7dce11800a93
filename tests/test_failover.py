"""HA failover on a real primary and streaming standby (initdb,
``pg_basebackup -R``, ``pg_ctl promote``, in a temp dir; see
support/replica.py).

- awa_trio given both hosts with ``target_session_attrs=read-write`` leads
  on the primary, and once the primary is stopped and the standby promoted
  it leads on the new primary and promotes due jobs there;
- pointed at the standby alone it never takes the lock there (advisory
  locks work on a standby and are not replicated), says so once, and leads
  as soon as that server is promoted.

The servers are stopped and started, so this runs in CI's restart slice
(AWA_TRIO_TEST_PG_RESTART=1), beside tests/test_pg_restart.py.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import trio
from support.helpers import leader_lock_holders
from support.replica import postgres_bin_dir, replica_cluster
from support.takeover import awa_trio_process

from awa_trio.db import DatabaseError, open_database

pytestmark = [
    pytest.mark.pg_restart,
    pytest.mark.skipif(
        os.environ.get("AWA_TRIO_TEST_PG_RESTART") != "1",
        reason="starts and stops servers of its own: CI runs it in the restart slice (AWA_TRIO_TEST_PG_RESTART=1)",
    ),
    pytest.mark.skipif(postgres_bin_dir() is None, reason="no PostgreSQL server binaries (initdb) installed"),
]

DUE_JOB_SQL = (
    "INSERT INTO awa.scheduled_jobs (kind, queue, state, run_at) "
    "VALUES ('ha_due', 'ha', 'scheduled', now() - interval '1 second') RETURNING id"
)
FLAGS = ("--promote-interval", "100ms")


@pytest.fixture
def cluster():
    with replica_cluster() as replicas:
        migrate = subprocess.run(
            [sys.executable, "-m", "awa_trio", "migrate", "--database-url", replicas.primary.url()],
            capture_output=True, text=True, timeout=120, check=False,
        )
        assert migrate.returncode == 0, migrate.stderr
        yield replicas


async def wait_for(predicate, timeout: float, poll: float = 0.05):
    with trio.fail_after(timeout):
        while True:
            try:
                value = await predicate()
            except DatabaseError:
                value = None
            if value:
                return value
            await trio.sleep(poll)


async def lock_holders_on(url: str) -> list[int]:
    async with open_database(url) as db:
        return await leader_lock_holders(db)


async def promoted_on(url: str, job_id: int) -> bool:
    async with open_database(url) as db:
        return await db.fetchval("SELECT state::text FROM awa.jobs WHERE id = $1", job_id) == "available"


async def logged(process, text: str) -> bool:
    return any(text in line for line in process.lines)


async def insert_due_job(url: str) -> int:
    async with open_database(url) as db:
        return await db.fetchval(DUE_JOB_SQL)


async def test_leader_follows_a_promoted_standby_behind_a_multi_host_url(cluster):
    primary, standby = cluster.primary, cluster.standby
    url = (f"postgresql://postgres@127.0.0.1:{primary.port},127.0.0.1:{standby.port}/postgres"
           "?target_session_attrs=read-write")
    async with awa_trio_process(url, *FLAGS) as leader:
        await wait_for(lambda: lock_holders_on(primary.url()), timeout=30)
        first = await insert_due_job(primary.url())
        await wait_for(lambda: promoted_on(primary.url(), first), timeout=10)

        await trio.to_thread.run_sync(primary.stop, "immediate")
        await trio.to_thread.run_sync(standby.promote)
        second = await insert_due_job(standby.url())

        await wait_for(lambda: promoted_on(standby.url(), second), timeout=30)
        assert len(await lock_holders_on(standby.url())) == 1
        assert leader.process.returncode is None
    text = "\n".join(leader.lines)
    assert "Traceback" not in text
    assert "lost maintenance leadership" in text
    assert text.count("elected maintenance leader") == 2


async def test_a_standby_alone_is_never_led_and_is_led_once_promoted(cluster):
    standby = cluster.standby
    async with awa_trio_process(standby.url(), *FLAGS) as follower:
        await wait_for(lambda: logged(follower, "is a standby"), timeout=30)
        # Polling a standby goes on (the session sees its promotion in place)
        # without taking the lock there, and says why only once.
        await trio.sleep(2)
        assert await lock_holders_on(standby.url()) == []
        assert sum("is a standby" in line for line in follower.lines) == 1
        assert not any("elected maintenance leader" in line for line in follower.lines)

        await trio.to_thread.run_sync(standby.promote)
        await wait_for(lambda: lock_holders_on(standby.url()), timeout=30)
        job_id = await insert_due_job(standby.url())
        await wait_for(lambda: promoted_on(standby.url(), job_id), timeout=10)
    text = "\n".join(follower.lines)
    assert "writable primary again" in text
    assert "cannot execute LISTEN during recovery" not in text
    assert "Traceback" not in text
