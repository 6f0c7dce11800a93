"""What one round trip costs through the trio-asyncio bridge, against plain
asyncpg on asyncio. Prints per-operation latency (median of several runs).
asyncpg's own pool resets a session when it is released (one more round
trip); awa_trio's pool does not (awa_trio.db._Pool says why), so the
single-connection row compares the drivers' paths alone.

    python bench/bench_bridge.py [--dsn URL] [--ops 2000] [--runs 5]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import asyncpg
import trio

from awa_trio.db import open_database

QUERY = "SELECT 1"


async def asyncio_round_trips(dsn: str, ops: int) -> dict[str, float]:
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=2)
    try:
        await pool.fetchval(QUERY)
        started = time.perf_counter()
        for _ in range(ops):
            await pool.fetchval(QUERY)
        query = (time.perf_counter() - started) / ops
        started = time.perf_counter()
        for _ in range(ops // 4):
            async with pool.acquire() as conn, conn.transaction():
                await conn.fetchval(QUERY)
        transaction = (time.perf_counter() - started) / (ops // 4)
    finally:
        await pool.close()
    conn = await asyncpg.connect(dsn)
    try:
        await conn.fetchval(QUERY)
        started = time.perf_counter()
        for _ in range(ops):
            await conn.fetchval(QUERY)
        connection = (time.perf_counter() - started) / ops
    finally:
        await conn.close()
    return {"query": query, "transaction": transaction, "connection": connection}


async def bridge_round_trips(dsn: str, ops: int) -> dict[str, float]:
    async with open_database(dsn, pool_size=2) as db:
        await db.fetchval(QUERY)
        started = time.perf_counter()
        for _ in range(ops):
            await db.fetchval(QUERY)
        query = (time.perf_counter() - started) / ops
        started = time.perf_counter()
        for _ in range(ops // 4):
            async with db.transaction() as conn:
                await conn.fetchval(QUERY)
        transaction = (time.perf_counter() - started) / (ops // 4)
        conn = await db.connect_dedicated()
        try:
            await conn.fetchval(QUERY)
            started = time.perf_counter()
            for _ in range(ops):
                await conn.fetchval(QUERY)
            connection = (time.perf_counter() - started) / ops
        finally:
            await conn.close()
    return {"query": query, "transaction": transaction, "connection": connection}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dsn", default="postgresql://postgres@localhost:5432/postgres")
    parser.add_argument("--ops", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()

    plain = [asyncio.run(asyncio_round_trips(args.dsn, args.ops)) for _ in range(args.runs)]
    bridged = [trio.run(bridge_round_trips, args.dsn, args.ops) for _ in range(args.runs)]
    print(f"round trips over loopback, median of {args.runs} runs x {args.ops} ops")
    print(f"{'operation':<34}{'asyncpg/asyncio':>16}{'awa_trio bridge':>17}{'ratio':>8}")
    for kind, label in (("query", "pool.fetchval('SELECT 1')"),
                        ("transaction", "acquire + BEGIN + query + COMMIT"),
                        ("connection", "connection.fetchval('SELECT 1')")):
        a = statistics.median(r[kind] for r in plain) * 1e6
        b = statistics.median(r[kind] for r in bridged) * 1e6
        print(f"{label:<34}{a:>13.0f} us{b:>14.0f} us{b / a:>7.2f}x")


if __name__ == "__main__":
    main()
