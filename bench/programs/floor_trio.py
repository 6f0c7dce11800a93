"""The "trio floor" of bench_idle: the loops of floor_asyncio.py on Trio,
through awa_trio's own bridge to asyncpg (awa_trio.db): what the stack costs
before any maintenance logic runs.

    python bench/programs/floor_trio.py DSN TICKS_JSON LOCK_KEY
"""

import json
import sys

import trio

from awa_trio.db import open_database


async def loop_at(db, period):
    tick = trio.current_time()
    while True:
        tick += period
        await trio.sleep_until(tick)
        await db.fetchval("SELECT 1")


async def main():
    dsn, ticks, key = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
    async with open_database(dsn) as db:
        lock = await db.connect_dedicated()
        await lock.execute(f"SELECT pg_advisory_lock({key})")
        async with trio.open_nursery() as nursery:
            for period, count in ticks:
                for _ in range(count):
                    nursery.start_soon(loop_at, db, period)


if __name__ == "__main__":
    trio.run(main)
