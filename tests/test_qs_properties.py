"""Random interleavings of real work and the queue ring, on the real schema.

Two real awa-pg 0.6.1 workers (``--role auto``) run for the whole test: one
completes every job of queue ``prop_ok``, one fails every job of
``prop_fail`` (max_attempts 1, so each becomes a failed done row). Hypothesis
draws programs of enqueue (awa-pg insert), pause/resume of the queues (which
decides when the workers may claim), rotate, prune, a whole tick and short
pauses, so claims, completions and failures land between ring steps. The
database and the workers persist across examples, so later examples start
from whatever ring state, parked or mid-lap, earlier ones left.

Invariants:
* no failed row is ever lost (failed retention is a day, so every failed
  job stays visible to awa-pg), checked after every prune;
* once drained, every job is terminal, nothing is left available or running,
  and upstream's exact terminal count equals the number of jobs inserted per
  queue (a job truncated with a slot it still needed would be missing);
* nothing was folded into the failed rollup (nothing left the floor).

Examples run one at a time, each in its own Trio run (Hypothesis drives a
plain function).
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import trio
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from support.awa_pg import WORKER_SCRIPT
from support.contexts import make_context
from support.qs_rings import exact_terminal_total, job_states, pruned_rollups

from awa_trio.db import open_database
from awa_trio.engines.queue_storage import rotate_queue
from awa_trio.leadership import LOCK_KEY

DAY = 86400.0
QUEUES = {"ok": "prop_ok", "fail": "prop_fail"}
KINDS = {"ok": "prop_complete", "fail": "prop_failing"}

HOLD_LOCK_SCRIPT = (
    "import asyncio, sys, asyncpg\n"
    "async def main(dsn, key):\n"
    "    conn = await asyncpg.connect(dsn)\n"
    "    await conn.execute('SELECT pg_advisory_lock($1)', key)\n"
    "    print('LOCKED', flush=True)\n"
    "    await asyncio.sleep(3600)\n"
    "asyncio.run(main(sys.argv[1], int(sys.argv[2])))\n"
)

# Ring steps drawn more often than the rest, so slots are sealed and pruned
# with work in them; "lap" is a whole turn of ticks (rotate, then prune).
enqueue_step = st.tuples(st.just("enqueue"), st.sampled_from(["ok", "fail"]), st.integers(1, 4))
ring_step = st.tuples(st.sampled_from(["rotate", "prune", "tick"]))
steps = st.one_of(
    enqueue_step, enqueue_step,
    st.tuples(st.just("pause")), st.tuples(st.just("resume")),
    ring_step, ring_step, ring_step,
    st.tuples(st.just("lap")),
    st.tuples(st.just("sleep"), st.sampled_from([0.05, 0.3])),
)


@pytest.fixture
def awa_fleet(qs_database_url):
    """The leader lock held by a bystander process (so the workers never run
    maintenance), then the two workers; all killed at the end."""
    processes = []
    try:
        holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK_SCRIPT, qs_database_url, str(LOCK_KEY)],
                                  stdout=subprocess.PIPE, text=True)
        processes.append(holder)
        assert holder.stdout.readline().strip() == "LOCKED"
        for key, behaviour in (("ok", "complete"), ("fail", "fail")):
            worker = subprocess.Popen(
                [sys.executable, str(WORKER_SCRIPT), qs_database_url,
                 "--kind", f"{KINDS[key]}:{QUEUES[key]}", "--behaviour", behaviour, "--role", "auto"],
                stdout=subprocess.PIPE, text=True)
            processes.append(worker)
            deadline = time.monotonic() + 60
            while worker.stdout.readline().strip() != "READY":
                assert time.monotonic() < deadline and worker.poll() is None, "worker did not start"
        yield
    finally:
        for process in processes:
            process.kill()
            process.wait(timeout=10)


class Ledger:
    """Every job inserted so far, across examples."""

    def __init__(self) -> None:
        self.ids: dict[str, list[int]] = {"ok": [], "fail": []}


#: One ledger per test database (the database outlives single examples).
LEDGERS: dict[str, Ledger] = {}


@settings(max_examples=10, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(program=st.lists(steps, min_size=3, max_size=14))
# Work enqueued behind a paused queue, then its slot sealed and pruned.
@example(program=[("pause",), ("enqueue", "fail", 2), ("enqueue", "ok", 2), ("rotate",), ("prune",),
                  ("tick",), ("resume",), ("sleep", 0.3), ("tick",), ("prune",)])
def test_random_interleavings_keep_every_job_and_exact_counts(
        qs_database_url, qs_awa_client, awa_fleet, program):
    ledger = LEDGERS.setdefault(qs_database_url, Ledger())
    trio.run(run_program, qs_database_url, qs_awa_client, ledger, program)


async def run_program(dsn, client, ledger: Ledger, program) -> None:
    async with open_database(dsn) as db:
        ctx = await make_context(db, failed_retention=DAY, queue_rotate_interval=0.05)
        for step in program:
            name = step[0]
            if name == "enqueue":
                _, key, count = step
                ledger.ids[key] += await trio.to_thread.run_sync(
                    lambda key=key, count=count: [
                        client.insert({"n": n}, kind=KINDS[key], queue=QUEUES[key], max_attempts=1).id
                        for n in range(count)])
            elif name == "pause":
                await trio.to_thread.run_sync(
                    lambda: [client.pause_queue(queue) for queue in QUEUES.values()])
            elif name == "resume":
                await resume(client)
            elif name == "rotate":
                await rotate_queue.rotate(ctx)
            elif name == "prune":
                event(f"prune {(await rotate_queue.prune(ctx)).outcome.value}")
                await assert_no_failed_job_lost(client, ledger)
            elif name == "tick":
                tick = await rotate_queue.run_once(ctx)
                event(f"prune {tick.prune.outcome.value}" if tick.prune else "prune backed off")
                await assert_no_failed_job_lost(client, ledger)
            elif name == "lap":
                slot_count = await db.fetchval("SELECT slot_count FROM awa.queue_ring_state")
                for _ in range(slot_count):
                    tick = await rotate_queue.run_once(ctx)
                    event(f"prune {tick.prune.outcome.value}" if tick.prune else "prune backed off")
                await assert_no_failed_job_lost(client, ledger)
            elif name == "sleep":
                await trio.sleep(step[1])

        await resume(client)
        await drain(client, ledger)
        for key, queue in QUEUES.items():
            assert await exact_terminal_total(db, queue) == len(ledger.ids[key]), key
        assert (await pruned_rollups(db, QUEUES["fail"]))[1] == 0
        failed_rows = await db.fetchval("SELECT count(*) FROM awa.done_entries WHERE state = 'failed'")
        assert failed_rows == len(ledger.ids["fail"])


async def resume(client) -> None:
    await trio.to_thread.run_sync(lambda: [client.resume_queue(queue) for queue in QUEUES.values()])


async def assert_no_failed_job_lost(client, ledger: Ledger) -> None:
    """A fail-queue job is never gone: it is pending, running or failed."""
    states = await job_states(client, ledger.ids["fail"])
    assert sorted(states) == sorted(ledger.ids["fail"]), "a failed or pending job vanished"
    assert set(states.values()) <= {"available", "running", "failed"}, states


async def drain(client, ledger: Ledger) -> None:
    """Wait until every job has run: failed jobs show as failed, completed
    ones as completed or pruned, and no queue has anything left to do."""
    with trio.fail_after(60):
        while True:
            failing = await job_states(client, ledger.ids["fail"])
            completing = await job_states(client, ledger.ids["ok"])
            stats = {s.queue: s for s in await trio.to_thread.run_sync(client.queue_stats)}
            idle = all(stats[q].available == 0 and stats[q].running == 0
                       for q in QUEUES.values() if q in stats)
            if (idle and set(failing.values()) <= {"failed"} and len(failing) == len(ledger.ids["fail"])
                    and set(completing.values()) <= {"completed"}):
                return
            await trio.sleep(0.1)
