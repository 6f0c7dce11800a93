"""Failover under a silent network partition of the leader's lock connection.

Two awa_trio nodes on one database; once one leads, every packet its lock
connection sends to the server is dropped (an iptables rule on the loopback
interface, matching that connection's client port), so neither side sees a
close or a reset. Prints how long until a node leads again, for the default
``lock_keepalive`` and with it disabled (the OS's keepalive, as every other
Awa runtime has), waiting at most ``--give-up`` seconds.

Needs root and iptables (Linux); it changes nothing else and removes its rule.

    python bench/bench_partition.py [--server postgresql://postgres@127.0.0.1:5432] [--give-up 90]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import subprocess

import _common
import trio

from awa_trio import MaintenanceConfig, MaintenanceService
from awa_trio.db import open_database


def iptables(action: str, client_port: int) -> None:
    subprocess.run(
        ["iptables", action, "INPUT", "-i", "lo", "-p", "tcp", "--sport", str(client_port), "-j", "DROP"],
        check=True,
    )


async def failover_seconds(dsn: str, config: MaintenanceConfig, give_up: float) -> float | None:
    nodes = [MaintenanceService(dsn, config), MaintenanceService(dsn, config)]
    async with trio.open_nursery() as nursery:
        await nursery.start(nodes[0].run)
        await nodes[0].wait_until_leader()
        await nursery.start(nodes[1].run)
        async with open_database(dsn, pool_size=1) as db:
            port = await db.fetchval(
                "SELECT client_port FROM pg_stat_activity WHERE pid = $1", nodes[0].lock_backend_pid)
        iptables("-I", port)
        try:
            partitioned_at = trio.current_time()
            await nodes[0].wait_until_follower()
            stepped_down = trio.current_time() - partitioned_at
            result = None
            with trio.move_on_after(give_up):
                while not any(node.is_leader for node in nodes):
                    await trio.sleep(0.05)
                result = trio.current_time() - partitioned_at
            print(f"    old leader stepped down after {stepped_down:.1f} s")
        finally:
            iptables("-D", port)
        nursery.cancel_scope.cancel()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", default="postgresql://postgres@127.0.0.1:5432")
    parser.add_argument("--give-up", type=float, default=90.0)
    args = parser.parse_args()
    if shutil.which("iptables") is None:
        raise SystemExit("bench_partition: needs iptables (and root)")

    database = _common.scratch_name("awa_trio_bench_partition")
    try:
        dsn = asyncio.run(_common.create_database(args.server, database))
        base = MaintenanceConfig(leader_election_interval=1.0, leader_check_interval=2.0)
        print("failover after a silent partition of the leader's lock connection")
        for label, config in (
            ("lock_keepalive 30 s (default)", base),
            ("lock_keepalive 10 s", base.replace(lock_keepalive=10)),
            ("lock_keepalive off (OS keepalive)", base.replace(lock_keepalive=0)),
        ):
            print(f"  {label}:")
            seconds = trio.run(failover_seconds, dsn, config, args.give_up)
            shown = f"{seconds:.1f} s" if seconds is not None else f"none within {args.give_up:.0f} s"
            print(f"    a node leads again after {shown}")
    finally:
        asyncio.run(_common.drop_database(args.server, database))


if __name__ == "__main__":
    main()
