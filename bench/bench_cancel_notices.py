"""What ``awa:cancel`` notices cost a mass rescue: 5,000 stale attempts
rescued in one heartbeat-rescue tick with their notices and without them,
on both engines, and what the listeners get.

Each run: a fresh copy of a migrated (canonical) or finalised (queue
storage) database; N running attempts whose heartbeat is 10 minutes old
(canonical: ``awa.jobs_hot`` rows as a killed awa-pg 0.6.1 worker leaves
them; queue storage: compact claims made by Awa's own claim function); an
idle awa-pg 0.6.1 runtime (its maintenance muted, never leading), whose
cancel listener parses every notice; and a plain LISTEN connection in this
process. awa_trio's ``rescue_stale_heartbeats`` then drains the backlog
(batches of 500, budget large enough for one tick). Measured:

* rescue: wall time of the tick (notices are one statement per batch, in
  the batch's transaction), and the part of it spent in the notice
  statements (their commit, which queues the notices, is not in that part);
* listener: notices received, and when the last one arrived, counted from
  the tick's start (batches commit one after another, so most arrive
  while the tick still runs);
* the most of ``pg_notification_queue_usage()`` seen (sampled every 10 ms
  from the tick's start until the notices are in): the share of the
  server's notify queue, 8 GB by default, not yet read by every listener;
* the awa-pg runtime's CPU from the tick's start until the notices are in.

Before the ticks, the notices alone: transactions of one 500-row batch's
notice statement and its COMMIT, against the same transaction with the
statement counting the same rows without notifying (a listener attached).

"without" runs the same code with the notice statement replaced by a no-op
(the batch's transaction stays: on the canonical engine that transaction is
itself new, BEGIN and COMMIT being two more round trips per batch than the
former single autocommit statement).

    python bench/bench_cancel_notices.py [--server postgresql://postgres@localhost:5432]
        [--jobs 5000] [--runs 3] [--engine canonical|queue_storage ...]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

import _common
import trio

ROOT = Path(__file__).resolve().parent.parent
# This checkout's awa_trio (not an installed one), and the tests' claim helpers.
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from support.qs_rescue import age_claims, claim, insert_jobs

from awa_trio.config import MaintenanceConfig
from awa_trio.context import MaintenanceContext
from awa_trio.db import open_database
from awa_trio.engines.canonical import rescue as canonical_rescue
from awa_trio.engines.canonical import rescue_heartbeats
from awa_trio.engines.queue_storage import rescue as qs_rescue
from awa_trio.engines.queue_storage import rescue_heartbeats as qs_rescue_heartbeats
from awa_trio.maintenance.rescue import CANCEL_NOTICES_SQL
from awa_trio.metrics import MaintenanceMetrics
from awa_trio.schema import check_schema

KIND = "bench_cancel"
QUEUE = "bench_cancel"
STALENESS = 60.0
CONFIG = MaintenanceConfig(heartbeat_staleness=STALENESS, drain_time_budget=120.0,
                           heartbeat_rescue_interval=600.0)

INSERT_STALE_CANONICAL_SQL = """
    INSERT INTO awa.jobs_hot (kind, queue, args, state, attempt, max_attempts, run_lease,
                              run_at, attempted_at, heartbeat_at)
    SELECT $1, $2, jsonb_build_object('n', n), 'running', 1, 25, 1,
           now() - interval '11 minutes', now() - interval '10 minutes',
           now() - interval '10 minutes'
    FROM generate_series(1, $3::int) AS n
"""


async def seed(db, engine: str, jobs: int) -> None:
    if engine == "canonical":
        await db.execute(INSERT_STALE_CANONICAL_SQL, KIND, QUEUE, jobs)
        return
    for start in range(0, jobs, 1000):
        count = min(1000, jobs - start)
        await insert_jobs(db, count, kind=KIND, queue=QUEUE)
        await claim(db, QUEUE, count, deadline=0)
    await age_claims(db, STALENESS * 10)


async def no_notices(*_args, **_kwargs) -> int:
    return 0


async def one_run(dsn: str, engine: str, jobs: int, notices: bool) -> dict[str, float]:
    runtime = await trio.lowlevel.open_process(
        _common.awa_pg_runtime(
            dsn, kind=KIND, queue="bench_cancel_idle", role="auto",
            leader_election_interval_ms=600_000, promote_interval_ms=10**10,
            heartbeat_rescue_interval_ms=10**10, deadline_rescue_interval_ms=10**10,
            callback_rescue_interval_ms=10**10),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        async with open_database(dsn, pool_size=3) as db:
            await seed(db, engine, jobs)
            schema = await check_schema(db)
            ctx = MaintenanceContext.standalone(db=db, config=CONFIG, metrics=MaintenanceMetrics(None),
                                                schema=schema)
            arrivals: list[float] = []
            listener = await db.connect_dedicated()
            await listener.listen("awa:cancel", lambda _payload: arrivals.append(time.perf_counter()))
            await trio.sleep(3)  # the runtime has started and listens
            module, patched = ((rescue_heartbeats, canonical_rescue) if engine == "canonical"
                               else (qs_rescue_heartbeats, qs_rescue))
            original = patched.send_cancel_notices
            in_notices = [0.0]

            async def timed_notices(*args, **kwargs) -> int:
                began = time.perf_counter()
                try:
                    return await original(*args, **kwargs)
                finally:
                    in_notices[0] += time.perf_counter() - began

            patched.send_cancel_notices = timed_notices if notices else no_notices
            usage = [0.0]

            async def sample_usage(task_status=trio.TASK_STATUS_IGNORED) -> None:
                task_status.started()
                while True:
                    usage.append(await db.fetchval("SELECT pg_notification_queue_usage()"))
                    await trio.sleep(0.01)

            cpu_before = _common.cpu_seconds(runtime.pid)
            async with trio.open_nursery() as nursery:
                await nursery.start(sample_usage)
                try:
                    started = time.perf_counter()
                    result = await module.run_once(ctx)
                    ended = time.perf_counter()
                finally:
                    patched.send_cancel_notices = original
                expected = jobs if notices else 0
                with trio.move_on_after(60):
                    while len(arrivals) < expected:
                        await trio.sleep(0.005)
                nursery.cancel_scope.cancel()
            await trio.sleep(1.0)  # anything late, and the runtime's share of it
            cpu_after = _common.cpu_seconds(runtime.pid)
            await listener.close()
        assert len(result.rescued) == jobs, f"rescued {len(result.rescued)} of {jobs}"
        return {
            "rescue": ended - started,
            "batches": result.batches,
            "in_notices": in_notices[0],
            "received": len(arrivals),
            "last_arrival": (max(arrivals) - started) if arrivals else 0.0,
            "queue_usage": max(usage),
            # Includes the idle runtime's own ~1 s after the last notice.
            "runtime_cpu": cpu_after - cpu_before,
        }
    finally:
        runtime.kill()
        await runtime.wait()


#: The notice statement's shape over 500 attempts, and the same without pg_notify.
ISOLATED_SQL = {
    "with pg_notify": CANCEL_NOTICES_SQL.text,
    "without": CANCEL_NOTICES_SQL.text.replace("pg_notify(", "concat("),
}


async def isolated_cost(server: str, repeats: int = 50) -> dict[str, float]:
    """Median ms of BEGIN; one 500-notice statement; COMMIT (a listener attached)."""
    dsn = await _common.in_trio(_common.create_database, server, _common.scratch_name("awa_trio_bench_cn"))
    try:
        async with open_database(dsn, pool_size=2) as db:
            listener = await db.connect_dedicated()
            await listener.listen("awa:cancel", lambda _payload: None)
            ids = list(range(1, 501))
            medians = {}
            for label, sql in ISOLATED_SQL.items():
                times = []
                for _ in range(repeats):
                    started = time.perf_counter()
                    async with db.transaction() as conn:
                        await conn.fetchval(sql, ids, ids)
                    times.append((time.perf_counter() - started) * 1000)
                medians[label] = statistics.median(times)
            await listener.close()
        return medians
    finally:
        await _common.in_trio(_common.drop_database, server, dsn)


async def measure(server: str, engines: list[str], jobs: int, runs: int) -> None:
    isolated = await isolated_cost(server)
    print("one batch's transaction (500 attempts), median of 50: "
          + ", ".join(f"{label} {ms:.2f} ms" for label, ms in isolated.items()))
    print(f"heartbeat rescue of {jobs} stale attempts in one tick, {runs} runs each "
          f"(interleaved); load average {Path('/proc/loadavg').read_text().split()[0]} at start")
    print(f"{'engine':<15}{'notices':<9}{'rescue s':>10}{'min':>7}{'max':>7}{'batches':>9}{'in notices s':>14}"
          f"{'received':>10}{'last notice s':>15}{'queue usage':>13}{'runtime CPU s':>15}")
    for engine in engines:
        template = await _common.in_trio(_common.make_template, server, "awa_trio_bench_cn",
                                         queue_storage=engine == "queue_storage")
        try:
            results: dict[bool, list[dict[str, float]]] = {True: [], False: []}
            for _ in range(runs):
                for notices in results:
                    dsn = await _common.in_trio(_common.copy_database, server, template, "awa_trio_bench_cn")
                    try:
                        results[notices].append(await one_run(dsn, engine, jobs, notices))
                    finally:
                        await _common.in_trio(_common.drop_database, server, dsn)
        finally:
            await _common.in_trio(_common.drop_database, server, template)
        for notices, rows in results.items():
            rescue = [row["rescue"] for row in rows]
            print(f"{engine:<15}{'with' if notices else 'without':<9}{statistics.median(rescue):>10.3f}"
                  f"{min(rescue):>7.3f}{max(rescue):>7.3f}{statistics.median(r['batches'] for r in rows):>9.0f}"
                  f"{statistics.median(r['in_notices'] for r in rows):>14.3f}"
                  f"{statistics.median(r['received'] for r in rows):>10.0f}"
                  f"{statistics.median(r['last_arrival'] for r in rows):>15.3f}"
                  f"{max(r['queue_usage'] for r in rows):>13.2e}"
                  f"{statistics.median(r['runtime_cpu'] for r in rows):>15.2f}")
    print(f"load average at end {Path('/proc/loadavg').read_text().split()[0]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", default=_common.SERVER)
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--engine", action="append", choices=("canonical", "queue_storage"))
    args = parser.parse_args()
    trio.run(measure, args.server, args.engine or ["canonical", "queue_storage"], args.jobs, args.runs)


if __name__ == "__main__":
    main()
