"""Real claims and leases on a queue-storage database, for ring tests.

Also a small awa-pg worker (run this file as a script):
``python qs_claims.py DSN KIND:QUEUE [--plain] [--deadline-ms N]``. Its
handler registers a callback, which materialises the attempt into a
``leases`` row (unless ``--plain``), then hangs if the job's args say
``{"hang": true}`` and completes otherwise. ``--deadline-ms 0`` makes the
queue's claims compact (``lease_claim_batches``, no per-claim row). Prints
READY, ``START <id>`` and ``DONE <id>`` lines like awa_pg_worker.py.
"""

from __future__ import annotations

import asyncio
import sys
from contextlib import asynccontextmanager
from pathlib import Path

import trio

THIS_SCRIPT = Path(__file__)

CURSOR_SQL = "SELECT current_slot, generation, slot_count FROM awa.{ring}_ring_state WHERE singleton"

# A claim for the job's ready row, as a claimer that read the cursor before a
# rotation writes it: into the slot it read, not the current one.
LAGGARD_CLAIM_SQL = """
    INSERT INTO awa.lease_claims (
        claim_slot, job_id, run_lease, ready_slot, ready_generation, queue,
        priority, attempt, max_attempts, lane_seq, enqueue_shard, deadline_at
    )
    SELECT $1, job_id, run_lease + 1, ready_slot, ready_generation, queue,
           priority, attempt + 1, max_attempts, lane_seq, enqueue_shard,
           now() + interval '5 minutes'
    FROM awa.ready_entries
    WHERE job_id = $2
"""

LAGGARD_LEASE_SQL = """
    INSERT INTO awa.leases (
        lease_slot, lease_generation, ready_slot, ready_generation, job_id, queue,
        priority, attempt, run_lease, max_attempts, lane_seq, enqueue_shard,
        heartbeat_at, attempted_at
    )
    SELECT $1, $2, ready_slot, ready_generation, job_id, queue,
           priority, attempt + 1, run_lease + 1, max_attempts, lane_seq, enqueue_shard,
           now(), now()
    FROM awa.ready_entries
    WHERE job_id = $3
"""

WAITING_FOR_EXCLUSIVE_SQL = """
    SELECT EXISTS (
        SELECT 1 FROM pg_locks
        WHERE relation = $1::regclass AND mode = 'AccessExclusiveLock' AND NOT granted
    )
"""

WAITING_ON_LOCK_SQL = """
    SELECT EXISTS (
        SELECT 1 FROM pg_stat_activity
        WHERE datname = current_database() AND wait_event_type = 'Lock'
          AND query ILIKE $1
    )
"""

CLAIM_CHILD_TABLES = ("lease_claims", "lease_claim_batches", "lease_claim_closures",
                      "lease_claim_closure_batches")


async def ring_cursor(db, ring: str) -> tuple[int, int, int]:
    row = await db.fetchrow(CURSOR_SQL.format(ring=ring))
    return row["current_slot"], row["generation"], row["slot_count"]


async def slot_rows(db, table: str, slot: int) -> int:
    return await db.fetchval(f"SELECT count(*) FROM awa.{table}_{slot}")


async def claim_slot_rows(db, slot: int) -> dict[str, int]:
    return {table: await slot_rows(db, table, slot) for table in CLAIM_CHILD_TABLES}


async def relfilenode(db, table: str) -> int:
    return await db.fetchval("SELECT relfilenode FROM pg_class WHERE oid = $1::regclass", table)


async def wait_until(predicate, *, timeout: float = 20.0, interval: float = 0.05) -> None:
    with trio.fail_after(timeout):
        while not await predicate():
            await trio.sleep(interval)


async def wait_for_exclusive_waiter(db, table: str, timeout: float = 10.0) -> None:
    """Until some session queues for ACCESS EXCLUSIVE on ``table``."""
    await wait_until(lambda: db.fetchval(WAITING_FOR_EXCLUSIVE_SQL, table), timeout=timeout)


async def wait_for_lock_waiter(db, query_pattern: str, timeout: float = 10.0) -> None:
    """Until a session running a query like ``query_pattern`` waits on a lock."""
    await wait_until(lambda: db.fetchval(WAITING_ON_LOCK_SQL, query_pattern), timeout=timeout)


@asynccontextmanager
async def leader_lock_held(db):
    """Hold Awa's leader lock on a connection of our own, so that no awa-pg
    runtime the test starts ever leads (and rotates the rings itself)."""
    from awa_trio.leadership import LOCK_KEY

    conn = await db.connect_dedicated(application_name="test-leader-lock")
    try:
        assert await conn.fetchval("SELECT pg_try_advisory_lock($1)", LOCK_KEY)
        yield conn
    finally:
        await conn.close()


async def insert_job(client, kind: str, queue: str, args: dict | None = None) -> int:
    job = await trio.to_thread.run_sync(
        lambda: client.insert(args or {}, kind=kind, queue=queue))
    return job.id


async def claim_closed(db, job_id: int) -> bool:
    """The attempt's claim has closure evidence (explicit or compact)."""
    return await db.fetchval(
        """
        SELECT EXISTS (SELECT 1 FROM awa.lease_claim_closures WHERE job_id = $1)
            OR EXISTS (
                SELECT 1 FROM awa.lease_claims AS claims
                JOIN awa.lease_claim_closure_batches AS batches
                  ON batches.claim_slot = claims.claim_slot
                 AND batches.receipt_ranges @> claims.receipt_id
                WHERE claims.job_id = $1)
        """,
        job_id,
    )


async def compact_claim_of(db, job_id: int):
    """(claim_slot, receipt_id) of the job's compact claim, or None."""
    return await db.fetchrow(
        """
        SELECT batch.claim_slot, item.receipt_id
        FROM awa.lease_claim_batches AS batch,
             unnest(batch.job_ids, batch.receipt_ids) AS item(job_id, receipt_id)
        WHERE item.job_id = $1
        """,
        job_id,
    )


async def receipt_closed(db, receipt_id: int) -> bool:
    return await db.fetchval(
        "SELECT EXISTS (SELECT 1 FROM awa.lease_claim_closure_batches WHERE receipt_ranges @> $1::bigint)",
        receipt_id,
    )


async def claim_slot_of(db, job_id: int) -> int | None:
    return await db.fetchval("SELECT claim_slot FROM awa.lease_claims WHERE job_id = $1", job_id)


@asynccontextmanager
async def callback_worker(dsn: str, spec: str, *, callback: bool = True,
                          deadline_ms: int | None = None):
    """An awa-pg worker running this file's handler for KIND:QUEUE."""
    from support.awa_pg import worker_process

    argv = [sys.executable, str(THIS_SCRIPT), dsn, spec]
    if not callback:
        argv.append("--plain")
    if deadline_ms is not None:
        argv += ["--deadline-ms", str(deadline_ms)]
    async with worker_process(argv) as worker:
        yield worker


def _worker_main() -> None:
    import argparse

    import awa

    parser = argparse.ArgumentParser()
    parser.add_argument("dsn")
    parser.add_argument("spec", help="KIND:QUEUE")
    parser.add_argument("--plain", action="store_true", help="no callback, no leases row")
    parser.add_argument("--deadline-ms", type=int, default=None)
    args = parser.parse_args()
    kind, _, queue = args.spec.partition(":")

    async def main() -> None:
        client = awa.AsyncClient(args.dsn)

        @client.task(dict, kind=kind, queue=queue)
        async def handle(job):
            print("START", job.id, flush=True)
            if not args.plain:
                await job.register_callback(timeout_seconds=3600)
            if job.args.get("hang"):
                await asyncio.Event().wait()
            print("DONE", job.id, flush=True)

        queue_config = {"name": queue, "max_workers": 4}
        if args.deadline_ms is not None:
            queue_config["deadline_duration_ms"] = args.deadline_ms
        await client.start([queue_config], storage_transition_role="auto", poll_interval_ms=50)
        print("READY", flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())



# --- synthetic claim-plane rows, for model-based tests ------------------------
# Shaped as awa-pg writes them (see the ADR-023 shapes: row-local claims and
# explicit closures, compact claim batches and compact closure batches).

# DELETE, not TRUNCATE: truncating the whole partition tree costs seconds.
RESET_CLAIM_PLANE_SQL = """
    DELETE FROM awa.lease_claims;
    DELETE FROM awa.lease_claim_batches;
    DELETE FROM awa.lease_claim_closures;
    DELETE FROM awa.lease_claim_closure_batches;
    UPDATE awa.claim_ring_slots
    SET generation = CASE WHEN slot = 0 THEN 0 ELSE -1 END,
        rescue_cursor_claimed_at = '-infinity', rescue_cursor_job_id = 0,
        rescue_cursor_run_lease = 0, deadline_cursor_deadline_at = '-infinity',
        deadline_cursor_job_id = 0, deadline_cursor_run_lease = 0;
"""

SET_CLAIM_RING_SQL = """
    UPDATE awa.claim_ring_state SET current_slot = 0, generation = 0, slot_count = $1
"""

ROW_CLAIM_SQL = """
    INSERT INTO awa.lease_claims (
        claim_slot, job_id, run_lease, ready_slot, ready_generation, queue,
        priority, attempt, max_attempts, lane_seq, deadline_at
    )
    SELECT current_slot, $1, 1, 0, 0, 'model_q', 2, 1, 25, $1, now() + interval '5 minutes'
    FROM awa.claim_ring_state
    RETURNING claim_slot, receipt_id
"""

COMPACT_CLAIM_SQL = """
    WITH ids AS (
        SELECT array_agg(job_id ORDER BY job_id) AS job_ids,
               array_agg(nextval('awa.lease_claim_receipt_id_seq') ORDER BY job_id) AS receipt_ids
        FROM unnest($1::bigint[]) AS job_id
    )
    INSERT INTO awa.lease_claim_batches (
        claim_slot, ready_slot, ready_generation, queue, priority, claimed_count,
        job_ids, run_leases, receipt_ids, receipt_ranges, lane_seqs, attempts, max_attempts
    )
    SELECT state.current_slot, 0, 0, 'model_q', 2, cardinality(ids.job_ids),
           ids.job_ids, array_fill(1::bigint, ARRAY[cardinality(ids.job_ids)]), ids.receipt_ids,
           (SELECT range_agg(int8range(receipt, receipt + 1)) FROM unnest(ids.receipt_ids) AS receipt),
           ids.job_ids, array_fill(1::smallint, ARRAY[cardinality(ids.job_ids)]),
           array_fill(25::smallint, ARRAY[cardinality(ids.job_ids)])
    FROM awa.claim_ring_state AS state, ids
    RETURNING claim_slot, receipt_ids
"""

EXPLICIT_CLOSURE_SQL = """
    INSERT INTO awa.lease_claim_closures (claim_slot, job_id, run_lease, outcome)
    VALUES ($1, $2, 1, 'completed')
    ON CONFLICT DO NOTHING
"""

CLOSURE_BATCH_SQL = """
    INSERT INTO awa.lease_claim_closure_batches (
        claim_slot, ready_slot, ready_generation, outcome, closed_count, receipt_ids, receipt_ranges
    )
    VALUES ($1, 0, 0, 'completed', 1, ARRAY[$2::bigint], int8multirange(int8range($2, $2 + 1)))
"""

CLAIMED_JOBS_SQL = """
    SELECT claim_slot, job_id FROM awa.lease_claims
    UNION ALL
    SELECT claim_slot, unnest(job_ids) FROM awa.lease_claim_batches
"""


if __name__ == "__main__":
    _worker_main()
