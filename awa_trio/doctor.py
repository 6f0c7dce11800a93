"""``python -m awa_trio doctor``: what is wrong with this database for a
maintenance leader, one finding a line (severity, what, why, what to do).

Exit codes: 0 healthy, 1 warnings only, 2 any critical finding (or a
database that cannot be reached)."""

from __future__ import annotations

import dataclasses
import json
import sys
import time
import uuid
from collections.abc import Awaitable, Sequence
from typing import Any

import trio

from .config import MaintenanceConfig
from .db import (
    Database,
    DatabaseError,
    LockTimeout,
    QueryError,
    describe_error,
    find_lock_holder,
    open_database,
)
from .engines import engine_for
from .errors import UnsupportedSchema
from .grants import CURRENT_USER_SQL, missing_privileges
from .leadership import LOCK_KEY, unwritable_reason
from .logs import redact_url
from .schema import (
    SUPPORTED_ENGINES,
    SUPPORTED_SCHEMA_VERSIONS,
    SchemaInfo,
    read_schema,
    unsupported_engine_message,
    unsupported_version_message,
)
from .sql import Statement
from .status import LOCK_SESSIONS_SQL, RUNTIMES_SQL

OK, WARNING, CRITICAL = "ok", "warning", "critical"
EXIT_HEALTHY, EXIT_WARNINGS, EXIT_CRITICAL = 0, 1, 2

#: An open snapshot (a transaction or statement holding back ``backend_xmin``)
#: older than this is a warning; older than :data:`HORIZON_CRITICAL` critical.
#: While it is open VACUUM cannot remove any row version deleted after it
#: began: awa.jobs_hot bloats with finished rows, and on queue storage the
#: rollups and the ring prunes (TRUNCATE of rotated partitions) wait for it,
#: so the rings stop recycling and dead tuples pile up for every queue.
HORIZON_WARNING = 5 * 60.0
HORIZON_CRITICAL = 30 * 60.0
#: A due scheduled/retryable job older than this was not promoted: the
#: promote branch runs every 250 ms by default, so a minute means no leader
#: promotes (or it fails every pass).
DUE_GRACE = 60.0
#: Host/server clock difference: past a second, run_at, heartbeats and
#: deadlines compared across hosts drift; past 30 s rescues fire early or late.
SKEW_WARNING = 1.0
SKEW_CRITICAL = 30.0
#: A lock that maintenance statements cannot share (an operator's DDL, an
#: explicit LOCK TABLE) held this long on an awa table: every branch that
#: needs the table yields at each tick (statement_lock_timeout) until it ends.
DDL_LOCK_WARNING = 2 * 60.0
#: How long the NOTIFY round trip may take.
NOTIFY_TIMEOUT = 2.0

_RANK = {OK: 0, WARNING: 1, CRITICAL: 2}


@dataclasses.dataclass
class Finding:
    check: str
    severity: str
    summary: str
    why: str = ""
    action: str = ""
    details: dict[str, Any] = dataclasses.field(default_factory=dict)

    def line(self) -> str:
        parts = [f"{self.severity.upper():<8} {self.check}: {self.summary}"]
        if self.why:
            parts.append(f"why: {self.why}")
        if self.action:
            parts.append(f"do: {self.action}")
        return " | ".join(parts)


def exit_code(findings: list[Finding]) -> int:
    worst = max((_RANK[f.severity] for f in findings), default=0)
    return {0: EXIT_HEALTHY, 1: EXIT_WARNINGS, 2: EXIT_CRITICAL}[worst]


async def check_schema_finding(db: Database) -> tuple[Finding, SchemaInfo | None]:
    try:
        info = await read_schema(db)
    except QueryError as exc:  # e.g. no USAGE on the awa schema
        return Finding(
            "schema",
            CRITICAL,
            f"cannot read the awa schema: {describe_error(exc)}",
            "a leader reads the schema version before anything else",
            "grant the role the privileges `python -m awa_trio grants` prints",
        ), None
    except UnsupportedSchema as exc:
        return Finding(
            "schema",
            CRITICAL,
            str(exc),
            "awa_trio cannot address this schema",
            "let an Awa runtime lead this database",
        ), None
    why = "a leader refuses to run on a schema it does not know"
    if info is None or info.version not in SUPPORTED_SCHEMA_VERSIONS:
        return Finding(
            "schema",
            CRITICAL,
            unsupported_version_message(None if info is None else info.version),
            why,
            "install or upgrade the schema with `python -m awa_trio migrate`, or pin a matching awa_trio",
            {"version": None if info is None else info.version, "supported": list(SUPPORTED_SCHEMA_VERSIONS)},
        ), None
    details = {"version": info.version, "engine": info.engine, "state": info.state}
    if info.engine not in SUPPORTED_ENGINES:
        return Finding(
            "schema",
            CRITICAL,
            unsupported_engine_message(info.engine),
            why,
            "let an Awa runtime lead this database",
            details,
        ), None
    return Finding(
        "schema", OK, f"schema version {info.version}, engine {info.engine} ({info.state})", details=details
    ), info


SERVER_SQL = Statement("""
    SELECT pg_is_in_recovery() AS in_recovery, current_setting('transaction_read_only') = 'on' AS read_only
""")


async def check_server(db: Database) -> Finding:
    row = await db.fetchrow(*SERVER_SQL.bind())
    assert row is not None
    details = {"in_recovery": row["in_recovery"], "read_only": row["read_only"]}
    reason = unwritable_reason("this server", row["in_recovery"], row["read_only"])
    if reason:
        summary, _, action = reason.partition(": ")
        return Finding(
            "server",
            CRITICAL,
            summary,
            "a leader must write (promote, rescue, prune) and steps down on an unwritable server",
            action,
            details,
        )
    return Finding("server", OK, "writable primary", details=details)


async def check_leader(db: Database) -> Finding:
    sessions = [dict(row) for row in await db.fetch(*LOCK_SESSIONS_SQL.bind(lock_key=LOCK_KEY))]
    holder = next((s for s in sessions if s["holds_lock"]), None)
    if holder:
        name = holder["application_name"] or ""
        kind = "awa_trio" if name.startswith("awa_trio") else "another process (not awa_trio)"
        details = {
            "pid": holder["pid"],
            "application_name": name,
            "client_addr": holder["client_addr"],
            "since": str(holder["backend_start"]),
            "kind": kind,
        }
        return Finding(
            "leader",
            OK,
            f"lock held by pid {holder['pid']} {name or '?'} ({kind}) since "
            + (f"{since:%Y-%m-%d %H:%M:%S%z}" if (since := holder["backend_start"]) else "? (not visible)"),
            details=details,
        )
    try:
        runtimes = [dict(row) for row in await db.fetch(*RUNTIMES_SQL.bind())]
    except DatabaseError:
        runtimes = []
    # An awa_trio node leads only while it holds the lock (the case above):
    # a row of one that says so without it is a killed node's, not yet expired.
    leaders = [r for r in runtimes if r["leader"] and r["maintenance_alive"] and not r["awa_trio"]]
    if leaders:
        runtime = leaders[0]
        return Finding(
            "leader",
            OK,
            f"awa runtime {runtime['hostname']}:{runtime['pid']} {runtime['version']} leads maintenance",
            details={"kind": "awa runtime", "hostname": runtime["hostname"], "pid": runtime["pid"]},
        )
    return Finding(
        "leader",
        CRITICAL,
        "no session holds the maintenance lock and no awa runtime reports leading",
        "nothing promotes scheduled jobs, rescues stale ones or prunes finished ones",
        "start `python -m awa_trio` (or an awa-pg runtime) against this database",
        {"candidates": [s["pid"] for s in sessions]},
    )


#: Live runtimes that run queues (awa-pg or Rust workers: the processes whose
#: code may declare schedules with client.periodic); awa_trio's own
#: maintenance-only instance runs none.
WORKER_RUNTIMES_SQL = Statement("""
    SELECT hostname, pid, version
    FROM awa.runtime_instances
    WHERE last_seen_at > now() - make_interval(secs => greatest(snapshot_interval_ms, 1000) * 3 / 1000.0)
      AND NOT shutting_down
      AND jsonb_typeof(queues) = 'array' AND jsonb_array_length(queues) > 0
    ORDER BY hostname, pid
""")


async def check_periodic_declarations(
    db: Database, periodic_jobs: int = 0, periodic_from: Sequence[str] = ()
) -> Finding:
    """While awa_trio holds the lock, no runtime registers the schedules its
    code declares; only awa_trio's own (--periodic-from, [periodic_jobs])
    reach awa.cron_jobs. ``periodic_jobs`` and ``periodic_from`` are what this
    doctor's configuration gives awa_trio (run it with run's flags)."""
    sessions = await db.fetch(*LOCK_SESSIONS_SQL.bind(lock_key=LOCK_KEY))
    holder = next((s for s in sessions if s["holds_lock"]), None)
    if holder is not None and holder["application_name"] is None:
        return Finding(
            "periodic_declarations",
            OK,
            "cannot tell whether awa_trio leads: the lock holder's application_name is hidden from this role",
        )
    if holder is None or not holder["application_name"].startswith("awa_trio"):
        return Finding(
            "periodic_declarations", OK, "awa_trio does not lead: the leading runtime registers its schedules"
        )
    workers = [dict(row) for row in await db.fetch(*WORKER_RUNTIMES_SQL.bind())]
    details = {
        "worker_runtimes": len(workers),
        "periodic_jobs": periodic_jobs,
        "periodic_from": list(periodic_from),
    }
    if periodic_from:
        return Finding(
            "periodic_declarations",
            OK,
            f"awa_trio registers {periodic_jobs} schedule(s), with the code declarations of {', '.join(periodic_from)}",
            details=details,
        )
    if not workers:
        return Finding("periodic_declarations", OK, "no live awa runtime runs queues", details=details)
    if periodic_jobs:
        return Finding(
            "periodic_declarations",
            OK,
            f"awa_trio registers {periodic_jobs} configured schedule(s); schedules declared in code "
            "(client.periodic) are registered only with --periodic-from",
            details=details,
        )
    names = ", ".join(f"{w['hostname']}:{w['pid']}" for w in workers[:3]) + (
        " ..." if len(workers) > 3 else ""
    )
    return Finding(
        "periodic_declarations",
        WARNING,
        f"awa_trio leads and {len(workers)} awa runtime(s) run queues ({names}), "
        "but awa_trio registers no schedules of its own",
        "only the lock holder writes the schedules declared in code (client.periodic) into "
        "awa.cron_jobs: while awa_trio leads, a new one is never registered and a changed "
        "expression or args never takes effect (rows already there keep firing)",
        "name the app's declaration function with --periodic-from package.module:function (or "
        "periodic_from in the config file), and run doctor with the same flags and config as run",
        details,
    )


async def check_instances(db: Database) -> Finding:
    """The registered instances (awa.runtime_instances, what Awa's admin
    views show), the one that says it leads first."""
    instances = [_instance(dict(row)) for row in await db.fetch(*RUNTIMES_SQL.bind())]
    if not instances:
        return Finding("instances", OK, "none live in awa.runtime_instances", details={"instances": []})
    leading = [i for i in instances if i["leader"]]
    names = "; ".join(
        f"{i['kind']} {i['hostname'] or '?'}:{i['pid']} {'leads' if i['leader'] else 'follows'}"
        for i in instances
    )
    return Finding(
        "instances",
        OK,
        f"{len(instances)} live ({len(leading)} leading): {names}",
        details={"instances": instances},
    )


def _instance(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "instance_id": str(row["instance_id"]),
        "kind": "awa_trio" if row["awa_trio"] else "awa runtime",
        "hostname": row["hostname"],
        "pid": row["pid"],
        "version": row["version"],
        "leader": row["leader"],
        "maintenance_alive": row["maintenance_alive"],
        "storage_capability": row["storage_capability"],
        "shutting_down": row["shutting_down"],
    }


#: The other session holding the oldest snapshot.
OLDEST_SNAPSHOT_SQL = Statement("""
    SELECT pid, application_name, state, backend_xmin::text AS xmin,
           extract(epoch FROM now() - coalesce(xact_start, query_start))::float8 AS age
    FROM pg_stat_activity
    WHERE datname = current_database() AND pid <> pg_backend_pid()
      AND backend_xmin IS NOT NULL
    ORDER BY coalesce(xact_start, query_start) NULLS LAST
    LIMIT 1
""")


async def check_horizon(
    db: Database, warning: float = HORIZON_WARNING, critical: float = HORIZON_CRITICAL
) -> Finding:
    row = await db.fetchrow(*OLDEST_SNAPSHOT_SQL.bind())
    if row is None:
        return Finding("mvcc_horizon", OK, "no other session holds a snapshot")
    if row["age"] is None:  # another role's session, seen without pg_read_all_stats
        return Finding(
            "mvcc_horizon",
            WARNING,
            f"pid {row['pid']} holds a snapshot of unknown age (its transaction start is hidden)",
            "an old snapshot blocks vacuum, and on queue storage the rollups and ring prunes",
            "run the doctor as a role with pg_read_all_stats (or a superuser)",
            {"pid": row["pid"], "backend_xmin": row["xmin"]},
        )
    age = float(row["age"])
    details = {
        "pid": row["pid"],
        "application_name": row["application_name"],
        "state": row["state"],
        "backend_xmin": row["xmin"],
        "age_seconds": round(age, 1),
    }
    who = f"pid {row['pid']} {row['application_name'] or '?'} ({row['state']})"
    severity = CRITICAL if age > critical else WARNING if age > warning else OK
    if severity == OK:
        return Finding("mvcc_horizon", OK, f"oldest snapshot {age:.0f}s old ({who})", details=details)
    return Finding(
        "mvcc_horizon",
        severity,
        f"{who} has held a snapshot for {age:.0f}s",
        "it blocks vacuum of every table; on queue storage the rollups and ring prunes wait for it",
        f"end that transaction (SELECT pg_terminate_backend({row['pid']})) or fix the client that "
        "leaves it open; set idle_in_transaction_session_timeout",
        details,
    )


async def check_ddl_locks(
    db: Database, info: SchemaInfo | None, warning: float = DDL_LOCK_WARNING
) -> Finding:
    """Repeated yields, seen from their cause: a transaction that has held
    a lock maintenance cannot share, on an awa table, for minutes. (The
    yields themselves are counted in the leader's metrics, which the
    doctor, a client of the database only, cannot read.)"""
    schemas = sorted({"awa", info.queue_storage_schema if info is not None else "awa"})
    rows = await db.fetch(*DDL_LOCKS_SQL.bind(schemas=schemas, held_for=warning))
    if not rows:
        return Finding("ddl_locks", OK, "no session has held an exclusive lock on an awa table for long")
    first = rows[0]
    who = f"pid {first['pid']} {first['application_name'] or '?'} ({first['state']})"
    relations = sorted({row["relation"] for row in rows})
    shown = ", ".join(relations[:5]) + (f" and {len(relations) - 5} more" if len(relations) > 5 else "")
    return Finding(
        "ddl_locks",
        WARNING,
        f"{who} has held {first['mode']} on {shown} for {first['age']:.0f}s",
        "maintenance gives way to it: every branch that needs these tables yields each tick "
        "(awa_trio_branch_yields_total) until that transaction ends",
        f"let the migration finish, or end that transaction (SELECT pg_terminate_backend({first['pid']}))",
        {"pid": first["pid"], "relations": relations, "age_seconds": round(float(first["age"]), 1)},
    )


#: Granted relation locks that conflict with what maintenance takes (SHARE
#: and stronger block its writes, ACCESS EXCLUSIVE its reads too), on tables
#: of the awa schemas, in transactions older than the threshold.
DDL_LOCKS_SQL = Statement("""
    SELECT l.pid, a.application_name, a.state, l.mode,
           format('%I.%I', n.nspname, c.relname) AS relation,
           extract(epoch FROM now() - a.xact_start)::float8 AS age
    FROM pg_locks l
    JOIN pg_stat_activity a ON a.pid = l.pid
    JOIN pg_class c ON c.oid = l.relation
    JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE l.locktype = 'relation' AND l.granted AND l.pid <> pg_backend_pid()
      AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
      AND l.mode IN ('ShareLock', 'ShareRowExclusiveLock', 'ExclusiveLock', 'AccessExclusiveLock')
      AND n.nspname = ANY(:schemas::text[])
      AND a.xact_start < now() - make_interval(secs => :held_for)
    ORDER BY a.xact_start, relation
""")


async def check_backlogs(
    db: Database, info: SchemaInfo, config: MaintenanceConfig, due_grace: float = DUE_GRACE
) -> list[Finding]:
    findings = []
    backlog = engine_for(info).backlog
    due = {row["state"]: row for row in await db.fetch(*backlog.due_counts_query(info.queue_storage_schema))}
    late = {
        state: row["jobs"]
        for state, row in due.items()
        if row["oldest_seconds"] is not None and row["oldest_seconds"] > due_grace
    }
    if late:
        findings.append(
            Finding(
                "due_not_promoted",
                WARNING,
                ", ".join(f"{n} {state}" for state, n in late.items()) + f" due for over {due_grace:g}s",
                "due jobs wait until the promote branch moves them to available",
                "check that a leader runs and its promote branch is not failing (its logs)",
                {
                    state: {"jobs": row["jobs"], "oldest_seconds": row["oldest_seconds"]}
                    for state, row in due.items()
                },
            )
        )
    else:
        findings.append(Finding("due_not_promoted", OK, "no due job waits to be promoted"))
    try:
        row = await db.fetchrow(
            *backlog.rescue_backlog_query(info.queue_storage_schema, config.heartbeat_staleness)
        )
    except DatabaseError as exc:
        findings.append(
            Finding(
                "rescue_backlog",
                WARNING,
                f"unreadable: {describe_error(exc)}",
                "a row awa.jobs cannot decode",
                "inspect the bad rows",
            )
        )
        return findings
    assert row is not None
    labels = (
        (
            "stale_heartbeats",
            f"running with a heartbeat older than {config.heartbeat_staleness:g}s",
            "their workers are presumed dead; the slot stays taken until rescued",
        ),
        ("past_deadline", "running past their deadline", "they hold a slot past their time budget"),
        (
            "callbacks_timed_out",
            "waiting for a callback past its timeout",
            "they never resume or fail until rescued",
        ),
    )
    for key, what, why in labels:
        count = int(row[key])
        if count:
            findings.append(
                Finding(
                    key,
                    WARNING,
                    f"{count} job(s) {what}",
                    why,
                    "check that a leader runs and its rescue branches are not failing",
                    {"jobs": count},
                )
            )
        else:
            findings.append(Finding(key, OK, f"no job {what}"))
    return findings


SERVER_CLOCK_SQL = Statement("SELECT extract(epoch FROM clock_timestamp())::float8")
NOTIFY_SQL = Statement("SELECT pg_notify(:channel, '')")


async def check_clock(db: Database) -> Finding:
    before = time.time()
    server = float(await db.fetchval(*SERVER_CLOCK_SQL.bind()))
    after = time.time()
    skew = server - (before + after) / 2
    uncertainty = (after - before) / 2
    effective = max(0.0, abs(skew) - uncertainty)
    details = {"skew_seconds": round(skew, 3), "round_trip_seconds": round(after - before, 3)}
    severity = CRITICAL if effective > SKEW_CRITICAL else WARNING if effective > SKEW_WARNING else OK
    if severity == OK:
        return Finding(
            "clock_skew", OK, f"server clock within {abs(skew):.3f}s of this host", details=details
        )
    return Finding(
        "clock_skew",
        severity,
        f"server clock is {skew:+.1f}s from this host",
        "run_at, heartbeats and deadlines are compared across hosts' clocks",
        "run NTP (chrony, systemd-timesyncd) on both hosts",
        details,
    )


async def check_notify(db: Database, timeout: float = NOTIFY_TIMEOUT) -> Finding:
    channel = f"awa_trio_doctor_{uuid.uuid4().hex}"
    arrived = trio.Event()
    why = "followers wake on the leader's release NOTIFY; without it takeovers wait for the poll"
    started = time.monotonic()
    try:
        conn = await db.connect_dedicated(application_name="awa_trio doctor listen")
        try:
            await conn.listen(channel, lambda _payload: arrived.set())
            await db.execute(*NOTIFY_SQL.bind(channel=channel))
            with trio.move_on_after(timeout):
                await arrived.wait()
        finally:
            with trio.move_on_after(2, shield=True):
                await conn.close()
    except DatabaseError as exc:
        return Finding(
            "notify",
            WARNING,
            f"LISTEN/NOTIFY failed: {describe_error(exc)}",
            why,
            "connect directly (not through a transaction-mode pooler) for LISTEN",
        )
    if not arrived.is_set():
        return Finding(
            "notify",
            WARNING,
            f"a NOTIFY did not arrive within {timeout:g}s",
            why,
            "check for a pooler or proxy between here and the server that drops notifications",
        )
    return Finding("notify", OK, f"NOTIFY round trip in {time.monotonic() - started:.3f}s")


async def check_privileges(db: Database, info: SchemaInfo) -> Finding:
    try:
        missing = await missing_privileges(db, info)
    except (DatabaseError, UnsupportedSchema) as exc:
        return Finding("privileges", WARNING, f"could not check privileges: {exc}")
    if not missing:
        return Finding("privileges", OK, "the connected role has every privilege a leader needs")
    role = str(await db.fetchval(*CURRENT_USER_SQL.bind()))
    return Finding(
        "privileges",
        WARNING,
        f"role {role} lacks {len(missing)} privilege(s): {', '.join(missing[:5])}",
        "the branches needing them fail every pass",
        f"apply `python -m awa_trio grants --role {role}` as the schema owner",
        {"missing": missing},
    )


async def collect_findings(
    db: Database,
    config: MaintenanceConfig | None = None,
    *,
    horizon_warning: float = HORIZON_WARNING,
    horizon_critical: float = HORIZON_CRITICAL,
    due_grace: float = DUE_GRACE,
    periodic_jobs: int = 0,
    periodic_from: Sequence[str] = (),
    ddl_lock_warning: float = DDL_LOCK_WARNING,
) -> list[Finding]:
    """Every check, in order of priority; ``db`` should be a one-connection
    pool so that the horizon check excludes the doctor's own session."""
    config = config or MaintenanceConfig()
    schema_finding, info = await check_schema_finding(db)
    findings = [schema_finding]
    findings.append(await _guarded("server", check_server(db)))
    findings.append(await _guarded("leader", check_leader(db)))
    findings.append(await _guarded("mvcc_horizon", check_horizon(db, horizon_warning, horizon_critical)))
    findings.append(await _guarded("instances", check_instances(db)))
    findings.append(await _guarded("ddl_locks", check_ddl_locks(db, info, ddl_lock_warning)))
    if info is not None:
        try:
            findings.extend(await check_backlogs(db, info, config, due_grace))
        except QueryError as exc:
            findings.append(await _refused_after(db, "backlogs", exc))
    findings.append(await _guarded("clock_skew", check_clock(db)))
    findings.append(await _guarded("notify", check_notify(db)))
    if info is not None:
        findings.append(await _guarded("privileges", check_privileges(db, info)))
        findings.append(
            await _guarded(
                "periodic_declarations", check_periodic_declarations(db, periodic_jobs, periodic_from)
            )
        )
    return findings


async def _guarded(check: str, run: Awaitable[Finding]) -> Finding:
    """A check the server refused (a permission, a missing view) becomes a
    warning of its own; the other checks still run. A lost connection is not
    caught: the whole run fails with one line."""
    try:
        return await run
    except QueryError as exc:
        return _refused(check, exc)


async def _refused_after(db: Database, check: str, exc: QueryError) -> Finding:
    if isinstance(exc, LockTimeout):
        exc.relation = await find_lock_holder(db, exc)
    return _refused(check, exc)


def _refused(check: str, exc: QueryError) -> Finding:
    if isinstance(exc, LockTimeout):
        return Finding(
            check,
            WARNING,
            f"the check gave way to a lock on {exc.relation or 'a table'} held by another session",
            "its part of the database is not known to be healthy",
            "run the doctor again once the migration (see ddl_locks) has finished",
        )
    return Finding(
        check,
        WARNING,
        f"the check could not run: {describe_error(exc)}",
        "its part of the database is not known to be healthy",
        "run the doctor as a role with the privileges `python -m awa_trio grants` prints",
    )


def format_findings(findings: list[Finding]) -> str:
    return "\n".join(finding.line() for finding in findings)


async def run_doctor(
    database_url: str,
    as_json: bool = False,
    config: MaintenanceConfig | None = None,
    *,
    periodic_jobs: int = 0,
    periodic_from: Sequence[str] = (),
) -> int:
    try:
        # Its reads give way to a migration as maintenance's do (a doctor
        # run must never be the reason a deploy fails, nor hang behind one).
        lock_timeout = (config or MaintenanceConfig()).statement_lock_timeout
        async with open_database(
            database_url, pool_size=1, application_name="awa_trio doctor", statement_lock_timeout=lock_timeout
        ) as db:
            findings = await collect_findings(
                db, config, periodic_jobs=periodic_jobs, periodic_from=periodic_from
            )
    except DatabaseError as exc:
        message = f"cannot use database {redact_url(database_url)}: {exc}"
        print(f"awa_trio: {message}", file=sys.stderr)
        if as_json:
            print(json.dumps({"error": message, "exit_code": EXIT_CRITICAL}))
        return EXIT_CRITICAL
    if as_json:
        print(json.dumps([dataclasses.asdict(f) for f in findings], indent=2, default=str))
    else:
        print(format_findings(findings))
    sys.stdout.flush()
    return exit_code(findings)
