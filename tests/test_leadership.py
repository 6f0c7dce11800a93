"""Leader election on the real advisory lock: one leader, failover, handover,
and a mixed fleet with a real awa-pg 0.6.1 runtime."""

import dataclasses
import logging

import trio
from support.awa_pg import awa_pg_worker
from support.helpers import leader_lock_holders
from support.probes import BodyRecorder, assert_bodies_ran_only_while_leading, wait_for_any_leader

from awa_trio import MaintenanceConfig, MaintenanceService
from awa_trio.db import CLEANUP_TIMEOUT, ConnectionLost, open_database
from awa_trio.leadership import LOCK_APPLICATION_NAME, LOCK_KEY, LeaderElector, LeadershipState

ELECTION = 0.2
CHECK = 0.3
FAST = MaintenanceConfig(
    leader_election_interval=ELECTION,
    leader_check_interval=CHECK,
    promote_interval=0.05,
)


def make_service(database_url, recorder=None, config=FAST):
    extra = [recorder.spec] if recorder else []
    return MaintenanceService(database_url, config, extra_branches=extra)


async def test_two_instances_elect_exactly_one_leader(database_url, db):
    probes = [BodyRecorder(), BodyRecorder()]
    services = [make_service(database_url, p) for p in probes]
    async with trio.open_nursery() as nursery:
        for service in services:
            await nursery.start(service.run)
        leader = await wait_for_any_leader(*services)
        await trio.sleep(3 * ELECTION)

        assert [s.is_leader for s in services].count(True) == 1
        assert await leader_lock_holders(db) == [leader.lock_backend_pid]
        follower_probe = probes[1] if leader is services[0] else probes[0]
        assert follower_probe.starts == [], "a follower ran a branch body"
        nursery.cancel_scope.cancel()


async def test_terminated_lock_connection_fails_over_and_rejoins(database_url, db):
    probes = [BodyRecorder(), BodyRecorder()]
    services = [make_service(database_url, p) for p in probes]
    async with trio.open_nursery() as nursery:
        for service in services:
            await nursery.start(service.run)
        old_leader = await wait_for_any_leader(*services)
        old_probe = probes[services.index(old_leader)]
        await trio.sleep(0.1)
        assert old_probe.starts, "the leader runs its branches"

        await db.execute("SELECT pg_terminate_backend($1)", old_leader.lock_backend_pid)
        # Noticed by the termination listener or the next check; the bound is
        # loose for a loaded machine (bench_failover measures the speed).
        with trio.fail_after(CHECK + 3):
            await old_leader.wait_until_follower()
        bodies_at_loss = len(old_probe.starts)

        new_leader = await wait_for_any_leader(*services, timeout=ELECTION + 2)
        assert await leader_lock_holders(db) == [new_leader.lock_backend_pid]
        for service, probe in zip(services, probes, strict=True):
            assert_bodies_ran_only_while_leading(service, probe)

        # The old leader rejoined the election: it leads once the other stops.
        if new_leader is not old_leader:
            new_leader.stop()
            with trio.fail_after(ELECTION + 2):
                await old_leader.wait_until_leader()
            assert await leader_lock_holders(db) == [old_leader.lock_backend_pid]
        # Leading again, its branches run again.
        with trio.fail_after(2):
            while len(old_probe.starts) <= bodies_at_loss:
                await trio.sleep(0.01)
        assert_bodies_ran_only_while_leading(old_leader, old_probe)
        nursery.cancel_scope.cancel()


async def test_no_branch_body_runs_after_the_lock_is_gone(database_url, db):
    probe = BodyRecorder(interval=0.01)
    service = make_service(database_url, probe)
    async with db.acquire() as blocker, trio.open_nursery() as nursery:
        await nursery.start(service.run)
        await service.wait_until_leader()
        await trio.sleep(0.1)

        # Queue a blocking lock request first, so that once the leader's backend
        # dies the lock goes to this test session and never back to the service.
        async def take_lock():
            await blocker.fetchval("SELECT pg_advisory_lock($1)", LOCK_KEY)

        nursery.start_soon(take_lock)
        await trio.sleep(0.1)
        await db.execute("SELECT pg_terminate_backend($1)", service.lock_backend_pid)
        await service.wait_until_follower()
        lost_at = trio.current_time()
        await trio.sleep(0.5)

        assert not service.is_leader
        assert await leader_lock_holders(db) == [blocker.backend_pid]
        assert [t for t in probe.starts if t > lost_at] == []
        assert_bodies_ran_only_while_leading(service, probe)
        await blocker.fetchval("SELECT pg_advisory_unlock($1)", LOCK_KEY)
        nursery.cancel_scope.cancel()


async def test_lock_check_notices_a_silently_lost_lock(database_url, db, caplog):
    """No connection event at all: only the periodic pg_locks check can tell."""
    probe = BodyRecorder()
    service = make_service(database_url, probe, FAST.replace(leader_election_interval=5.0))
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        await service.wait_until_leader()
        lock = service._elector.lock_connection
        # Unlock on the holder's own session; the connection stays healthy.
        while True:
            try:
                assert await lock.fetchval("SELECT pg_advisory_unlock($1)", LOCK_KEY)
                break
            except Exception:  # the watcher may be using the connection right now
                await trio.sleep(0.01)
        unlocked_at = trio.current_time()
        await service.wait_until_follower()
        assert trio.current_time() - unlocked_at <= CHECK + 0.2
        assert "advisory lock no longer held" in caplog.text
        assert_bodies_ran_only_while_leading(service, probe)
        nursery.cancel_scope.cancel()


async def test_graceful_stop_hands_leadership_to_the_follower(database_url, db, caplog):
    caplog.set_level(logging.INFO, logger="awa_trio")
    first, second = make_service(database_url), make_service(database_url)
    async with trio.open_nursery() as nursery:
        await nursery.start(first.run)
        await first.wait_until_leader()
        await nursery.start(second.run)
        await trio.sleep(2 * ELECTION)
        assert not second.is_leader

        first.stop()
        stopped_at = trio.current_time()
        with trio.fail_after(ELECTION + 1):
            await second.wait_until_leader()
        assert trio.current_time() - stopped_at <= ELECTION + 0.5
        # The lock goes first; the pool closes after (the follower need not wait).
        with trio.fail_after(CLEANUP_TIMEOUT + 1):
            while first.is_alive:
                await trio.sleep(0.01)
        assert await leader_lock_holders(db) == [second.lock_backend_pid]
        assert "released maintenance leader lock" in caplog.text
        nursery.cancel_scope.cancel()
    assert await leader_lock_holders(db) == []


async def runtime_leader_flags(db):
    """The leader flags of the awa-pg runtimes' rows (not awa_trio's own)."""
    return [
        row["leader"]
        for row in await db.fetch("SELECT leader FROM awa.runtime_instances WHERE version NOT LIKE '%+awa-trio.%'")
    ]


async def test_awa_trio_leading_keeps_an_awa_pg_runtime_a_follower(database_url, db):
    service = make_service(database_url)
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        await service.wait_until_leader()
        async with awa_pg_worker(
            database_url, "mixed_fleet:q", extra_args=["--leader-election-interval-ms", "100"]
        ):
            await trio.sleep(1.0)
            with trio.fail_after(20):  # the runtime publishes its snapshot on its own schedule
                while not await runtime_leader_flags(db):
                    await trio.sleep(0.05)
            assert service.is_leader
            assert await leader_lock_holders(db) == [service.lock_backend_pid]
            assert await runtime_leader_flags(db) == [False]
        nursery.cancel_scope.cancel()


async def test_awa_pg_leader_excludes_awa_trio_until_it_dies(database_url, db):
    async with awa_pg_worker(
        database_url, "mixed_fleet:q", extra_args=["--leader-election-interval-ms", "100"]
    ) as runtime:
        # The lock in pg_locks first (the runtime's own snapshot of being
        # leader is published on its own schedule, later under load).
        with trio.fail_after(20):
            while len(await leader_lock_holders(db)) != 1:
                await trio.sleep(0.05)
        awa_pg_lock = await leader_lock_holders(db)
        service = make_service(database_url)
        async with trio.open_nursery() as nursery:
            await nursery.start(service.run)
            await trio.sleep(4 * ELECTION)
            assert not service.is_leader
            assert await leader_lock_holders(db) == awa_pg_lock
            with trio.fail_after(20):
                while await runtime_leader_flags(db) != [True]:
                    await trio.sleep(0.05)

            runtime.kill()
            with trio.fail_after(ELECTION + 3):
                await service.wait_until_leader()
            assert await leader_lock_holders(db) == [service.lock_backend_pid]
            nursery.cancel_scope.cancel()


class ElectionRecorder:
    """A stand-in database for the election loop alone (no server): the
    first ``failures`` connection attempts fail, then every lock attempt
    finds the lock taken. Records when each attempt happened."""

    def __init__(self, failures: int):
        self.failures = failures
        self.attempts: list[tuple[float, str]] = []
        self.listening: list[str] = []

    async def connect_dedicated(self, *, application_name: str, server_settings=None, dsn=None):
        if sum(1 for _, what in self.attempts if what == "connect failed") < self.failures:
            self.attempts.append((trio.current_time(), "connect failed"))
            raise ConnectionLost("connection refused")
        return self

    async def listen(self, channel: str, callback) -> None:
        self.listening.append(channel)

    async def fetch(self, sql: str, *args):
        self.attempts.append((trio.current_time(), "lock taken"))
        return [{"in_recovery": False, "read_only": False, "acquired": False, "backend_pid": 1,
                 "holder_pid": 2}]

    async def fetchrow(self, sql: str, *args):
        return {"application_name": "elsewhere", "client_addr": None}

    server_address = "recorder:5432"

    def note_backend_pid(self, pid: int) -> None:
        pass

    def is_closed(self) -> bool:
        return False

    async def close(self) -> None:
        pass


async def test_election_tries_at_once_backs_off_after_errors_and_polls_fast_while_healthy(
    autojump_clock, caplog
):
    """Errors back off from 0.1 s, doubling up to 1 s (the election interval
    being longer); a healthy follower tries every takeover_poll_interval on
    the same connection."""
    config = MaintenanceConfig(leader_election_interval=10, takeover_poll_interval=2)
    recorder = ElectionRecorder(failures=6)

    async def never_leads(*, task_status):
        raise AssertionError("the lock was never granted")

    elector = LeaderElector(recorder, config, LeadershipState(), never_leads)
    began = trio.current_time()
    with trio.move_on_after(10):
        await elector.run()
    assert [(round(when - began, 6), what) for when, what in recorder.attempts] == [
        (0, "connect failed"), (0.1, "connect failed"), (0.3, "connect failed"),
        (0.7, "connect failed"), (1.5, "connect failed"), (2.5, "connect failed"),
        (3.5, "lock taken"), (5.5, "lock taken"), (7.5, "lock taken"), (9.5, "lock taken"),
    ]
    assert recorder.listening == ["awa_trio_leader_released", "awa_trio_control"], "one connection, listening once"
    assert caplog.text.count("leader election attempt failed: connection refused") == 6


async def test_the_error_backoff_stops_at_a_shorter_election_interval(autojump_clock):
    config = MaintenanceConfig(leader_election_interval=0.25, takeover_poll_interval=2)
    recorder = ElectionRecorder(failures=4)

    async def never_leads(*, task_status):
        raise AssertionError("the lock was never granted")

    elector = LeaderElector(recorder, config, LeadershipState(), never_leads)
    began = trio.current_time()
    with trio.move_on_after(1):
        await elector.run()
    assert [round(when - began, 6) for when, _ in recorder.attempts] == [0, 0.1, 0.3, 0.55, 0.8]


async def test_a_release_notice_cuts_the_poll_wait_short(autojump_clock):
    config = MaintenanceConfig(leader_election_interval=10, takeover_poll_interval=5)
    recorder = ElectionRecorder(failures=0)

    async def never_leads(*, task_status):
        raise AssertionError("the lock was never granted")

    elector = LeaderElector(recorder, config, LeadershipState(), never_leads)
    began = trio.current_time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(elector.run)
        await trio.sleep(1)
        elector._on_release_notice("")  # what a leader's NOTIFY does
        await trio.sleep(7)
        nursery.cancel_scope.cancel()
    assert [round(when - began, 6) for when, _ in recorder.attempts] == [0, 1, 6]


async def test_tracker_state_starts_fresh_in_every_term(database_url, db, meter_provider, metric_reader):
    """A branch in overrun cooldown when the lock is lost runs at the first
    tick of the next term: hysteresis and cooldown belong to one term."""
    from support.helpers import metric_points

    interval, slow_body = 0.02, 0.8  # cooldown: 2 * ceil(0.8 / 0.02) = 80 ticks = 1.6 s

    async def slow_three_times(ctx, n):
        if n <= 3:
            await trio.sleep(slow_body)

    probe = BodyRecorder("slow", interval, slow_three_times)
    service = MaintenanceService(database_url, FAST, extra_branches=[probe.spec],
                                 meter_provider=meter_provider)
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        with trio.fail_after(10):
            while not any(attrs == {"awa.maintenance.branch": "slow"}
                          for attrs, _ in metric_points(metric_reader, "awa.maintenance.branch.overrun")):
                await trio.sleep(0.01)
        flipped_at = trio.current_time()
        assert len(probe.starts) == 3, "the tick that flips to delayed skips its body"

        await db.execute("SELECT pg_terminate_backend($1)", service.lock_backend_pid)
        await service.wait_until_follower()
        await service.wait_until_leader()
        with trio.fail_after(5):
            while len(probe.starts) < 4:
                await trio.sleep(0.005)
        assert probe.starts[3] - flipped_at < 0.8, "the old term's 1.6 s cooldown carried over"
        assert_bodies_ran_only_while_leading(service, probe)
        nursery.cancel_scope.cancel()


async def test_the_server_drops_a_silent_leaders_lock_session_after_lock_keepalive(database_url, db):
    """Server-side keepalive and user timeout on the lock session only: with
    the OS defaults a partitioned leader's lock outlives it by hours."""
    service = make_service(database_url, config=FAST.replace(lock_keepalive=12))
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        await service.wait_until_leader()
        lock = service._elector.lock_connection
        while True:
            try:  # the lock watch may be using the connection right now
                settings = {name: await lock.fetchval(f"SHOW {name}") for name in (
                    "tcp_keepalives_idle", "tcp_keepalives_interval", "tcp_keepalives_count",
                    "tcp_user_timeout")}
                break
            except Exception:
                await trio.sleep(0.01)
        assert settings == {"tcp_keepalives_idle": "4", "tcp_keepalives_interval": "2",
                            "tcp_keepalives_count": "4", "tcp_user_timeout": "12000"}
        # Pooled connections keep the OS defaults (7200 s idle on Linux).
        assert await db.fetchval("SHOW tcp_keepalives_idle") != settings["tcp_keepalives_idle"]
        nursery.cancel_scope.cancel()


def test_lock_keepalive_settings_add_up_to_the_budget():
    from awa_trio.leadership import lock_keepalive_settings

    assert lock_keepalive_settings(0) == {}
    for budget in (5, 12, 30, 90, 600):
        settings = lock_keepalive_settings(budget)
        total = int(settings["tcp_keepalives_idle"]) + 4 * int(settings["tcp_keepalives_interval"])
        assert abs(total - budget) <= 2
        assert settings["tcp_user_timeout"] == str(budget * 1000)


SERVICE_SESSIONS_SQL = """
    SELECT application_name FROM pg_stat_activity
    WHERE datname = current_database() AND application_name LIKE 'awa_trio%'
    ORDER BY application_name
"""


async def test_a_deposed_leader_keeps_only_its_election_connection(database_url):
    """Leading, branches that tick together share the pool's connections;
    once deposed, the service drops them at once (not when they idle out)."""
    bursty = dataclasses.replace(
        FAST,
        heartbeat_rescue_interval=0.1,
        deadline_rescue_interval=0.1,
        callback_rescue_interval=0.1,
        queue_stats_interval=0.1,
        cleanup_interval=0.1,
    )
    service = MaintenanceService(database_url, bursty)
    async with open_database(database_url, pool_size=2, application_name="test admin") as admin:

        async def sessions():
            return [row["application_name"] for row in await admin.fetch(SERVICE_SESSIONS_SQL)]

        taker = await admin.connect_dedicated(application_name="test lock taker")
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(service.run)
                with trio.fail_after(10):
                    await service.wait_until_leader()
                    while len(await sessions()) < 3:  # the lock's and two pooled, at least
                        await trio.sleep(0.02)
                nursery.start_soon(taker.fetchval, "SELECT pg_advisory_lock($1)", LOCK_KEY)
                with trio.fail_after(5):
                    while not await admin.fetchval(
                        "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                        "AND application_name = 'test lock taker')"
                    ):
                        await trio.sleep(0.02)
                await admin.execute("SELECT pg_terminate_backend($1)", service.lock_backend_pid)
                with trio.fail_after(5):
                    await service.wait_until_follower()
                    while await sessions() != [LOCK_APPLICATION_NAME]:
                        await trio.sleep(0.05)
                nursery.cancel_scope.cancel()
        finally:
            await taker.close()
