"""Observation and set-up helpers for the queue-storage queue ring tests."""

from __future__ import annotations

from contextlib import asynccontextmanager

import trio

from awa_trio.engines.queue_storage.queue_ring import QUEUE_SLOT_CHILDREN, child
from awa_trio.leadership import LOCK_KEY

from .awa_pg import awa_pg_worker
from .qs_load import EXACT_TERMINAL_SQL


@asynccontextmanager
async def leader_lock_held(db):
    """Hold Awa's leader lock, so an awa-pg runtime started by a test works
    its queues but never leads (its maintenance would rotate the ring)."""
    conn = await db.connect_dedicated()
    try:
        await conn.fetchval("SELECT pg_advisory_lock($1)", LOCK_KEY)
        yield conn
    finally:
        await conn.close()


async def ring_state(db) -> tuple[int, int]:
    row = await db.fetchrow("SELECT current_slot, generation FROM awa.queue_ring_state")
    return int(row["current_slot"]), int(row["generation"])


async def slot_generations(db) -> dict[int, int]:
    rows = await db.fetch("SELECT slot, generation FROM awa.queue_ring_slots ORDER BY slot")
    return {int(r["slot"]): int(r["generation"]) for r in rows}


async def slot_row_counts(db, slot: int) -> dict[str, int]:
    """Rows per child of ``slot``, keyed by upstream's blocker label."""
    counts = {}
    for label, table in QUEUE_SLOT_CHILDREN:
        counts[label] = int(await db.fetchval(f"SELECT count(*) FROM {child('awa', table, slot)}"))
    return counts


async def done_rows(db, state: str | None = None) -> list:
    """(ready_slot, job_id, state, finalized_at) of every done row."""
    where = "WHERE state = $1::awa.job_state" if state else ""
    args = (state,) if state else ()
    return await db.fetch(
        f"SELECT ready_slot, ready_generation, job_id, state::text AS state, finalized_at, args, payload "
        f"FROM awa.done_entries {where} ORDER BY job_id", *args)


async def job_states(client, job_ids) -> dict[int, str]:
    """State of each job as awa-pg reads it (``get_job``); jobs awa-pg cannot
    find are left out. (The ``awa.jobs`` view of 0.6.1 does not show jobs
    running on a receipt claim.)"""
    def read() -> dict[int, str]:
        states = {}
        for job_id in job_ids:
            try:
                states[job_id] = str(client.get_job(job_id).state)
            except Exception as exc:  # awa's AwaError: "job not found"
                if "not found" not in str(exc):
                    raise
        return states
    return await trio.to_thread.run_sync(read)


async def insert_jobs(client, count: int, *, kind: str, queue: str = "default",
                      max_attempts: int = 25) -> list[int]:
    """Insert ``count`` jobs with awa-pg (into the live slot of the ring)."""
    def insert() -> list[int]:
        return [client.insert({"n": n}, kind=kind, queue=queue, max_attempts=max_attempts).id
                for n in range(count)]
    return await trio.to_thread.run_sync(insert)


async def wait_until(predicate, *, timeout: float = 30.0, interval: float = 0.1):
    """Poll an async predicate until it returns something truthy."""
    with trio.fail_after(timeout):
        while True:
            value = await predicate()
            if value:
                return value
            await trio.sleep(interval)


async def run_worker_until(dsn: str, db, kind: str, behaviour: str, done) -> None:
    """Run a real awa-pg worker (``--role auto``) until ``done()`` holds,
    with the leader lock held so that runtime never runs maintenance."""
    async with leader_lock_held(db), awa_pg_worker(
            dsn, kind, behaviour=behaviour, extra_args=["--role", "auto"]):
        await wait_until(done, timeout=60)


async def finish_jobs(dsn: str, db, client, kind: str, behaviour: str, job_ids) -> None:
    """A real worker completes (``complete``) or fails (``fail``) every job."""
    await run_worker_until(dsn, db, kind, behaviour, lambda: terminal_states(client, job_ids))


async def exact_terminal_total(db, queue: str) -> int:
    """Terminal jobs of ``queue`` as upstream's exact count reads them
    (see :data:`support.qs_load.EXACT_TERMINAL_SQL`)."""
    return int(await db.fetchval(EXACT_TERMINAL_SQL, queue))


async def pruned_rollups(db, queue: str) -> tuple[int, int]:
    row = await db.fetchrow(
        "SELECT COALESCE(sum(pruned_completed_count), 0) AS c, COALESCE(sum(pruned_failed_count), 0) AS f "
        "FROM awa.queue_terminal_rollups WHERE queue = $1", queue)
    return int(row["c"]), int(row["f"])


async def terminal_states(client, job_ids) -> bool:
    states = await job_states(client, job_ids)
    return len(states) == len(list(job_ids)) and all(
        s in ("completed", "failed", "cancelled") for s in states.values())
