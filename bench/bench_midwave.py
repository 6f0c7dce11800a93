"""SIGKILL of the leader mid-wave: 20,000 scheduled jobs (canonical engine)
come due at once while two awa-pg 0.6.1 workers (16 slots each, a no-op
handler, never leading) consume them. The leader is SIGKILLed 0.3 s after
the first rows leave awa.scheduled_jobs and its follower takes over. Run
with awa_trio processes as leader and follower, then with awa-pg 0.6.1
runtimes (upstream's leader, default 10 s election interval), each on a
fresh database; median of ``--runs``.

Printed per run: rows promoted when the leader died, takeover (SIGKILL to a
new holder in pg_locks), time from the due moment until no row is left in
awa.scheduled_jobs (the leaders' part) and until every job is completed
(bound by the workers' throughput once the backlog promoted before the kill
covers the takeover), and whether each job completed exactly once at
attempt 1.

    python bench/bench_midwave.py [--server postgresql://postgres@localhost:5432]
        [--jobs 20000] [--kill-after 0.3] [--runs 3] [--skip-upstream]
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import uuid
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from support.midwave import WaveResult, run_wave

from awa_trio.db import open_database


async def make_template(server: str) -> str:
    import awa

    name = f"awa_trio_midwave_tpl_{os.getpid()}"
    async with open_database(f"{server}/postgres", pool_size=1) as admin:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.execute(f'CREATE DATABASE "{name}"')
        await trio.to_thread.run_sync(lambda: awa.Client(f"{server}/{name}").migrate())
        gc.collect()
        await admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                            f"WHERE datname = '{name}' AND pid <> pg_backend_pid()")
    return name


async def admin_execute(server: str, sql: str) -> None:
    async with open_database(f"{server}/postgres", pool_size=1) as admin:
        await admin.execute(sql)


async def one_wave(server: str, template: str, leaders: str, jobs: int, kill_after: float) -> WaveResult:
    import awa

    name = f"awa_trio_midwave_{uuid.uuid4().hex[:8]}"
    await admin_execute(server, f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
    dsn = f"{server}/{name}"
    client = awa.Client(dsn)
    try:
        async with open_database(dsn, pool_size=2, application_name="bench admin") as admin:
            return await run_wave(admin, client, dsn, leaders=leaders, jobs=jobs, kill_after=kill_after)
    finally:
        del client
        gc.collect()
        await admin_execute(server, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def run(server: str, jobs: int, kill_after: float, runs: int, skip_upstream: bool) -> None:
    print(f"{jobs:,} jobs due at once, leader SIGKILLed {kill_after:g} s into promotion; "
          f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    template = await make_template(server)
    results: dict[str, list[WaveResult]] = {}
    try:
        for leaders in ("awa_trio",) if skip_upstream else ("awa_trio", "awa-pg"):
            for _ in range(runs):
                result = await one_wave(server, template, leaders, jobs, kill_after)
                results.setdefault(leaders, []).append(result)
                print(f"  {leaders:<9} promoted when killed {result.promoted_at_kill:>6,}  takeover "
                      f"{result.takeover:6.3f} s  all promoted {result.promotion:6.2f} s, all completed {result.completion:6.2f} s after due  "
                      f"exactly once at attempt 1: {'yes' if result.exactly_once else 'NO'} "
                      f"{'' if result.exactly_once else result.outcomes}"
                      f"{' exits: ' + str(result.unexpected_exits) if result.unexpected_exits else ''}")
    finally:
        await admin_execute(server, f'DROP DATABASE IF EXISTS "{template}" WITH (FORCE)')

    print()
    print(f"| leaders (median of {runs}) | promoted when killed | takeover | all promoted after due "
          f"| all {jobs:,} completed after due | exactly once, attempt 1 |")
    print("| --- | --- | --- | --- | --- | --- |")
    for leaders, rows in results.items():
        print(f"| {leaders} | {statistics.median(r.promoted_at_kill for r in rows):,.0f} "
              f"| {statistics.median(r.takeover for r in rows):.3f} s "
              f"| {statistics.median(r.promotion for r in rows):.2f} s "
              f"| {statistics.median(r.completion for r in rows):.2f} s "
              f"(min {min(r.completion for r in rows):.2f}, max {max(r.completion for r in rows):.2f}) "
              f"| {sum(r.exactly_once for r in rows)} of {len(rows)} runs |")
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--server", default=os.environ.get("AWA_TRIO_TEST_SERVER",
                                                           "postgresql://postgres@localhost:5432"))
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--kill-after", type=float, default=0.3)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--skip-upstream", action="store_true")
    args = parser.parse_args()
    trio.run(run, args.server, args.jobs, args.kill_after, args.runs, args.skip_upstream)


if __name__ == "__main__":
    main()
