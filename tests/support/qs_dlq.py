"""Dead-letter rows on a queue-storage test database.

Real ones: awa-pg inserts jobs with one attempt, a real awa-pg worker fails
them, and awa-pg's own ``bulk_move_failed_to_dlq`` moves them into the DLQ.
Bulk ones (for backlogs of thousands): rows of the same shape written by one
INSERT ... SELECT, with ids from queue storage's own job sequence.
"""

from __future__ import annotations

import datetime as dt
from contextlib import asynccontextmanager

import trio

from awa_trio.leadership import LOCK_KEY
from support.awa_pg import awa_pg_worker

DLQ_KIND = "dlq_probe"

BULK_DLQ_ROWS_SQL = """
    INSERT INTO awa.dlq_entries (
        job_id, kind, queue, args, state, priority, attempt, run_lease, max_attempts,
        run_at, attempted_at, finalized_at, created_at, payload, dlq_reason, dlq_at,
        original_run_lease
    )
    SELECT nextval('awa.job_id_seq'), $1, $2, jsonb_build_object('n', n), 'failed', 2, 1, 1, 1,
           now() - $4::interval, now() - $4::interval, now() - $4::interval,
           now() - $4::interval,
           jsonb_build_object('metadata', '{}'::jsonb, 'tags', '[]'::jsonb,
                              'errors', '[]'::jsonb, 'progress', NULL),
           'bulk_test', now() - $4::interval, 1
    FROM generate_series(1, $3) AS n
    RETURNING job_id
"""


async def add_bulk_dlq_rows(db, queue: str, count: int, age: dt.timedelta) -> list[int]:
    """``count`` DLQ rows of ``queue`` dead-lettered ``age`` ago; their ids."""
    rows = await db.fetch(BULK_DLQ_ROWS_SQL, DLQ_KIND, queue, count, age)
    return sorted(row["job_id"] for row in rows)


async def backdate_dlq(db, job_ids: list[int], age: dt.timedelta) -> None:
    await db.execute(
        "UPDATE awa.dlq_entries SET dlq_at = now() - $2::interval WHERE job_id = ANY($1)",
        job_ids, age,
    )


async def dlq_ids(db, queue: str | None = None) -> list[int]:
    rows = await db.fetch(
        "SELECT job_id FROM awa.dlq_entries WHERE $1::text IS NULL OR queue = $1 ORDER BY job_id",
        queue,
    )
    return [row["job_id"] for row in rows]


@asynccontextmanager
async def holding_leader_lock(db):
    """Keep any awa-pg runtime a follower (so its own maintenance never runs)."""
    async with db.acquire() as conn:
        assert await conn.fetchval("SELECT pg_try_advisory_lock($1)", LOCK_KEY)
        try:
            yield
        finally:
            await conn.fetchval("SELECT pg_advisory_unlock($1)", LOCK_KEY)


async def fail_jobs_with_awa_pg(dsn: str, db, queue: str, job_ids: list[int],
                                timeout: float = 60.0, until_state: str = "failed") -> None:
    """Run a real awa-pg worker that fails every ``dlq_probe`` job of
    ``queue`` until all of ``job_ids`` are in ``until_state`` (``failed``
    for one-attempt jobs, ``retryable`` otherwise)."""
    async with holding_leader_lock(db):
        async with awa_pg_worker(dsn, f"{DLQ_KIND}:{queue}", behaviour="fail",
                                 extra_args=["--role", "auto"]):
            with trio.fail_after(timeout):
                while True:
                    failed = await db.fetchval(
                        "SELECT count(*) FROM awa.jobs WHERE id = ANY($1) AND state = $2::awa.job_state",
                        job_ids, until_state,
                    )
                    if failed == len(job_ids):
                        return
                    await trio.sleep(0.2)


async def dead_letter_with_awa_pg(dsn: str, db, awa_client, queue: str, count: int) -> list[int]:
    """``count`` jobs inserted by awa-pg, failed by a real awa-pg worker and
    moved to the DLQ by awa-pg; their ids."""
    job_ids = []
    for n in range(count):
        job = await trio.to_thread.run_sync(
            lambda n=n: awa_client.insert({"n": n}, kind=DLQ_KIND, queue=queue, max_attempts=1)
        )
        job_ids.append(job.id)
    await fail_jobs_with_awa_pg(dsn, db, queue, job_ids)
    moved = await trio.to_thread.run_sync(
        lambda: awa_client.bulk_move_failed_to_dlq(queue=queue, reason="test_dead_letter")
    )
    assert moved == count, f"awa-pg moved {moved} of {count} failed jobs to the DLQ"
    assert await dlq_ids(db, queue) == sorted(job_ids)
    return sorted(job_ids)
