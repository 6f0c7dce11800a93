"""The schema contract: supported versions and engines, refused with one line."""

import dataclasses
import logging

import pytest
import trio
from conftest import EXPECTED_SCHEMA_VERSION
from support.helpers import leader_lock_holders

from awa_trio import MaintenanceConfig, MaintenanceService, UnsupportedSchema
from awa_trio.registry import default_branches
from awa_trio.schema import check_schema
from awa_trio.term import STORAGE_POLL_INTERVAL

SWITCH_TO_QUEUE_STORAGE_SQL = """
    UPDATE awa.storage_transition_state
    SET current_engine = 'queue_storage', state = 'active',
        transition_epoch = transition_epoch + 1, updated_at = now()
"""


async def idle(ctx):
    """A body that does nothing: these tests are about which branches run."""


def idle_default_branches(config, schema):
    return [dataclasses.replace(spec, run_once=idle) for spec in default_branches(config, schema)]


async def test_fresh_awa_pg_install_is_supported(db):
    info = await check_schema(db)
    assert (info.version, info.engine) == (EXPECTED_SCHEMA_VERSION, "canonical")


@pytest.mark.skipif(EXPECTED_SCHEMA_VERSION != 39, reason="needs a schema-39 install (awa-pg 0.6.0-0.6.1) to stamp 40 on")
async def test_version_40_is_supported(db):
    await db.execute("INSERT INTO awa.schema_version (version, description) VALUES (40, 'v40')")
    assert (await check_schema(db)).version == 40


async def test_newer_schema_is_refused_with_one_clear_line(db):
    await db.execute("INSERT INTO awa.schema_version (version, description) VALUES (41, 'future')")
    with pytest.raises(UnsupportedSchema) as caught:
        await check_schema(db)
    assert str(caught.value) == (
        "awa schema version 41 is not supported (supported: 39, 40); "
        "upgrade awa_trio or pin awa-pg"
    )


async def test_missing_schema_is_refused(empty_database_url):
    service = MaintenanceService(empty_database_url)
    with pytest.raises(UnsupportedSchema, match="no awa schema in this database"):
        await service.run()


async def test_queue_storage_is_read_from_storage_status(qs_db):
    info = await check_schema(qs_db)
    assert (info.engine, info.state, info.queue_storage_schema) == ("queue_storage", "active", "awa")
    assert info.runs_queue_storage and not info.in_mixed_transition


async def test_an_unknown_engine_is_refused(database_url, db):
    await db.execute(
        "UPDATE awa.storage_transition_state SET current_engine = 'columnar', state = 'active'"
    )
    with pytest.raises(UnsupportedSchema, match="'columnar' is not maintained"):
        await MaintenanceService(database_url).run()
    assert await leader_lock_holders(db) == []


async def test_engine_change_while_leading_restarts_the_term_with_the_new_branches(
    database_url, db
):
    """The database moves to queue storage under a canonical leader: that term
    ends, and the next one (same lock, same process) runs the queue-storage set."""
    service = MaintenanceService(
        database_url, MaintenanceConfig(leader_election_interval=0.2, leader_check_interval=0.2),
        branch_factory=idle_default_branches,
    )
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            await nursery.start(service.run)
            await service.wait_until_leader()
            lock_pid = service.lock_backend_pid
            assert "priority_aging" in {spec.name for spec in service.branches}
            await db.execute(SWITCH_TO_QUEUE_STORAGE_SQL)
            while service.schema.engine != "queue_storage":
                await trio.sleep(0.05)
            names = {spec.name for spec in service.branches}
            assert "rotate_queue" in names and "priority_aging" not in names
            assert service.is_leader and service.lock_backend_pid == lock_pid
            assert await leader_lock_holders(db) == [lock_pid]
            service.stop()
    assert await leader_lock_holders(db) == []


PREPARE_SQL = "SELECT state FROM awa.storage_prepare('queue_storage', '{\"schema\": \"awa\"}')"
ENTER_MIXED_TRANSITION_SQL = """
    UPDATE awa.storage_transition_state
    SET state = 'mixed_transition', transition_epoch = transition_epoch + 1, updated_at = now()
"""


async def test_prepare_keeps_the_canonical_term_and_the_flip_ends_it(database_url, db, caplog):
    """Prepared routes nothing to queue storage yet: the canonical term goes
    on (logged); the routing flip then ends it within a storage poll, and the
    mixed-transition term keeps the lock."""
    caplog.set_level(logging.INFO, logger="awa_trio.term")
    # A long lock check: the storage is still polled every STORAGE_POLL_INTERVAL.
    service = MaintenanceService(
        database_url, MaintenanceConfig(leader_election_interval=0.2, leader_check_interval=30),
        branch_factory=idle_default_branches,
    )
    with trio.fail_after(40):
        async with trio.open_nursery() as nursery:
            await nursery.start(service.run)
            await service.wait_until_leader()
            # Elected is not yet started: the term reads the storage state
            # first, and a prepare that lands before that read is no change.
            while "maintenance branches started" not in caplog.text:
                await trio.sleep(0.01)
            lock_pid = service.lock_backend_pid
            branches = service.branches
            assert await db.fetchval(PREPARE_SQL) == "prepared"
            while "storage state changed from canonical to prepared" not in caplog.text:
                await trio.sleep(0.05)
            assert service.branches == branches and "storage moved" not in caplog.text

            flipped = trio.current_time()
            await db.execute(ENTER_MIXED_TRANSITION_SQL)
            while service.schema.state != "mixed_transition":
                await trio.sleep(0.05)
            # Within a storage poll or so (slack for a loaded machine), far
            # below the 30 s lock-check interval this service runs with.
            assert trio.current_time() - flipped < STORAGE_POLL_INTERVAL + 8
            assert "canonical_drain" in {spec.name for spec in service.branches}
            assert ("storage moved from canonical (prepared) to queue_storage (mixed_transition)"
                    in caplog.text)
            assert service.lock_backend_pid == lock_pid
            assert await leader_lock_holders(db) == [lock_pid]
            service.stop()
