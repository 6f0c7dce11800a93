"""Rescue latency on queue storage after a SIGKILLed worker: awa_trio against
upstream's leader (the one inside an awa-pg 0.6.1 runtime).

Each run: a fresh queue-storage database (finalised by a real awa-pg
runtime); the leader under test starts first and takes the lock; an awa-pg
worker (its own maintenance muted, heartbeating every 200 ms) claims one
job, runs it for a second, and is SIGKILLed. Latency is the time from the
kill until the job's attempt is closed as rescued (its receipt closure
written, or its retryable row visible). Both leaders run with
``heartbeat_staleness`` 3 s and a 1 s heartbeat-rescue tick, so the floor
is about 3 s (staleness) and the worst case about 3 s + 1 s (one tick) +
the worker's last heartbeat interval. Target for awa_trio: at most
staleness + interval + 0.5 s = 4.5 s.

awa_trio runs as its CLI, leading, with only its rescue branches enabled
(the queue-storage ring, promotion and stats branches are disabled so they
cannot disturb the measurement, whatever state they are in).

    python bench/bench_qs_rescue.py [--server postgresql://postgres@localhost:5432] [--runs 5]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import _common
import asyncpg

ROOT = Path(__file__).resolve().parent.parent
WORKER_SCRIPT = ROOT / "tests" / "support" / "awa_pg_worker.py"
STALENESS_MS = 3000
RESCUE_INTERVAL_MS = 1000
WORKER_HEARTBEAT_MS = 200
TARGET = (STALENESS_MS + RESCUE_INTERVAL_MS) / 1000 + 0.5
KIND = "bench_crash"
QUEUE = "bench_crash"

# Branches awa_trio leaves alone in this benchmark (everything but the rescues).
DISABLED_BRANCHES = (
    "promote_scheduled", "cleanup", "queue_stats", "batch_operations", "terminal_count_rollup",
    "rotate_queue", "rotate_lease", "rotate_claim", "cron_sync", "cron_eval",
)  # fmt: skip

INSERT_SQL = """
    SELECT id FROM awa.insert_job_compat(
        p_kind => $1, p_queue => $2, p_args => '{}'::jsonb, p_state => 'available',
        p_priority => 2::smallint, p_max_attempts => 25::smallint, p_run_at => NULL,
        p_metadata => '{}'::jsonb, p_tags => '{}'::text[], p_unique_key => NULL,
        p_unique_states => NULL, p_ordering_key => NULL)
"""

# The attempt is rescued once its claim is closed by a rescue, or its
# successor row exists (retryable, or already promoted with a new run lease).
RESCUED_SQL = """
    SELECT EXISTS (
        SELECT 1 FROM awa.lease_claim_closures
        WHERE job_id = $1 AND run_lease = $2 AND outcome IN ('rescued', 'rescue')
    ) OR EXISTS (
        SELECT 1 FROM awa.deferred_jobs WHERE job_id = $1
    ) OR EXISTS (
        SELECT 1 FROM awa.ready_entries WHERE job_id = $1 AND run_lease > $2
    )
"""


def start_leader(leader: str, dsn: str) -> subprocess.Popen:
    if leader == "awa_trio":
        argv = _common.awa_trio_argv(
            dsn, "--leader-election-interval", "100ms", "--heartbeat-rescue-interval", f"{RESCUE_INTERVAL_MS}ms",
            "--heartbeat-staleness", f"{STALENESS_MS}ms", "--log-level", "ERROR")
        for name in DISABLED_BRANCHES:
            argv += ["--disable-branch", name]
    else:
        argv = _common.awa_pg_runtime(
            dsn, role="auto", leader_election_interval_ms=100,
            heartbeat_rescue_interval_ms=RESCUE_INTERVAL_MS, heartbeat_staleness_ms=STALENESS_MS)
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=_common.repo_env())


async def start_worker(dsn: str) -> tuple[asyncio.subprocess.Process, asyncio.StreamReader]:
    process = await asyncio.create_subprocess_exec(
        sys.executable, str(WORKER_SCRIPT), dsn, "--kind", f"{KIND}:{QUEUE}",
        "--behaviour", "hang", "--role", "auto", "--mute-maintenance",
        "--heartbeat-interval-ms", str(WORKER_HEARTBEAT_MS),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )
    return process, process.stdout


async def wait_for_line(stream: asyncio.StreamReader, prefix: str, timeout: float = 60) -> str:
    async def read() -> str:
        while True:
            line = (await stream.readline()).decode()
            if not line:
                raise RuntimeError(f"worker exited before {prefix!r}")
            if line.startswith(prefix):
                return line

    return await asyncio.wait_for(read(), timeout)


async def one_run(server: str, template: str, leader: str) -> dict[str, float]:
    dsn = await _common.copy_database(server, template, "awa_trio_bench_qsr")
    leader_process = worker = None
    try:
        conn = await asyncpg.connect(dsn)
        leader_process = start_leader(leader, dsn)
        await _common.wait_until(conn, _common.LOCK_HELD_SQL, timeout=30)
        worker, stdout = await start_worker(dsn)
        await wait_for_line(stdout, "READY")
        job_id = await conn.fetchval(INSERT_SQL, KIND, QUEUE)
        await wait_for_line(stdout, f"START {job_id} ")
        await asyncio.sleep(1.0)  # a few heartbeats
        run_lease = await conn.fetchval(
            "SELECT max(run_lease) FROM awa.lease_claims WHERE job_id = $1", job_id)
        worker.send_signal(signal.SIGKILL)
        killed = time.perf_counter()
        killed_at = await conn.fetchval("SELECT clock_timestamp()")
        seen = await conn.fetchval(
            "SELECT max(heartbeat_at) FROM awa.attempt_state WHERE job_id = $1", job_id)
        claimed = await conn.fetchval(
            "SELECT max(claimed_at) FROM awa.lease_claims WHERE job_id = $1", job_id)
        await worker.wait()
        rescued = await _common.wait_until(conn, RESCUED_SQL, job_id, run_lease)
        await conn.close()
        return {
            "latency": rescued - killed,
            # Staleness counts from the last heartbeat, else from the claim.
            "heartbeat_age_at_kill": (killed_at - (seen or claimed)).total_seconds(),
        }
    finally:
        if worker is not None and worker.returncode is None:
            worker.kill()
            await worker.wait()
        _common.stop(leader_process)
        await _common.drop_database(server, dsn)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--server", default=_common.SERVER)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()

    template = await _common.make_template(args.server, "awa_trio_bench_qsr", queue_storage=True)
    try:
        results: dict[str, list[dict[str, float]]] = {"awa-pg": [], "awa_trio": []}
        for _ in range(args.runs):  # interleaved, so machine load hits both alike
            for leader in results:
                results[leader].append(await one_run(args.server, template, leader))
    finally:
        await _common.drop_database(args.server, template)

    print(f"rescue latency after SIGKILL, queue storage: staleness {STALENESS_MS / 1000:g} s, "
          f"rescue tick {RESCUE_INTERVAL_MS / 1000:g} s, worker heartbeat "
          f"{WORKER_HEARTBEAT_MS} ms, {args.runs} runs each")
    print(f"{'leader':<16}{'median s':>10}{'min s':>8}{'max s':>8}{'target s':>10}"
          f"{'last sign of life before kill (median) s':>44}")
    medians = {}
    for leader, runs in results.items():
        latencies = [run["latency"] for run in runs]
        ages = [run["heartbeat_age_at_kill"] for run in runs]
        medians[leader] = statistics.median(latencies)
        target = f"{TARGET:.1f}" if leader == "awa_trio" else ""
        print(f"{leader:<16}{medians[leader]:>10.2f}{min(latencies):>8.2f}{max(latencies):>8.2f}"
              f"{target:>10}{statistics.median(ages):>44.2f}")
    print(f"awa_trio / awa-pg median: {medians['awa_trio'] / medians['awa-pg']:.2f}; "
          f"awa_trio max within target: {max(r['latency'] for r in results['awa_trio']) <= TARGET}")


if __name__ == "__main__":
    asyncio.run(main())
