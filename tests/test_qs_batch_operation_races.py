"""move_queue on queue storage against a claimer and a canceller racing it.

An available job's entry is tombstoned and re-entered in its target lane;
that must never happen to an entry whose attempt was already claimed, or
tombstoned by someone else meanwhile: the job would run twice, or come back
after a cancel. Each race is built for real on the database: awa-pg's claim
function commits a claim whose cursor advance has not run yet, or a second
connection tombstones the entry while our statement waits for its row lock.
"""

from __future__ import annotations

import trio

from awa_trio.db import QueryError
from awa_trio.engines.queue_storage import batch_operations
from awa_trio.engines.queue_storage.batch_operations import _reenter_available

QUEUE = "race_src"
TARGET = "race_dst"

ENTRIES_SQL = "SELECT queue, lane_seq FROM awa.ready_entries WHERE job_id = $1 ORDER BY lane_seq"
JOB_STATE_SQL = "SELECT state::text FROM awa.jobs WHERE id = $1"

CLAIM_SQL = "SELECT job_id, lane_seq FROM awa.claim_ready_runtime($1, 10, 0, 0)"
CLAIM_CURSOR_SQL = "SELECT awa.sequence_next_value(seq_name) FROM awa.queue_claim_heads WHERE queue = $1"

# Our LIVE_READY_ENTRY_SQL waiting for the entry's row lock (pg_stat_activity
# keeps only the start of a long statement).
WAITING_FOR_THE_ENTRY_SQL = """
    SELECT count(*) FROM pg_stat_activity
    WHERE datname = current_database() AND wait_event_type = 'Lock'
      AND query LIKE '%SELECT ready.ready_slot, ready.ready_generation, ready.queue, ready.priority%'
"""


async def submit_move(client, source: str, target: str) -> None:
    await trio.to_thread.run_sync(lambda: client.move_queue(target, filter={"queue": source}))


async def test_a_claimed_job_whose_cursor_has_not_moved_yet_is_not_re_entered(qs_ctx, qs_db, qs_awa_client):
    # awa-pg's claim, as its runtime runs it: claim_ready_runtime in a
    # transaction of its own; the runtime moves the lane's claim cursor in a
    # later one, not run here (the window a move must not fall into).
    job = await trio.to_thread.run_sync(lambda: qs_awa_client.insert({"n": 1}, kind="race", queue=QUEUE))
    claimed = await qs_db.fetch(CLAIM_SQL, QUEUE)
    assert [row["job_id"] for row in claimed] == [job.id]
    assert await qs_db.fetchval(CLAIM_CURSOR_SQL, QUEUE) == claimed[0]["lane_seq"]
    await submit_move(qs_awa_client, QUEUE, TARGET)

    result = await batch_operations.run_once(qs_ctx)

    assert result.skipped == 1 and result.processed == 0, result
    # No second entry that a worker of the target queue would run again.
    assert [row["queue"] for row in await qs_db.fetch(ENTRIES_SQL, job.id)] == [QUEUE]


async def test_an_entry_tombstoned_while_we_wait_for_its_row_is_not_re_entered(
    qs_ctx, qs_db, qs_awa_client
):
    # As awa-pg's cancel does: lock the entry, tombstone it, commit later.
    job = await trio.to_thread.run_sync(lambda: qs_awa_client.insert({"n": 1}, kind="race", queue=QUEUE))
    await submit_move(qs_awa_client, QUEUE, TARGET)
    canceller = await qs_db.connect_dedicated()
    try:
        await canceller.execute("BEGIN")
        entry = await canceller.fetchrow(
            "SELECT * FROM awa.ready_entries WHERE job_id = $1 FOR UPDATE", job.id)
        await canceller.execute(
            "INSERT INTO awa.ready_tombstones (ready_slot, ready_generation, queue, priority, enqueue_shard, "
            "lane_seq, job_id) VALUES ($1, $2, $3, $4, $5, $6, $7)",
            entry["ready_slot"], entry["ready_generation"], entry["queue"], entry["priority"],
            entry["enqueue_shard"], entry["lane_seq"], job.id)
        async with trio.open_nursery() as nursery:
            outcome = {}

            async def move():
                outcome["result"] = await batch_operations.run_once(qs_ctx)

            nursery.start_soon(move)
            with trio.fail_after(10):
                while not await qs_db.fetchval(WAITING_FOR_THE_ENTRY_SQL):
                    await trio.sleep(0.01)
            await canceller.execute("COMMIT")
    finally:
        await canceller.close()

    assert outcome["result"].processed == 0, outcome["result"]
    assert [row["queue"] for row in await qs_db.fetch(ENTRIES_SQL, job.id)] == [QUEUE]


async def test_a_job_that_changes_lanes_while_we_wait_for_its_lane_is_left_for_the_next_tick(
    qs_db, qs_awa_client
):
    # Two moves of one job queue behind a third connection holding the
    # source lane's claim head. The first moves the job to priority 1; the
    # second then finds the job in a lane whose head it does not hold, and
    # must not move it from there (a claimer of that lane could take it).
    job = await trio.to_thread.run_sync(lambda: qs_awa_client.insert({"n": 1}, kind="race", queue=QUEUE))
    holder = await qs_db.connect_dedicated()
    outcomes = {}
    try:
        await holder.execute("BEGIN")
        await holder.execute("SELECT 1 FROM awa.queue_claim_heads WHERE queue = $1 FOR UPDATE", QUEUE)

        async def move(name: str, priority: int) -> None:
            async with qs_db.transaction() as conn:
                try:
                    outcomes[name] = await _reenter_available(conn, "awa", job.id, None, priority)
                except QueryError as exc:
                    outcomes[name] = exc.sqlstate

        async with trio.open_nursery() as nursery:
            nursery.start_soon(move, "first", 1)
            await wait_for_lock_waiters(qs_db, 1)
            nursery.start_soon(move, "second", 3)
            await wait_for_lock_waiters(qs_db, 2)
            await holder.execute("COMMIT")
    finally:
        await holder.close()

    assert outcomes == {"first": True, "second": "40001"}
    live = await qs_db.fetch(
        "SELECT priority FROM awa.ready_entries AS ready WHERE job_id = $1 AND NOT EXISTS ("
        " SELECT 1 FROM awa.ready_tombstones AS tomb WHERE tomb.job_id = ready.job_id"
        " AND tomb.lane_seq = ready.lane_seq AND tomb.priority = ready.priority)", job.id)
    assert [row["priority"] for row in live] == [1]


async def wait_for_lock_waiters(db, count: int) -> None:
    with trio.fail_after(10):
        while await db.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND wait_event_type = 'Lock'") < count:
            await trio.sleep(0.01)
