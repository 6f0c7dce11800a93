"""Small observation helpers shared by tests."""

from __future__ import annotations

from awa_trio.leadership import LOCK_KEY

# Advisory locks are per database; pg_locks shows the whole cluster. A bigint
# key shows as classid (high 32 bits) and objid (low 32 bits), objsubid 1.
ADVISORY_LOCK_HOLDERS_SQL = """
    SELECT pid
    FROM pg_locks
    WHERE locktype = 'advisory'
      AND granted
      AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
      AND (classid::bigint << 32 | objid::bigint) = $1
      AND objsubid = 1
"""


async def advisory_lock_holders(db, key: int) -> list[int]:
    """Backend pids holding a session or transaction advisory lock on ``key``."""
    return [row["pid"] for row in await db.fetch(ADVISORY_LOCK_HOLDERS_SQL, key)]


async def leader_lock_holders(db) -> list[int]:
    """Backend pids holding Awa's leader lock in the test database."""
    return await advisory_lock_holders(db, LOCK_KEY)


async def dirty_admin_tables(db) -> tuple[str, str]:
    """The tables where triggers mark queues and kinds whose admin counts are
    stale: schema 40 (awa-pg 0.6.2+) appends marks to ``*_marks`` tables,
    schema 39 upserts into ``admin_dirty_queues`` / ``admin_dirty_kinds``."""
    if await db.fetchval("SELECT to_regclass('awa.admin_dirty_queue_marks') IS NOT NULL"):
        return "awa.admin_dirty_queue_marks", "awa.admin_dirty_kind_marks"
    return "awa.admin_dirty_queues", "awa.admin_dirty_kinds"


async def dirty_admin_keys(db) -> tuple[set[str], set[str]]:
    """Queues and kinds marked dirty and not yet recomputed."""
    queues_table, kinds_table = await dirty_admin_tables(db)
    queues = {r["queue"] for r in await db.fetch(f"SELECT queue FROM {queues_table}")}
    kinds = {r["kind"] for r in await db.fetch(f"SELECT kind FROM {kinds_table}")}
    return queues, kinds


def metric_points(reader, name: str) -> list[tuple[dict, object]]:
    """(attributes, point) pairs of one metric from an InMemoryMetricReader."""
    data = reader.get_metrics_data()
    points = []
    if data is None:
        return points
    for resource_metrics in data.resource_metrics:
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                if metric.name == name:
                    for point in metric.data.data_points:
                        points.append((dict(point.attributes), point))
    return points


async def status_report(database_url: str) -> dict:
    """``python -m awa_trio status --json`` run as a user would, parsed; the
    command must print its report (exit 0 with a leader, 3 without one)."""
    import json
    import os
    import subprocess
    import sys

    import trio

    result = await trio.to_thread.run_sync(lambda: subprocess.run(
        [sys.executable, "-m", "awa_trio", "status", "--json", "--database-url", database_url],
        capture_output=True, text=True, timeout=60, env=dict(os.environ)))
    assert result.returncode in (0, 3), result.stderr
    return json.loads(result.stdout)
