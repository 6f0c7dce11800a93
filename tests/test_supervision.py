"""What happens when a branch body fails: database errors, timeouts, crashes."""

import logging

import pytest
import trio
from support.helpers import leader_lock_holders
from support.probes import BodyRecorder

from awa_trio import MaintenanceConfig, MaintenanceService

FAST = MaintenanceConfig(
    leader_election_interval=0.2,
    leader_check_interval=0.3,
    promote_interval=0.05,
)


async def test_database_error_is_logged_and_the_branch_runs_next_tick(database_url, caplog):
    async def body(ctx, n):
        if n == 2:
            await ctx.db.fetchval("SELECT 1 / 0")

    probe = BodyRecorder("flaky_sql", 0.02, body)
    healthy = BodyRecorder("healthy", 0.02)
    service = MaintenanceService(database_url, FAST, extra_branches=[probe.spec, healthy.spec])
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        await service.wait_until_leader()
        with trio.fail_after(5):
            while len(probe.starts) < 5:
                await trio.sleep(0.01)
        assert service.is_leader
        assert "flaky_sql: database error [22012] division by zero" in caplog.text
        assert "crashed" not in caplog.text
        assert len(healthy.starts) >= 4
        nursery.cancel_scope.cancel()


async def test_body_past_branch_timeout_is_cancelled_and_logged(database_url, caplog):
    async def body(ctx, n):
        if n == 1:
            await ctx.db.fetchval("SELECT pg_sleep(30)")

    probe = BodyRecorder("stuck", 0.02, body)
    service = MaintenanceService(
        database_url, FAST.replace(branch_timeout=0.3), extra_branches=[probe.spec]
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        with trio.fail_after(5):
            while len(probe.starts) < 3:
                await trio.sleep(0.01)
        assert probe.starts[1] - probe.starts[0] >= 0.3
        assert "stuck: body ran longer than branch_timeout (0.3s)" in caplog.text
        nursery.cancel_scope.cancel()


async def test_crashed_branch_is_restarted_and_siblings_keep_running(database_url, caplog):
    async def body(ctx, n):
        if n == 2:
            raise RuntimeError("bug in branch")

    crashy = BodyRecorder("crashy", 0.02, body)
    healthy = BodyRecorder("healthy", 0.02)
    service = MaintenanceService(database_url, FAST, extra_branches=[crashy.spec, healthy.spec])
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        await service.wait_until_leader()
        with trio.fail_after(5):
            while len(crashy.starts) < 5:
                await trio.sleep(0.01)
        assert service.is_leader, "one crash is not a reason to give up leadership"
        assert "crashy: crashed (1 of 5 allowed within 60s); restarting" in caplog.text
        assert "RuntimeError: bug in branch" in caplog.text  # traceback logged
        assert service.leadership_history == [service.leadership_history[0]]
        nursery.cancel_scope.cancel()


async def test_branch_crashing_repeatedly_hands_leadership_to_a_healthy_node(
    database_url, db, caplog
):
    caplog.set_level(logging.INFO, logger="awa_trio")

    async def always_crash(ctx, n):
        raise RuntimeError("deterministic bug")

    broken = MaintenanceService(
        database_url,
        FAST.replace(branch_restart_limit=2, branch_restart_window=10),
        extra_branches=[BodyRecorder("broken", 0.02, always_crash).spec],
    )
    healthy = MaintenanceService(database_url, FAST)
    async with trio.open_nursery() as nursery:
        await nursery.start(broken.run)
        await broken.wait_until_leader()
        await nursery.start(healthy.run)
        with trio.fail_after(5):
            await healthy.wait_until_leader()
        assert not broken.is_leader
        assert broken.is_alive, "the broken node stays a candidate"
        assert await leader_lock_holders(db) == [healthy.lock_backend_pid]
        assert "broken: crashed 3 times within 10s; giving up leadership" in caplog.text
        assert "released maintenance leader lock" in caplog.text
        nursery.cancel_scope.cancel()


async def test_lone_node_that_gave_up_leads_again_after_the_penalty(database_url, caplog):
    """With no healthy peer the cluster must not stay without a leader."""
    crashes = []

    async def crash_three_times(ctx, n):
        crashes.append(n)
        if len(crashes) <= 3:
            raise RuntimeError("transient bug")

    service = MaintenanceService(
        database_url,
        FAST.replace(branch_restart_limit=2, branch_restart_window=10),
        extra_branches=[BodyRecorder("wobbly", 0.02, crash_three_times).spec],
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        await service.wait_until_leader()
        await service.wait_until_follower()
        with trio.fail_after(3):
            await service.wait_until_leader()
        assert [leading for _, leading in service.leadership_history] == [True, False, True]
        nursery.cancel_scope.cancel()


async def test_disabled_branches_do_not_run_and_unknown_names_are_refused(database_url):
    from awa_trio import ConfigError

    service = MaintenanceService(database_url, FAST, disabled_branches=["cleanup", "queue_stats"])
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        names = {spec.name for spec in service.branches}
        assert "promote_scheduled" in names and "cron_eval" in names
        assert not names & {"cleanup", "queue_stats"}
        nursery.cancel_scope.cancel()

    with pytest.raises(ConfigError, match="unknown branches: clenaup"):
        await MaintenanceService(database_url, FAST, disabled_branches=["clenaup"]).run()


async def test_database_error_starting_a_term_releases_the_lock_and_retries(
    database_url, db, caplog, monkeypatch
):
    """The term's start-up query (the schema check) failing must not end the
    service: the lock is released and the node stands again after the
    error backoff."""
    from awa_trio import term as supervisor
    from awa_trio.db import ConnectionLost
    from awa_trio.leadership import FIRST_ERROR_BACKOFF

    real_read_schema = supervisor.read_schema
    failures = []

    async def flaky_read_schema(database):
        if not failures:
            failures.append(trio.current_time())
            raise ConnectionLost("connection was closed in the middle of operation")
        return await real_read_schema(database)

    monkeypatch.setattr(supervisor, "read_schema", flaky_read_schema)
    probe = BodyRecorder("probe", 0.02)
    service = MaintenanceService(database_url, FAST, extra_branches=[probe.spec])
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        with trio.fail_after(5):
            while not probe.starts:
                await trio.sleep(0.01)
        assert service.is_alive and service.is_leader
        assert await leader_lock_holders(db) == [service.lock_backend_pid]
        assert [leading for _, leading in service.leadership_history] == [True, False, True]
        nursery.cancel_scope.cancel()
    retried_at = service.leadership_history[2][0]
    assert retried_at - failures[0] >= min(FIRST_ERROR_BACKOFF, FAST.leader_election_interval)
    assert "leadership term failed, releasing the lock and retrying" in caplog.text
    assert "connection was closed in the middle of operation" in caplog.text
