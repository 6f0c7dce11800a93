"""Sustained load on queue storage with awa_trio leading: real awa-pg workers
complete and fail thousands of jobs while the rings rotate and prune at short
intervals. Every ring must rotate and prune, done rows stay bounded, the
counts afterwards equal the true numbers, and no job is lost.

(The stall figures beside upstream's are in bench/bench_qs_sustained.py.)"""

from __future__ import annotations

import subprocess
import sys

import trio
from support.helpers import metric_points
from support.qs_load import JOB_STATES_SQL, LOAD_WORKER_SCRIPT, RING_SAMPLE_SQL, RINGS, RingSamples
from support.qs_rings import exact_terminal_total

from awa_trio import MaintenanceConfig, MaintenanceService
from awa_trio.metrics import MAINTENANCE_PRUNE_ATTEMPTS

QUEUE = "load"
RATE_PER_TICK = 25  # every 100 ms: 250 jobs/s
SECONDS = 12
BOOM_EVERY = 10

CONFIG = MaintenanceConfig(
    leader_election_interval=0.5,
    leader_check_interval=1,
    queue_rotate_interval=0.2,
    lease_rotate_interval=0.1,
    claim_rotate_interval=0.2,
    promote_interval=0.1,
    terminal_count_rollup_interval=1,
)


async def start_worker(nursery, dsn: str) -> trio.Process:
    process = await trio.lowlevel.open_process(
        [sys.executable, str(LOAD_WORKER_SCRIPT), dsn, "--workers", "16"],
        stdout=subprocess.PIPE,
    )
    ready = b""
    with trio.fail_after(60):
        while b"READY" not in ready:
            chunk = await process.stdout.receive_some(4096)
            assert chunk, "load worker exited before READY"
            ready += chunk

    async def drain():
        while await process.stdout.receive_some(4096):
            pass

    nursery.start_soon(drain)
    return process


async def produce(client) -> tuple[int, int]:
    ok = boom = 0
    ticks = int(SECONDS * 10)
    start = trio.current_time()
    for tick in range(ticks):
        fails = RATE_PER_TICK // BOOM_EVERY
        leased = RATE_PER_TICK // BOOM_EVERY
        await trio.to_thread.run_sync(lambda fails=fails, leased=leased: client.insert_many_copy(
            [{"n": n} for n in range(RATE_PER_TICK - fails - leased)], kind="ok", queue=QUEUE))
        await trio.to_thread.run_sync(lambda leased=leased: client.insert_many_copy(
            [{"n": n} for n in range(leased)], kind="leased", queue=QUEUE))
        await trio.to_thread.run_sync(lambda fails=fails: client.insert_many_copy(
            [{"n": n} for n in range(fails)], kind="boom", queue=QUEUE, max_attempts=1))
        ok += RATE_PER_TICK - fails
        boom += fails
        await trio.sleep_until(start + (tick + 1) * 0.1)
    return ok, boom


def pruned_rings(metric_reader) -> set[str]:
    return {
        attrs["awa.ring"]
        for attrs, point in metric_points(metric_reader, MAINTENANCE_PRUNE_ATTEMPTS)
        if attrs["awa.ring.outcome"] == "pruned" and point.value > 0
    }


async def test_sustained_load_rotates_prunes_and_loses_nothing(
    qs_database_url, qs_db, qs_awa_client, meter_provider, metric_reader
):
    service = MaintenanceService(qs_database_url, CONFIG, meter_provider=meter_provider)
    samples = RingSamples()
    workers = []
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        with trio.fail_after(20):
            await service.wait_until_leader()
        for _ in range(2):
            workers.append(await start_worker(nursery, qs_database_url))

        async def sample():
            while True:
                samples.add(trio.current_time(), await qs_db.fetchrow(RING_SAMPLE_SQL))
                await trio.sleep(0.05)

        sampler = trio.CancelScope()

        async def run_sampler():
            with sampler:
                await sample()

        nursery.start_soon(run_sampler)
        ok, boom = await produce(qs_awa_client)
        sampler.cancel()

        with trio.fail_after(90):
            while True:
                states = {r["state"]: r["n"] for r in await qs_db.fetch(JOB_STATES_SQL, QUEUE)}
                if not any(states.get(s) for s in ("available", "running", "scheduled", "retryable")):
                    break
                await trio.sleep(0.5)
        # A few more laps so every ring prunes what the load left behind. On a
        # loaded machine a ring's prune can be Blocked (10 ms lock timeout)
        # through the whole load and back off for up to 32 ticks: wait for it.
        await trio.sleep(3)
        with trio.move_on_after(30):
            while pruned_rings(metric_reader) != set(RINGS):
                await trio.sleep(0.2)
        [stat] = [s for s in await trio.to_thread.run_sync(qs_awa_client.queue_stats)
                  if s.queue == QUEUE]
        terminal = await exact_terminal_total(qs_db, QUEUE)
        rings_pruned = pruned_rings(metric_reader)
        for process in workers:
            process.terminate()
        service.stop()

    # About 60 ticks of the queue and claim rings in the load window; busy
    # slots skip some (more on a loaded machine), but every ring keeps moving.
    for ring in RINGS:
        assert samples.rotations(ring) >= 5, (ring, samples.rotations(ring))
    assert rings_pruned == set(RINGS)
    # Done rows hold the failed jobs (kept for failed_retention) and at most
    # a few laps of completions: nothing grows with the number completed.
    assert max(samples.done_rows) < boom + 20 * RATE_PER_TICK * 10, max(samples.done_rows)
    # Exact counts (rollups of pruned slots + live counters + pending deltas +
    # receipt completions) say every job ended, none twice.
    assert terminal == ok + boom
    assert stat.failed == boom
    assert (stat.available, stat.running, stat.retryable, stat.scheduled) == (0, 0, 0, 0)
    failed_rows = await qs_db.fetchval("SELECT count(*) FROM awa.jobs WHERE queue = $1 AND state = 'failed'", QUEUE)
    assert failed_rows == boom, "a failed job inside the retention floor was pruned away"
