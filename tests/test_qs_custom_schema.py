"""Queue storage under a schema name and ring sizes of its own: awa_trio reads
the schema from ``awa.storage_status()`` details and each ring's size from its
ring-state row, never from constants (issue 8, engine selection). The
database is finalised by a real awa-pg runtime started with those options."""

from __future__ import annotations

import os
import uuid

import awa
import pytest
import trio
from conftest import _admin, _drop, _make_queue_storage, dsn_for
from support.qs_jobs import insert_one_scheduled

from awa_trio import MaintenanceConfig, MaintenanceService
from awa_trio.db import open_database

SCHEMA = "awa_custom"
SLOT_COUNTS = {"queue": 4, "lease": 3, "claim": 5}
RINGS = tuple(SLOT_COUNTS)
CURSOR_SQL = "SELECT current_slot, generation, slot_count FROM {schema}.{ring}_ring_state WHERE singleton"

pytestmark = pytest.mark.queue_storage


@pytest.fixture
def custom_qs_url(awa_template: str) -> str:
    name = f"awa_trio_qc_{os.getpid()}_{uuid.uuid4().hex[:10]}"
    _admin(f'CREATE DATABASE "{name}" TEMPLATE "{awa_template}"')
    _make_queue_storage(
        dsn_for(name),
        queue_storage_schema=SCHEMA,
        queue_storage_queue_slot_count=SLOT_COUNTS["queue"],
        queue_storage_lease_slot_count=SLOT_COUNTS["lease"],
        queue_storage_claim_slot_count=SLOT_COUNTS["claim"],
    )
    yield dsn_for(name)
    _drop(name)


async def cursors(db, schema: str) -> dict[str, tuple[int, int, int]]:
    return {ring: tuple(await db.fetchrow(CURSOR_SQL.format(schema=schema, ring=ring))) for ring in RINGS}


async def test_a_custom_schema_and_ring_sizes_are_read_from_the_database(custom_qs_url):
    fast = MaintenanceConfig(
        queue_rotate_interval=0.05,
        lease_rotate_interval=0.05,
        claim_rotate_interval=0.05,
        promote_interval=0.05,
    )
    service = MaintenanceService(custom_qs_url, fast)
    async with open_database(custom_qs_url, application_name="test admin") as admin:
        before = await cursors(admin, SCHEMA)
        assert {ring: count for ring, (_slot, _gen, count) in before.items()} == SLOT_COUNTS
        # The default schema's ring tables exist too (Awa's migrations make
        # them); nothing may touch them.
        default_before = await cursors(admin, "awa")
        async with trio.open_nursery() as nursery:
            await nursery.start(service.run)
            with trio.fail_after(20):
                await service.wait_until_leader()
                assert service.schema.queue_storage_schema == SCHEMA
                # Every ring laps twice, by its own size.
                while True:
                    now = await cursors(admin, SCHEMA)
                    if all(now[ring][1] >= before[ring][1] + 2 * SLOT_COUNTS[ring] for ring in RINGS):
                        break
                    await trio.sleep(0.05)
                # awa-pg schedules a job (into the custom schema's deferred
                # rows); time passing is simulated by moving its run_at. Ready
                # and unclaimed, it then holds its queue slot (rotation waits).
                client = awa.Client(custom_qs_url)
                job_id = await insert_one_scheduled(client, {"n": 1}, kind="noop", queue="default")
                moved = await admin.execute(
                    f"UPDATE {SCHEMA}.deferred_jobs SET run_at = now() - interval '1 second' WHERE job_id = $1", job_id
                )
                assert moved == "UPDATE 1"
                while await admin.fetchval(f"SELECT count(*) FROM {SCHEMA}.deferred_jobs"):
                    await trio.sleep(0.05)
            nursery.cancel_scope.cancel()
        assert all(0 <= slot < SLOT_COUNTS[ring] for ring, (slot, _gen, _count) in now.items())
        assert await admin.fetchval(f"SELECT count(*) FROM {SCHEMA}.ready_entries WHERE job_id = $1", job_id) == 1
        assert await cursors(admin, "awa") == default_before
