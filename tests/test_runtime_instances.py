"""awa_trio's own row in awa.runtime_instances: what it says while leading and
following, how a handover and a clean stop show, and that a database error
while refreshing never stops the service."""

import datetime as dt
import os
import re
import socket

import trio
from conftest import in_thread
from support.probes import wait_for_any_leader

from awa_trio import MaintenanceConfig, MaintenanceService
from awa_trio.db import open_database
from awa_trio.doctor import collect_findings
from awa_trio.runtime_instance import AWA_CONTRACT_VERSION, is_awa_trio_version, runtime_version
from awa_trio.status import collect_status, format_status

SNAPSHOT = 0.3
FAST = MaintenanceConfig(
    leader_election_interval=0.2,
    leader_check_interval=0.3,
    runtime_snapshot_interval=SNAPSHOT,
)

ROWS_SQL = """
    SELECT instance_id, hostname, pid, version, storage_capability, transition_role, started_at,
           last_seen_at, snapshot_interval_ms, healthy, postgres_connected, poll_loop_alive,
           heartbeat_alive, maintenance_alive, shutting_down, leader, global_max_workers,
           queues, queue_descriptor_hashes, job_kind_descriptor_hashes
    FROM awa.runtime_instances ORDER BY started_at
"""

#: semver.org's own pattern (MAJOR.MINOR.PATCH, optional pre-release and build).
SEMVER = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$"
)


async def rows(db):
    return [dict(row) for row in await db.fetch(ROWS_SQL)]


async def wait_for_rows(db, predicate, timeout=10.0):
    with trio.fail_after(timeout):
        while True:
            found = await rows(db)
            if predicate(found):
                return found
            await trio.sleep(0.05)


async def not_fresh(db, awa_client):
    """A canonical database auto-finalize would leave alone: one job in it."""
    await in_thread(awa_client.insert, {}, kind="keeps_it_canonical", queue="rt")


async def test_the_leader_and_a_follower_each_register_truthfully(database_url, db, awa_client):
    await not_fresh(db, awa_client)
    services = [MaintenanceService(database_url, FAST) for _ in range(2)]
    async with trio.open_nursery() as nursery:
        for service in services:
            await nursery.start(service.run)
        leader = await wait_for_any_leader(*services)
        found = await wait_for_rows(db, lambda found: len(found) == 2 and sum(r["leader"] for r in found) == 1)
        before = dt.datetime.now(dt.UTC)
        for row in found:
            leads = row["leader"]
            assert row["maintenance_alive"] is leads
            assert (row["hostname"], row["pid"]) == (socket.gethostname(), os.getpid())
            assert row["version"] == runtime_version()
            assert row["version"].startswith(AWA_CONTRACT_VERSION + "+awa-trio.")
            assert is_awa_trio_version(row["version"])
            assert (row["storage_capability"], row["transition_role"]) == ("queue_storage", "auto")
            assert row["snapshot_interval_ms"] == SNAPSHOT * 1000
            assert row["healthy"] and row["postgres_connected"] and not row["shutting_down"]
            # Nothing it does not do: no dispatch loop, no heartbeats, no queues.
            assert not row["poll_loop_alive"] and not row["heartbeat_alive"]
            assert row["global_max_workers"] is None
            assert (row["queues"], row["queue_descriptor_hashes"], row["job_kind_descriptor_hashes"]) == (
                [], {}, {})
            assert row["started_at"] <= row["last_seen_at"] <= before + dt.timedelta(seconds=1)
        leader_row = next(r for r in found if r["leader"])
        assert {str(r["instance_id"]) for r in found} == {str(s.registration.instance_id) for s in services}
        assert leader_row["instance_id"] == leader.registration.instance_id

        # Refreshed every snapshot interval.
        seen = leader_row["last_seen_at"]
        await wait_for_rows(db, lambda found: all(r["last_seen_at"] > seen for r in found), timeout=3 * SNAPSHOT + 2)

        # Resign: the rows swap at the change, not a snapshot interval later.
        follower = services[1] if leader is services[0] else services[0]
        assert leader.resign()
        await follower.wait_until_leader()
        with trio.fail_after(SNAPSHOT + 1):
            found = await wait_for_rows(
                db, lambda found: [r["instance_id"] for r in found if r["leader"]] == [follower.registration.instance_id]
            )
        assert sum(r["maintenance_alive"] for r in found) == 1

        # A clean stop marks the row shutting down and removes it.
        follower.stop()
        await wait_for_rows(db, lambda found: [r["instance_id"] for r in found] == [leader.registration.instance_id])
        nursery.cancel_scope.cancel()
    assert await rows(db) == []


#: Every change to awa.runtime_instances, in order (installed by the test).
HISTORY_SQL = """
    CREATE TABLE public.instance_history (
        seq bigserial, op text, instance_id uuid, shutting_down boolean, leader boolean);
    CREATE FUNCTION public.record_instance() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF TG_OP = 'DELETE' THEN
            INSERT INTO public.instance_history (op, instance_id, shutting_down, leader)
            VALUES (TG_OP, OLD.instance_id, OLD.shutting_down, OLD.leader);
        ELSE
            INSERT INTO public.instance_history (op, instance_id, shutting_down, leader)
            VALUES (TG_OP, NEW.instance_id, NEW.shutting_down, NEW.leader);
        END IF;
        RETURN NULL;
    END $$;
    CREATE TRIGGER record_instance AFTER INSERT OR UPDATE OR DELETE ON awa.runtime_instances
        FOR EACH ROW EXECUTE FUNCTION public.record_instance();
"""


async def test_a_clean_stop_marks_the_row_shutting_down_then_deletes_it(database_url, db, awa_client):
    await not_fresh(db, awa_client)
    await db.execute(HISTORY_SQL)
    service = MaintenanceService(database_url, FAST)
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        await service.wait_until_leader()
        await wait_for_rows(db, lambda found: len(found) == 1 and found[0]["leader"])
        service.stop()
    history = [tuple(row) for row in await db.fetch(
        "SELECT op, instance_id, shutting_down, leader FROM public.instance_history ORDER BY seq")]
    instance = service.registration.instance_id
    assert history[0][:3] == ("INSERT", instance, False)
    assert any(leader for _, _, _, leader in history), "written as the leader while leading"
    assert history[-2:] == [("UPDATE", instance, True, False), ("DELETE", instance, True, False)]
    assert await rows(db) == []


async def test_a_database_error_while_refreshing_is_logged_and_retried(database_url, db, awa_client, caplog):
    await not_fresh(db, awa_client)
    service = MaintenanceService(database_url, FAST.replace(lock_timeout=0.2))
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        await service.wait_until_leader()
        await wait_for_rows(db, lambda found: len(found) == 1)
        blocker = await db.connect_dedicated(application_name="table holder")
        try:
            await blocker.execute("BEGIN")
            await blocker.execute("LOCK TABLE awa.runtime_instances IN ACCESS EXCLUSIVE MODE")
            with trio.fail_after(5):
                while "refresh failed, next try in 0.3 s" not in caplog.text:
                    await trio.sleep(0.05)
            await trio.sleep(3 * SNAPSHOT)
            warnings = [r for r in caplog.records if "refresh failed" in r.getMessage()]
            assert len(warnings) >= 2, "it kept trying"
            assert [r.levelname for r in warnings].count("WARNING") == 1, "repeats are debug lines"
            assert service.is_leader and service.is_alive
            await blocker.execute("ROLLBACK")
        finally:
            await blocker.close()
        with trio.fail_after(5):
            while "refreshed again" not in caplog.text:
                await trio.sleep(0.05)
        await db.execute("DELETE FROM awa.runtime_instances")
        found = await wait_for_rows(db, lambda found: len(found) == 1)
        assert found[0]["leader"]
        nursery.cancel_scope.cancel()


async def test_no_awa_schema_is_no_row_and_no_warning(database_url, db, awa_client, caplog):
    await not_fresh(db, awa_client)
    service = MaintenanceService(database_url, FAST)
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        await service.wait_until_leader()
        await wait_for_rows(db, lambda found: len(found) == 1)
        await db.execute("ALTER SCHEMA awa RENAME TO awa_away")
        try:
            with trio.fail_after(5):
                while service.registration.registered is not False:
                    await trio.sleep(0.05)
        finally:
            await db.execute("ALTER SCHEMA awa_away RENAME TO awa")
        with trio.fail_after(10):
            while not service.registration.registered:
                await trio.sleep(0.05)
        nursery.cancel_scope.cancel()
    assert "refresh failed" not in caplog.text


def test_the_version_is_semver_above_every_floor_that_reads_it():
    version = runtime_version()
    match = SEMVER.match(version)
    assert match, version
    # Awa 0.7's migration floor (Rust semver, build metadata ignored) and
    # awa.semver_rank (leading MAJOR.MINOR.PATCH) both read 0.6.9.
    assert tuple(int(part) for part in match.groups()[:3]) >= (0, 6, 2)
    assert match.group(5).startswith("awa-trio.")
    assert not is_awa_trio_version("0.6.1") and not is_awa_trio_version(None)


#: An awa-pg runtime's row as its publisher writes it (following, seen now).
AWA_PG_ROW_SQL = """
    INSERT INTO awa.runtime_instances (instance_id, hostname, pid, version, started_at, last_seen_at,
        snapshot_interval_ms, healthy, postgres_connected, poll_loop_alive, heartbeat_alive,
        shutting_down, leader, maintenance_alive, storage_capability, transition_role)
    VALUES (gen_random_uuid(), 'worker-host', 4242, '0.6.9', now(), now(), 10000, true, true, true, true,
        false, false, true, 'canonical', 'canonical_drain')
"""


async def test_status_and_doctor_list_the_registered_instances_and_which_leads(database_url, db, awa_client):
    await not_fresh(db, awa_client)
    await db.execute(AWA_PG_ROW_SQL)
    services = [MaintenanceService(database_url, FAST) for _ in range(2)]
    async with trio.open_nursery() as nursery:
        for service in services:
            await nursery.start(service.run)
        leader = await wait_for_any_leader(*services)
        await wait_for_rows(db, lambda found: len(found) == 3 and sum(r["leader"] for r in found) == 1)
        async with open_database(database_url, pool_size=1) as own:
            report = await collect_status(own)
            findings = {f.check: f for f in await collect_findings(own)}
        nursery.cancel_scope.cancel()

    host = socket.gethostname()
    instances = report["instances"]
    assert [(i["awa_trio"], i["hostname"], i["leader"]) for i in instances] == [
        (True, host, True), (True, host, False), (False, "worker-host", False)]
    assert instances[0]["instance_id"] == leader.registration.instance_id
    assert instances[0]["maintenance_alive"] and not instances[1]["maintenance_alive"]
    assert [r["pid"] for r in report["awa_runtimes"]] == [4242]  # the awa-pg / Rust runtimes alone
    text = format_status(report)
    assert f"  awa_trio {host}:{os.getpid()} {runtime_version()}: LEADS maintenance (maintenance alive" in text
    assert f"  awa_trio {host}:{os.getpid()} {runtime_version()}: follows (maintenance off" in text
    assert "  awa runtime worker-host:4242 0.6.9: follows (maintenance alive, canonical, role canonical_drain)" in text

    finding = findings["instances"]
    assert finding.severity == "ok"
    assert finding.summary == (
        f"3 live (1 leading): awa_trio {host}:{os.getpid()} leads; awa_trio {host}:{os.getpid()} follows; "
        "awa runtime worker-host:4242 follows")
    assert [(i["kind"], i["leader"]) for i in finding.details["instances"]] == [
        ("awa_trio", True), ("awa_trio", False), ("awa runtime", False)]
    assert finding.details["instances"][0]["instance_id"] == str(leader.registration.instance_id)
