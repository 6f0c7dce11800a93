"""Live control (issue 18 part 4): a leader resigns without a restart.

resign() uses the graceful release path (unlock + release NOTIFY), so the
follower takes over at once, and the resigner stays out for resign_hold_off.
Every wait is bounded with trio.fail_after.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request

import trio
from support.helpers import leader_lock_holders

from awa_trio import MaintenanceConfig, MaintenanceService
from awa_trio.db import open_database
from awa_trio.leadership import LOCK_KEY

BOUND = 10.0


async def test_resign_hands_the_lock_to_the_follower_and_the_resigner_holds_off(database_url):
    config = MaintenanceConfig(takeover_poll_interval=0.1, leader_election_interval=0.2, resign_hold_off=3.0)
    first, second = MaintenanceService(database_url, config), MaintenanceService(database_url, config)
    async with open_database(database_url, pool_size=1, application_name="test admin") as admin:
        async with trio.open_nursery() as nursery:
            with trio.fail_after(BOUND):
                await nursery.start(first.run)
                await first.wait_until_leader()
                await nursery.start(second.run)
                assert not second.resign()  # a follower has nothing to hand over
                old_pid = first.lock_backend_pid
                assert await leader_lock_holders(admin) == [old_pid]
                resigned_at = trio.current_time()
                assert first.resign()
                await second.wait_until_leader()
            assert trio.current_time() - resigned_at < 3.0
            new_pid = second.lock_backend_pid
            assert new_pid is not None and new_pid != old_pid
            assert await leader_lock_holders(admin) == [new_pid]

            # Inside its hold-off the resigner does not stand, even with the lock free.
            second.stop()
            with trio.fail_after(BOUND):
                while await leader_lock_holders(admin):
                    await trio.sleep(0.05)
            await trio.sleep(0.5)
            assert not first.is_leader
            # After it, it competes again.
            with trio.fail_after(BOUND):
                await first.wait_until_leader()
            assert trio.current_time() - resigned_at >= config.resign_hold_off
            nursery.cancel_scope.cancel()


FAST = MaintenanceConfig(
    takeover_poll_interval=0.1,
    leader_election_interval=0.2,
    queue_stats_interval=0.05,
    promote_interval=30.0,
)


async def insert_scheduled(db, due_in: float) -> int:
    return await db.fetchval(
        "INSERT INTO awa.scheduled_jobs (kind, queue, state, run_at) "
        "VALUES ('live', 'live', 'scheduled', now() + make_interval(secs => $1)) RETURNING id",
        due_in,
    )


async def job_state(db, job_id: int) -> str:
    return await db.fetchval("SELECT state::text FROM awa.jobs WHERE id = $1", job_id)


async def wait_for_state(db, job_id: int, state: str, timeout: float = 5.0) -> None:
    with trio.fail_after(timeout):
        while await job_state(db, job_id) != state:
            await trio.sleep(0.02)


async def runs_of(service, branch: str) -> int:
    return (await service.status())["branches"].get(branch, {}).get("runs", 0)


async def test_a_reload_changes_an_interval_at_the_next_tick_keeping_lock_term_and_tracker(db, database_url):
    service = MaintenanceService(database_url, FAST)
    async with trio.open_nursery() as nursery:
        with trio.fail_after(BOUND):
            await nursery.start(service.run)
            await service.wait_until_leader()
            while await runs_of(service, "queue_stats") < 3:
                await trio.sleep(0.02)
        job_id = await insert_scheduled(db, 0.3)
        await trio.sleep(1.0)
        assert await job_state(db, job_id) == "scheduled"  # the next promote tick is 30 s away
        before = await service.status()
        lock_pid = service.lock_backend_pid

        result = service.reconfigure(FAST.replace(promote_interval=0.05))
        assert (result.applied, result.generation, result.changed) == (True, 2, ("promote_interval",))
        await wait_for_state(db, job_id, "available", timeout=2.0)

        after = await service.status()
        assert after["config_generation"] == 2
        assert after["branches"]["promote_scheduled"]["interval"] == 0.05
        assert after["term"] == before["term"]
        assert await leader_lock_holders(db) == [lock_pid]
            # The tracker actor was not restarted: an unchanged branch keeps its count.
        assert after["branches"]["queue_stats"]["runs"] >= before["branches"]["queue_stats"]["runs"] >= 3

        # Nothing changed: same generation.
        assert service.reconfigure(FAST.replace(promote_interval=0.05)).generation == 2
        # Restart-only settings keep their running value and are named.
        kept = service.reconfigure(FAST.replace(promote_interval=0.05, pool_size=3))
        assert kept.restart_only == ("pool_size",) and service.config.pool_size == FAST.pool_size
        nursery.cancel_scope.cancel()


async def test_a_reload_stops_and_starts_branches_and_refuses_unknown_names(db, database_url, caplog):
    from awa_trio import ConfigError

    caplog.set_level("INFO", logger="awa_trio")
    service = MaintenanceService(database_url, FAST)
    async with trio.open_nursery() as nursery:
        with trio.fail_after(BOUND):
            await nursery.start(service.run)
            await service.wait_until_leader()
            while await runs_of(service, "queue_stats") < 1:  # the term is up
                await trio.sleep(0.01)
        service.reconfigure(FAST, disabled_branches=["queue_stats"])
        with trio.fail_after(BOUND):  # the term applies it as soon as it is scheduled
            while "queue_stats" in {spec.name for spec in service.branches}:
                await trio.sleep(0.01)
        assert "queue_stats: stopped (disabled by config generation 2)" in caplog.text
        await trio.sleep(0.1)
        stopped_at = await runs_of(service, "queue_stats")
        await trio.sleep(0.4)
        assert await runs_of(service, "queue_stats") == stopped_at

        try:
            service.reconfigure(FAST, disabled_branches=["queue_stat"])
        except ConfigError as exc:
            assert "unknown branches: queue_stat" in str(exc)
        else:
            raise AssertionError("an unknown branch name was accepted")
        assert service.config_generation == 2

        service.reconfigure(FAST, disabled_branches=[])
        with trio.fail_after(BOUND):
            while "queue_stats: started (enabled by config generation 3)" not in caplog.text:
                await trio.sleep(0.01)
        with trio.fail_after(BOUND):
            while await runs_of(service, "queue_stats") <= stopped_at:
                await trio.sleep(0.02)
        nursery.cancel_scope.cancel()


async def test_a_paused_branch_runs_no_body_until_resumed_and_says_so(db, database_url, meter_provider, metric_reader):
    from support.helpers import metric_points

    config = FAST.replace(promote_interval=0.05)
    service = MaintenanceService(database_url, config, meter_provider=meter_provider)
    async with trio.open_nursery() as nursery:
        with trio.fail_after(BOUND):
            await nursery.start(service.run)
            await service.wait_until_leader()
        assert service.pause("promote_scheduled")
        assert not service.pause("promote_scheduled")
        job_id = await insert_scheduled(db, 0.1)
        await trio.sleep(0.8)
        assert await job_state(db, job_id) == "scheduled"
        status = await service.status()
        assert status["paused_branches"] == ["promote_scheduled"]
        assert status["branches"]["promote_scheduled"]["paused"] is True
        paused = {point[0]["awa.maintenance.branch"]: point[1].value for point in metric_points(metric_reader, "awa_trio.branch.paused")}
        assert paused["promote_scheduled"] == 1 and paused["queue_stats"] == 0

        assert service.resume("promote_scheduled")
        await wait_for_state(db, job_id, "available", timeout=2.0)
        paused = {point[0]["awa.maintenance.branch"]: point[1].value for point in metric_points(metric_reader, "awa_trio.branch.paused")}
        assert paused["promote_scheduled"] == 0
        nursery.cancel_scope.cancel()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def http(method: str, url: str, headers: dict | None = None) -> tuple[int, str]:
    """One request in a thread (urllib), bounded."""

    def call() -> tuple[int, str]:
        request = urllib.request.Request(url, method=method, headers=headers or {}, data=b"" if method == "POST" else None)
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode()

    with trio.fail_after(BOUND):
        return await trio.to_thread.run_sync(call)


async def status_of(base: str) -> dict:
    code, body = await http("GET", f"{base}/status")
    assert code == 200, body
    return json.loads(body)


async def read_until(process, logs: list[bytes], marker: bytes, timeout: float = BOUND) -> str:
    with trio.fail_after(timeout):
        while marker not in b"".join(logs):
            chunk = await process.stderr.receive_some()
            assert chunk, b"".join(logs).decode()
            logs.append(chunk)
    return b"".join(logs).decode()


def write_config(path, promote_interval: str, extra: str = "") -> None:
    path.write_text(
        f'[maintenance]\npromote_interval = "{promote_interval}"\nresign_hold_off = "1s"\n'
        f'takeover_poll_interval = "100ms"\nleader_election_interval = "200ms"\n{extra}'
    )


async def test_sighup_reloads_sigusr1_resigns_and_only_the_admin_listener_changes_anything(db, database_url, tmp_path):
    config_file = tmp_path / "awa_trio.toml"
    write_config(config_file, "1s")
    metrics, admin = f"http://127.0.0.1:{free_port()}", free_port()
    environ = {k: v for k, v in os.environ.items() if not k.startswith("AWA_")}
    process = await trio.lowlevel.open_process(
        [sys.executable, "-m", "awa_trio", "--database-url", database_url, "--config", str(config_file),
         "--metrics-addr", metrics.removeprefix("http://"), "--admin-addr", str(admin)],
        stderr=subprocess.PIPE, env=environ,
    )
    admin_url = f"http://127.0.0.1:{admin}"
    logs: list[bytes] = []
    try:
        await read_until(process, logs, b"maintenance branches started")
        lock_pid = (await status_of(metrics))["lock_backend_pid"]
        assert (await status_of(admin_url))["config_generation"] == 1

        # An invalid file keeps the running settings, with one line saying why.
        write_config(config_file, "2s", extra='promote_intervl = "3s"\n')
        process.send_signal(signal.SIGHUP)
        text = await read_until(process, logs, b"config reload refused")
        assert re.search(r"config reload refused, keeping generation 1: .*promote_intervl", text)
        assert (await status_of(metrics))["config_generation"] == 1

        write_config(config_file, "2s")
        process.send_signal(signal.SIGHUP)
        await read_until(process, logs, b"config generation 2 applied: promote_interval changed")
        status = await status_of(metrics)
        assert status["config_generation"] == 2
        assert status["branches"]["promote_scheduled"]["interval"] == 2.0
        assert status["lock_backend_pid"] == lock_pid == (await leader_lock_holders(db))[0]

        # The same through the admin listener.
        write_config(config_file, "3s")
        code, body = await http("POST", f"{admin_url}/reload")
        assert code == 200 and json.loads(body)["changed"] == ["promote_interval"], body

        # Pause: shown in /status and in the metrics.
        code, body = await http("POST", f"{admin_url}/branches/promote_scheduled/pause")
        assert code == 200, body
        assert (await status_of(metrics))["paused_branches"] == ["promote_scheduled"]
        code, scrape = await http("GET", f"{metrics}/metrics")
        assert re.search(r'awa_trio_branch_paused\{awa_maintenance_branch="promote_scheduled"[^}]*\} 1\.0', scrape)
        assert (await http("POST", f"{admin_url}/branches/no_such_branch/pause"))[0] == 404
        code, body = await http("POST", f"{admin_url}/branches/promote_scheduled/resume")
        assert code == 200 and (await status_of(metrics))["paused_branches"] == []

        # The metrics listener changes nothing; a web page cannot drive the admin one.
        for path in ("/resign", "/reload", "/branches/promote_scheduled/pause"):
            assert (await http("POST", f"{metrics}{path}"))[0] == 405
        assert (await http("POST", f"{admin_url}/resign", {"Origin": "http://evil.example"}))[0] == 403
        assert (await http("GET", f"{admin_url}/resign"))[0] == 405
        assert await leader_lock_holders(db) == [lock_pid]

        # SIGUSR1 resigns: the lock is released at once; after the hold-off
        # (1 s) the node, alone, leads again on a new lock session.
        process.send_signal(signal.SIGUSR1)
        await read_until(process, logs, b"released maintenance leader lock")
        with trio.fail_after(BOUND):
            while (await leader_lock_holders(db)) in ([], [lock_pid]):
                await trio.sleep(0.05)
        # And through the admin listener: 200, and the lock moves once more
        # (once the node itself knows it leads: its lock session holds the
        # lock a moment before its term has started).
        second_pid = (await leader_lock_holders(db))[0]
        with trio.fail_after(BOUND):
            while (await status_of(metrics))["lock_backend_pid"] != second_pid:
                await trio.sleep(0.05)
        code, body = await http("POST", f"{admin_url}/resign")
        assert code == 200 and json.loads(body)["resigned"] is True, body
        with trio.fail_after(BOUND):
            while await leader_lock_holders(db) == [second_pid]:
                await trio.sleep(0.02)
        # Inside its hold-off the node follows: nothing to hand over.
        code, body = await http("POST", f"{admin_url}/resign")
        assert code == 409 and "not the leader" in body, body
    finally:
        process.send_signal(signal.SIGTERM)
        with trio.move_on_after(BOUND):
            await process.wait()
        if process.returncode is None:
            process.kill()
    assert process.returncode == 0


async def test_resign_command_moves_the_lock_to_a_follower_or_says_why_not(db, database_url):
    config = MaintenanceConfig(takeover_poll_interval=0.1, leader_election_interval=0.2, resign_hold_off=5.0)
    first, second = MaintenanceService(database_url, config), MaintenanceService(database_url, config)
    environ = {k: v for k, v in os.environ.items() if not k.startswith("AWA_")}

    async def resign(*flags: str) -> subprocess.CompletedProcess:
        with trio.fail_after(30):
            return await trio.run_process(
                [sys.executable, "-m", "awa_trio", "resign", "--database-url", database_url, *flags],
                capture_stdout=True, capture_stderr=True, check=False, env=environ,
            )

    result = await resign()
    assert result.returncode == 3 and b"no node holds the maintenance lock" in result.stderr

    async with trio.open_nursery() as nursery:
        with trio.fail_after(BOUND):
            await nursery.start(first.run)
            await first.wait_until_leader()
            await nursery.start(second.run)
        old_pid = first.lock_backend_pid
        result = await resign()
        assert result.returncode == 0, result.stderr
        assert re.match(rb"leadership moved from backend pid %d .* to backend pid \d+ " % old_pid, result.stdout)
        assert second.is_leader and not first.is_leader
        assert await leader_lock_holders(db) == [second.lock_backend_pid]
        nursery.cancel_scope.cancel()

    # A holder that is not awa_trio does not listen: exit 1, naming it.
    async with open_database(database_url, pool_size=1, application_name="not awa_trio") as other:
        async with other.acquire() as conn:
            await conn.execute("SELECT pg_advisory_lock($1)", LOCK_KEY)
            result = await resign("--timeout", "500ms")
            await conn.execute("SELECT pg_advisory_unlock($1)", LOCK_KEY)
    assert result.returncode == 1
    assert b"did not resign within 0.5s" in result.stderr and b"'not awa_trio'" in result.stderr


def test_the_admin_address_defaults_to_loopback_and_bad_ones_are_one_line():
    import pytest

    from awa_trio import ConfigError
    from awa_trio.http_api import parse_admin_address

    assert parse_admin_address("9465") == ("127.0.0.1", 9465)
    assert parse_admin_address(":9465") == ("127.0.0.1", 9465)
    assert parse_admin_address("[::1]:9465") == ("::1", 9465)
    assert parse_admin_address("10.0.0.5:9465") == ("10.0.0.5", 9465)
    with pytest.raises(ConfigError, match="admin_addr must be HOST:PORT, not 'nine'"):
        parse_admin_address("nine")


async def test_a_reload_changes_retention_and_periodic_jobs_at_the_next_tick(db, database_url):
    """Settings a body reads (retention) and cron's periodic jobs follow a
    reload too: the next cleanup deletes under the new retention, the next
    cron sync registers the new schedule."""
    from awa_trio import PeriodicJob

    config = FAST.replace(cleanup_interval=0.2, cron_sync_interval=0.2, completed_retention="1h")
    finished = await db.fetchval(
        "INSERT INTO awa.jobs_hot (kind, queue, state, finalized_at) "
        "VALUES ('old', 'live', 'completed', now() - interval '10 minutes') RETURNING id"
    )
    service = MaintenanceService(database_url, config)
    async with trio.open_nursery() as nursery:
        with trio.fail_after(BOUND):
            await nursery.start(service.run)
            await service.wait_until_leader()
            while await runs_of(service, "cleanup") < 2:
                await trio.sleep(0.02)
        assert await db.fetchval("SELECT count(*) FROM awa.jobs_hot WHERE id = $1", finished) == 1

        nightly = PeriodicJob("reloaded_nightly", "0 3 * * *", kind="report")
        result = service.reconfigure(config.replace(completed_retention="1m"), periodic_jobs=[nightly])
        assert set(result.changed) == {"completed_retention", "periodic_jobs"}
        with trio.fail_after(BOUND):
            while await db.fetchval("SELECT count(*) FROM awa.jobs_hot WHERE id = $1", finished):
                await trio.sleep(0.02)
            while not await db.fetchval("SELECT count(*) FROM awa.cron_jobs WHERE name = 'reloaded_nightly'"):
                await trio.sleep(0.02)
        nursery.cancel_scope.cancel()
