"""A real crash: an awa-pg 0.6.1 worker process is SIGKILLed mid-job;
awa_trio, leading, rescues the job and promotes it, and a fresh awa-pg worker
completes it on attempt 2.

awa_trio starts first and leads, so the awa-pg runtimes stay followers and
every rescue and promotion is ours. (awa-pg 0.6.1 never refreshes
``heartbeat_at`` on the canonical engine, so the job's heartbeat is its claim
time; the short staleness makes the rescue come quickly after the kill.)
"""

from __future__ import annotations

import signal

import trio
from conftest import in_thread
from support.awa_pg import awa_pg_worker
from support.helpers import leader_lock_holders
from test_rescue import job_snapshot

from awa_trio.branch import BranchSpec
from awa_trio.config import MaintenanceConfig
from awa_trio.engines.canonical import promote, rescue_heartbeats
from awa_trio.hooks import Hooks, JobRescued, RescueReason
from awa_trio.service import MaintenanceService

KIND = "crash_job"
QUEUE = "crash"


def crash_test_branches(config, schema):
    return [
        BranchSpec(promote.NAME, config.promote_interval, promote.run_once),
        BranchSpec(rescue_heartbeats.NAME, config.heartbeat_rescue_interval,
                   rescue_heartbeats.run_once),
    ]


async def test_killed_worker_job_is_rescued_and_completed_by_a_fresh_worker(
    database_url, db, awa_client
):
    assert await db.fetchval("SELECT awa.active_storage_engine()") == "canonical"
    config = MaintenanceConfig(
        heartbeat_staleness=2, heartbeat_rescue_interval=0.5, promote_interval=0.25,
        leader_election_interval=0.5,
    )
    hooks = Hooks()
    rescues: list[JobRescued] = []
    hooks.on_event(KIND, rescues.append)
    service = MaintenanceService(database_url, config, hooks=hooks,
                                 branch_factory=crash_test_branches)

    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        with trio.fail_after(90):
            await service.wait_until_leader()

            async with awa_pg_worker(database_url, f"{KIND}:{QUEUE}",
                                     behaviour="hang-first") as doomed:
                job = await in_thread(awa_client.insert, {"n": 1}, kind=KIND, queue=QUEUE)
                await doomed.wait_for_line(f"START {job.id} 1 ")
                doomed.kill()
                await doomed.process.wait()
            assert doomed.process.returncode == -signal.SIGKILL
            assert not any(line.startswith("DONE") for line in doomed.lines)

            # awa_trio takes the job back from the dead worker.
            while not (await job_snapshot(db, job.id))["errors"]:
                await trio.sleep(0.1)
            rescued = await job_snapshot(db, job.id)
            assert rescued["attempt"] == 1
            assert rescued["state"] in ("retryable", "available")  # promoted soon after

            # hang-first again: it completes only if the job comes back as attempt 2.
            async with awa_pg_worker(database_url, f"{KIND}:{QUEUE}",
                                     behaviour="hang-first") as fresh:
                await fresh.wait_for_line(f"DONE {job.id} 2 ")
                while (await job_snapshot(db, job.id))["state"] != "completed":
                    await trio.sleep(0.05)
                # The awa-pg runtimes never led: the only lock holder is ours.
                assert await leader_lock_holders(db) == [service.lock_backend_pid]
        service.stop()

    final = await job_snapshot(db, job.id)
    assert final["state"] == "completed"
    assert final["attempt"] == 2
    assert final["run_lease"] == 2
    assert [(e["error"], e["attempt"]) for e in final["errors"]] == [
        ("heartbeat stale: worker presumed dead", 1)
    ]
    assert [(event.job.id, event.reason) for event in rescues] == [
        (job.id, RescueReason.STALE_HEARTBEAT)
    ]
