"""Sustained load on queue storage: awa-pg workers complete and fail jobs at a
steady rate while one leader rotates and prunes the rings; the same run with
upstream's leader (an awa-pg 0.6.1 runtime) and with awa_trio.

Reports, per leader: the longest and median stall of each ring (time between
generation changes, sampled at 20 Hz), rotations, the most done rows seen,
and whether every job ended where it should (completed or failed, none lost).

    python bench/bench_qs_sustained.py [--rate 250] [--seconds 60] [--server postgresql://postgres@localhost:5432]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

import _common
import asyncpg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from support.qs_load import (
    EXACT_TERMINAL_SQL,
    JOB_STATES_SQL,
    LOAD_WORKER_SCRIPT,
    RING_SAMPLE_SQL,
    RINGS,
    RingSamples,
)

QUEUE = "load"
RING_INTERVALS_MS = {"queue": 200, "lease": 100, "claim": 200}
FAIL_EVERY = 10  # one job in ten is kind "boom" (max_attempts 1: fails terminally)


async def start_leader(kind: str, dsn: str) -> asyncio.subprocess.Process:
    if kind == "awa-pg":
        leader = await _common.start_process(
            sys.executable, str(LOAD_WORKER_SCRIPT), dsn, "--lead", "--workers", "16",
            "--queue-rotate-ms", str(RING_INTERVALS_MS["queue"]),
            "--lease-rotate-ms", str(RING_INTERVALS_MS["lease"]),
            "--claim-rotate-ms", str(RING_INTERVALS_MS["claim"]),
        )
        await _common.wait_for_output(leader, "READY")
    else:
        leader = await _common.start_process(
            *_common.awa_trio_argv(dsn),
            "--queue-rotate-interval", f"{RING_INTERVALS_MS['queue']}ms",
            "--lease-rotate-interval", f"{RING_INTERVALS_MS['lease']}ms",
            "--claim-rotate-interval", f"{RING_INTERVALS_MS['claim']}ms",
            "--leader-check-interval", "1s",
        )
        await _common.wait_for_output(leader, "elected maintenance leader")
    return leader


async def produce(dsn: str, rate: int, seconds: float) -> tuple[int, int]:
    import awa

    client = awa.AsyncClient(dsn)
    ok = boom = 0
    batch = max(1, rate // 10)
    started = time.monotonic()
    tick = 0
    while time.monotonic() - started < seconds:
        fails = leased = batch // FAIL_EVERY
        await client.insert_many_copy([{"n": i} for i in range(batch - fails - leased)], kind="ok",
                                      queue=QUEUE)
        if leased:  # through a leases row, so the lease ring turns over real rows
            await client.insert_many_copy([{"n": i} for i in range(leased)], kind="leased", queue=QUEUE)
        if fails:
            await client.insert_many_copy([{"n": i} for i in range(fails)], kind="boom",
                                          queue=QUEUE, max_attempts=1)
        ok += batch - fails
        boom += fails
        tick += 1
        await asyncio.sleep(max(0.0, started + tick * 0.1 - time.monotonic()))
    return ok, boom


async def sample(dsn: str, samples: RingSamples, stop_event: asyncio.Event) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        while not stop_event.is_set():
            samples.add(time.monotonic(), await conn.fetchrow(RING_SAMPLE_SQL))
            await asyncio.sleep(0.05)
    finally:
        await conn.close()


async def settle(dsn: str, timeout: float = 120) -> dict[str, int]:
    conn = await asyncpg.connect(dsn)
    try:
        deadline = time.monotonic() + timeout
        while True:
            states = {row["state"]: row["n"] for row in await conn.fetch(JOB_STATES_SQL, QUEUE)}
            pending = sum(states.get(s, 0) for s in ("available", "running", "scheduled", "retryable"))
            if not pending or time.monotonic() > deadline:
                counts = await queue_counts(dsn)
                counts["terminal_exact"] = int(await conn.fetchval(EXACT_TERMINAL_SQL, QUEUE))
                return {"states": states, "counts": counts}
            await asyncio.sleep(0.5)
    finally:
        await conn.close()


async def queue_counts(dsn: str) -> dict[str, int]:
    """awa-pg's own counts (exact: live counts plus pending terminal deltas);
    pruned completed rows are gone from awa.jobs but still counted here."""
    import awa

    for stat in await awa.AsyncClient(dsn).queue_stats():
        if stat.queue == QUEUE:
            return {"completed": stat.completed_last_hour, "failed": stat.failed,
                    "available": stat.available, "running": stat.running,
                    "retryable": stat.retryable, "scheduled": stat.scheduled}
    return {}


async def run_one(kind: str, server: str, rate: int, seconds: float) -> dict:
    dsn = await _common.create_database(server, _common.scratch_name("awa_trio_bench_qs"), queue_storage=True)
    processes = []
    drains = []  # referenced so the event loop does not drop them mid-run
    try:
        leader = await start_leader(kind, dsn)
        processes.append(leader)
        drains.append(asyncio.ensure_future(_common.drain_output(leader)))
        for _ in range(2):
            worker = await _common.start_process(sys.executable, str(LOAD_WORKER_SCRIPT), dsn, "--workers", "16")
            await _common.wait_for_output(worker, "READY")
            drains.append(asyncio.ensure_future(_common.drain_output(worker)))
            processes.append(worker)
        samples = RingSamples()
        stop_event = asyncio.Event()
        sampler = asyncio.ensure_future(sample(dsn, samples, stop_event))
        ok, boom = await produce(dsn, rate, seconds)
        stop_event.set()  # stalls are measured while the load runs
        await sampler
        result = await settle(dsn)
        return {"leader": kind, "ok": ok, "boom": boom, "samples": samples, **result}
    finally:
        for process in processes:
            await _common.stop_process(process)
        await _common.drop_database(server, dsn)


def report(results: list[dict], rate: int, seconds: float) -> None:
    print(f"\nsustained load: {rate} jobs/s for {seconds:g} s (1 in {FAIL_EVERY} fails terminally), "
          f"ring intervals {RING_INTERVALS_MS['queue']}/{RING_INTERVALS_MS['lease']}/"
          f"{RING_INTERVALS_MS['claim']} ms\n")
    print("| measure | " + " | ".join(r["leader"] for r in results) + " |")
    print("| --- |" + " --- |" * len(results))
    for ring in RINGS:
        print(f"| {ring} ring: longest stall | "
              + " | ".join(f"{r['samples'].longest_stall(ring):.2f} s" for r in results) + " |")
        print(f"| {ring} ring: median stall | "
              + " | ".join(f"{r['samples'].median_stall(ring):.2f} s" for r in results) + " |")
        print(f"| {ring} ring: rotations | "
              + " | ".join(str(r["samples"].rotations(ring)) for r in results) + " |")
    print("| most done rows seen | " + " | ".join(str(max(r["samples"].done_rows, default=0)) for r in results) + " |")
    for r in results:
        states, counts = r["states"], r["counts"]
        lost = r["ok"] + r["boom"] - counts.get("terminal_exact", 0)
        print(f"\n{r['leader']}: inserted {r['ok']} ok + {r['boom']} boom; states {states}; "
              f"counts {r['counts']}; not accounted for: {lost}")


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rate", type=int, default=250)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--server", default=_common.env_server())
    parser.add_argument("--leaders", default="awa-pg,awa_trio")
    args = parser.parse_args()
    results = [await run_one(kind, args.server, args.rate, args.seconds)
               for kind in args.leaders.split(",")]
    report(results, args.rate, args.seconds)


if __name__ == "__main__":
    asyncio.run(main())
