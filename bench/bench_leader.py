"""awa_trio against upstream's Rust maintenance leader (the one inside an
awa-pg 0.6.1 runtime), on the same database and the same data.

Two user-visible latencies, each leader leading alone with the same tick
intervals:

* promotion: N due scheduled jobs are committed at once; time until all are
  ``available``;
* heartbeat rescue: N running jobs with stale heartbeats are committed at once,
  beside a backlog of completed jobs; time until none is ``running``. Run at
  a 1 s and a 100 ms rescue tick: upstream updates through the ``awa.jobs``
  view, which scans every job, so with a backlog its pass takes a few hundred
  ms; at a short tick that overruns 3/2 of the interval and trips its fixed
  120-tick cooldown (upstream defect 1), at a long tick it does not;
* idle: nothing to do for 20 s, every branch ticking at its default interval
  (promotion at 250 ms).

For each run it also reads the leader process's CPU time (user + system)
and peak resident memory from /proc (Linux). The awa-pg runtime also hosts
one idle worker slot, which its leader cannot run without.

Needs awa-pg (the test extra) and a local PostgreSQL.

    python bench/bench_leader.py [--server postgresql://postgres@localhost:5432] [--runs 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import time

import _common
import asyncpg


def start_leader(kind: str, dsn: str, rescue_interval_ms: int) -> subprocess.Popen:
    if kind == "awa_trio":
        argv = _common.awa_trio_argv(
            dsn, "--leader-election-interval", "100ms", "--promote-interval", "250ms",
            "--heartbeat-rescue-interval", f"{rescue_interval_ms}ms",
            "--heartbeat-staleness", "60s", "--log-level", "WARNING")
    else:
        argv = _common.awa_pg_runtime(
            dsn, role="canonical_drain", leader_election_interval_ms=100, promote_interval_ms=250,
            heartbeat_rescue_interval_ms=rescue_interval_ms, heartbeat_staleness_ms=60_000)
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


async def wait_until(conn, sql: str, predicate, timeout: float = 120.0) -> float:
    return await _common.wait_until(conn, sql, until=predicate, timeout=timeout, every=0.005)


async def one_run(
    server: str, template: str, leader: str, scenario: str, size: int, backlog: int,
    rescue_interval_ms: int,
) -> tuple[float, float, float]:
    """(seconds until done, leader CPU seconds in that time, leader peak RSS MiB)."""
    dsn = await _common.copy_database(server, template, "awa_trio_bench")
    process = None
    try:
        conn = await asyncpg.connect(dsn)
        if backlog:
            await conn.execute(
                "INSERT INTO awa.jobs_hot (kind, queue, state, finalized_at, attempt) "
                "SELECT 'bench_done', 'bench', 'completed', now(), 1 FROM generate_series(1, $1)",
                backlog,
            )
            await conn.execute("VACUUM ANALYZE awa.jobs_hot")
        process = start_leader(leader, dsn, rescue_interval_ms)
        await wait_until(conn, _common.LOCK_HELD_SQL, lambda n: n == 1, timeout=30)
        await asyncio.sleep(1.0)  # let the leader settle into its ticks
        cpu_before, _ = _common.process_cost(process.pid)
        if scenario == "idle":
            committed = time.perf_counter()
            await asyncio.sleep(size)
            done = time.perf_counter()
        elif scenario == "promotion":
            await conn.execute(
                "INSERT INTO awa.scheduled_jobs (kind, queue, state, run_at) "
                "SELECT 'bench', 'bench', 'scheduled', now() - interval '1 minute' "
                "FROM generate_series(1, $1)",
                size,
            )
            committed = time.perf_counter()
            done = await wait_until(conn, "SELECT count(*) FROM awa.scheduled_jobs", lambda n: n == 0)
        else:
            await conn.execute(
                "INSERT INTO awa.jobs_hot (kind, queue, state, attempt, run_lease, attempted_at, heartbeat_at) "
                "SELECT 'bench', 'bench', 'running', 1, 1, now() - interval '10 minutes', "
                "now() - interval '10 minutes' FROM generate_series(1, $1)",
                size,
            )
            committed = time.perf_counter()
            done = await wait_until(
                conn, "SELECT count(*) FROM awa.jobs_hot WHERE state = 'running'", lambda n: n == 0
            )
        await conn.close()
        cpu_after, peak_rss = _common.process_cost(process.pid)
        return done - committed, cpu_after - cpu_before, peak_rss
    finally:
        _common.stop(process)
        await _common.drop_database(server, dsn)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--server", default=_common.SERVER)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--promote-jobs", type=int, default=100_000)
    parser.add_argument("--rescue-jobs", type=int, default=5_000)
    parser.add_argument("--backlog", type=int, default=300_000)
    args = parser.parse_args()

    template = await _common.make_template(args.server, "awa_trio_bench")
    rescued = f"{args.rescue_jobs:,} stale jobs rescued, {args.backlog:,} completed beside"
    scenarios = [
        ("promotion", f"{args.promote_jobs:,} due jobs -> available (tick 250ms)",
         args.promote_jobs, 0, 100),
        ("rescue", f"{rescued} (tick 1s)", args.rescue_jobs, args.backlog, 1000),
        ("rescue", f"{rescued} (tick 100ms)", args.rescue_jobs, args.backlog, 100),
        ("idle", "idle for 20 s, default ticks", 20, 0, 30_000),
    ]
    try:
        print(f"median of {args.runs} runs; same tick intervals for both leaders")
        print(f"{'scenario':<60}{'':>9}{'awa-pg (Rust)':>15}{'awa_trio':>11}{'ratio':>8}")
        for scenario, label, size, backlog, rescue_interval_ms in scenarios:
            results = {}
            for leader in ("awa-pg", "awa_trio"):
                runs = [await one_run(args.server, template, leader, scenario, size, backlog,
                                      rescue_interval_ms)
                        for _ in range(args.runs)]
                results[leader] = [statistics.median(column) for column in zip(*runs, strict=True)]
            measures = [(0, "time", "s"), (1, "CPU", "s"), (2, "peak RSS", "MiB")]
            if scenario == "idle":
                measures = measures[1:]  # its time is the fixed wait
            for line, (index, what, unit) in enumerate(measures):
                theirs, ours = results["awa-pg"][index], results["awa_trio"][index]
                ratio = f"{ours / theirs:>7.2f}x" if theirs else f"{'-':>8}"
                print(f"{label if line == 0 else '':<60}"
                      f"{what:>9}{theirs:>11.2f} {unit:<3}{ours:>7.2f} {unit:<3}{ratio}")
    finally:
        await _common.drop_database(args.server, template)


if __name__ == "__main__":
    asyncio.run(main())
