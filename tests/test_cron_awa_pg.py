"""End to end: awa_trio leads and fires a periodic job; a real awa-pg 0.6.1
worker (a follower) runs it.

awa_trio starts first and takes the leader lock, so the awa-pg runtime never
leads and every cron row, mark and job comes from our branches.
"""

from __future__ import annotations

import trio
from support.awa_pg import awa_pg_worker
from support.helpers import leader_lock_holders

from awa_trio.config import MaintenanceConfig
from awa_trio.cron import PeriodicJob, cron_branches
from awa_trio.service import MaintenanceService

KIND = "cron_probe"
QUEUE = "cronq"


def no_default_branches(config, schema):
    return []  # only the cron branches below, whatever the registry holds


async def test_cron_job_fired_by_awa_trio_is_executed_by_an_awa_pg_worker(database_url, db):
    config = MaintenanceConfig(leader_election_interval=0.5)
    schedule = PeriodicJob("every_second_probe", "* * * * * *", kind=KIND, queue=QUEUE,
                           args={"source": "awa_trio"}, tags=["cron"])
    service = MaintenanceService(
        database_url, config, periodic_jobs=[schedule],
        extra_branches=cron_branches(config), branch_factory=no_default_branches,
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        with trio.fail_after(60):
            await service.wait_until_leader()
            async with awa_pg_worker(database_url, f"{KIND}:{QUEUE}") as worker:
                done = await worker.wait_for_line("DONE")
                job_id = int(done.split()[1])
                # DONE is printed by the handler; the runtime records completion just after.
                while await db.fetchval("SELECT state::text FROM awa.jobs WHERE id = $1",
                                        job_id) != "completed":
                    await trio.sleep(0.05)
                assert service.is_leader
                assert await leader_lock_holders(db) == [service.lock_backend_pid]
        service.stop()

    job = await db.fetchrow(
        "SELECT kind, queue, args, tags, metadata, state::text AS state FROM awa.jobs WHERE id = $1",
        job_id,
    )
    assert (job["kind"], job["queue"], job["args"], job["tags"], job["state"]) == (
        KIND, QUEUE, {"source": "awa_trio"}, ["cron"], "completed")
    assert job["metadata"]["cron_name"] == "every_second_probe"
    row = await db.fetchrow("SELECT last_enqueued_at FROM awa.cron_jobs WHERE name = $1",
                            schedule.name)
    assert row["last_enqueued_at"] is not None
    # The runtime stayed a follower throughout.
    assert [r["leader"] for r in await db.fetch(
        "SELECT leader FROM awa.runtime_instances WHERE version NOT LIKE '%+awa-trio.%'")] == [False]
