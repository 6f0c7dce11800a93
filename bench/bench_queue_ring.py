"""Queue ring: failed rows rewritten by prune, upstream's rule against awa_trio's.

    python bench/bench_queue_ring.py [--server postgresql://postgres@localhost:5432]
                                     [--failed 500] [--laps 4]

Builds a fresh queue-storage database (awa-pg 0.6.1 migrates it and an
``auto`` runtime finalises it), makes N failed jobs inside the retention floor
with a real failing awa-pg worker, then drives the queue ring tick by tick
(rotate, then prune) for a number of laps, once with upstream's rule (carry
every failed row into the live slot whenever its slot is pruned) and once
with awa_trio's (leave a slot that holds nothing but such rows alone while
the live slot has no traffic). Two scenarios: an idle ring, and a ring with
traffic (5 jobs per tick, completed by a real worker). Prints rows rewritten
and the rate they imply at the default 1 s rotation. Asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import _common
import trio

from awa_trio.config import MaintenanceConfig
from awa_trio.context import MaintenanceContext
from awa_trio.db import open_database
from awa_trio.engines.queue_storage import rotate_queue
from awa_trio.leadership import LOCK_KEY
from awa_trio.metrics import MaintenanceMetrics
from awa_trio.schema import check_schema

TESTS = Path(__file__).resolve().parent.parent / "tests"
WORKER = TESTS / "support" / "awa_pg_worker.py"
def make_database(server: str, name: str) -> str:
    dsn = asyncio.run(_common.create_database(server, name))
    # The test suite's recipe: an awa-pg ``auto`` runtime finalises a fresh
    # install to queue storage (and checks it did, rings at slot 0).
    sys.path.insert(0, str(TESTS))
    from conftest import _make_queue_storage

    _make_queue_storage(dsn)
    return dsn


def start_worker(dsn: str, kind_queue: str, behaviour: str) -> subprocess.Popen:
    worker = subprocess.Popen(
        [sys.executable, str(WORKER), dsn, "--kind", kind_queue, "--behaviour", behaviour,
         "--role", "auto"],
        stdout=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    while worker.stdout.readline().strip() != "READY":
        if worker.poll() is not None:
            raise RuntimeError("awa-pg worker did not start")
    return worker


async def wait_for(db, sql: str, expected: int, timeout: float = 600.0) -> None:
    with trio.fail_after(timeout):
        while (seen := await db.fetchval(sql)) < expected:
            print(f"  {seen}/{expected}", end="\r", file=sys.stderr)
            await trio.sleep(0.5)


async def drive(ctx, client, *, ticks: int, warmup: int, defer: bool, traffic: bool) -> dict:
    """``warmup`` unmeasured ticks first, so each rule starts from its own
    steady state rather than from the previous scenario's ring."""
    rewritten = rotations = pruned = 0
    prune_seconds = 0.0
    for tick in range(-warmup, ticks):
        if tick == 0:
            rewritten = rotations = pruned = 0
            prune_seconds = 0.0
        if traffic:
            await trio.to_thread.run_sync(
                lambda: client.insert_many_copy([{"n": n} for n in range(5)],
                                                kind="bench_ok", queue="bench_traffic"))
            await trio.sleep(0.1)
        if (await rotate_queue.rotate(ctx)).rotated:
            rotations += 1
        started = time.perf_counter()
        result = await rotate_queue.prune(ctx, defer_idle_carry=defer)
        prune_seconds += time.perf_counter() - started
        if result.outcome.value == "pruned":
            pruned += 1
        rewritten += result.details.get("rewritten_rows", 0)
    return {"rotations": rotations, "pruned": pruned, "rewritten": rewritten,
            "prune_ms": 1000 * prune_seconds / ticks}


async def bench(dsn: str, failed: int, laps: int) -> None:
    import awa

    client = awa.Client(dsn)
    async with open_database(dsn) as db:
        lock = await db.connect_dedicated()
        await lock.fetchval("SELECT pg_advisory_lock($1)", LOCK_KEY)  # workers never lead
        config = MaintenanceConfig().replace(failed_retention=3 * 86400.0)
        ctx = MaintenanceContext.standalone(db=db, config=config, metrics=MaintenanceMetrics(),
                                 schema=await check_schema(db))
        await trio.to_thread.run_sync(lambda: client.insert_many_copy(
            [{"n": n} for n in range(failed)], kind="bench_fail", queue="bench_failing",
            max_attempts=1))
        failing = start_worker(dsn, "bench_fail:bench_failing", "fail")
        try:
            await wait_for(db, "SELECT count(*) FROM awa.done_entries WHERE state = 'failed'", failed)
        finally:
            failing.kill()
        completing = start_worker(dsn, "bench_ok:bench_traffic", "complete")
        slot_count = await db.fetchval("SELECT slot_count FROM awa.queue_ring_state")
        ticks = laps * slot_count
        rows = []
        try:
            for scenario, traffic in (("idle", False), ("traffic", True)):
                for mode, defer in (("upstream", False), ("awa_trio", True)):
                    figures = await drive(ctx, client, ticks=ticks, warmup=slot_count,
                                          defer=defer, traffic=traffic)
                    rows.append((scenario, mode, figures))
        finally:
            completing.kill()
            await lock.close()
        assert await db.fetchval(
            "SELECT count(*) FROM awa.done_entries WHERE state = 'failed'") == failed

    print(f"\nqueue ring, {failed} failed rows inside the floor, {ticks} measured ticks "
          f"({laps} laps of {slot_count} slots) after one lap of warm-up\n")
    header = f"{'scenario':<9} {'rule':<9} {'rotations':>9} {'pruned':>7} {'rewritten':>10} " \
             f"{'per tick':>9} {'per hour @1s':>13} {'prune ms':>9}"
    print(header)
    print("-" * len(header))
    baseline = {}
    for scenario, mode, f in rows:
        per_tick = f["rewritten"] / ticks
        print(f"{scenario:<9} {mode:<9} {f['rotations']:>9} {f['pruned']:>7} {f['rewritten']:>10} "
              f"{per_tick:>9.1f} {per_tick * 3600:>13,.0f} {f['prune_ms']:>9.2f}")
        baseline.setdefault(scenario, f["rewritten"])
    print()
    for scenario, mode, f in rows:
        if mode == "awa_trio" and baseline[scenario]:
            print(f"{scenario}: awa_trio rewrites {f['rewritten'] / baseline[scenario]:.2f}x upstream's rows")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--server", default=_common.SERVER)
    parser.add_argument("--failed", type=int, default=500)
    parser.add_argument("--laps", type=int, default=4)
    args = parser.parse_args()
    name = f"awa_trio_bench_ring_{os.getpid()}"
    dsn = make_database(args.server, name)
    try:
        trio.run(bench, dsn, args.failed, args.laps)
    finally:
        asyncio.run(_common.drop_database(args.server, name))


if __name__ == "__main__":
    main()
