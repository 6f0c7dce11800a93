"""Schedules declared in code (``client.periodic``), with real awa-pg 0.6.1
runtimes: awa_trio writes the rows an awa-pg leader writes from the same
``declare(client)``, registers and fires them while awa-pg workers follow,
and doctor warns when it leads such a fleet without them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from contextlib import asynccontextmanager
from pathlib import Path

import trio
from support.awa_pg import worker_process
from support.declared_schedules import PROBE_KIND, PROBE_QUEUE
from support.helpers import leader_lock_holders

import awa_trio
from awa_trio.config import MaintenanceConfig
from awa_trio.cron import cron_branches
from awa_trio.doctor import OK, WARNING, collect_findings
from awa_trio.leadership import LOCK_KEY
from awa_trio.service import MaintenanceService

TESTS = Path(__file__).parent
DECLARING_WORKER = TESTS / "support" / "awa_pg_declaring_worker.py"
DECLARE = "support.declared_schedules:declare"
DECLARE_PROBE = "support.declared_schedules:declare_probe"
#: Written when a row is inserted, updated or fired, so they differ between
#: two registrations made at different times; every other column must match.
TIMESTAMPS = ("created_at", "updated_at", "last_enqueued_at")
ROWS_SQL = "SELECT *, args::text AS args_text, metadata::text AS metadata_text FROM awa.cron_jobs ORDER BY name"


def subprocess_env(**extra: str) -> dict[str, str]:
    """The awa_trio under test (not another installed copy) and tests/support."""
    paths = [str(Path(awa_trio.__file__).parents[1]), str(TESTS)]
    return dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=os.pathsep.join(paths), **extra)


@asynccontextmanager
async def declaring_worker(dsn, declaration, *kinds, election_ms=200):
    """An awa-pg runtime that calls ``declaration(client)`` and starts."""
    argv = [sys.executable, str(DECLARING_WORKER), dsn, declaration,
            "--leader-election-interval-ms", str(election_ms)]
    for kind in kinds:
        argv += ["--kind", kind]
    async with worker_process(argv, env=subprocess_env(), graceful=10) as worker:
        yield worker


async def wait_for_rows(db, count, timeout=30.0):
    with trio.fail_after(timeout):
        while await db.fetchval("SELECT count(*) FROM awa.cron_jobs") < count:
            await trio.sleep(0.1)
    return [dict(row) for row in await db.fetch(ROWS_SQL)]


async def test_rows_from_a_declaration_equal_an_awa_pg_leaders_column_for_column(database_url, db):
    # 1. awa-pg leads (nobody else is there) and writes its declarations.
    async with declaring_worker(database_url, DECLARE, "probe:probeq"):
        from_awa_pg = await wait_for_rows(db, 3)
    assert {row["kind"] for row in from_awa_pg} == {"nightly_report", "smtp_digest", "html_to_pdf"}
    await db.execute("DELETE FROM awa.cron_jobs")

    # 2. awa_trio leads, with the same function named by --periodic-from.
    process = await trio.lowlevel.open_process(
        [sys.executable, "-m", "awa_trio", "--database-url", database_url,
         "--leader-election-interval", "200ms", "--periodic-from", DECLARE],
        cwd=TESTS, env=subprocess_env(), stderr=subprocess.PIPE,
    )
    try:
        from_awa_trio = await wait_for_rows(db, 3)
        holders = await leader_lock_holders(db)
        holder_name = await db.fetchval(
            "SELECT application_name FROM pg_stat_activity WHERE pid = $1", holders[0])
        assert holder_name.startswith("awa_trio")
    finally:
        process.send_signal(signal.SIGTERM)
        with trio.fail_after(15):
            await process.wait()

    assert [row["name"] for row in from_awa_trio] == [row["name"] for row in from_awa_pg]
    for ours, theirs in zip(from_awa_trio, from_awa_pg, strict=True):
        assert set(ours) == set(theirs)
        for column in theirs:
            if column not in TIMESTAMPS:
                assert ours[column] == theirs[column], (ours["name"], column)
    odd = next(row for row in from_awa_pg if row["name"] == "odd_values")
    assert json.loads(odd["args_text"])["nan"] is None and odd["tags"] == ["a"]


async def test_a_declared_schedule_is_registered_fired_and_changed_while_awa_trio_leads(
    database_url, db, monkeypatch
):
    config = MaintenanceConfig(leader_election_interval=0.2)

    def leader() -> MaintenanceService:
        # Only the cron branches: the rows and jobs below come from them.
        return MaintenanceService(
            database_url, config, periodic_from=DECLARE_PROBE,
            extra_branches=cron_branches(config), branch_factory=lambda config, schema: [],
        )

    async def wait_done(worker, version):
        with trio.fail_after(30):
            while True:
                for line in worker.lines:
                    if line.startswith("DONE") and line.endswith(f'{{"version": {version}}}'):
                        return int(line.split()[1])
                await trio.sleep(0.05)

    async def declared_row():
        return tuple(await db.fetchrow(
            "SELECT cron_expr, args FROM awa.cron_jobs WHERE name = 'declared_probe'"))

    monkeypatch.setenv("DECLARED_PROBE_VERSION", "1")
    async with trio.open_nursery() as nursery:
        first = leader()
        await nursery.start(first.run)
        with trio.fail_after(30):
            await first.wait_until_leader()
        # The worker declares too, but starts as a follower and never tries again.
        async with declaring_worker(database_url, DECLARE_PROBE, f"{PROBE_KIND}:{PROBE_QUEUE}",
                                    election_ms=600_000) as worker:
            first_job = await wait_done(worker, 1)
            assert await declared_row() == ("* * * * * *", {"version": 1})
            first.stop()

            # A deploy changes the expression and the args: the next awa_trio registers them.
            monkeypatch.setenv("DECLARED_PROBE_VERSION", "2")
            monkeypatch.setenv("DECLARED_PROBE_EXPR", "*/2 * * * * *")
            second = leader()
            await nursery.start(second.run)
            with trio.fail_after(30):
                await second.wait_until_leader()
            second_job = await wait_done(worker, 2)
            assert await declared_row() == ("*/2 * * * * *", {"version": 2})
            assert await leader_lock_holders(db) == [second.lock_backend_pid]
            # The awa-pg worker never led (awa_trio's own rows aside).
            assert [r["leader"] for r in await db.fetch(
                "SELECT leader FROM awa.runtime_instances WHERE version NOT LIKE '%+awa-trio.%'")] == [False]
            second.stop()

    jobs = await db.fetch(
        "SELECT id, kind, queue, args, tags, metadata->>'cron_name' AS cron_name, state::text AS state "
        "FROM awa.jobs WHERE id = ANY($1::bigint[]) ORDER BY id", [first_job, second_job])
    assert [(j["kind"], j["queue"], j["args"], j["tags"], j["cron_name"]) for j in jobs] == [
        (PROBE_KIND, PROBE_QUEUE, {"version": 1}, ["declared"], "declared_probe"),
        (PROBE_KIND, PROBE_QUEUE, {"version": 2}, ["declared"], "declared_probe"),
    ]


async def hold_lock_as(db, application_name):
    conn = await db.connect_dedicated(application_name=application_name)
    await conn.fetchval("SELECT pg_advisory_lock($1)", LOCK_KEY)
    return conn


def declarations_finding(findings):
    return next(f for f in findings if f.check == "periodic_declarations")


async def run_doctor_cli(url, *extra):
    return await trio.run_process(
        [sys.executable, "-m", "awa_trio", "doctor", "--database-url", url, *extra],
        cwd=TESTS, env=subprocess_env(), capture_stdout=True, capture_stderr=True, check=False)


async def test_doctor_warns_when_awa_trio_leads_awa_pg_workers_without_their_declarations(database_url, db):
    lock = await hold_lock_as(db, "awa_trio testhost:1 lock")
    try:
        assert declarations_finding(await collect_findings(db)).severity == OK  # no runtime yet
        async with declaring_worker(database_url, DECLARE, "probe:probeq", election_ms=600_000):
            with trio.fail_after(30):
                while not await db.fetchval("SELECT count(*) FROM awa.runtime_instances"):
                    await trio.sleep(0.1)

            finding = declarations_finding(await collect_findings(db))
            assert finding.severity == WARNING, finding
            assert finding.details["worker_runtimes"] == 1
            assert "never registered" in finding.why and "--periodic-from" in finding.action

            result = await run_doctor_cli(database_url)
            lines = [line for line in result.stdout.decode().splitlines() if "periodic_declarations" in line]
            assert len(lines) == 1 and lines[0].startswith("WARNING"), result.stdout
            assert result.returncode == 1, result.stdout

            result = await run_doctor_cli(database_url, "--periodic-from", DECLARE, "--json")
            finding = next(f for f in json.loads(result.stdout) if f["check"] == "periodic_declarations")
            assert finding["severity"] == OK and finding["details"]["periodic_jobs"] == 3, finding
            assert await db.fetchval("SELECT count(*) FROM awa.cron_jobs") == 0  # doctor writes nothing

            configured = declarations_finding(await collect_findings(db, periodic_jobs=1))
            assert configured.severity == OK and "only with --periodic-from" in configured.summary
    finally:
        await lock.close()

    # Another kind of process holds the lock: it is the one that registers.
    other = await hold_lock_as(db, "some awa runtime")
    try:
        async with declaring_worker(database_url, DECLARE, "probe:probeq", election_ms=600_000):
            with trio.fail_after(30):
                while not await db.fetchval(
                    "SELECT count(*) FROM awa.runtime_instances WHERE NOT shutting_down "
                    "AND last_seen_at > now() - interval '5 seconds'"
                ):
                    await trio.sleep(0.1)
            assert declarations_finding(await collect_findings(db)).severity == OK
    finally:
        await other.close()
