"""Metrics, health and status over real HTTP, from a running service."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import trio
from conftest import in_thread

from awa_trio import MaintenanceConfig, MaintenanceService
from awa_trio.errors import ConfigError
from awa_trio.http_api import parse_address, prometheus_meter_provider

FAST = MaintenanceConfig(leader_election_interval=0.2, leader_check_interval=0.5,
                         promote_interval=0.05, queue_stats_interval=0.2,
                         heartbeat_rescue_interval=0.2, heartbeat_staleness=1,
                         queue_rotate_interval=0.05, lease_rotate_interval=0.05)
GRAFANA_SERIES = Path(__file__).parent / "data" / "awa_0_6_1_grafana_metrics.txt"
SAMPLE_RE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? ")
LABEL_RE = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="')


async def get(url: str) -> tuple[int, bytes, str]:
    def fetch():
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                return response.status, response.read(), response.headers["content-type"]
        except urllib.error.HTTPError as error:
            return error.code, error.read(), error.headers["content-type"]

    return await trio.to_thread.run_sync(fetch)


def scraped_series(text: str) -> dict[str, set[str]]:
    series: dict[str, set[str]] = {}
    for line in text.splitlines():
        match = SAMPLE_RE.match(line)
        if match:
            series.setdefault(match.group(1), set()).update(LABEL_RE.findall(match.group(2) or ""))
    return series


def expected_series() -> list[tuple[str, set[str]]]:
    rows = []
    for line in GRAFANA_SERIES.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, *labels = line.split()
            rows.append((name, set(labels)))
    return rows


def test_metrics_addr_must_be_host_and_port():
    assert parse_address("127.0.0.1:9464") == ("127.0.0.1", 9464)
    assert parse_address("[::1]:0") == ("::1", 0)
    assert parse_address(":9464") == ("0.0.0.0", 9464)
    with pytest.raises(ConfigError, match="HOST:PORT"):
        parse_address("localhost")


async def test_livez_readyz_status_for_a_leader_and_a_follower(database_url, db):
    leader = MaintenanceService(database_url, FAST, http_address="127.0.0.1:0")
    follower = MaintenanceService(database_url, FAST, http_address="127.0.0.1:0")
    async with trio.open_nursery() as nursery:
        await nursery.start(leader.run)
        with trio.fail_after(10):
            await leader.wait_until_leader()
        await nursery.start(follower.run)
        [leader_url], [follower_url] = leader.http_urls, follower.http_urls

        assert await get(f"{leader_url}/livez") == (200, b"ok\n", "text/plain")
        for url, role in ((leader_url, True), (follower_url, False)):
            status, body, kind = await get(f"{url}/readyz")
            assert (status, kind) == (200, "application/json")
            ready = json.loads(body)
            assert ready["ready"] and ready["leader"] is role
            assert (ready["engine"], ready["schema_version"]) == ("canonical", leader.schema.version)

        with trio.fail_after(10):
            while True:  # until promotion has run at least once
                status, body, _ = await get(f"{leader_url}/status")
                report = json.loads(body)
                if report["branches"].get("promote_scheduled", {}).get("last_run_at"):
                    break
                await trio.sleep(0.1)
        assert status == 200
        assert report["role"] == "leader" and report["term"] == 1
        assert report["lock_backend_pid"] == leader.lock_backend_pid
        assert (report["engine"], report["transition_state"]) == ("canonical", "canonical")
        promote = report["branches"]["promote_scheduled"]
        assert promote["interval"] == FAST.promote_interval
        assert promote["last_error"] is None and promote["in_cooldown"] is False
        assert promote["last_duration"] >= 0
        assert set(report["branches"]) >= {spec.name for spec in leader.branches}

        status, body, _ = await get(f"{follower_url}/status")
        assert json.loads(body)["role"] == "follower"
        assert (await get(f"{leader_url}/nope"))[0] == 404
        nursery.cancel_scope.cancel()


async def test_readyz_says_503_when_the_schema_is_not_one_awa_trio_maintains(database_url, db):
    """A follower (a leader would stop on such a schema): ready while the
    schema is supported, 503 with the reason once it is not."""
    from support.helpers import LOCK_KEY

    holder = await db.connect_dedicated(application_name="test lock holder")
    assert await holder.fetchval("SELECT pg_try_advisory_lock($1)", LOCK_KEY)
    service = MaintenanceService(database_url, FAST, http_address="127.0.0.1:0")
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        [url] = service.http_urls
        assert (await get(f"{url}/readyz"))[0] == 200
        await db.execute("INSERT INTO awa.schema_version (version, description) VALUES (99, 'x')")
        status, body, _ = await get(f"{url}/readyz")
        assert status == 503
        assert "version 99 is not supported" in json.loads(body)["reason"]
        assert (await get(f"{url}/livez"))[0] == 200
        assert not service.is_leader
        nursery.cancel_scope.cancel()
    await holder.close()


async def test_a_branch_error_shows_in_status_and_as_a_metric(database_url, db):
    from awa_trio import BranchSpec
    from awa_trio.db import QueryError

    async def broken(ctx):
        raise QueryError("relation does not exist", sqlstate="42P01")

    provider = prometheus_meter_provider()
    service = MaintenanceService(database_url, FAST, http_address="127.0.0.1:0",
                                 meter_provider=provider,
                                 extra_branches=[BranchSpec("broken_probe", 0.05, broken)])
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        await service.wait_until_leader()
        [url] = service.http_urls
        with trio.fail_after(10):
            while True:
                report = json.loads((await get(f"{url}/status"))[1])
                if report["branches"].get("broken_probe", {}).get("last_error"):
                    break
                await trio.sleep(0.1)
        assert report["branches"]["broken_probe"]["last_error"] == (
            "database error [42P01] relation does not exist")
        text = (await get(f"{url}/metrics"))[1].decode()
        assert re.search(r'^awa_trio_branch_errors_total\{awa_maintenance_branch="broken_probe"[^}]*\} '
                         r'[1-9]', text, re.M)
        assert re.search(r"^awa_trio_leader\{[^}]*\} 1\.0$", text, re.M)
        assert re.search(r"^awa_trio_term_started_seconds\{[^}]*\} 1\.[0-9.e+]+$", text, re.M)
        nursery.cancel_scope.cancel()
    provider.shutdown()


async def test_every_series_of_awas_grafana_dashboard_is_scraped(qs_database_url, qs_db, qs_awa_client):
    """Queue storage, with a stale running job (rescue), due jobs (promotion),
    a declared queue (awa_queue_info) and job kind (awa_job_kind_info) and
    busy ring slots (skipped rotations)."""
    import datetime as dt

    from support.awa_pg import awa_pg_worker

    await qs_db.execute(
        "INSERT INTO awa.queue_descriptors (queue, display_name, owner, tags, descriptor_hash) "
        "VALUES ('grafana_declared', 'Grafana queue', 'ops@example.com', '{a,b}', 'h')")
    await qs_db.execute(
        "INSERT INTO awa.job_kind_descriptors (kind, display_name, owner, tags, descriptor_hash) "
        "VALUES ('grafana_kind', 'Grafana kind', 'ops@example.com', '{c,d}', 'h')")
    provider = prometheus_meter_provider()
    service = MaintenanceService(qs_database_url, FAST, http_address="127.0.0.1:0",
                                 meter_provider=provider)
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        with trio.fail_after(20):
            await service.wait_until_leader()
        [url] = service.http_urls
        # A job hangs in a worker we then kill: its lease goes stale and is rescued.
        async with awa_pg_worker(qs_database_url, "grafana_hang:grafana", behaviour="hang",
                                 extra_args=["--role", "auto"]) as worker:
            await in_thread(qs_awa_client.insert, {}, kind="grafana_hang", queue="grafana")
            await worker.wait_for_line("START", timeout=30)
            worker.kill()
        past = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=1)
        for _ in range(3):
            await in_thread(qs_awa_client.insert, {}, kind="grafana_later", queue="grafana", run_at=past)
        # A paused queue's ready job keeps its queue slot busy.
        await in_thread(qs_awa_client.pause_queue, "grafana_paused")
        await in_thread(qs_awa_client.insert, {}, kind="grafana_idle", queue="grafana_paused")

        missing: list[str] = []
        with trio.move_on_after(60):
            while True:
                series = scraped_series((await get(f"{url}/metrics"))[1].decode())
                missing = [f"{name} {sorted(labels - series.get(name, set()))}"
                           for name, labels in expected_series()
                           if name not in series or not labels <= series[name]]
                if not missing:
                    break
                await trio.sleep(0.5)
        assert missing == [], missing
        nursery.cancel_scope.cancel()
    provider.shutdown()


async def test_metrics_name_the_service_and_the_instance_awas_views_show(qs_database_url, qs_db):
    """target_info says service_name "awa_trio" and the node's id in
    awa.runtime_instances (not unknown_service:python), so a scrape and
    Awa's admin views name the same process (queue storage: a database
    where awa_trio registers)."""
    database_url, db = qs_database_url, qs_db
    import socket
    import subprocess
    import sys

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = await trio.lowlevel.open_process(
        [sys.executable, "-m", "awa_trio", "run", "--database-url", database_url,
         "--metrics-addr", f"127.0.0.1:{port}", "--runtime-snapshot-interval", "200ms"],
        stderr=subprocess.DEVNULL)
    try:
        with trio.fail_after(30):
            while True:
                try:
                    status, body, _ = await get(f"http://127.0.0.1:{port}/metrics")
                except OSError:
                    status, body = 0, b""
                ids = await db.fetch("SELECT instance_id FROM awa.runtime_instances")
                if status == 200 and b"target_info" in body and ids:
                    break
                await trio.sleep(0.2)
    finally:
        process.terminate()
        with trio.fail_after(20):
            await process.wait()
    [target] = [line for line in body.decode().splitlines() if line.startswith("target_info{")]
    assert 'service_name="awa_trio"' in target, target
    [row] = ids
    assert f'service_instance_id="{row["instance_id"]}"' in target, target
