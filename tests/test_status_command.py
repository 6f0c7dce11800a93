"""``python -m awa_trio status``: read-only, from the database alone, on both
engines, whoever leads."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import subprocess
import sys

import trio
from conftest import in_thread

from awa_trio import MaintenanceConfig, MaintenanceService, PeriodicJob

FAST = MaintenanceConfig(leader_election_interval=0.2, leader_check_interval=0.5)


async def run_status(url: str, *extra: str) -> subprocess.CompletedProcess:
    return await trio.to_thread.run_sync(lambda: subprocess.run(
        [sys.executable, "-m", "awa_trio", "status", "--database-url", url, *extra],
        capture_output=True, text=True, timeout=60, env=dict(os.environ)))


async def test_status_names_the_awa_trio_leader_and_the_backlog(database_url, db, awa_client):
    service = MaintenanceService(
        database_url, FAST,
        disabled_branches=["promote_scheduled", "rescue_stale_heartbeats"],
        periodic_jobs=[PeriodicJob("nightly", "30 2 * * *", kind="report", timezone="Europe/London")],
    )
    follower = MaintenanceService(database_url, FAST)
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        with trio.fail_after(10):
            await service.wait_until_leader()
        await nursery.start(follower.run)
        await db.execute(
            "INSERT INTO awa.scheduled_jobs (kind, queue, state, run_at) VALUES "
            "('late', 'q', 'scheduled', now() - interval '2 minutes'), "
            "('late', 'q', 'scheduled', now() - interval '1 minute'), "
            "('again', 'q', 'retryable', now() - interval '10 seconds'), "
            "('later', 'q', 'scheduled', now() + interval '1 hour')")
        await db.execute(
            "INSERT INTO awa.jobs_hot (kind, queue, state, attempt, run_lease, attempted_at, heartbeat_at) "
            "VALUES ('stuck', 'q', 'running', 1, 1, now() - interval '1 hour', now() - interval '1 hour')")
        with trio.fail_after(10):
            while not await db.fetchval("SELECT count(*) FROM awa.cron_jobs"):
                await trio.sleep(0.05)

        result = await run_status(database_url, "--json")
        assert result.returncode == 0, result.stderr
        report = json.loads(result.stdout)
        holder = report["lock_holder"]
        assert holder["pid"] == service.lock_backend_pid
        assert re.fullmatch(r"awa_trio \S+:\d+ lock", holder["application_name"])
        [candidate] = report["candidates"]  # the follower, polling for the lock
        assert re.fullmatch(r"awa_trio \S+:\d+ lock", candidate["application_name"])
        assert (report["engine"], report["transition_state"]) == ("canonical", "canonical")
        assert report["due_not_promoted"]["scheduled"]["jobs"] == 2
        assert report["due_not_promoted"]["scheduled"]["oldest_seconds"] >= 110
        assert report["due_not_promoted"]["retryable"]["jobs"] == 1
        assert report["rescue_backlog"] == {
            "stale_heartbeats": 1, "past_deadline": 0, "callbacks_timed_out": 0}
        [cron] = report["cron"]
        assert cron["name"] == "nightly" and cron["last_fire"] is None
        next_fire = dt.datetime.fromisoformat(cron["next_fire"])
        assert next_fire.astimezone(dt.UTC) > dt.datetime.now(dt.UTC)

        table = await run_status(database_url)
        assert table.returncode == 0
        assert f"maintenance leader: pid {service.lock_backend_pid} awa_trio " in table.stdout
        assert re.search(r"due scheduled, not promoted\s+2\s+\d+\.\ds", table.stdout)
        assert re.search(r"running, heartbeat stale\s+1", table.stdout)
        assert "nightly" in table.stdout
        nursery.cancel_scope.cancel()


async def test_status_on_queue_storage_led_by_an_awa_pg_runtime(qs_database_url, qs_db, qs_awa_client):
    from support.awa_pg import awa_pg_worker

    later = dt.datetime.now(dt.UTC) + dt.timedelta(milliseconds=300)
    async with awa_pg_worker(qs_database_url, "other:elsewhere", extra_args=[
            "--role", "auto", "--leader-election-interval-ms", "100", "--mute-maintenance"]):
        for _ in range(2):
            await in_thread(qs_awa_client.insert, {}, kind="x", queue="q", run_at=later)
        with trio.fail_after(30):
            while True:
                report = json.loads((await run_status(qs_database_url, "--json")).stdout)
                if report["lock_holder"] and any(r["leader"] for r in report["awa_runtimes"]):
                    break
                await trio.sleep(0.3)
        await trio.sleep(0.5)  # the jobs come due; this runtime's promotion is muted
        report = json.loads((await run_status(qs_database_url, "--json")).stdout)
    assert (report["engine"], report["transition_state"]) == ("queue_storage", "active")
    assert not report["lock_holder"]["application_name"].startswith("awa_trio")
    [runtime] = [r for r in report["awa_runtimes"] if r["leader"]]
    assert runtime["storage_capability"] == "queue_storage"
    assert report["due_not_promoted"]["scheduled"]["jobs"] == 2


async def test_status_exits_3_when_no_node_leads_and_0_once_one_does(database_url):
    """A probe can ask "does anything lead?" by the exit status alone."""
    table = await run_status(database_url)
    assert table.returncode == 3, table.stderr
    assert "maintenance leader: none (no session holds the lock)" in table.stdout
    as_json = await run_status(database_url, "--json")
    assert as_json.returncode == 3, as_json.stderr
    assert json.loads(as_json.stdout)["lock_holder"] is None
    service = MaintenanceService(database_url, FAST)
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        with trio.fail_after(10):
            await service.wait_until_leader()
        led = await run_status(database_url)
        assert led.returncode == 0, led.stderr
        nursery.cancel_scope.cancel()
    unreachable = await run_status("postgresql://postgres@127.0.0.1:1/awa")
    assert unreachable.returncode == 1
