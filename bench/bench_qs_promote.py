"""Promotion of a due burst on queue storage: awa_trio against upstream's
leader (the one inside an awa-pg 0.6.1 runtime), in one run, same data.

For each burst size, a fresh queue-storage database gets that many jobs
scheduled an hour ahead (half through awa-pg's ``enqueue_many_copy``, with a
NULL payload, half through ``insert_many_copy``); then one UPDATE makes them
all due at once, and we time until ``deferred_jobs`` is empty.

* awa_trio: ``awa_trio.engines.queue_storage.promote.run_once`` called in-process,
  tick after tick (the same body its branch actor runs every
  ``promote_interval``), until nothing is left;
* awa-pg 0.6.1: a runtime leading alone, ``promote_interval`` 250 ms. Past
  about 3,640 due jobs of one state its batch exceeds PostgreSQL's
  65,535-parameter limit and fails every tick: it never finishes. It is
  given ``--upstream-timeout`` seconds and reported as wedged; its figure at
  3,000 jobs (one batch) stands beside ours.

Upstream's time includes the wait for its next 250 ms tick (at most one
interval); awa_trio's is the bodies alone. Needs awa-pg and a local PostgreSQL.

    python bench/bench_qs_promote.py [--server postgresql://postgres@localhost:5432]
        [--sizes 50000,3000] [--upstream-sizes 50000,3000] [--runs 1]
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import subprocess
import time

import _common
import trio

from awa_trio.config import MaintenanceConfig
from awa_trio.context import MaintenanceContext
from awa_trio.db import open_database
from awa_trio.engines.queue_storage import promote
from awa_trio.metrics import MaintenanceMetrics
from awa_trio.schema import check_schema


async def insert_burst(dsn: str, size: int) -> None:
    import awa

    client = awa.Client(dsn)
    run_at = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    half = size // 2
    for count, copy in ((half, client.enqueue_many_copy), (size - half, client.insert_many_copy)):
        for start in range(0, count, 5000):
            jobs = [{"n": start + i} for i in range(min(5000, count - start))]
            await trio.to_thread.run_sync(
                lambda copy=copy, jobs=jobs: copy(jobs, kind="burst", queue="burst", run_at=run_at))


async def one_run(server: str, template: str, leader: str, size: int,
                  upstream_timeout: float) -> tuple[int, float, int]:
    """(jobs promoted, seconds, ticks); seconds is the timeout when wedged."""
    dsn = await _common.in_trio(_common.copy_database, server, template, "awa_trio_bench_q")
    process = None
    try:
        async with open_database(dsn, pool_size=4) as db:
            await insert_burst(dsn, size)
            await db.execute("VACUUM ANALYZE awa.deferred_jobs")
            if leader == "awa-pg 0.6.1":
                process = await trio.lowlevel.open_process(
                    _common.awa_pg_runtime(dsn, role="auto", leader_election_interval_ms=100,
                                           promote_interval_ms=250),
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                with trio.fail_after(30):
                    while await db.fetchval(_common.LOCK_HELD_SQL) != 1:
                        await trio.sleep(0.05)
                await trio.sleep(1.0)  # settle into its ticks
            await db.execute("UPDATE awa.deferred_jobs SET run_at = now() - interval '1 second'")
            started = time.perf_counter()
            ticks = 0
            if leader == "awa_trio":
                schema = await check_schema(db)
                ctx = MaintenanceContext.standalone(db=db, config=MaintenanceConfig(),
                                         metrics=MaintenanceMetrics(None), schema=schema)
                while await db.fetchval("SELECT count(*) FROM awa.deferred_jobs"):
                    await promote.run_once(ctx)
                    ticks += 1
            else:
                deadline = started + upstream_timeout
                while await db.fetchval("SELECT count(*) FROM awa.deferred_jobs"):
                    if time.perf_counter() > deadline:
                        break
                    await trio.sleep(0.005)
            elapsed = time.perf_counter() - started
            promoted = await db.fetchval("SELECT count(*) FROM awa.ready_entries "
                                         "WHERE queue = 'burst'")
            return promoted, elapsed, ticks
    finally:
        if process is not None:
            process.terminate()
            with trio.move_on_after(5):
                await process.wait()
            if process.returncode is None:
                process.kill()
        await _common.in_trio(_common.drop_database, server, dsn)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", default=_common.SERVER)
    parser.add_argument("--sizes", default="50000,3000", help="awa_trio burst sizes")
    parser.add_argument("--upstream-sizes", default="50000,3000")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--upstream-timeout", type=float, default=20.0)
    args = parser.parse_args()
    plan = ([("awa_trio", int(size)) for size in args.sizes.split(",") if size]
            + [("awa-pg 0.6.1", int(size)) for size in args.upstream_sizes.split(",") if size])

    template = await _common.in_trio(_common.make_template, args.server, "awa_trio_bench_q", queue_storage=True)
    rows = []
    try:
        for leader, size in plan:
            runs = [await one_run(args.server, template, leader, size, args.upstream_timeout)
                    for _ in range(args.runs)]
            rows.append((leader, size, runs))
    finally:
        await _common.in_trio(_common.drop_database, args.server, template)

    print(f"\nPromotion of a due queue-storage burst (median of {args.runs} run(s); "
          "half the rows with a NULL payload)\n")
    header = f"{'leader':<14} {'burst':>7} {'promoted':>9} {'seconds':>8} {'rows/s':>9}  note"
    print(header)
    print("-" * len(header))
    rates: dict[tuple[str, int], float] = {}
    for leader, size, runs in rows:
        promoted = min(run[0] for run in runs)
        seconds = statistics.median(run[1] for run in runs)
        ticks = max(run[2] for run in runs)
        if promoted < size:
            print(f"{leader:<14} {size:>7,} {promoted:>9,} {seconds:>8.2f} {'-':>9}  "
                  f"wedged: {promoted:,} promoted after {seconds:.0f} s")
            continue
        rate = size / seconds
        rates[(leader, size)] = rate
        note = f"{ticks} tick(s)" if leader == "awa_trio" else "incl. wait for its 250 ms tick"
        print(f"{leader:<14} {size:>7,} {promoted:>9,} {seconds:>8.2f} {rate:>9,.0f}  {note}")
    ours = rates.get(("awa_trio", 50_000)) or next(
        (rate for (leader, _), rate in rates.items() if leader == "awa_trio"), None)
    theirs = rates.get(("awa-pg 0.6.1", 3_000))
    if ours and theirs:
        print(f"\nawa_trio (largest burst) rows/s over awa-pg 0.6.1 at 3,000 jobs: "
              f"{ours / theirs:.1f}x")


if __name__ == "__main__":
    trio.run(main)
