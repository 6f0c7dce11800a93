"""Arranging and observing jobs on the queue-storage engine, for tests and
benchmarks. Jobs are inserted by awa-pg itself; SQL only moves their clock
(run_at) or state, which a test could otherwise only wait for."""

from __future__ import annotations

import asyncio
import datetime as dt
import threading
from typing import Self

import asyncpg
import trio

FAR_FUTURE = dt.timedelta(hours=1)


def future_run_at() -> dt.datetime:
    return dt.datetime.now(dt.UTC) + FAR_FUTURE


async def insert_scheduled(client, count: int, *, kind: str = "burst", queue: str = "burst",
                           null_payload: bool = False, priority: int = 2,
                           chunk: int = 5000) -> int:
    """``count`` jobs scheduled an hour ahead, inserted by awa-pg.
    ``null_payload``: through ``enqueue_many_copy``, which writes a NULL
    payload; otherwise through ``insert_many_copy``. Returns the count."""
    run_at = future_run_at()
    inserted = 0
    while inserted < count:
        size = min(chunk, count - inserted)
        jobs = [{"n": inserted + i} for i in range(size)]
        if null_payload:
            await trio.to_thread.run_sync(lambda jobs=jobs: client.enqueue_many_copy(
                jobs, kind=kind, queue=queue, priority=priority, run_at=run_at))
        else:
            await trio.to_thread.run_sync(lambda jobs=jobs: client.insert_many_copy(
                jobs, kind=kind, queue=queue, priority=priority, run_at=run_at))
        inserted += size
    return inserted


async def insert_one_scheduled(client, args: dict, *, kind: str = "burst", queue: str = "burst",
                               **options) -> int:
    job = await trio.to_thread.run_sync(lambda: client.insert(
        args, kind=kind, queue=queue, run_at=future_run_at(), **options))
    return job.id


async def make_due(db, where: str = "TRUE", *, seconds_ago: float = 60.0) -> int:
    """Move deferred rows' run_at into the past (as time passing would)."""
    status = await db.execute(
        f"UPDATE awa.deferred_jobs SET run_at = now() - make_interval(secs => $1) WHERE {where}",
        seconds_ago,
    )
    return int(status.split()[-1])


async def make_retryable(db, job_ids: list[int], *, seconds_ago: float = 60.0) -> None:
    """Turn deferred rows into due retryable rows after a first failed attempt
    (what a failing worker plus backoff would leave)."""
    await db.execute(
        """
        UPDATE awa.deferred_jobs
        SET state = 'retryable', attempt = 1, run_lease = 1,
            attempted_at = now() - make_interval(secs => $2 + 1),
            run_at = now() - make_interval(secs => $2)
        WHERE job_id = ANY($1::bigint[])
        """,
        job_ids, seconds_ago,
    )


async def deferred_count(db, where: str = "TRUE") -> int:
    return await db.fetchval(f"SELECT count(*) FROM awa.deferred_jobs WHERE {where}")


async def ready_count(db, where: str = "TRUE") -> int:
    return await db.fetchval(f"SELECT count(*) FROM awa.ready_entries WHERE {where}")


class Listener:
    """LISTEN on channels with plain asyncpg, on its own loop in a thread.
    ``async with Listener(dsn, [...]) as listener`` enters once listening;
    ``listener.heard`` collects the channel names notified."""

    def __init__(self, dsn: str, channels: list[str], timeout: float = 30.0):
        self.dsn = dsn
        self.channels = channels
        self.timeout = timeout
        self.heard: list[str] = []
        self._ready = threading.Event()
        self._stop = threading.Event()

    def _run(self) -> None:
        async def main() -> None:
            conn = await asyncpg.connect(self.dsn)
            try:
                for channel in self.channels:
                    await conn.add_listener(
                        channel, lambda _c, _pid, chan, _payload: self.heard.append(chan))
                self._ready.set()
                loop = asyncio.get_running_loop()
                deadline = loop.time() + self.timeout
                while not self._stop.is_set() and loop.time() < deadline:
                    await asyncio.sleep(0.02)
            finally:
                self._ready.set()
                await conn.close()

        asyncio.run(main())

    async def __aenter__(self) -> Self:
        self._nursery_cm = trio.open_nursery()
        nursery = await self._nursery_cm.__aenter__()
        nursery.start_soon(lambda: trio.to_thread.run_sync(self._run))
        await trio.to_thread.run_sync(self._ready.wait, 10)
        return self

    async def wait_for(self, channel: str, timeout: float = 5.0) -> bool:
        with trio.move_on_after(timeout):
            while channel not in self.heard:
                await trio.sleep(0.02)
            return True
        return False

    async def __aexit__(self, *exc_info) -> None:
        self._stop.set()
        await self._nursery_cm.__aexit__(*exc_info)


# Terminal rows of a queue as upstream's exact read counts them: folded live
# counts, pending deltas, retained compact completions minus their tombstones.
TERMINAL_COUNT_SQL = """
    SELECT
        COALESCE((SELECT sum(live_terminal_count) FROM awa.queue_terminal_live_counts
                  WHERE queue = $1), 0)
      + COALESCE((SELECT sum(terminal_delta) FROM awa.queue_terminal_count_deltas
                  WHERE queue = $1), 0)
      + COALESCE((SELECT sum(completed_count) FROM awa.receipt_completion_batches
                  WHERE queue = $1), 0)
      - COALESCE((SELECT count(*) FROM awa.receipt_completion_tombstones
                  WHERE queue = $1), 0)
"""


async def terminal_count(db, queue: str) -> int:
    return int(await db.fetchval(TERMINAL_COUNT_SQL, queue))


async def rotate_queue_ring(db) -> tuple[int, int]:
    """Advance the queue ring by one slot, as a leader's rotation does when
    the next slot is empty (tests hold the leader lock, so no runtime rotates)."""
    async with db.transaction() as conn:
        state = await conn.fetchrow(
            "SELECT current_slot, generation, slot_count FROM awa.queue_ring_state "
            "WHERE singleton FOR UPDATE")
        slot = (state["current_slot"] + 1) % state["slot_count"]
        generation = state["generation"] + 1
        await conn.execute("UPDATE awa.queue_ring_state SET current_slot = $1, generation = $2 "
                           "WHERE singleton", slot, generation)
        await conn.execute("UPDATE awa.queue_ring_slots SET generation = $2 WHERE slot = $1",
                           slot, generation)
    return slot, generation
