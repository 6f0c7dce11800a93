"""The "asyncio floor" of bench_idle: the cheapest Python leader we can think
of, for a lower bound. asyncpg on plain asyncio (no Trio, no bridge, no
maintenance logic) holds the leader lock and sends SELECT 1 at the given
ticks, each loop on a connection of its own, as each branch borrows one.

    python bench/programs/floor_asyncio.py DSN TICKS_JSON LOCK_KEY

TICKS_JSON is a list of [period seconds, loops]; the key is an argument so
this process imports nothing of awa_trio.
"""

import asyncio
import json
import sys

import asyncpg


async def loop_at(dsn, period):
    conn = await asyncpg.connect(dsn)
    loop = asyncio.get_running_loop()
    tick = loop.time()
    while True:
        tick += period
        await asyncio.sleep(max(0.0, tick - loop.time()))
        await conn.fetchval("SELECT 1")


async def main():
    dsn, ticks, key = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
    lock = await asyncpg.connect(dsn)
    await lock.execute(f"SELECT pg_advisory_lock({key})")
    await asyncio.gather(*(loop_at(dsn, period) for period, count in ticks for _ in range(count)))


if __name__ == "__main__":
    asyncio.run(main())
