"""An idle leader on queue storage: awa_trio against upstream's leader (an
awa-pg 0.6.1 runtime with one idle worker slot), one after the other on a
fresh database each, every branch at its default tick.

CPU (user + system) and peak RSS of the leader process from /proc, over the
whole run (start-up included) and from 5 s in (start-up excluded).

    python bench/bench_qs_idle.py [--seconds 120] [--server postgresql://postgres@localhost:5432]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import asyncpg

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from bench_leader import LOCK_HELD_SQL, process_cost
from bench_qs_sustained import admin, make_queue_storage_database

AWA_PG_IDLE_LEADER = r"""
import asyncio, signal, sys, awa
async def main():
    client = awa.AsyncClient(sys.argv[1])
    @client.task(dict, kind="bench_idle", queue="bench_idle")
    async def idle(job):
        pass
    await client.start([{"name": "bench_idle", "max_workers": 1}], storage_transition_role="auto",
                       leader_election_interval_ms=100)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await client.shutdown(timeout_ms=2000)
asyncio.run(main())
"""

STARTUP_SECONDS = 5.0


def start_leader(kind: str, dsn: str) -> subprocess.Popen:
    if kind == "awa_trio":
        argv = [sys.executable, "-m", "awa_trio", "--database-url", dsn,
                "--leader-election-interval", "100ms", "--log-level", "WARNING"]
    else:
        argv = [sys.executable, "-c", AWA_PG_IDLE_LEADER, dsn]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


async def one_run(server: str, kind: str, seconds: float) -> tuple[float, float, float]:
    """(CPU s over the whole run, CPU s after start-up, peak RSS MiB)."""
    name, dsn = await make_queue_storage_database(server)
    process = start_leader(kind, dsn)
    started = time.monotonic()
    try:
        conn = await asyncpg.connect(dsn)
        while await conn.fetchval(LOCK_HELD_SQL) != 1:
            await asyncio.sleep(0.05)
        await conn.close()
        await asyncio.sleep(max(0.0, started + STARTUP_SECONDS - time.monotonic()))
        after_startup, _ = process_cost(process.pid)
        await asyncio.sleep(max(0.0, started + seconds - time.monotonic()))
        total, peak = process_cost(process.pid)
        return total, total - after_startup, peak
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
        await admin(server, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=120)
    parser.add_argument("--server", default=os.environ.get(
        "AWA_TRIO_TEST_SERVER", "postgresql://postgres@localhost:5432"))
    args = parser.parse_args()
    results = {kind: await one_run(args.server, kind, args.seconds) for kind in ("awa-pg", "awa_trio")}
    print(f"\nidle leader on queue storage, {args.seconds:g} s, default ticks\n")
    print("| measure | awa-pg 0.6.1 | awa_trio | ratio |")
    print("| --- | --- | --- | --- |")
    labels = ("CPU, start-up included", f"CPU, from {STARTUP_SECONDS:g} s in", "peak RSS")
    units = ("s", "s", "MiB")
    for index, (label, unit) in enumerate(zip(labels, units, strict=True)):
        theirs, ours = results["awa-pg"][index], results["awa_trio"][index]
        ratio = f"{ours / theirs:.2f}x" if theirs else "-"
        print(f"| {label} | {theirs:.2f} {unit} | {ours:.2f} {unit} | {ratio} |")


if __name__ == "__main__":
    asyncio.run(main())
