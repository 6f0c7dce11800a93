"""Awa's own web UI (``awa serve`` from awa-cli 0.6.9) on a fleet that
awa_trio leads beside a following awa-pg runtime: its admin API shows one
leader, awa_trio's instance, with maintenance alive; after a handover to a
second awa_trio node it shows the new one within a snapshot interval."""

import os
import socket

import trio
from support.awa_cli import serve_admin_ui
from support.awa_pg import awa_pg_worker
from support.takeover import awa_trio_process

from awa_trio import MaintenanceConfig, MaintenanceService

SNAPSHOT = 2.0
CONFIG = MaintenanceConfig(
    leader_election_interval=0.2, leader_check_interval=0.3, runtime_snapshot_interval=SNAPSHOT
)


def leaders(runtime: dict) -> list[dict]:
    return [i for i in runtime["instances"] if i["leader"] and not i["stale"]]


async def wait_for_view(served, predicate, timeout: float) -> dict:
    with trio.fail_after(timeout):
        while True:
            runtime = await served.runtime()
            if predicate(runtime):
                return runtime
            await trio.sleep(0.05)


async def test_awa_serve_shows_awa_trio_leading_and_the_new_leader_after_a_handover(qs_database_url):
    first = MaintenanceService(qs_database_url, CONFIG)
    host = socket.gethostname()
    async with trio.open_nursery() as nursery:
        await nursery.start(first.run)
        await first.wait_until_leader()
        async with awa_pg_worker(qs_database_url, "served:served", extra_args=["--role", "auto"]) as worker:
            served = await nursery.start(serve_admin_ui, qs_database_url)
            # The awa-pg runtime publishes its first snapshot as it starts.
            runtime = await wait_for_view(served, lambda r: len(r["instances"]) == 2, timeout=20)
            assert runtime["leader_instances"] == 1, runtime
            (leader,) = leaders(runtime)
            assert (leader["hostname"], leader["pid"]) == (host, os.getpid())
            assert leader["maintenance_alive"] is True and leader["stale"] is False
            (follower,) = [i for i in runtime["instances"] if not i["leader"]]
            assert follower["pid"] == worker.process.pid

            async with awa_trio_process(
                qs_database_url, "--runtime-snapshot-interval", f"{SNAPSHOT}s", "--leader-election-interval", "0.2s"
            ) as second:
                await wait_for_view(served, lambda r: any(i["pid"] == second.pid for i in r["instances"]), timeout=20)
                assert first.resign()
                resigned_at = trio.current_time()
                runtime = await wait_for_view(
                    served,
                    lambda r: r["leader_instances"] == 1 and [i["pid"] for i in leaders(r)] == [second.pid],
                    timeout=SNAPSHOT + 5,
                )
                shown_after = trio.current_time() - resigned_at
                print(f"awa serve showed the new leader {shown_after * 1000:.0f} ms after the resign")
                (leader,) = leaders(runtime)
                assert (leader["hostname"], leader["maintenance_alive"]) == (host, True)
                old = next(i for i in runtime["instances"] if i["pid"] == os.getpid())
                assert (old["leader"], old["maintenance_alive"], old["stale"]) == (False, False, False)
                assert shown_after < SNAPSHOT, f"the new leader was shown {shown_after:.2f} s after the resign"
        nursery.cancel_scope.cancel()
