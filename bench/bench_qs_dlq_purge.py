"""DLQ purge on queue storage: how fast awa_trio's cleanup drains a backlog
of expired dead-letter rows, per batch size. Prints a table, asserts nothing.

    python bench/bench_qs_dlq_purge.py [--rows 200000] [--batch-sizes 1000,10000]
                                       [--server postgresql://postgres@localhost:5432]

A scratch database is created, migrated by awa-pg and finalised to queue
storage by a real awa-pg runtime (as every default Awa 0.6 install is), then
dropped. For each batch size the DLQ is filled with ``--rows`` rows
dead-lettered 31 days ago (one INSERT ... SELECT) and one cleanup tick with a
generous budget drains it.

Upstream (awa-worker 0.6.1) deletes one ``dlq_cleanup_batch_size`` batch per
pass per ``cleanup_interval``: 1,000 rows / 60 s = 16.7 rows/s at the
defaults, whatever the server could do; that figure is printed beside ours.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
import uuid

import _common
import trio

from awa_trio.config import MaintenanceConfig
from awa_trio.context import MaintenanceContext
from awa_trio.db import open_database
from awa_trio.engines.queue_storage import cleanup
from awa_trio.metrics import MaintenanceMetrics
from awa_trio.schema import check_schema

UPSTREAM_ROWS_PER_SECOND = 1000 / 60

FILL_SQL = """
    INSERT INTO awa.dlq_entries (
        job_id, kind, queue, args, state, priority, attempt, run_lease, max_attempts,
        run_at, finalized_at, created_at, payload, dlq_reason, dlq_at, original_run_lease
    )
    SELECT nextval('awa.job_id_seq'), 'bench', 'q' || (n % 8), jsonb_build_object('n', n),
           'failed', 2, 1, 1, 1, now() - interval '31 days', now() - interval '31 days',
           now() - interval '31 days',
           '{"metadata": {}, "tags": [], "errors": [], "progress": null}'::jsonb,
           'bench', now() - interval '31 days', 1
    FROM generate_series(1, $1) AS n
"""


async def drain(dsn: str, rows: int, batch_size: int) -> tuple[float, int, int]:
    async with open_database(dsn) as db:
        await db.execute("TRUNCATE awa.dlq_entries")
        await db.execute(FILL_SQL, rows)
        await db.execute("VACUUM ANALYZE awa.dlq_entries")
        config = MaintenanceConfig(dlq_cleanup_batch_size=batch_size, cleanup_interval="1h",
                                   drain_time_budget="30m")
        ctx = MaintenanceContext.standalone(db=db, config=config, metrics=MaintenanceMetrics(),
                                 schema=await check_schema(db))
        started = time.perf_counter()
        result = await cleanup.run_once(ctx)
        elapsed = time.perf_counter() - started
        left = await db.fetchval("SELECT count(*) FROM awa.dlq_entries")
    return elapsed, result.total_dlq_purged, left


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--batch-sizes", default="1000,10000")
    parser.add_argument("--server", default=_common.SERVER)
    args = parser.parse_args()

    name = f"awa_trio_bench_dlq_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    try:
        dsn = asyncio.run(_common.create_database(args.server, name, queue_storage=True))
        print(f"DLQ purge on queue storage, {args.rows:,} expired rows per run")
        print(f"{'leader':<28}{'batch':>8}{'seconds':>10}{'rows/s':>12}{'left':>8}")
        for batch_size in (int(size) for size in args.batch_sizes.split(",")):
            elapsed, purged, left = trio.run(drain, dsn, args.rows, batch_size)
            print(f"{'awa_trio (one tick)':<28}{batch_size:>8}{elapsed:>10.2f}"
                  f"{purged / elapsed:>12,.0f}{left:>8}")
        upstream_seconds = args.rows / UPSTREAM_ROWS_PER_SECOND
        print(f"{'upstream 0.6.1 (1000/60s)':<28}{1000:>8}{upstream_seconds:>10,.0f}"
              f"{UPSTREAM_ROWS_PER_SECOND:>12,.1f}{'':>8}")
    finally:
        asyncio.run(_common.drop_database(args.server, name))


if __name__ == "__main__":
    main()
