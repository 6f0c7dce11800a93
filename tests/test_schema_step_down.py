"""A leader outlives its schema (issue 16): dropped and re-created under it
(as upstream's own Python suite does between tests), or migrated past what
awa_trio supports, it steps down, says why once, keeps checking, and leads
again once a supported schema is back. At start, a missing schema is still
a one-line error (tests/test_schema.py, tests/test_cli.py)."""

from __future__ import annotations

import logging

import trio
from support.helpers import leader_lock_holders

from awa_trio import MaintenanceConfig, MaintenanceService
from awa_trio.schema import migrate

CONFIG = MaintenanceConfig(
    leader_election_interval=0.5, leader_check_interval=0.2, takeover_poll_interval=0.1, promote_interval=0.05
)
DUE_JOB_SQL = (
    "INSERT INTO awa.scheduled_jobs (kind, queue, state, run_at) "
    "VALUES ('back', 'step_down', 'scheduled', now() - interval '1 second') RETURNING id"
)


async def wait_until(predicate, timeout: float = 15.0) -> None:
    with trio.fail_after(timeout):
        while not await predicate():
            await trio.sleep(0.05)


async def has_a_reason(service) -> bool:
    return service.not_leading_reason is not None


def count(caplog, text: str) -> int:
    return sum(text in record.getMessage() for record in caplog.records)


async def test_a_dropped_schema_makes_the_leader_step_down_until_it_is_migrated_again(
    database_url, db, caplog
):
    service = MaintenanceService(database_url, CONFIG)
    with caplog.at_level(logging.INFO, logger="awa_trio"):
        async with trio.open_nursery() as nursery:
            await nursery.start(service.run)
            await service.wait_until_leader()

            await db.execute("DROP SCHEMA awa CASCADE")
            await wait_until(lambda: has_a_reason(service))
            assert "no awa schema in this database" in service.not_leading_reason
            assert not service.is_leader and service.is_alive
            await trio.sleep(2)  # a few rechecks: still one line, no lock held
            assert await leader_lock_holders(db) == []
            assert count(caplog, "stepping down, not leading: no awa schema") == 1
            assert (await service.status())["not_leading_reason"] == service.not_leading_reason

            await migrate(database_url)
            await service.wait_until_leader()
            job_id = await db.fetchval(DUE_JOB_SQL)
            await wait_until(lambda: db.fetchval(
                "SELECT state::text = 'available' FROM awa.jobs WHERE id = $1", job_id))
            assert service.not_leading_reason is None
            assert await leader_lock_holders(db) == [service.lock_backend_pid]
            nursery.cancel_scope.cancel()
    assert count(caplog, "a supported awa schema is back") == 1


async def test_a_schema_migrated_past_what_is_supported_is_not_led_until_it_is_rolled_back(
    database_url, db, caplog
):
    service = MaintenanceService(database_url, CONFIG)
    with caplog.at_level(logging.INFO, logger="awa_trio"):
        async with trio.open_nursery() as nursery:
            await nursery.start(service.run)
            await service.wait_until_leader()

            await db.execute("INSERT INTO awa.schema_version (version, description) VALUES (41, 'future')")
            await service.wait_until_follower()
            await wait_until(lambda: has_a_reason(service))
            assert "awa schema version 41 is not supported" in service.not_leading_reason
            await trio.sleep(1.5)
            assert await leader_lock_holders(db) == []

            await db.execute("DELETE FROM awa.schema_version WHERE version = 41")
            await service.wait_until_leader()
            assert service.not_leading_reason is None
            nursery.cancel_scope.cancel()
    assert count(caplog, "stepping down, not leading: awa schema version 41") == 1
