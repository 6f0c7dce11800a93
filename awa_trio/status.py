"""``python -m awa_trio status``: a read-only report from the database alone.

Who holds the maintenance lock (whichever runtime it is: awa_trio, awa-pg or a
Rust worker), who else is a candidate, the schema and storage state, the
backlog a maintenance leader exists to clear (due jobs not yet promoted,
stale heartbeats, expired deadlines and callbacks) and the cron schedules
with their last and next fire. Works on both engines, whoever leads.
Tables for a person, ``--json`` for scripts.
"""

from __future__ import annotations

import datetime as dt
import json
import sys
from typing import Any

from .config import MaintenanceConfig
from .cron.fire_times import CronSchedule
from .db import Database, QueryError, describe_error, open_database
from .engines import engine_for
from .leadership import LOCK_KEY
from .schema import check_schema
from .sql import Statement

#: The exit status when no session holds the maintenance lock (1 is "could
#: not read the database", 2 a usage error).
EXIT_NO_LEADER = 3

#: Sessions holding (or, being awa_trio, polling for) the maintenance lock.
LOCK_SESSIONS_SQL = Statement("""
    SELECT a.pid,
           a.application_name,
           host(a.client_addr) AS client_addr,
           a.backend_start,
           l.granted IS TRUE AS holds_lock
    FROM pg_stat_activity AS a
    LEFT JOIN pg_locks AS l
      ON l.pid = a.pid
     AND l.locktype = 'advisory'
     AND l.granted
     AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
     AND (l.classid::bigint << 32 | l.objid::bigint) = :lock_key
     AND l.objsubid = 1
    WHERE a.datname = current_database()
      AND (l.pid IS NOT NULL OR a.application_name LIKE 'awa_trio % lock')
    ORDER BY holds_lock DESC, a.backend_start
""")

#: The live registered instances: awa-pg / Rust runtimes and awa_trio nodes
#: (``awa_trio``: its version carries the ``+awa-trio.`` build tag), each
#: refreshed every snapshot interval; live for three intervals, at least 30 s
#: (what Awa's admin views call not stale).
RUNTIMES_SQL = Statement("""
    SELECT instance_id, hostname, pid, version, leader, maintenance_alive, storage_capability,
           transition_role, shutting_down, last_seen_at,
           version LIKE '%+awa-trio.%' AS awa_trio
    FROM awa.runtime_instances
    WHERE last_seen_at + make_interval(secs => greatest(greatest(snapshot_interval_ms, 1000) * 3, 30000) / 1000.0)
          >= now()
    ORDER BY leader DESC, awa_trio DESC, hostname, pid
""")

CRON_SQL = Statement("""
    SELECT name, cron_expr, timezone, kind, queue, last_enqueued_at, paused_at
    FROM awa.cron_jobs ORDER BY name
""")


async def collect_status(db: Database, config: MaintenanceConfig | None = None) -> dict[str, Any]:
    config = config or MaintenanceConfig()
    schema = await check_schema(db)
    sessions = [dict(row) for row in await db.fetch(*LOCK_SESSIONS_SQL.bind(lock_key=LOCK_KEY))]
    holder = next((s for s in sessions if s["holds_lock"]), None)
    runtimes = [dict(row) for row in await db.fetch(*RUNTIMES_SQL.bind())]
    backlog = engine_for(schema).backlog
    due = {
        row["state"]: {"jobs": row["jobs"], "oldest_seconds": row["oldest_seconds"]}
        for row in await db.fetch(*backlog.due_counts_query(schema.queue_storage_schema))
    }
    try:
        rescue: dict[str, Any] = dict(
            await db.fetchone(
                *backlog.rescue_backlog_query(schema.queue_storage_schema, config.heartbeat_staleness)
            )
        )
    except QueryError as exc:
        # On queue storage awa.jobs decodes every row's payload, and one
        # payload it cannot read (tags that are not an array) fails the
        # query: report that here and the rest as usual.
        rescue = {"error": describe_error(exc)}
    now = dt.datetime.now(dt.UTC)
    return {
        "lock_holder": holder and _session(holder),
        "candidates": [_session(s) for s in sessions if not s["holds_lock"]],
        # Every registered instance, awa_trio's own included; awa_runtimes
        # keeps its meaning: the awa-pg / Rust runtimes among them.
        "instances": [_runtime(r) for r in runtimes],
        "awa_runtimes": [_runtime(r) for r in runtimes if not r["awa_trio"]],
        "schema_version": schema.version,
        "engine": schema.engine,
        "transition_state": schema.state,
        "due_not_promoted": due,
        "rescue_backlog": rescue,
        "cron": [_cron(dict(row), now) for row in await db.fetch(*CRON_SQL.bind())],
    }


def _session(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "pid": row["pid"],
        "application_name": row["application_name"],
        "client_addr": row["client_addr"],
        "connected_since": row["backend_start"],
    }


def _runtime(row: dict[str, Any]) -> dict[str, Any]:
    return {
        key: row[key]
        for key in (
            "instance_id",
            "awa_trio",
            "hostname",
            "pid",
            "version",
            "leader",
            "maintenance_alive",
            "storage_capability",
            "transition_role",
            "shutting_down",
            "last_seen_at",
        )
    }


def _cron(row: dict[str, Any], now: dt.datetime) -> dict[str, Any]:
    entry = {key: row[key] for key in ("name", "cron_expr", "timezone", "kind", "queue")}
    entry["last_fire"] = row["last_enqueued_at"]
    entry["paused"] = row["paused_at"] is not None
    try:
        entry["next_fire"] = CronSchedule.parse(row["cron_expr"], row["timezone"]).next_fire_after(now)
    except ValueError as exc:  # invalid expression or zone: say so, keep the others
        entry["next_fire"] = None
        entry["error"] = str(exc)
    return entry


def format_status(report: dict[str, Any]) -> str:
    """The report as short tables for a terminal."""
    lines = []
    holder = report["lock_holder"]
    if holder:
        lines.append(
            f"maintenance leader: pid {holder['pid']} {holder['application_name'] or '?'} "
            f"from {holder['client_addr'] or 'local socket'}, connected since "
            f"{_when(holder['connected_since'])}"
        )
    else:
        lines.append("maintenance leader: none (no session holds the lock)")
    for candidate in report["candidates"]:
        lines.append(f"  candidate: pid {candidate['pid']} {candidate['application_name']}")
    lines.extend(format_instances(report["instances"]))
    lines.append(
        f"schema version {report['schema_version']}, engine {report['engine']}, "
        f"transition state {report['transition_state']}"
    )
    lines.append("")
    lines.append(f"{'backlog':<40}{'jobs':>10}  oldest")
    for state in ("scheduled", "retryable"):
        due = report["due_not_promoted"].get(state, {"jobs": 0, "oldest_seconds": None})
        oldest = f"{due['oldest_seconds']:.1f}s" if due["oldest_seconds"] is not None else "-"
        lines.append(f"{'due ' + state + ', not promoted':<40}{due['jobs']:>10}  {oldest}")
    rescue = report["rescue_backlog"]
    if "error" in rescue:
        lines.append(f"{'rescue backlog':<40}unreadable: {rescue['error']}")
    else:
        lines.append(f"{'running, heartbeat stale':<40}{rescue['stale_heartbeats']:>10}")
        lines.append(f"{'running, past deadline':<40}{rescue['past_deadline']:>10}")
        lines.append(f"{'waiting for callback, timed out':<40}{rescue['callbacks_timed_out']:>10}")
    if report["cron"]:
        lines.append("")
        lines.append(f"{'cron schedule':<24}{'expression':<20}{'last fire':<28}next fire")
        for cron in report["cron"]:
            next_fire = (
                "paused"
                if cron["paused"]
                else (_when(cron["next_fire"]) if cron["next_fire"] else cron.get("error", "-"))
            )
            lines.append(
                f"{cron['name']:<24}{cron['cron_expr']:<20}{_when(cron['last_fire']):<28}{next_fire}"
            )
    return "\n".join(lines)


def format_instances(instances: list[dict[str, Any]]) -> list[str]:
    """One line per registered instance, the one that says it leads first."""
    if not instances:
        return ["registered instances: none live in awa.runtime_instances"]
    lines = [f"registered instances ({len(instances)} live in awa.runtime_instances):"]
    for instance in instances:
        what = "awa_trio" if instance["awa_trio"] else "awa runtime"
        role = "LEADS maintenance" if instance["leader"] else "follows"
        if instance["shutting_down"]:
            role += ", shutting down"
        lines.append(
            f"  {what} {instance['hostname'] or '?'}:{instance['pid']} {instance['version']}: {role} "
            f"(maintenance {'alive' if instance['maintenance_alive'] else 'off'}, "
            f"{instance['storage_capability']}, role {instance['transition_role']})"
        )
    return lines


def _when(value: dt.datetime | None) -> str:
    return value.isoformat(timespec="seconds") if value else "-"


async def print_status(
    database_url: str, as_json: bool = False, config: MaintenanceConfig | None = None
) -> int:
    async with open_database(database_url, pool_size=1) as db:
        report = await collect_status(db, config)
    if as_json:
        print(json.dumps(report, indent=2, default=str))
    else:
        print(format_status(report))
    sys.stdout.flush()
    # Scripts and probes can ask "does anything lead?" without parsing output.
    return 0 if report["lock_holder"] else EXIT_NO_LEADER
