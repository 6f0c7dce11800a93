"""queue_stats: awa.queue.depth and awa.queue.lag with upstream's values."""

from __future__ import annotations

import datetime as dt

import pytest
from conftest import in_thread
from support.contexts import make_context
from support.helpers import metric_points

from awa_trio.context import MaintenanceContext
from awa_trio.engines.canonical import admin_metadata, queue_stats
from awa_trio.metrics import (
    ATTR_JOB_QUEUE,
    ATTR_JOB_STATE,
    QUEUE_DEPTH,
    QUEUE_LAG,
)


async def insert(awa_client, queue: str, **options) -> int:
    job = await in_thread(awa_client.insert, {"n": 1}, kind="stats_probe", queue=queue, **options)
    return job.id


async def set_state(db, table: str, job_id: int, state: str, extra: str = "") -> None:
    await db.execute(
        f"UPDATE awa.{table} SET state = $2::awa.job_state, attempt = 1 {extra} WHERE id = $1",
        job_id, state,
    )


async def flush_admin_cache(ctx: MaintenanceContext) -> None:
    while (await admin_metadata.run_recompute_dirty(ctx)).keys_recomputed:
        pass


def depth_points(reader) -> dict[tuple[str, str], int]:
    return {
        (attrs[ATTR_JOB_QUEUE], attrs[ATTR_JOB_STATE]): point.value
        for attrs, point in metric_points(reader, QUEUE_DEPTH)
    }


def lag_points(reader) -> dict[str, float]:
    return {attrs[ATTR_JOB_QUEUE]: point.value for attrs, point in metric_points(reader, QUEUE_LAG)}


async def test_depth_and_lag_per_queue_match_awa_pg_queue_stats(
    db, awa_client, meter_provider, metric_reader
):
    ctx = await make_context(db, meter_provider=meter_provider)
    # Queue "busy": 3 available (the oldest has the lowest priority), 1 running,
    # 1 failed, 1 waiting_external, 2 scheduled, 1 retryable, 1 completed.
    oldest = await insert(awa_client, "busy", priority=4)
    await db.execute(
        "UPDATE awa.jobs_hot SET run_at = now() - interval '120 seconds' WHERE id = $1", oldest
    )
    for _ in range(2):
        recent = await insert(awa_client, "busy", priority=1)
        await db.execute(
            "UPDATE awa.jobs_hot SET run_at = now() - interval '10 seconds' WHERE id = $1", recent
        )
    await set_state(db, "jobs_hot", await insert(awa_client, "busy"), "running",
                    ", heartbeat_at = now()")
    await set_state(db, "jobs_hot", await insert(awa_client, "busy"), "failed",
                    ", finalized_at = now()")
    await set_state(db, "jobs_hot", await insert(awa_client, "busy"), "waiting_external",
                    ", callback_id = gen_random_uuid(),"
                    " callback_timeout_at = now() + interval '1 hour'")
    await set_state(db, "jobs_hot", await insert(awa_client, "busy"), "completed",
                    ", finalized_at = now()")
    future = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    for _ in range(2):
        await insert(awa_client, "busy", run_at=future)
    await set_state(db, "scheduled_jobs", await insert(awa_client, "busy", run_at=future),
                    "retryable")
    # Queue "idle": nothing available, one scheduled job: depth but no lag.
    await insert(awa_client, "idle", run_at=future)
    # Queue "paused": declared by an operator, no jobs at all.
    await in_thread(awa_client.pause_queue, "paused")
    await flush_admin_cache(ctx)

    result = await queue_stats.run_once(ctx)

    assert [stats.queue for stats in result.queues] == ["busy", "idle", "paused"]
    assert depth_points(metric_reader) == {
        ("busy", "available"): 3,
        ("busy", "running"): 1,
        ("busy", "failed"): 1,
        ("busy", "scheduled"): 2,
        ("busy", "retryable"): 1,
        ("busy", "waiting_external"): 1,
        ("idle", "available"): 0,
        ("idle", "running"): 0,
        ("idle", "failed"): 0,
        ("idle", "scheduled"): 1,
        ("idle", "retryable"): 0,
        ("idle", "waiting_external"): 0,
        **{("paused", state): 0 for state in queue_stats.DEPTH_STATES},
    }
    lags = lag_points(metric_reader)
    assert set(lags) == {"busy"}
    assert 120 <= lags["busy"] < 150

    # Same numbers as upstream's own overview (what Awa's UI and dashboards show).
    upstream = {stat.queue: stat for stat in await in_thread(awa_client.queue_stats)}
    assert sorted(upstream) == ["busy", "idle", "paused"]
    for stats in result.queues:
        theirs = upstream[stats.queue]
        assert stats.depth == {state: getattr(theirs, state) for state in queue_stats.DEPTH_STATES}
        if theirs.lag_seconds is None:
            assert stats.lag_seconds is None
        else:
            assert stats.lag_seconds == pytest.approx(theirs.lag_seconds, abs=5)


async def test_depth_comes_from_the_admin_cache(db, awa_client, meter_provider, metric_reader):
    """Upstream's semantics: counts are as fresh as recompute_dirty_admin_metadata
    made them; jobs the cache has not seen yet are not reported."""
    ctx = await make_context(db, meter_provider=meter_provider)
    await insert(awa_client, "fresh")

    before = await queue_stats.run_once(ctx)
    assert before.queues == []
    assert depth_points(metric_reader) == {}

    await flush_admin_cache(ctx)
    await insert(awa_client, "fresh")  # not yet recomputed
    after = await queue_stats.run_once(ctx)

    assert [(s.queue, s.depth["available"]) for s in after.queues] == [("fresh", 1)]
    assert depth_points(metric_reader)[("fresh", "available")] == 1
    assert "fresh" in lag_points(metric_reader)


async def test_lag_is_the_oldest_available_run_at_across_all_priorities(
    db, meter_provider, metric_reader
):
    ctx = await make_context(db, meter_provider=meter_provider)
    # Each priority level's oldest job is younger than the one before, except
    # level 3, which holds the queue's oldest job; plus a non-available older row.
    await db.execute(
        """
        INSERT INTO awa.jobs_hot (kind, queue, priority, run_at)
        VALUES ('stats_probe', 'mixed', 1, now() - interval '30 seconds'),
               ('stats_probe', 'mixed', 2, now() - interval '60 seconds'),
               ('stats_probe', 'mixed', 3, now() - interval '600 seconds'),
               ('stats_probe', 'mixed', 3, now() - interval '5 seconds'),
               ('stats_probe', 'mixed', 4, now() - interval '90 seconds')
        """
    )
    await db.execute(
        "INSERT INTO awa.jobs_hot (kind, queue, state, attempt, run_at, heartbeat_at)"
        " VALUES ('stats_probe', 'mixed', 'running', 1, now() - interval '9000 seconds', now())"
    )
    await flush_admin_cache(ctx)

    result = await queue_stats.run_once(ctx)

    [stats] = result.queues
    assert 600 <= stats.lag_seconds < 630
    assert lag_points(metric_reader)["mixed"] == stats.lag_seconds


async def test_drained_and_vanished_queues_stop_reporting_old_values(
    db, awa_client, meter_provider, metric_reader
):
    """A synchronous gauge repeats its last value: without care, a queue that
    drained would show its old lag forever, and one that disappeared its old
    depth. Here they go to zero; a queue that never had a lag still has none."""
    ctx = await make_context(db, meter_provider=meter_provider)
    drained = await insert(awa_client, "drained")
    await db.execute("UPDATE awa.jobs_hot SET run_at = now() - interval '5 minutes' WHERE id = $1", drained)
    gone = await insert(awa_client, "gone")
    await insert(awa_client, "idle", run_at=dt.datetime.now(dt.UTC) + dt.timedelta(hours=1))
    await flush_admin_cache(ctx)
    await queue_stats.run_once(ctx)
    assert lag_points(metric_reader)["drained"] >= 290
    assert depth_points(metric_reader)[("gone", "available")] == 1
    assert "idle" not in lag_points(metric_reader)

    await set_state(db, "jobs_hot", drained, "running", ", heartbeat_at = now()")
    await db.execute("DELETE FROM awa.jobs_hot WHERE id = $1", gone)
    await flush_admin_cache(ctx)
    await db.execute("DELETE FROM awa.queue_state_counts WHERE queue = 'gone'")
    result = await queue_stats.run_once(ctx)

    assert "gone" not in [stats.queue for stats in result.queues]
    lags, depths = lag_points(metric_reader), depth_points(metric_reader)
    assert lags["drained"] == 0.0 and lags["gone"] == 0.0
    assert "idle" not in lags
    assert depths[("drained", "running")] == 1 and depths[("drained", "available")] == 0
    assert {state: depths[("gone", state)] for state in queue_stats.DEPTH_STATES} == dict.fromkeys(
        queue_stats.DEPTH_STATES, 0)


async def test_metric_names_and_attribute_keys_are_upstreams(
    db, awa_client, meter_provider, metric_reader
):
    """Dashboards and alerts built for Awa query these exact strings; the
    other tests use the constants, so a renamed constant would go unnoticed."""
    ctx = await make_context(db, meter_provider=meter_provider)
    job_id = await insert(awa_client, "named")
    await db.execute(
        "UPDATE awa.jobs_hot SET run_at = now() - interval '30 seconds' WHERE id = $1", job_id
    )
    await flush_admin_cache(ctx)

    await queue_stats.run_once(ctx)

    depth = metric_points(metric_reader, "awa.queue.depth")
    assert depth and all(set(attrs) == {"awa.job.queue", "awa.job.state"} for attrs, _ in depth)
    assert {attrs["awa.job.queue"] for attrs, _ in depth} == {"named"}
    assert {attrs["awa.job.state"]: point.value for attrs, point in depth}["available"] == 1
    lag = metric_points(metric_reader, "awa.queue.lag")
    assert [attrs for attrs, _ in lag] == [{"awa.job.queue": "named"}]
    assert lag[0][1].value >= 30
