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
from pathlib import Path

import _common
import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from support.midwave import WaveResult, run_wave

from awa_trio.db import open_database


async def one_wave(server: str, template: str, leaders: str, jobs: int, kill_after: float) -> WaveResult:
    import awa

    dsn = await _common.in_trio(_common.copy_database, server, template, "awa_trio_midwave")
    client = awa.Client(dsn)
    try:
        async with open_database(dsn, pool_size=2, application_name="bench admin") as admin:
            return await run_wave(admin, client, dsn, leaders=leaders, jobs=jobs, kill_after=kill_after)
    finally:
        del client
        gc.collect()
        await _common.in_trio(_common.drop_database, server, dsn)


async def run(server: str, jobs: int, kill_after: float, runs: int, skip_upstream: bool) -> None:
    print(f"{jobs:,} jobs due at once, leader SIGKILLed {kill_after:g} s into promotion; "
          f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    template = await _common.in_trio(_common.make_template, server, "awa_trio_midwave")
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
        await _common.in_trio(_common.drop_database, server, template)

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
    parser.add_argument("--server", default=_common.env_server())
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--kill-after", type=float, default=0.3)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--skip-upstream", action="store_true")
    args = parser.parse_args()
    trio.run(run, args.server, args.jobs, args.kill_after, args.runs, args.skip_upstream)


if __name__ == "__main__":
    main()
