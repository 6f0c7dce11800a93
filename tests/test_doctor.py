"""``python -m awa_trio doctor``: each bad state built for real."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import trio
from test_grants import as_role, role  # noqa: F401  (the fixture)

from awa_trio.db import open_database
from awa_trio.doctor import CRITICAL, OK, WARNING, collect_findings, exit_code
from awa_trio.leadership import LOCK_KEY


async def run_doctor_cli(url: str, *extra: str) -> subprocess.CompletedProcess:
    return await trio.to_thread.run_sync(lambda: subprocess.run(
        [sys.executable, "-m", "awa_trio", "doctor", "--database-url", url, *extra],
        capture_output=True, text=True, timeout=60, env=dict(os.environ)))


async def hold_lock(db):
    """A session named like an awa_trio leader's lock connection, holding the lock."""
    conn = await db.connect_dedicated(application_name="awa_trio testhost:1 lock")
    await conn.fetchval("SELECT pg_advisory_lock($1)", LOCK_KEY)
    return conn


def by_check(findings):
    return {f.check: f for f in findings}


async def test_healthy_database_with_a_leader_exits_0_and_json_has_the_shape(database_url, db):
    conn = await hold_lock(db)
    try:
        result = await run_doctor_cli(database_url, "--json")
        assert result.returncode == 0, result.stdout + result.stderr
        findings = json.loads(result.stdout)
        assert [f["check"] for f in findings][:4] == ["schema", "server", "leader", "mvcc_horizon"]
        for finding in findings:
            assert set(finding) == {"check", "severity", "summary", "why", "action", "details"}
            assert finding["severity"] == OK, finding
        leader = next(f for f in findings if f["check"] == "leader")
        assert leader["details"]["pid"] == conn.backend_pid
        assert leader["details"]["kind"] == "awa_trio"
        assert {"notify", "clock_skew", "privileges", "stale_heartbeats"} <= {f["check"] for f in findings}

        text = await run_doctor_cli(database_url)
        assert text.returncode == 0
        assert len(text.stdout.strip().splitlines()) == len(findings)
    finally:
        await conn.close()


async def test_no_leader_is_critical_exit_2(database_url):
    result = await run_doctor_cli(database_url)
    assert result.returncode == 2, result.stdout + result.stderr
    [line] = [line for line in result.stdout.splitlines() if " leader:" in line]
    assert line.startswith("CRITICAL") and "no session holds the maintenance lock" in line


async def test_a_session_holding_a_snapshot_is_reported(db):
    conn = await hold_lock(db)
    other = await db.connect_dedicated(application_name="snapshot holder")
    try:
        await other.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        await other.fetchval("SELECT count(*) FROM awa.jobs_hot")
        await trio.sleep(0.3)
        findings = await collect_findings(db, horizon_warning=0.1, horizon_critical=60)
        horizon = by_check(findings)["mvcc_horizon"]
        assert horizon.severity == WARNING
        assert horizon.details["pid"] == other.backend_pid
        assert horizon.details["application_name"] == "snapshot holder"
        assert exit_code(findings) == 1
        findings = await collect_findings(db, horizon_warning=0.05, horizon_critical=0.1)
        assert by_check(findings)["mvcc_horizon"].severity == CRITICAL
        assert exit_code(findings) == 2
    finally:
        await other.close()
        await conn.close()


async def test_a_running_job_with_a_stale_heartbeat_is_a_warning(database_url, db):
    conn = await hold_lock(db)
    try:
        await db.execute(
            "INSERT INTO awa.jobs_hot (kind, queue, state, attempt, run_lease, attempted_at, heartbeat_at) "
            "VALUES ('stuck', 'q', 'running', 1, 1, now() - interval '1 hour', now() - interval '1 hour')")
        result = await run_doctor_cli(database_url, "--json")
        assert result.returncode == 1, result.stdout + result.stderr
        stale = next(f for f in json.loads(result.stdout) if f["check"] == "stale_heartbeats")
        assert stale["severity"] == WARNING and stale["details"] == {"jobs": 1}
    finally:
        await conn.close()


async def test_due_jobs_not_promoted_are_a_warning(db):
    conn = await hold_lock(db)
    try:
        await db.execute(
            "INSERT INTO awa.scheduled_jobs (kind, queue, state, run_at) VALUES "
            "('late', 'q', 'scheduled', now() - interval '5 minutes')")
        findings = await collect_findings(db)
        due = by_check(findings)["due_not_promoted"]
        assert due.severity == WARNING and due.details["scheduled"]["jobs"] == 1
    finally:
        await conn.close()


async def test_no_awa_schema_is_critical(database_url, db):
    await db.execute("DROP SCHEMA awa CASCADE")
    conn = await hold_lock(db)
    try:
        result = await run_doctor_cli(database_url, "--json")
        assert result.returncode == 2, result.stdout + result.stderr
        schema = json.loads(result.stdout)[0]
        assert (schema["check"], schema["severity"]) == ("schema", CRITICAL)
        assert "no awa schema" in schema["summary"]
    finally:
        await conn.close()


async def test_an_unreachable_database_is_one_line_and_exit_2(database_url):
    result = await run_doctor_cli(database_url + "_missing")
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1
    assert "cannot use database" in result.stderr


async def test_a_read_only_server_is_critical(database_url, db):
    name = database_url.rsplit("/", 1)[1]
    await db.execute(f'ALTER DATABASE "{name}" SET default_transaction_read_only = on')
    conn = await hold_lock(db)
    try:
        result = await run_doctor_cli(database_url, "--json")
        assert result.returncode == 2, result.stdout + result.stderr
        server = next(f for f in json.loads(result.stdout) if f["check"] == "server")
        assert server["severity"] == CRITICAL and server["details"]["read_only"] is True
        assert "read-only" in server["summary"]
    finally:
        await conn.close()


async def test_a_role_without_privileges_gets_findings_not_a_crash(database_url, db, role):  # noqa: F811
    conn = await hold_lock(db)
    try:
        result = await run_doctor_cli(as_role(database_url, role), "--json")
        assert result.returncode == 2, result.stdout + result.stderr
        findings = {f["check"]: f for f in json.loads(result.stdout)}
        assert findings["schema"]["severity"] == CRITICAL
        assert "cannot read the awa schema" in findings["schema"]["summary"]
        assert findings["notify"]["severity"] == OK and findings["clock_skew"]["severity"] == OK
    finally:
        await conn.close()


async def test_queue_storage_database_with_a_leader_is_healthy(qs_database_url, qs_db):
    conn = await hold_lock(qs_db)
    try:
        findings = await collect_findings(qs_db)
        assert by_check(findings)["schema"].details["engine"] == "queue_storage"
        assert [f for f in findings if f.severity != OK] == []
        assert exit_code(findings) == 0
    finally:
        await conn.close()


async def test_a_long_held_exclusive_lock_on_an_awa_table_is_a_warning(database_url, db):
    """Repeated yields, seen from their cause: a migration's transaction
    holding ACCESS EXCLUSIVE on an awa table; and a leader beside it yields
    (counted, logged at INFO) instead of failing."""
    conn = await hold_lock(db)
    migration = await db.connect_dedicated(application_name="migration")
    try:
        async with open_database(database_url, pool_size=1, statement_lock_timeout=0.1) as doctor_db:
            findings = await collect_findings(doctor_db, ddl_lock_warning=0.1)
            assert by_check(findings)["ddl_locks"].severity == OK
            await migration.execute("BEGIN")
            await migration.execute("ALTER TABLE awa.scheduled_jobs ADD COLUMN ddl_probe integer")
            await trio.sleep(0.3)
            findings = await collect_findings(doctor_db, ddl_lock_warning=0.1)
            ddl = by_check(findings)["ddl_locks"]
            assert ddl.severity == WARNING, ddl
            assert ddl.details["pid"] == migration.backend_pid
            assert "awa.scheduled_jobs" in ddl.details["relations"]
            assert "AccessExclusiveLock" in ddl.summary and "migration" in ddl.summary
            # The doctor's own reads of that table gave way instead of hanging.
            backlogs = by_check(findings)["backlogs"]
            assert "gave way to a lock on awa.scheduled_jobs" in backlogs.summary, backlogs
            # Not yet "for minutes" by the default threshold.
            assert by_check(await collect_findings(doctor_db))["ddl_locks"].severity == OK
            await migration.execute("ROLLBACK")
            assert (
                by_check(await collect_findings(doctor_db, ddl_lock_warning=0.1))["ddl_locks"].severity == OK
            )
    finally:
        await migration.close()
        await conn.close()
