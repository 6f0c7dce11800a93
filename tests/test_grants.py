"""Least privilege (upstream #452): a LOGIN role holding exactly what
``python -m awa_trio grants`` prints leads each engine through real work, and
a privilege taken away is named, by the term-start check and by the branch
that needs it.

Work is arranged as postgres (awa-pg inserts, then SQL moving a job's clock or
state, as the other tests do); everything after that is done by the leader as
the maintenance role, and checked in the database."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import os
import subprocess
import sys
import urllib.parse
import uuid

import asyncpg
import awa
import pytest
import trio
from conftest import _admin, _drop, _make_queue_storage, dsn_for, in_thread
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from support.contexts import make_context
from support.helpers import dirty_admin_tables, metric_points
from support.qs_claims import relfilenode
from support.qs_dlq import add_bulk_dlq_rows, dlq_ids
from support.qs_jobs import deferred_count, insert_one_scheduled, make_due, make_retryable, ready_count
from support.qs_rescue import claim, expire_deadlines, insert_jobs, job, materialise, open_attempts

from awa_trio import MaintenanceConfig, MaintenanceService
from awa_trio.cli import resolve
from awa_trio.cron import PeriodicJob
from awa_trio.db import open_database
from awa_trio.engines import planes
from awa_trio.engines.canonical import cleanup
from awa_trio.engines.queue_storage import rotate_lease, rotate_queue, terminal_count_rollup
from awa_trio.errors import ConfigError
from awa_trio.grants import (
    DEFAULT_ROLE,
    build_grants_script,
    missing_privileges,
    missing_privileges_message,
    warn_about_missing_privileges,
)
from awa_trio.metrics import STORAGE_STATE
from awa_trio.schema import SchemaInfo
from awa_trio.status import collect_status

UTC = dt.UTC
#: Every branch often, so a run of a few seconds exercises each many times.
LEAD = MaintenanceConfig(
    leader_election_interval=0.2,
    leader_check_interval=0.3,
    promote_interval=0.05,
    heartbeat_rescue_interval=0.1,
    deadline_rescue_interval=0.1,
    callback_rescue_interval=0.1,
    heartbeat_staleness=30,
    cleanup_interval=0.2,
    completed_retention=3600,
    runtime_snapshot_retention=60,
    descriptor_retention=60,
    dlq_retention=3600,
    priority_aging_interval=1,
    dirty_key_recompute_interval=0.1,
    metadata_reconciliation_interval=0.3,
    queue_stats_interval=0.2,
    batch_operations_interval=0.1,
    cron_sync_interval=0.5,
    cron_eval_interval=0.2,
    queue_rotate_interval=0.05,
    lease_rotate_interval=0.05,
    claim_rotate_interval=0.05,
    terminal_count_rollup_interval=0.1,
)
TICK = PeriodicJob("grants_tick", "* * * * * *", kind="grants_tick", queue="cron_registered")

STALE_RUNTIME_SQL = """
    INSERT INTO awa.runtime_instances (
        instance_id, pid, version, started_at, last_seen_at, snapshot_interval_ms,
        healthy, postgres_connected, poll_loop_alive, heartbeat_alive, shutting_down, leader
    )
    VALUES (gen_random_uuid(), 1, '0.6.1', now() - interval '1 day', now() - interval '1 day',
            10000, true, true, true, true, false, false)
"""
#: The stale snapshot cleaned up, and the leader's own row written as the role.
RUNTIME_ROWS_DONE_SQL = """
    SELECT count(*) FILTER (WHERE version = '0.6.1') = 0
           AND count(*) FILTER (WHERE version LIKE '%+awa-trio.%' AND leader) = 1
    FROM awa.runtime_instances
"""
STALE_DESCRIPTOR_SQL = """
    INSERT INTO awa.queue_descriptors (queue, descriptor_hash, last_seen_at)
    VALUES ('forgotten', 'h', now() - interval '1 day')
"""
EXPIRED_OPERATION_SQL = """
    INSERT INTO awa.batch_operations (id, op_kind, filter, spec, state, finalized_at, retention_until)
    VALUES ($1, 'set_priority', '{}', '{"op_kind": "set_priority", "priority": 1}', 'completed',
            now() - interval '91 days', now() - interval '1 day')
"""
# A schedule another deployment registered: it fires every second.
FOREIGN_SCHEDULE_SQL = """
    INSERT INTO awa.cron_jobs (name, cron_expr, timezone, kind, queue, missed_fire_policy, created_at)
    VALUES ('foreign_tick', '* * * * * *', 'UTC', 'foreign_tick', $1, 'coalesce', now() - interval '1 hour')
"""


# --- the role ------------------------------------------------------------------------


def _drop_role(name: str, database_url: str) -> None:
    """Roles outlive databases: end the role's sessions, drop what it owns or
    was granted in the test database (lane sequences it created), then the
    role itself, whatever failed before."""

    async def release() -> None:
        conn = await asyncpg.connect(database_url)
        try:
            await conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1", name
            )
            await conn.execute(f'DROP OWNED BY "{name}"')
        finally:
            await conn.close()

    try:
        asyncio.run(release())
    finally:
        _admin(f'DROP ROLE IF EXISTS "{name}"')


def _role_on(database_url: str):
    name = f"awa_trio_role_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    _admin(f'CREATE ROLE "{name}" LOGIN')
    try:
        yield name
    finally:
        _drop_role(name, database_url)


@pytest.fixture
def role(database_url):
    """A fresh LOGIN role with no privileges, dropped after the test."""
    yield from _role_on(database_url)


@pytest.fixture
def qs_role(qs_database_url):
    yield from _role_on(qs_database_url)


def as_role(database_url: str, role_name: str) -> str:
    """The same database, reached as ``role_name`` (no password: trust auth)."""
    parts = urllib.parse.urlsplit(database_url)
    host = parts.netloc.rpartition("@")[2]
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{role_name}@{host}"))


async def print_grants(database_url: str, role_name: str) -> str:
    """``python -m awa_trio grants`` run by postgres, as an operator would."""
    result = await trio.to_thread.run_sync(
        lambda: subprocess.run(
            [sys.executable, "-m", "awa_trio", "grants", "--database-url", database_url, "--role", role_name],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


async def apply_as_postgres(database_url: str, script: str) -> None:
    def run() -> None:
        async def execute() -> None:
            conn = await asyncpg.connect(database_url)
            try:
                await conn.execute(script)
            finally:
                await conn.close()

        asyncio.run(execute())

    await trio.to_thread.run_sync(run)


async def withdraw_public_defaults(db, *schemas: str) -> None:
    """PostgreSQL lets PUBLIC connect and execute functions by default; take
    that away here, so the role holds only what the printed grants give it."""
    database = await db.fetchval("SELECT quote_ident(current_database())")
    await db.execute(f"REVOKE CONNECT ON DATABASE {database} FROM PUBLIC")
    for schema in ("awa", *schemas):
        await db.execute(f"REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA {schema} FROM PUBLIC")


async def grant_printed(database_url: str, role_name: str) -> str:
    script = await print_grants(database_url, role_name)
    lines = script.splitlines()
    assert lines[0].startswith("-- awa_trio maintenance role")
    statements = [line.partition("  -- ")[0] for line in lines if not line.startswith("--")]
    assert all(s.startswith(("GRANT ", "ALTER DEFAULT PRIVILEGES ")) and s.endswith(";") for s in statements)
    await apply_as_postgres(database_url, script)
    return script


# --- leading ----------------------------------------------------------------------------


async def lead_until(url: str, done, *, timeout: float = 30.0, **service_options) -> dict:
    """Lead as the role until ``done()`` holds and every branch has run;
    returns /status as it was then."""
    service = MaintenanceService(url, LEAD, **service_options)
    # The outer limit also bounds the shutdown that follows the cancel.
    with trio.fail_after(timeout + 15):
        async with trio.open_nursery() as nursery:
            with trio.fail_after(timeout):
                await nursery.start(service.run)
                await service.wait_until_leader()
                schema = await service.check_database()  # what /readyz asks
                assert schema.version >= 39
                while True:
                    status = await service.status()
                    branches = status["branches"]
                    ran = all(branches.get(spec.name, {}).get("runs", 0) >= 2 for spec in service.branches)
                    if ran and await done():
                        break
                    await trio.sleep(0.1)
            nursery.cancel_scope.cancel()
    return status


def assert_no_privilege_trouble(status: dict, caplog) -> None:
    denied = [r.getMessage() for r in caplog.records if "permission denied" in r.getMessage()]
    assert denied == []
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == []
    failing = {name: branch["last_error"] for name, branch in status["branches"].items() if branch.get("last_error")}
    assert failing == {}


async def insert_available(client, queue: str, **options) -> int:
    job_ = await in_thread(client.insert, {"n": 1}, kind="grants_probe", queue=queue, **options)
    return job_.id


# --- canonical -------------------------------------------------------------------------

RUNNING_SQL = """
    UPDATE awa.jobs_hot
    SET state = 'running', attempt = 1, run_lease = 1, attempted_at = now() - interval '1 hour',
        heartbeat_at = $2, deadline_at = $3
    WHERE id = $1
"""
WAITING_SQL = """
    UPDATE awa.jobs_hot
    SET state = 'waiting_external', attempt = 1, run_lease = 1, attempted_at = now() - interval '1 hour',
        callback_id = gen_random_uuid(), callback_timeout_at = now() - interval '1 second'
    WHERE id = $1
"""
FINISHED_LONG_AGO_SQL = """
    UPDATE awa.jobs_hot
    SET state = 'completed', attempt = 1, finalized_at = now() - interval '2 days'
    WHERE id = $1
"""
# Unique jobs: one due whose claim (available only) promotion takes; one
# finished whose claim (completed too) cleanup releases with the row.
UNIQUE_JOB_SQL = """
    SELECT id FROM awa.insert_job_compat(
        'grants_unique', 'unique_q', '{}'::jsonb, p_state => $1::awa.job_state,
        p_run_at => now() - interval '1 minute', p_unique_key => $2::bytea, p_unique_states => $3::bit(8))
"""


async def canonical_work(db, client) -> dict:
    """One job or row for each branch's work, by name."""
    now = dt.datetime.now(UTC)
    work: dict = {}
    work["scheduled"] = await insert_available(client, "promote_q", run_at=now - dt.timedelta(minutes=1))
    work["retryable"] = await insert_available(client, "promote_q", run_at=now + dt.timedelta(hours=1))
    await db.execute(
        "UPDATE awa.scheduled_jobs SET state = 'retryable', attempt = 1, run_at = now() - interval '1 minute' "
        "WHERE id = $1",
        work["retryable"],
    )
    work["unique"] = await db.fetchval(UNIQUE_JOB_SQL, "scheduled", b"due", asyncpg.BitString("01000000"))
    work["unique_finished"] = await db.fetchval(UNIQUE_JOB_SQL, "available", b"done", asyncpg.BitString("01010000"))
    await db.execute(FINISHED_LONG_AGO_SQL, work["unique_finished"])
    assert await db.fetchval("SELECT count(*) FROM awa.job_unique_claims WHERE job_id = $1", work["unique_finished"])
    hour_ago = now - dt.timedelta(hours=1)
    work["stale"] = await insert_available(client, "rescue_q")
    await db.execute(RUNNING_SQL, work["stale"], hour_ago, None)
    work["overdue"] = await insert_available(client, "rescue_q")
    await db.execute(RUNNING_SQL, work["overdue"], now + dt.timedelta(hours=1), now - dt.timedelta(seconds=1))
    work["callback"] = await insert_available(client, "rescue_q", max_attempts=5)
    await db.execute(WAITING_SQL, work["callback"])
    work["finished"] = await insert_available(client, "cleanup_q")
    await db.execute(FINISHED_LONG_AGO_SQL, work["finished"])
    work["waiting"] = await insert_available(client, "aging_q", priority=4)
    await db.execute("UPDATE awa.jobs_hot SET run_at = now() - interval '1 hour' WHERE id = $1", work["waiting"])
    work["bulk"] = [await insert_available(client, "bulk_q", priority=3) for _ in range(2)]
    work["operation"] = (await in_thread(client.set_priority, 1, filter={"queue": "bulk_q"}))["id"]
    work["expired_operation"] = uuid.uuid4()
    await db.execute(EXPIRED_OPERATION_SQL, work["expired_operation"])
    await db.execute(STALE_RUNTIME_SQL)
    await db.execute(STALE_DESCRIPTOR_SQL)
    await db.execute(FOREIGN_SCHEDULE_SQL, "cron_foreign")
    return work


async def canonical_work_done(db, work: dict) -> bool:
    rows = {
        row["id"]: row
        for row in await db.fetch(
            "SELECT id, state::text AS state, priority, errors FROM awa.jobs WHERE id = ANY($1::bigint[])",
            [work[name] for name in ("scheduled", "retryable", "unique", "stale", "overdue", "callback", "waiting")]
            + [work["finished"], *work["bulk"]],
        )
    }

    def last_error(name: str) -> str:
        errors = rows[work[name]]["errors"] or []
        return errors[-1]["error"] if errors else ""

    operation = await db.fetchval("SELECT state FROM awa.batch_operations WHERE id = $1", uuid.UUID(work["operation"]))
    return (
        all(rows[work[name]]["state"] == "available" for name in ("scheduled", "retryable", "unique"))
        and await db.fetchval("SELECT count(*) FROM awa.job_unique_claims WHERE job_id = $1", work["unique"]) == 1
        and await db.fetchval("SELECT count(*) FROM awa.jobs WHERE id = $1", work["unique_finished"]) == 0
        and await db.fetchval("SELECT count(*) FROM awa.job_unique_claims WHERE unique_key = 'done'") == 0
        and last_error("stale") == "heartbeat stale: worker presumed dead"
        and last_error("overdue") == "hard deadline exceeded"
        and last_error("callback") == "callback timed out"
        and work["finished"] not in rows
        and rows[work["waiting"]]["priority"] < 4
        and operation == "completed"
        and all(rows[job_id]["priority"] == 1 for job_id in work["bulk"])
        and await db.fetchval("SELECT count(*) FROM awa.jobs WHERE kind IN ('grants_tick', 'foreign_tick')") >= 2
        and await db.fetchval("SELECT count(*) FROM awa.batch_operations WHERE id = $1", work["expired_operation"]) == 0
        and await db.fetchval(RUNTIME_ROWS_DONE_SQL)
        and await db.fetchval("SELECT count(*) FROM awa.queue_descriptors WHERE queue = 'forgotten'") == 0
        and await db.fetchval(f"SELECT count(*) FROM {(await dirty_admin_tables(db))[0]}") == 0
    )


async def test_the_printed_grants_lead_the_canonical_engine(database_url, db, awa_client, role, caplog):
    await withdraw_public_defaults(db)
    script = await grant_printed(database_url, role)
    queues_table, kinds_table = await dirty_admin_tables(db)
    assert f"ON {queues_table} TO" in script and f"ON {kinds_table} TO" in script
    assert script.count("ON awa.admin_dirty_") == 2, "only the dirty-key tables this Awa's triggers use"
    assert "ready_entries" not in script, "a canonical database needs nothing of queue storage"
    work = await canonical_work(db, awa_client)
    url = as_role(database_url, role)

    status = await lead_until(url, lambda: canonical_work_done(db, work), periodic_jobs=[TICK])

    assert_no_privilege_trouble(status, caplog)
    async with open_database(url) as role_db:
        assert await role_db.fetchval("SELECT rolsuper FROM pg_roles WHERE rolname = current_user") is False
        report = await collect_status(role_db)  # `python -m awa_trio status` as the role
        assert "error" not in report["rescue_backlog"]
        assert {cron["name"] for cron in report["cron"]} == {"foreign_tick", "grants_tick"}
        assert await missing_privileges(role_db) == []


async def test_a_revoked_privilege_is_named_at_term_start_and_by_the_failing_branch(
    database_url, db, awa_client, role, caplog
):
    async with open_database(database_url) as admin:
        await apply_as_postgres(database_url, await build_grants_script(admin, role))
    await db.execute(f'REVOKE DELETE ON awa.jobs_hot FROM "{role}"')
    finished = await insert_available(awa_client, "cleanup_q")
    await db.execute(FINISHED_LONG_AGO_SQL, finished)

    async with open_database(as_role(database_url, role)) as role_db:
        assert await missing_privileges(role_db) == ["DELETE on awa.jobs_hot"]
        caplog.clear()
        await warn_about_missing_privileges(role_db)
        [line] = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        assert line == missing_privileges_message(role, ["DELETE on awa.jobs_hot"])
        assert "DELETE on awa.jobs_hot" in line and f"python -m awa_trio grants --role {role}" in line
        caplog.clear()
        result = await cleanup.run_once(await make_context(role_db, completed_retention=3600))
    assert result.failed_steps == ["finished jobs (global pass)"]
    assert any("permission denied for table jobs_hot" in r.getMessage() for r in caplog.records)
    assert await db.fetchval("SELECT count(*) FROM awa.jobs_hot WHERE id = $1", finished) == 1


async def test_a_role_name_is_quoted_as_an_identifier(db):
    script = await build_grants_script(db, 'Ops "Team"')
    assert 'GRANT USAGE ON SCHEMA awa TO "Ops ""Team""";' in script
    assert "CREATE ROLE \"Ops \"\"Team\"\"\" LOGIN" in script


@pytest.mark.parametrize(
    ("engine", "state", "needed"),
    [
        ("canonical", "canonical", (True, False)),
        ("canonical", "prepared", (True, True)),
        ("queue_storage", "mixed_transition", (True, True)),
        ("queue_storage", "active", (False, True)),
    ],
)
def test_a_staged_transition_needs_the_grants_of_both_planes(engine, state, needed):
    assert planes(SchemaInfo(version=40, engine=engine, state=state)) == needed


def test_the_grants_command_takes_a_role_name():
    assert resolve(["grants"], environ={}).grants_role == DEFAULT_ROLE == "awa_maintenance"
    assert resolve(["grants", "--role", "Ops Team"], environ={}).grants_role == "Ops Team"
    with pytest.raises(ConfigError, match="--role needs a role name"):
        resolve(["grants", "--role", " "], environ={})


def test_the_grants_command_reports_a_database_without_the_awa_schema_in_one_line(empty_database_url):
    result = subprocess.run(
        [sys.executable, "-m", "awa_trio", "grants", "--database-url", empty_database_url],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.strip().splitlines() == [
        "awa_trio: no awa schema in this database (supported versions: 39, 40); "
        "install it with `python -m awa_trio migrate`"
    ]


# --- queue storage -------------------------------------------------------------------------

DONE_ROW_SQL = """
    INSERT INTO awa.done_entries (
        ready_slot, ready_generation, job_id, kind, queue, state, priority, attempt, run_lease,
        lane_seq, enqueue_shard, finalized_at
    )
    VALUES (0, 0, nextval('awa.job_id_seq'), 'grants_done', 'done_q', 'completed', 2, 1, 1, 1, 0, now())
"""
WAIT_FOR_CALLBACK_SQL = """
    UPDATE awa.leases
    SET state = 'waiting_external', callback_id = gen_random_uuid(),
        callback_timeout_at = clock_timestamp() - interval '1 second'
    WHERE job_id = $1
"""
RING_GENERATIONS_SQL = """
    SELECT (SELECT generation FROM awa.queue_ring_state) AS queue,
           (SELECT generation FROM awa.lease_ring_state) AS lease,
           (SELECT generation FROM awa.claim_ring_state) AS claim
"""
RESCUE_ERRORS = {
    "stale_lease": "heartbeat stale: worker presumed dead",
    "stale_receipt": "receipt claim stale: worker presumed dead",
    "stale_compact": "receipt claim stale: worker presumed dead",
    "overdue": "hard deadline exceeded",
    "callback": "callback timed out",
}


async def queue_storage_work(qs_db, qs_ctx, client) -> dict:
    """Work for every queue-storage branch. The queue ring is moved on once
    first, so slot 0 holds nothing but a finished row for the prune to fold
    and truncate; the attempts to rescue live in slot 1."""
    work: dict = {}
    assert (await rotate_queue.rotate(qs_ctx)).rotated
    await qs_db.execute(DONE_ROW_SQL)
    stale_lease, stale_receipt, overdue, callback = await insert_jobs(qs_db, 4, queue="rescue_q")
    work.update(stale_lease=stale_lease, stale_receipt=stale_receipt, overdue=overdue, callback=callback)
    await claim(qs_db, "rescue_q", 4)
    await materialise(qs_db, [stale_lease], heartbeat_age=3600)
    await materialise(qs_db, [callback])
    await qs_db.execute(WAIT_FOR_CALLBACK_SQL, callback)
    await qs_db.execute(
        "UPDATE awa.lease_claims SET claimed_at = claimed_at - interval '1 hour' WHERE job_id = $1", stale_receipt
    )
    await expire_deadlines(qs_db, [overdue])
    # A claim of a queue without deadline: an item of a compact claim batch.
    [work["stale_compact"]] = await insert_jobs(qs_db, 1, queue="compact_q")
    await claim(qs_db, "compact_q", 1, deadline=0)
    await qs_db.execute("UPDATE awa.lease_claim_batches SET claimed_at = claimed_at - interval '1 hour'")
    work["scheduled"] = [await insert_one_scheduled(client, {"n": n}, queue="promote_q") for n in range(3)]
    await make_due(qs_db, "queue = 'promote_q'")
    await make_retryable(qs_db, work["scheduled"][:1])
    work["dead"] = await add_bulk_dlq_rows(qs_db, "dlq_q", 2, dt.timedelta(days=1))
    await qs_db.execute(FOREIGN_SCHEDULE_SQL, "cron_foreign")
    await qs_db.execute(STALE_RUNTIME_SQL)
    work["relfilenodes"] = {
        table: await relfilenode(qs_db, table) for table in ("awa.done_entries_0", "awa.leases_0", "awa.lease_claims_0")
    }
    return work


async def batch_operation_work(qs_db, client) -> dict:
    """Submitted once the grants are in: the lanes of this queue get their
    sequences from awa-pg now, so only the default privileges reach them."""
    scheduled = await insert_one_scheduled(client, {"n": 1}, queue="bulk_q", priority=3)
    available = await insert_available(client, "bulk_q", priority=3)
    operation = (await in_thread(client.set_priority, 1, filter={"queue": "bulk_q"}))["id"]
    return {"bulk_scheduled": scheduled, "bulk_available": available, "operation": uuid.UUID(operation)}


async def queue_storage_work_done(qs_db, work: dict) -> bool:
    for name, error in RESCUE_ERRORS.items():
        # Rescued, and once its backoff has passed, promoted again.
        row = await job(qs_db, work[name])
        if row is None or row["state"] != "available":
            return False
        if not any(entry.get("error") == error for entry in row["errors"] or []):
            return False
    nodes = work["relfilenodes"]
    rings = await qs_db.fetchrow(RING_GENERATIONS_SQL)
    bulk = await qs_db.fetch(
        "SELECT id, priority FROM awa.jobs WHERE id = ANY($1::bigint[])", [work["bulk_scheduled"], work["bulk_available"]]
    )
    return (
        await open_attempts(qs_db, [work[name] for name in RESCUE_ERRORS]) == []
        and await deferred_count(qs_db, "queue = 'promote_q'") == 0
        and await ready_count(qs_db, "queue = 'promote_q'") == 3
        and await ready_count(qs_db, "queue IN ('cron_registered', 'cron_foreign')") >= 2
        and await dlq_ids(qs_db, "dlq_q") == []
        and await qs_db.fetchval("SELECT state FROM awa.batch_operations WHERE id = $1", work["operation"]) == "completed"
        and sorted(row["priority"] for row in bulk) == [1, 1]
        and await qs_db.fetchval(RUNTIME_ROWS_DONE_SQL)
        # Slot 0 of the queue ring pruned: its finished row folded and truncated.
        and await qs_db.fetchval("SELECT pruned_completed_count FROM awa.queue_terminal_rollups WHERE queue = 'done_q'")
        == 1
        and await qs_db.fetchval("SELECT count(*) FROM awa.done_entries_0") == 0
        and await relfilenode(qs_db, "awa.done_entries_0") != nodes["awa.done_entries_0"]
        # The lease and claim slots the rescues emptied, truncated.
        and await relfilenode(qs_db, "awa.leases_0") != nodes["awa.leases_0"]
        and await relfilenode(qs_db, "awa.lease_claims_0") != nodes["awa.lease_claims_0"]
        and min(rings["queue"], rings["lease"], rings["claim"]) > 8
    )


async def rollup_as(role_db, qs_db) -> None:
    """terminal_count_rollup, driven directly (a leader's other sessions keep
    its MVCC guard busy). It must see that a session of another role holds a
    snapshot, which takes pg_read_all_stats; then it folds a sealed slot's
    deltas and deletes them (a lap-old generation stays in the child)."""
    current = await qs_db.fetchval("SELECT current_slot FROM awa.queue_ring_state")
    sealed = await qs_db.fetch(
        "SELECT slot, generation FROM awa.queue_ring_slots WHERE slot <> $1 AND generation >= 0 ORDER BY slot",
        current,
    )
    # A slot no ready entry lives in, so no attempt can still end there.
    empty = [row for row in sealed if not await qs_db.fetchval(f"SELECT count(*) FROM awa.ready_entries_{row['slot']}")]
    slot, generation = empty[0]["slot"], empty[0]["generation"]
    insert_delta = (
        "INSERT INTO awa.queue_terminal_count_deltas "
        "(ready_slot, ready_generation, queue, priority, enqueue_shard, counter_bucket, terminal_delta) "
        "VALUES ($1, $2, $3, 2, 0, 7, 3)"
    )
    await qs_db.execute(insert_delta, slot, generation, "rollup_q")
    await qs_db.execute(insert_delta, slot, generation - 16, "lap_old_q")
    ctx = await make_context(role_db)

    reader = await qs_db.connect_dedicated(application_name="test reader")
    try:
        await reader.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        await reader.fetchval("SELECT count(*) FROM awa.queue_terminal_live_counts")
        pinned = await terminal_count_rollup.run_once(ctx)
    finally:
        await reader.close()
    assert (pinned.rolled_slots, pinned.skipped_mvcc_pinned) == (0, True), pinned

    result = await terminal_count_rollup.run_once(ctx)
    assert (result.rolled_slots, result.skipped_mvcc_pinned) == (1, False), result
    live = await qs_db.fetchval("SELECT live_terminal_count FROM awa.queue_terminal_live_counts WHERE queue = 'rollup_q'")
    assert live == 3
    left = await qs_db.fetch(f"SELECT queue FROM awa.queue_terminal_count_deltas_{slot}")
    assert [row["queue"] for row in left] == ["lap_old_q"]


async def test_the_printed_grants_lead_queue_storage(
    qs_database_url, qs_db, qs_ctx, qs_awa_client, qs_role, caplog
):
    work = await queue_storage_work(qs_db, qs_ctx, qs_awa_client)
    await withdraw_public_defaults(qs_db)
    script = await grant_printed(qs_database_url, qs_role)
    assert f"GRANT USAGE, CREATE ON SCHEMA awa TO {qs_role}" in script
    assert f"GRANT pg_read_all_stats TO {qs_role}" in script
    assert "GRANT SELECT, TRUNCATE ON awa.ready_entries_0, awa.ready_entries_1," in script
    assert "queue_claim_seq_" in script, "the lanes made so far, one by one"
    work.update(await batch_operation_work(qs_db, qs_awa_client))
    url = as_role(qs_database_url, qs_role)

    # The leader's own provider: observable gauges are registered once per
    # provider, and qs_ctx's metrics hold the fixture's.
    metric_reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[metric_reader])
    storage_state: list = []

    async def done() -> bool:
        # The storage gauges as the role read them (no canonical table on finalised queue storage).
        storage_state[:] = metric_points(metric_reader, STORAGE_STATE)
        return bool(storage_state) and await queue_storage_work_done(qs_db, work)

    try:
        status = await lead_until(url, done, periodic_jobs=[TICK], meter_provider=meter_provider)
    finally:
        meter_provider.shutdown()

    assert_no_privilege_trouble(status, caplog)
    assert [attrs["awa.storage.state"] for attrs, _ in storage_state] == ["active"]
    async with open_database(url) as role_db:
        await rollup_as(role_db, qs_db)
        report = await collect_status(role_db)
        assert "error" not in report["rescue_backlog"]
        assert await missing_privileges(role_db) == []
    assert [r.getMessage() for r in caplog.records if "permission denied" in r.getMessage()] == []


LEASE_DEAD_TUPLE_SQL = """
    WITH ring AS (SELECT current_slot, generation FROM awa.lease_ring_state)
    INSERT INTO awa.leases (lease_slot, lease_generation, ready_slot, ready_generation, job_id, queue,
                            priority, lane_seq)
    SELECT current_slot, generation, 0, 0, 1, 'gone_q', 2, 1 FROM ring
"""


async def test_a_revoked_truncate_on_a_ring_child_is_named_and_the_prune_fails_naming_it(
    qs_database_url, qs_db, qs_role, caplog
):
    async with open_database(qs_database_url) as admin:
        await apply_as_postgres(qs_database_url, await build_grants_script(admin, qs_role))
    await qs_db.execute(f'REVOKE TRUNCATE ON awa.leases_0 FROM "{qs_role}"')
    # An attempt came and went in lease slot 0: a dead tuple to reclaim.
    await qs_db.execute(LEASE_DEAD_TUPLE_SQL)
    await qs_db.execute("DELETE FROM awa.leases WHERE queue = 'gone_q'")

    async with open_database(as_role(qs_database_url, qs_role)) as role_db:
        assert await missing_privileges(role_db) == ["TRUNCATE on awa.leases_0"]
        ctx = await make_context(role_db)
        caplog.clear()
        tick = await rotate_lease.run_once(ctx)
    assert tick.rotate.rotated and tick.prune is None
    [line] = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert line.startswith("rotate_lease: prune failed:") and "permission denied for table leases_0" in line
    assert await qs_db.fetchval("SELECT pg_relation_size('awa.leases_0')") > 0


CUSTOM_SCHEMA = "awa_custom"
CUSTOM_SLOTS = {"queue": 4, "lease": 3, "claim": 5}


@pytest.fixture
def custom_qs_url(awa_template: str) -> str:
    """Queue storage under a schema of its own, with small rings."""
    name = f"awa_trio_qg_{os.getpid()}_{uuid.uuid4().hex[:10]}"
    _admin(f'CREATE DATABASE "{name}" TEMPLATE "{awa_template}"')
    try:
        _make_queue_storage(
            dsn_for(name),
            queue_storage_schema=CUSTOM_SCHEMA,
            **{f"queue_storage_{ring}_slot_count": count for ring, count in CUSTOM_SLOTS.items()},
        )
        yield dsn_for(name)
    finally:
        _drop(name)


@pytest.fixture
def custom_role(custom_qs_url):
    yield from _role_on(custom_qs_url)


@pytest.mark.queue_storage
async def test_the_printed_grants_follow_a_custom_queue_storage_schema(custom_qs_url, custom_role, caplog):
    client = awa.Client(custom_qs_url)
    async with open_database(custom_qs_url) as admin:
        due = await insert_one_scheduled(client, {"n": 1}, queue="custom_q")
        await admin.execute(
            f"UPDATE {CUSTOM_SCHEMA}.deferred_jobs SET run_at = now() - interval '1 second' WHERE job_id = $1", due
        )
        await withdraw_public_defaults(admin, CUSTOM_SCHEMA)
        script = await grant_printed(custom_qs_url, custom_role)
        assert f"GRANT USAGE ON SCHEMA awa TO {custom_role}" in script
        assert f"GRANT USAGE, CREATE ON SCHEMA {CUSTOM_SCHEMA} TO {custom_role}" in script
        assert f"{CUSTOM_SCHEMA}.ready_entries_3 TO" in script and f"{CUSTOM_SCHEMA}.ready_entries_4" not in script
        assert "awa.ready_entries" not in script, "the default schema's rings are not this database's"

        async def done() -> bool:
            generation = {
                ring: await admin.fetchval(f"SELECT generation FROM {CUSTOM_SCHEMA}.{ring}_ring_state")
                for ring in CUSTOM_SLOTS
            }
            # The queue ring parks a lap on, before the slot the job went to.
            return (
                await admin.fetchval(f"SELECT count(*) FROM {CUSTOM_SCHEMA}.ready_entries WHERE job_id = $1", due)
                == 1
                and generation["queue"] >= CUSTOM_SLOTS["queue"] - 1
                and generation["lease"] > 2 * CUSTOM_SLOTS["lease"]
                and generation["claim"] > 2 * CUSTOM_SLOTS["claim"]
            )

        status = await lead_until(as_role(custom_qs_url, custom_role), done)
        untouched = await admin.fetchval("SELECT generation FROM awa.queue_ring_state")
    del client
    assert_no_privilege_trouble(status, caplog)
    assert untouched == 0
    async with open_database(as_role(custom_qs_url, custom_role)) as role_db:
        assert await missing_privileges(role_db) == []


async def test_a_leader_says_at_term_start_which_privilege_its_role_lacks(database_url, db, role, caplog):
    async with open_database(database_url) as admin:
        await apply_as_postgres(database_url, await build_grants_script(admin, role))
    await db.execute(f'REVOKE DELETE ON awa.jobs_hot FROM "{role}"')
    service = MaintenanceService(as_role(database_url, role), MaintenanceConfig(leader_election_interval=0.5))
    with caplog.at_level(logging.INFO, logger="awa_trio"):
        async with trio.open_nursery() as nursery:
            await nursery.start(service.run)
            await service.wait_until_leader()
            with trio.fail_after(10):
                while not any("lacks" in r.getMessage() for r in caplog.records):
                    await trio.sleep(0.05)
            nursery.cancel_scope.cancel()
    lines = [r.getMessage() for r in caplog.records if "lacks" in r.getMessage()]
    assert lines == [missing_privileges_message(role, ["DELETE on awa.jobs_hot"])]
