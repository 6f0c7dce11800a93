"""The schema contract: supported versions and engines, refused with one line."""

import pytest
import trio

from awa_trio import MaintenanceConfig, MaintenanceService, UnsupportedSchema
from awa_trio.schema import check_schema
from support.helpers import leader_lock_holders

SWITCH_TO_QUEUE_STORAGE_SQL = """
    UPDATE awa.storage_transition_state
    SET current_engine = 'queue_storage', state = 'active',
        transition_epoch = transition_epoch + 1, updated_at = now()
"""


async def test_fresh_awa_pg_install_is_supported(db):
    info = await check_schema(db)
    assert (info.version, info.engine) == (39, "canonical")


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


async def test_queue_storage_engine_is_refused(database_url, db):
    await db.execute(SWITCH_TO_QUEUE_STORAGE_SQL)
    assert await db.fetchval("SELECT awa.active_storage_engine()") == "queue_storage"
    with pytest.raises(UnsupportedSchema, match="'queue_storage' is not maintained"):
        await MaintenanceService(database_url).run()
    assert await leader_lock_holders(db) == []


async def test_engine_change_while_leading_stops_and_releases_the_lock(database_url, db):
    service = MaintenanceService(
        database_url, MaintenanceConfig(leader_election_interval=0.2, leader_check_interval=0.2)
    )

    async def switch_engine_once_leading():
        await service.wait_until_leader()
        await db.execute(SWITCH_TO_QUEUE_STORAGE_SQL)

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(switch_engine_once_leading)
            with pytest.raises(UnsupportedSchema, match="storage engine changed from 'canonical'"):
                await service.run()
    assert not service.is_leader and not service.is_alive
    assert await leader_lock_holders(db) == []
