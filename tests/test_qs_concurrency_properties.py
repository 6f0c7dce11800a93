"""Concurrent programs on queue storage: exactly-once by id after each one.

``test_qs_properties`` interleaves single steps one at a time. Here
Hypothesis draws one program per track and the tracks run at once, each on
its own connections, so their statements overlap at the server:

* two producer tracks (awa-pg's client): COPY batches, single inserts, jobs
  scheduled a moment ahead (so promotion of scheduled rows races them), and
  open transactions that insert, hold the lane lock for a while, insert more
  and commit (the shape that lost jobs in issue 15);
* a promotion track (scheduled and retryable rows);
* a queue-ring track: rotate, prune, whole ticks;
* a track for the other rings and the rollup: lease and claim ring ticks,
  terminal-count rollup.

A real awa-pg worker claims, completes and retries throughout (kinds ``ok``,
``retry``: RetryAfter on attempt 1, ``fail``: two failed attempts), writing
each run to a ledger. After every program the lane-order invariant holds on
the stored rows, and once drained every inserted job ran each expected
attempt exactly once and nothing is left live. The database, the worker and
the ledger persist across examples, so later programs start from whatever
ring state earlier ones left.
"""

from __future__ import annotations

import datetime as dt
import functools
import random
import subprocess
import sys
import time

import pytest
import trio
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from support.contexts import make_context
from support.lane_order import lane_order_violations
from support.ledger import (
    CREATE_LEDGER_SQL,
    LIVE_JOBS_SQL,
    LIVE_STATES,
    RUN_COUNT_SQL,
    RUNS_SQL,
    Inserted,
    Mix,
    insert_batch,
    judge,
    worker_command,
)
from test_qs_properties import HOLD_LOCK_SCRIPT

from awa_trio.db import open_database
from awa_trio.engines.queue_storage import (
    promote,
    rotate_claim,
    rotate_lease,
    rotate_queue,
    terminal_count_rollup,
)
from awa_trio.leadership import LOCK_KEY

QUEUES = ["cc_a", "cc_b"]
DAY = 86400.0
MIX = Mix(retry=0.2, fail=0.05)

queue = st.sampled_from(QUEUES)
pause = st.tuples(st.just("sleep"), st.sampled_from([0.0, 0.02, 0.1]))
producer_step = st.one_of(
    st.tuples(st.just("copy"), queue, st.integers(1, 40)),
    st.tuples(st.just("single"), queue, st.integers(1, 3)),
    st.tuples(st.just("scheduled"), queue, st.integers(1, 20), st.sampled_from([0.05, 0.2])),
    st.tuples(st.just("open"), queue, st.integers(1, 5), st.sampled_from([0.05, 0.2, 0.5]), st.integers(1, 10)),
    pause,
)
promote_step = st.one_of(st.tuples(st.just("promote")), pause)
queue_ring_step = st.one_of(st.tuples(st.sampled_from(["rotate", "prune", "tick"])), pause)
other_step = st.one_of(st.tuples(st.sampled_from(["lease", "claim", "rollup"])), pause)
programs = st.fixed_dictionaries({
    "producer_1": st.lists(producer_step, min_size=1, max_size=8),
    "producer_2": st.lists(producer_step, min_size=1, max_size=8),
    "promote": st.lists(promote_step, min_size=1, max_size=10),
    "queue_ring": st.lists(queue_ring_step, min_size=1, max_size=10),
    "others": st.lists(other_step, min_size=0, max_size=6),
})


@pytest.fixture
def ledger_fleet(qs_database_url):
    """The leader lock held by a bystander (the worker never runs
    maintenance), the ledger table, and one awa-pg ledger worker."""
    processes = []
    try:
        holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK_SCRIPT, qs_database_url, str(LOCK_KEY)],
                                  stdout=subprocess.PIPE, text=True)
        processes.append(holder)
        assert holder.stdout.readline().strip() == "LOCKED"
        trio.run(create_ledger, qs_database_url)
        worker = subprocess.Popen(worker_command(qs_database_url, QUEUES, workers=8),
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


async def create_ledger(dsn: str) -> None:
    async with open_database(dsn) as db:
        await db.execute(CREATE_LEDGER_SQL)


#: Every job inserted so far, per test database (it outlives single examples).
INSERTED: dict[str, Inserted] = {}


@settings(max_examples=8, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(program=programs, seed=st.integers(0, 2**16))
# Issue 15's interleaving: due rows in the lane (created by the first insert)
# of a producer whose open
# transaction holds the lane lock; promotion queues behind it, the queue ring
# rotates, the producer adds rows to the new slot and commits.
@example(
    program={
        "producer_1": [("single", "cc_a", 1), ("scheduled", "cc_a", 10, 0.05), ("sleep", 0.1),
                       ("open", "cc_a", 1, 0.5, 10)],
        "producer_2": [("sleep", 0.0)],
        "promote": [("sleep", 0.1), ("sleep", 0.1), ("promote",)],
        "queue_ring": [("sleep", 0.1), ("sleep", 0.1), ("sleep", 0.1), ("rotate",)],
        "others": [],
    },
    seed=15,
)
def test_concurrent_programs_run_every_job_exactly_once(qs_database_url, qs_awa_client, ledger_fleet,
                                                        program, seed):
    inserted = INSERTED.setdefault(qs_database_url, Inserted())
    trio.run(run_program, qs_database_url, qs_awa_client, inserted, program, random.Random(seed))


async def run_program(dsn, client, inserted: Inserted, program, rng: random.Random) -> None:
    async with open_database(dsn, pool_size=12) as db:
        ctx = await make_context(db, failed_retention=DAY, queue_rotate_interval=0.05,
                                 lease_rotate_interval=0.05, claim_rotate_interval=0.05)
        async with trio.open_nursery() as nursery:
            for track in ("producer_1", "producer_2"):
                nursery.start_soon(run_producer, client, inserted, program[track], rng)
            nursery.start_soon(run_maintenance, ctx, program["promote"])
            nursery.start_soon(run_maintenance, ctx, program["queue_ring"])
            nursery.start_soon(run_maintenance, ctx, program["others"])
        assert await lane_order_violations(db) == []
        await drain(ctx, db, inserted)
        assert await lane_order_violations(db) == []
        verdict = judge(inserted, await db.fetch(RUNS_SQL))
        assert verdict.exactly_once, verdict.describe()


async def run_producer(client, inserted: Inserted, steps, rng: random.Random) -> None:
    for step in steps:
        name = step[0]
        if name in ("copy", "single"):
            _, queue, count = step
            await trio.to_thread.run_sync(functools.partial(
                insert_batch, client, inserted, queue=queue, size=count, mix=MIX, rng=rng, single=name == "single"))
        elif name == "scheduled":
            _, queue, count, ahead = step
            run_at = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=ahead)
            jobs = await trio.to_thread.run_sync(functools.partial(
                client.insert_many_copy, [{"n": n} for n in range(count)], kind="retry", queue=queue,
                run_at=run_at))
            inserted.add(jobs, "retry")
        elif name == "open":
            _, queue, first, hold, more = step
            await open_transaction(client, inserted, queue, first, hold, more)
        elif name == "sleep":
            await trio.sleep(step[1])


async def open_transaction(client, inserted: Inserted, queue: str, first: int, hold: float, more: int) -> None:
    """awa-pg's transactional producer: some rows, a pause holding the lane
    lock (maintenance queues behind it, rings may rotate), more rows, commit."""
    tx = client.transaction()
    jobs = await trio.to_thread.run_sync(
        lambda: [tx.insert({"n": n}, kind="ok", queue=queue) for n in range(first)])
    await trio.sleep(hold)
    jobs += await trio.to_thread.run_sync(
        lambda: [tx.insert({"n": n}, kind="ok", queue=queue) for n in range(more)])
    await trio.to_thread.run_sync(tx.commit)
    inserted.add(jobs, "ok")


MAINTENANCE = {
    "promote": promote.run_once,
    "rotate": rotate_queue.rotate,
    "prune": rotate_queue.prune,
    "tick": rotate_queue.run_once,
    "lease": rotate_lease.run_once,
    "claim": rotate_claim.run_once,
    "rollup": terminal_count_rollup.run_once,
}


async def run_maintenance(ctx, steps) -> None:
    for step in steps:
        if step[0] == "sleep":
            await trio.sleep(step[1])
        else:
            await MAINTENANCE[step[0]](ctx)


async def drain(ctx, db, inserted: Inserted) -> None:
    """Keep promoting and turning the rings (as a leader would) until every
    expected run is in the ledger and nothing is live."""
    expected = inserted.expected_total()
    with trio.fail_after(90):
        while True:
            await promote.run_once(ctx)
            await rotate_queue.run_once(ctx)
            await rotate_lease.run_once(ctx)
            await rotate_claim.run_once(ctx)
            if (await db.fetchval(RUN_COUNT_SQL) >= expected
                    and not await db.fetch(LIVE_JOBS_SQL, list(LIVE_STATES))):
                return
            await trio.sleep(0.1)
