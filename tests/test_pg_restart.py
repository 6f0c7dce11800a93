"""PostgreSQL restarted under load: an awa_trio process leads while an
awa-pg 0.6.1 worker consumes a steady stream of scheduled jobs; the local
server is restarted once, then stopped for a few seconds and started again.
Each time leadership and work resume within a bounded reconnect backoff,
the process keeps running, no job is left behind, and the log holds at most
one warning per source (branch, election, lock watch) per failure episode
and no traceback.

Restarting the server breaks every other test using it, so this runs only
with AWA_TRIO_TEST_PG_RESTART=1 (CI runs it alone, last) and only when the
server under test is a local pg_ctlcluster cluster (not AWA_TRIO_TEST_SERVER
pointing elsewhere, not the embedded server)."""

from __future__ import annotations

import collections
import getpass
import json
import logging
import os
import shutil
import subprocess
import urllib.parse

import pytest
import trio
from conftest import SERVER_DSN
from support.chaos import AWA_TRIO_LOCK_NAME, awa_pg_consumer, produce_scheduled
from support.takeover import awa_trio_process

from awa_trio.db import DatabaseError, open_database

KIND = "restart_job"
QUEUE = "restart"
#: From the server answering again to awa_trio leading and a new job done.
RESUME_BOUND = 20.0
#: How long the second episode keeps the server down.
DOWNTIME = 3.0


def local_cluster() -> tuple[str, str] | None:
    """(version, name) of the pg_ctlcluster cluster serving the test server,
    when it is on this host and this user may restart it."""
    url = urllib.parse.urlsplit(SERVER_DSN)
    if os.environ.get("AWA_TRIO_TEST_EMBEDDED") == "1" or url.hostname not in ("localhost", "127.0.0.1", "::1"):
        return None
    if not (shutil.which("pg_lsclusters") and shutil.which("pg_ctlcluster")):
        return None
    listing = subprocess.run(["pg_lsclusters", "--no-header"], capture_output=True, text=True, check=False)
    for fields in (line.split() for line in listing.stdout.splitlines()):
        serves_it = len(fields) >= 5 and fields[2] == str(url.port or 5432) and fields[3] == "online"
        if serves_it and (os.geteuid() == 0 or getpass.getuser() == fields[4]):
            return fields[0], fields[1]
    return None


CLUSTER = local_cluster() if os.environ.get("AWA_TRIO_TEST_PG_RESTART") == "1" else None

pytestmark = [
    pytest.mark.pg_restart,
    pytest.mark.skipif(os.environ.get("AWA_TRIO_TEST_PG_RESTART") != "1",
                       reason="restarts PostgreSQL: set AWA_TRIO_TEST_PG_RESTART=1 and run it alone"),
    pytest.mark.skipif(os.environ.get("AWA_TRIO_TEST_PG_RESTART") == "1" and CLUSTER is None,
                       reason="the test server is not a local pg_ctlcluster cluster this user may restart"),
]


def pg_ctlcluster(action: str) -> None:
    assert CLUSTER is not None
    subprocess.run(["pg_ctlcluster", "--skip-systemctl-redirect", *CLUSTER, action],
                   check=True, capture_output=True, timeout=120)


async def query_until_it_answers(database_url: str, sql: str, *args, timeout: float = 60):
    """One statement on a fresh connection, retried while the server is away."""
    with trio.fail_after(timeout):
        while True:
            try:
                async with open_database(database_url, pool_size=1, application_name="test admin") as admin:
                    return await admin.fetchval(sql, *args)
            except (DatabaseError, OSError):
                await trio.sleep(0.2)


AWA_TRIO_LOCK_HOLDER_SQL = """
    SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a USING (pid)
    WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
      AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
      AND (l.classid::bigint << 32 | l.objid::bigint) = 4708303813012965710
"""


async def wait_until_leading(database_url: str, leader) -> None:
    """Until the leader lock's holder is the election connection of ``leader``."""
    while True:
        holder = await query_until_it_answers(database_url, AWA_TRIO_LOCK_HOLDER_SQL)
        match = AWA_TRIO_LOCK_NAME.match(holder or "")
        if match and int(match.group(1)) == leader.pid:
            return
        await trio.sleep(0.05)


async def wait_until_awa_trio_leads_and_a_new_job_is_done(database_url, leader, consumer, inserted) -> None:
    with trio.fail_after(RESUME_BOUND):
        await wait_until_leading(database_url, leader)
        mark = len(inserted)
        while not inserted[mark:] or not any(line.startswith(f"DONE {inserted[mark]} ")
                                             for line in consumer.lines):
            await trio.sleep(0.05)


def warnings_by_source(lines: list[str]) -> tuple[collections.Counter, list[dict]]:
    """WARNING-or-worse JSON records counted by branch (else logger), and
    the records that carry a traceback."""
    counts: collections.Counter = collections.Counter()
    with_traceback = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("exception"):
            with_traceback.append(record)
        if record["level"] in ("WARNING", "ERROR", "CRITICAL"):
            counts[record.get("branch") or record["logger"], record["message"].split(":")[0]] += 1
    return counts, with_traceback


async def test_postgresql_restarts_during_load_leadership_and_work_resume_with_one_warning_each(
        database_url, awa_client):
    inserted: list[int] = []
    consumer = awa_pg_consumer("awa-pg consumer", database_url, KIND, QUEUE)
    flags = ("--log-format", "json", "--promote-interval", "100ms", "--leader-election-interval", "500ms",
             "--heartbeat-rescue-interval", "1s", "--heartbeat-staleness", "5s")
    resumed = []
    async with awa_trio_process(database_url, *flags) as leader, trio.open_nursery() as nursery:
        with trio.fail_after(30):
            await wait_until_leading(database_url, leader)
        await consumer.start(nursery)
        await consumer.wait_ready()
        async with trio.open_nursery() as load:
            load.start_soon(produce_scheduled, awa_client, KIND, QUEUE, inserted)
            await wait_until_awa_trio_leads_and_a_new_job_is_done(database_url, leader, consumer, inserted)
            lines_before = len(leader.lines)

            await trio.to_thread.run_sync(pg_ctlcluster, "restart")
            back_at = trio.current_time()
            await wait_until_awa_trio_leads_and_a_new_job_is_done(database_url, leader, consumer, inserted)
            resumed.append(trio.current_time() - back_at)
            await trio.sleep(3.0)  # branches' next successful bodies close their episodes
            lines_between = len(leader.lines)

            await trio.to_thread.run_sync(pg_ctlcluster, "stop")
            await trio.sleep(DOWNTIME)
            await trio.to_thread.run_sync(pg_ctlcluster, "start")
            back_at = trio.current_time()
            await wait_until_awa_trio_leads_and_a_new_job_is_done(database_url, leader, consumer, inserted)
            resumed.append(trio.current_time() - back_at)
            await trio.sleep(3.0)
            load.cancel_scope.cancel()

        # Nothing left behind: every job the producer saw inserted completes
        # (one in flight at a restart may be rescued and run again).
        with trio.fail_after(30):
            while await query_until_it_answers(
                    database_url, "SELECT count(*) FROM awa.jobs WHERE kind = $1 AND state <> 'completed'", KIND):
                await trio.sleep(0.2)
        completed = await query_until_it_answers(
            database_url, "SELECT count(*) FROM awa.jobs WHERE kind = $1 AND id = ANY($2::bigint[])",
            KIND, inserted)
        assert leader.process.returncode is None, "awa_trio exited"
        await consumer.stop()
        nursery.cancel_scope.cancel()

    first, second = (warnings_by_source(leader.lines[a:b]) for a, b in
                     ((lines_before, lines_between), (lines_between, len(leader.lines))))
    logging.getLogger(__name__).info("resumed %s s after the server answered; warnings %s then %s",
                                     [round(r, 2) for r in resumed], dict(first[0]), dict(second[0]))
    assert completed == len(inserted) >= 50
    assert max(resumed) < RESUME_BOUND
    for counts, with_traceback in (first, second):
        assert counts, "the episode was logged"
        assert with_traceback == [], "a traceback in the log"
        assert max(counts.values()) == 1, f"more than one warning from one source in one episode: {counts}"
    assert not any("Traceback" in line for line in leader.lines)
    # Down for seconds, the election failed on every try: one warning for
    # all of them, though the first outage's failures were warned about too.
    assert second[0]["awa_trio.leadership", "leader election attempt failed"] == 1
