"""A maintenance write that waits on a producer's lane lock must file its rows
under the ring slot that is current once it holds the lock, not the one it
saw before the wait (issue 15).

The interleaving is driven step by step with separate connections: awa-pg's
own producer holds a lane lock in an open transaction, our statement queues
behind it, the queue ring rotates, the producer adds rows to the new slot and
commits. Before the fix the promoted rows went under the old slot with
higher lane positions than the producer's rows in the new one, and the
claimer stepped over the producer's rows for good. The test asserts the
invariant on the stored rows, then lets a real awa-pg worker drain the queue
and compares its ledger with what was inserted, by id.
"""

from __future__ import annotations

import collections
import subprocess

import trio
from support.lane_order import lane_order_violations
from support.ledger import CREATE_LEDGER_SQL, RUNS_SQL, worker_command
from support.qs_jobs import insert_one_scheduled, make_retryable
from support.qs_rings import ring_state

from awa_trio.db import Connection
from awa_trio.engines.queue_storage import batch_operations, promote
from awa_trio.engines.queue_storage.queue_ring import rotate_sql

QUEUE = "lane_order"

# A backend of this database other than ours, waiting on an advisory lock.
WAITING_ON_LANE_LOCK_SQL = """
    SELECT count(*) FROM pg_stat_activity
    WHERE datname = current_database() AND pid <> pg_backend_pid()
      AND wait_event_type = 'Lock' AND wait_event = 'advisory'
"""


async def wait_for_lane_lock_waiter(db) -> None:
    with trio.fail_after(10):
        while not await db.fetchval(WAITING_ON_LANE_LOCK_SQL):
            await trio.sleep(0.01)


class OpenProducer:
    """An awa-pg transaction (its Rust producer path), kept open between steps."""

    def __init__(self, client):
        self.tx = client.transaction()
        self.ids: list[int] = []

    async def insert(self, count: int) -> None:
        def run() -> list[int]:
            return [self.tx.insert({"n": n}, kind="ok", queue=QUEUE).id for n in range(count)]

        self.ids += await trio.to_thread.run_sync(run)

    async def commit(self) -> None:
        await trio.to_thread.run_sync(self.tx.commit)


async def insert_available(client, queue: str) -> int:
    job = await trio.to_thread.run_sync(lambda: client.insert({"n": 0}, kind="ok", queue=queue))
    return job.id


async def drain_with_ledger(dsn: str, db, expected: collections.Counter) -> collections.Counter:
    """Run a real awa-pg worker until the ledger holds every expected run (or
    nothing has run for a while), and return what ran."""
    await db.execute(CREATE_LEDGER_SQL)
    process = await trio.lowlevel.open_process(worker_command(dsn, [QUEUE], workers=4),
                                               stdout=subprocess.DEVNULL)
    try:
        ran: collections.Counter = collections.Counter()
        with trio.move_on_after(20):
            while not all(ran[key] >= count for key, count in expected.items()):
                await trio.sleep(0.2)
                ran = collections.Counter(
                    (row["job_id"], row["attempt"]) for row in await db.fetch(RUNS_SQL))
        return ran
    finally:
        process.terminate()
        with trio.move_on_after(10):
            await process.wait()
        if process.returncode is None:
            process.kill()


async def test_promotion_behind_a_producer_files_under_the_slot_current_after_the_wait(
    qs_ctx, qs_db, qs_database_url, qs_awa_client
):
    # The lane (queue, priority 2, shard 0) exists, and a due retryable job waits in it.
    first = await insert_available(qs_awa_client, QUEUE)
    retried = await insert_one_scheduled(qs_awa_client, {"n": -1}, kind="ok", queue=QUEUE)
    await make_retryable(qs_db, [retried])

    producer = OpenProducer(qs_awa_client)
    await producer.insert(1)                      # holds the lane lock until commit
    async with trio.open_nursery() as nursery:
        nursery.start_soon(promote.run_once, qs_ctx)
        await wait_for_lane_lock_waiter(qs_db)    # our promotion queues behind it
        before = await ring_state(qs_db)
        [rotated] = await qs_db.fetch(rotate_sql("awa"))
        assert rotated["moved"], dict(rotated)
        await producer.insert(20)                 # filed under the new slot
        await producer.commit()
    assert await ring_state(qs_db) != before

    # The promoted job went in after the producer's rows, so under the new slot.
    assert await lane_order_violations(qs_db) == []
    promoted = await qs_db.fetchrow(
        "SELECT ready_generation, lane_seq FROM awa.ready_entries WHERE job_id = $1", retried)
    newest = await qs_db.fetchrow(
        "SELECT max(ready_generation) AS generation, max(lane_seq) AS seq FROM awa.ready_entries "
        "WHERE job_id = ANY($1::bigint[])", producer.ids)
    assert promoted["lane_seq"] > newest["seq"]
    assert promoted["ready_generation"] == newest["generation"]

    # Every job runs exactly once: the first, the producer's 21 (attempt 1), the retry (attempt 2).
    expected = collections.Counter({(job_id, 1): 1 for job_id in [first, *producer.ids]})
    expected[(retried, 2)] = 1
    ran = await drain_with_ledger(qs_database_url, qs_db, expected)
    assert ran == expected, {"lost": sorted(set(expected) - set(ran)), "extra": sorted(set(ran) - set(expected))}


async def test_move_queue_behind_a_producer_files_under_the_slot_current_after_the_wait(
    qs_ctx, qs_db, qs_database_url, qs_awa_client, monkeypatch
):
    # An available job in another queue, moved by awa-pg's batch operation
    # into the producer's lane. The re-entry creates the target lane first
    # (whose trigger waits for, then releases, the lane lock), so the
    # producer is let in just before the statement that reserves the
    # position: that statement then waits for the producer.
    first = await insert_available(qs_awa_client, QUEUE)
    moved = await insert_available(qs_awa_client, "elsewhere")
    await trio.to_thread.run_sync(lambda: qs_awa_client.move_queue(QUEUE, filter={"queue": "elsewhere"}))
    reached, proceed = trio.Event(), trio.Event()
    pause_before_statements_containing(monkeypatch, "reserve_enqueue_seq", reached, proceed)
    producer = OpenProducer(qs_awa_client)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(batch_operations.run_once, qs_ctx)
        with trio.fail_after(10):
            await reached.wait()
        await producer.insert(1)
        proceed.set()
        await wait_for_lane_lock_waiter(qs_db)
        [rotated] = await qs_db.fetch(rotate_sql("awa"))
        assert rotated["moved"], dict(rotated)
        await producer.insert(20)
        await producer.commit()

    assert await lane_order_violations(qs_db) == []
    entry = await qs_db.fetchrow(
        "SELECT queue, lane_seq FROM awa.ready_entries WHERE job_id = $1 ORDER BY lane_seq DESC LIMIT 1", moved)
    assert entry["queue"] == QUEUE
    expected = collections.Counter({(job_id, 1): 1 for job_id in [first, *producer.ids, moved]})
    ran = await drain_with_ledger(qs_database_url, qs_db, expected)
    assert ran == expected, {"lost": sorted(set(expected) - set(ran)), "extra": sorted(set(ran) - set(expected))}


def pause_before_statements_containing(monkeypatch, marker: str, reached: trio.Event,
                                       proceed: trio.Event) -> None:
    """Hold our connections before sending a statement whose text contains
    ``marker``, until ``proceed`` is set (the statements themselves run
    unchanged, on the real database)."""
    for method in ("execute", "fetch", "fetchrow", "fetchval"):
        original = getattr(Connection, method)

        async def paused(self, sql, *args, _original=original):
            if marker in sql:
                reached.set()
                await proceed.wait()
            return await _original(self, sql, *args)

        monkeypatch.setattr(Connection, method, paused)
