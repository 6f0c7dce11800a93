"""awa_trio's row in awa.runtime_instances changes no gate that reads the
table: each test runs the same steps with and without an awa_trio leader
(the with-run also checks when its row was there) and expects the same
outcomes. The gates: storage_auto_finalize_if_fresh (any row seen in 90 s),
the readiness checks and SQL gates of enter-mixed, finalize and abort (by
storage_capability and transition_role), Awa 0.7's migration floor on
``version`` and its ring-authority flip gate (a row on a schema past 40)."""

import contextlib
import re

import pytest
import trio
from conftest import in_thread
from support.awa_cli import readiness, storage_report
from support.awa_pg import awa_pg_worker

from awa_trio import MaintenanceConfig, MaintenanceService
from awa_trio.db import QueryError

SNAPSHOT = 0.3
CONFIG = MaintenanceConfig(
    leader_election_interval=0.2, leader_check_interval=0.3, runtime_snapshot_interval=SNAPSHOT
)
STATE_SQL = "SELECT active_engine, state FROM awa.storage_status()"
PREPARE_SQL = "SELECT state FROM awa.storage_prepare('queue_storage', '{\"schema\": \"awa\"}')"
ENTER_MIXED_SQL = "SELECT state FROM awa.storage_enter_mixed_transition()"
FINALIZE_SQL = "SELECT state FROM awa.storage_finalize()"
ABORT_SQL = "SELECT state FROM awa.storage_abort()"
#: Another runtime's row, as awa-pg writes it (seen now, 10 s interval).
RUNTIME_SQL = """
    INSERT INTO awa.runtime_instances (instance_id, hostname, pid, version, started_at, last_seen_at,
        snapshot_interval_ms, healthy, postgres_connected, poll_loop_alive, heartbeat_alive,
        shutting_down, leader, storage_capability, transition_role)
    VALUES (gen_random_uuid(), 'gates-test', 4242, '0.6.9', now(), now(), 10000, true, true, true, true,
        false, false, $1, $2)
"""
#: Awa 0.7's migration pre-flight: the live rows whose version it checks against 0.6.2.
FLOOR_SQL = "SELECT version FROM awa.runtime_instances WHERE last_seen_at + make_interval(secs => 90) >= now()"
SEMVER_CORE = re.compile(r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(?:[-+][0-9A-Za-z.-]+)?$")

pytestmark = pytest.mark.parametrize("with_awa_trio", [False, True], ids=["without_awa_trio", "with_awa_trio"])


@contextlib.asynccontextmanager
async def maybe_awa_trio(dsn: str, enabled: bool):
    """An awa_trio leader for the block (None without one)."""
    if not enabled:
        yield None
        return
    service = MaintenanceService(dsn, CONFIG)
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        await service.wait_until_leader()
        yield service
        nursery.cancel_scope.cancel()


async def registered(service, expected: bool, timeout: float = SNAPSHOT + 2) -> None:
    """Wait until awa_trio's row is there (or gone), as the database shows it."""
    if service is None:
        return
    with trio.fail_after(timeout):
        while True:
            rows = await service._db.fetchval(
                "SELECT count(*) FROM awa.runtime_instances WHERE instance_id = $1",
                service.registration.instance_id,
            )
            if service.registration.registered is expected and rows == int(expected):
                return
            await trio.sleep(0.05)


async def storage(db) -> tuple[str, str]:
    return tuple(await db.fetchrow(STATE_SQL))


async def outcome(db, sql: str, *, keep: bool = True) -> str:
    """A gate's result (the state it left) or the error it raised; without
    ``keep`` the change is rolled back."""
    try:
        async with db.transaction() as conn:
            state = await conn.fetchval(sql)
            if not keep:
                raise _RollBack(state)
            return state
    except _RollBack as rolled_back:
        return f"{rolled_back.args[0]} (rolled back)"
    except QueryError as exc:
        return f"refused: {exc}"


class _RollBack(Exception):
    pass


async def auto_runtime_finalises(dsn: str, db) -> tuple[str, str]:
    """Start an awa-pg runtime with the default transition role (auto), as a
    new deployment does, and return where storage ends."""
    async with awa_pg_worker(dsn, "gates_probe:gates", extra_args=["--role", "auto"]):
        with trio.move_on_after(10):
            while await storage(db) != ("queue_storage", "active"):
                await trio.sleep(0.05)
    return await storage(db)


async def test_an_awa_pg_runtime_started_after_awa_trio_on_a_fresh_install_finalises_to_queue_storage(
    database_url, db, with_awa_trio
):
    async with maybe_awa_trio(database_url, with_awa_trio) as service:
        await registered(service, False)  # a fresh install: no row to hold auto-finalize back
        assert await auto_runtime_finalises(database_url, db) == ("queue_storage", "active")
        await registered(service, True)  # finalised: nothing left for the row to change
        versions = [row["version"] for row in await db.fetch(FLOOR_SQL)]
        assert all(
            (m := SEMVER_CORE.match(v)) and tuple(map(int, m.groups())) >= (0, 6, 2)
            for v in versions
            if "awa-trio" in v
        ), versions


async def test_a_database_whose_last_job_went_finalises_as_without_awa_trio(
    database_url, db, awa_client, with_awa_trio
):
    job = await in_thread(awa_client.insert, {}, kind="gates_probe", queue="gates")
    async with maybe_awa_trio(database_url, with_awa_trio) as service:
        await registered(service, True)  # a job: auto-finalize refuses anyway, the row is harmless
        await db.execute("DELETE FROM awa.jobs_hot WHERE id = $1", job.id)
        await registered(service, False)  # withdrawn within one snapshot interval
        assert await auto_runtime_finalises(database_url, db) == ("queue_storage", "active")


async def test_a_staged_transition_passes_the_same_gates_with_and_without_awa_trio(
    database_url, db, awa_client, with_awa_trio
):
    # One finished canonical job: not a fresh install, no live backlog.
    job = await in_thread(awa_client.insert, {}, kind="gates_probe", queue="gates")
    await db.execute(
        "UPDATE awa.jobs_hot SET state = 'completed', attempt = 1, finalized_at = now() WHERE id = $1", job.id
    )
    seen = []
    async with maybe_awa_trio(database_url, with_awa_trio) as service:
        await registered(service, True)
        seen.append(await outcome(db, ENTER_MIXED_SQL))
        seen.append(await outcome(db, PREPARE_SQL))
        await registered(service, True)
        await trio.sleep(2 * SNAPSHOT)  # at least one refresh in the prepared state
        seen.append(readiness(await storage_report(database_url)))
        seen.append(await outcome(db, ENTER_MIXED_SQL))  # no queue_storage_target: refused
        await db.execute(RUNTIME_SQL, "queue_storage", "queue_storage_target")
        seen.append(readiness(await storage_report(database_url)))
        seen.append(await outcome(db, ENTER_MIXED_SQL))
        await db.execute("DELETE FROM awa.runtime_instances WHERE hostname = 'gates-test'")
        await registered(service, False)  # mixed transition: any capability counts for finalize or abort
        seen.append(readiness(await storage_report(database_url)))
        seen.append(await outcome(db, ABORT_SQL, keep=False))
        seen.append(await outcome(db, FINALIZE_SQL, keep=False))
        seen.append(await outcome(db, FINALIZE_SQL))
        await registered(service, True)

    enter_blockers_prepared = [
        "no live runtimes with transition_role=queue_storage_target are reporting; "
        "auto-role runtimes downgrade to drain-only after the routing flip"
    ]
    assert seen[0].startswith("refused: ") and "prepared" in seen[0]
    assert seen[1] == "prepared"
    assert seen[2]["can_enter_mixed_transition"] is False
    assert seen[2]["enter_mixed_transition_blockers"] == enter_blockers_prepared
    assert "queue_storage_target" in seen[3] and seen[3].startswith("refused: ")
    assert (seen[4]["can_enter_mixed_transition"], seen[4]["enter_mixed_transition_blockers"]) == (True, [])
    assert seen[5] == "mixed_transition"
    assert (seen[6]["state"], seen[6]["can_finalize"], seen[6]["finalize_blockers"]) == (
        "mixed_transition", True, [])
    assert seen[7:] == ["canonical (rolled back)", "active (rolled back)", "active"]


async def test_a_live_queue_storage_row_would_block_abort(database_url, db, awa_client, with_awa_trio):
    """The control for the test above: in mixed transition a live row saying
    queue_storage (what awa_trio's row says elsewhere) makes abort refuse,
    so awa_trio's row must be gone there."""
    if with_awa_trio:
        pytest.skip("a control of the SQL gate alone")
    job = await in_thread(awa_client.insert, {}, kind="gates_probe", queue="gates")
    await db.execute(
        "UPDATE awa.jobs_hot SET state = 'completed', attempt = 1, finalized_at = now() WHERE id = $1", job.id
    )
    await db.execute(PREPARE_SQL)
    await db.execute(RUNTIME_SQL, "queue_storage", "queue_storage_target")
    await db.execute(ENTER_MIXED_SQL)
    assert "queue-storage runtime(s) are still live" in await outcome(db, ABORT_SQL, keep=False)


async def test_a_schema_awa_trio_does_not_maintain_leaves_no_row(database_url, db, awa_client, with_awa_trio):
    """Awa 0.7's ring-authority flip refuses while a live row has no
    binary_version (a v43 column awa_trio never writes): past schema 40 awa_trio
    steps down and takes its row away."""
    if not with_awa_trio:
        pytest.skip("awa_trio's own behaviour")
    await in_thread(awa_client.insert, {}, kind="gates_probe", queue="gates")
    async with maybe_awa_trio(database_url, with_awa_trio) as service:
        await registered(service, True)
        await db.execute("INSERT INTO awa.schema_version (version, description) VALUES (43, 'a later Awa')")
        await registered(service, False)
        await db.execute("DELETE FROM awa.schema_version WHERE version = 43")
        await registered(service, True)
