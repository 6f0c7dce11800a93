"""Connection storms: every awa_trio backend terminated, five times in a row,
while an awa-pg 0.6.1 worker consumes a steady stream of scheduled jobs that
awa_trio must promote. The service recovers each time: it leads again,
promotion resumes, and every job completes exactly once."""

from __future__ import annotations

import collections
import datetime
import logging

import trio
from conftest import in_thread
from support.awa_pg import awa_pg_worker
from support.takeover import backend_pids, terminate_backends

from awa_trio import MaintenanceConfig, MaintenanceService
from awa_trio.db import DatabaseError, open_database

KIND = "storm_job"
QUEUE = "storm"
STORMS = 5


async def test_connection_storms_during_load_leadership_and_work_resume(database_url, awa_client, caplog):
    caplog.set_level(logging.INFO, logger="awa_trio")
    config = MaintenanceConfig(promote_interval=0.1, leader_check_interval=1.0, leader_election_interval=0.5)
    service = MaintenanceService(database_url, config)
    inserted: list[int] = []

    async def produce(stop: trio.Event) -> None:
        """Jobs due 0.2 s after insertion, every 50 ms, through awa-pg."""
        while not stop.is_set():
            run_at = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=0.2)
            job = await in_thread(awa_client.insert, {"n": len(inserted)}, kind=KIND, queue=QUEUE,
                                  run_at=run_at)
            inserted.append(job.id)
            await trio.sleep(0.05)

    async with open_database(database_url, pool_size=2, application_name="test admin") as admin:
        async with trio.open_nursery() as nursery:
            await nursery.start(service.run)
            with trio.fail_after(20):
                await service.wait_until_leader()
            # The runtime stays a follower: its next election try is minutes away.
            async with awa_pg_worker(database_url, f"{KIND}:{QUEUE}",
                                     extra_args=["--leader-election-interval-ms", "600000"]) as worker:
                stop_producing = trio.Event()
                nursery.start_soon(produce, stop_producing)
                await trio.sleep(1.0)
                recoveries = []
                for _ in range(STORMS):
                    victims = await backend_pids(admin, "awa_trio%")
                    assert len(victims) >= 2, "the leader's lock and pool connections"
                    # A pooled or registration connection may close by itself
                    # between the listing and the kill; the lock's may not.
                    assert service.lock_backend_pid in victims
                    assert await terminate_backends(admin, victims) >= 2
                    cut_at = trio.current_time()
                    with trio.fail_after(10):
                        while not service.is_leader or service.lock_backend_pid in victims:
                            await trio.sleep(0.005)
                        # Work resumes: a job inserted after the cut is promoted and done.
                        mark = len(inserted)
                        while not inserted[mark:] or not any(
                                line.startswith(f"DONE {inserted[mark]} ") for line in worker.lines):
                            await trio.sleep(0.02)
                    recoveries.append(trio.current_time() - cut_at)
                    await trio.sleep(0.5)
                stop_producing.set()
                # Everything inserted completes, each job once, at attempt 1.
                with trio.fail_after(20):
                    while await admin.fetchval(
                            "SELECT count(*) FROM awa.jobs WHERE kind = $1 AND state <> 'completed'", KIND):
                        await trio.sleep(0.1)
                done_lines = [line.split() for line in worker.lines if line.startswith("DONE ")]
            assert service.is_leader and service.is_alive
            nursery.cancel_scope.cancel()

        completed = await admin.fetchval(
            "SELECT count(*) FROM awa.jobs WHERE kind = $1 AND state = 'completed' AND attempt = 1", KIND)
    runs = collections.Counter(int(fields[1]) for fields in done_lines)
    assert completed == len(inserted) >= 50
    assert set(runs) == set(inserted)
    assert max(runs.values()) == 1, "a job ran twice"
    assert [r for r in caplog.records if "crashed" in r.getMessage()] == []
    assert "giving up leadership" not in caplog.text
    assert not [r for r in caplog.records if r.exc_info and not isinstance(r.exc_info[1], DatabaseError)
                and r.levelno >= logging.WARNING]
    logging.getLogger(__name__).info("recovered from each storm in %s s",
                                     [round(r, 3) for r in recoveries])
