"""What the claim prune's open-claim proof costs, per sealed slot size, and
what an idle ring tick costs.

Fills claim slot 0 of a fresh queue-storage database with N closed claims
(half row-local ``lease_claims`` rows, half items of compact
``lease_claim_batches`` of 100, all closed by compact closure batches, as
awa-pg's compact completion writes them), seals the slot, and times:

- upstream 0.6.1's proof (ledger totals only, ``claims = closures``);
- awa_trio's proof (totals, then each claim looked up in the ledgers);
- the whole prune (both proofs, the exclusive lock, TRUNCATE, commit); the
  exclusive lock is held for the second proof plus the TRUNCATE.

Then, on the emptied database, one idle tick (rotate + prune) of each ring:
awa_trio's (a slot with no heap page is a Noop, nothing is locked or
truncated) against a TRUNCATE every tick, as upstream does.

    python bench/bench_claim_prune.py [--server postgresql://postgres@localhost:5432]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import statistics
import time

import _common
import trio

from awa_trio.db import open_database
from awa_trio.engines.queue_storage import lease_claim_rings, rotate_claim, rotate_lease
from awa_trio.tracker import PruneOutcome

SIZES = (1_000, 10_000, 50_000)
REPEATS = 5
IDLE_TICKS = 40

UPSTREAM_PROOF_SQL = """
    SELECT (SELECT count(*) FROM awa.lease_claims_0)
         + (SELECT COALESCE(sum(claimed_count), 0) FROM awa.lease_claim_batches_0)
         = (SELECT count(*) FROM awa.lease_claim_closures_0)
         + (SELECT COALESCE(sum(closed_count), 0) FROM awa.lease_claim_closure_batches_0)
"""

FILL_SQL = """
    WITH row_claims AS (
        INSERT INTO awa.lease_claims (claim_slot, job_id, run_lease, ready_slot, ready_generation,
                                      queue, priority, attempt, max_attempts, lane_seq)
        SELECT 0, job_id, 1, 0, 0, 'bench_q', 2, 1, 25, job_id
        FROM generate_series(1, $1 / 2) AS job_id
        RETURNING receipt_id
    ),
    row_closures AS (
        INSERT INTO awa.lease_claim_closure_batches (claim_slot, ready_slot, ready_generation,
                                                     outcome, closed_count, receipt_ids, receipt_ranges)
        SELECT 0, 0, 0, 'completed', count(*), array_agg(receipt_id),
               range_agg(int8range(receipt_id, receipt_id + 1))
        FROM row_claims
        GROUP BY receipt_id / 100
    ),
    items AS (
        SELECT job_id, nextval('awa.lease_claim_receipt_id_seq') AS receipt_id
        FROM generate_series($1 / 2 + 1, $1) AS job_id
    ),
    batches AS (
        SELECT (job_id - 1) / 100 AS batch, array_agg(job_id ORDER BY job_id) AS job_ids,
               array_agg(receipt_id ORDER BY job_id) AS receipt_ids,
               range_agg(int8range(receipt_id, receipt_id + 1)) AS receipt_ranges
        FROM items GROUP BY 1
    ),
    compact_claims AS (
        INSERT INTO awa.lease_claim_batches (claim_slot, ready_slot, ready_generation, queue, priority,
                                             claimed_count, job_ids, run_leases, receipt_ids,
                                             receipt_ranges, lane_seqs, attempts, max_attempts)
        SELECT 0, 0, 0, 'bench_q', 2, cardinality(job_ids), job_ids,
               array_fill(1::bigint, ARRAY[cardinality(job_ids)]), receipt_ids, receipt_ranges,
               job_ids, array_fill(1::smallint, ARRAY[cardinality(job_ids)]),
               array_fill(25::smallint, ARRAY[cardinality(job_ids)])
        FROM batches
    )
    INSERT INTO awa.lease_claim_closure_batches (claim_slot, ready_slot, ready_generation,
                                                 outcome, closed_count, receipt_ids, receipt_ranges)
    SELECT 0, 0, 0, 'completed', cardinality(receipt_ids), receipt_ids, receipt_ranges
    FROM batches
"""

RESET_RING_SQL = """
    UPDATE awa.claim_ring_state SET current_slot = 0, generation = 0;
    UPDATE awa.claim_ring_slots SET generation = CASE WHEN slot = 0 THEN 0 ELSE -1 END;
"""

async def timed(call) -> float:
    started = time.perf_counter()
    await call()
    return (time.perf_counter() - started) * 1000


async def measure(dsn: str) -> list[tuple]:
    from awa_trio.config import MaintenanceConfig
    from awa_trio.context import MaintenanceContext
    from awa_trio.metrics import MaintenanceMetrics
    from awa_trio.schema import check_schema

    rows = []
    async with open_database(dsn) as db:
        schema = await check_schema(db)
        assert schema.runs_queue_storage, "the awa-pg runtime did not finalise queue storage"
        ctx = MaintenanceContext.standalone(db=db, config=MaintenanceConfig(), metrics=MaintenanceMetrics(None),
                                 schema=schema)
        [proof_sql] = rotate_claim.CLAIM_RING_TABLES.bind(rotate_claim.CLAIM_OPEN_SQL, "awa", 0)
        for size in SIZES:
            upstream, ours, prunes = [], [], []
            for _ in range(REPEATS):
                await db.execute(RESET_RING_SQL)
                await db.execute(FILL_SQL, size)
                await db.execute("ANALYZE awa.lease_claims_0, awa.lease_claim_batches_0,"
                                 " awa.lease_claim_closure_batches_0")
                assert (await rotate_claim.rotate(ctx)).rotated
                assert await db.fetchval(UPSTREAM_PROOF_SQL)
                assert await db.fetchval(proof_sql) == 0
                upstream.append(await timed(lambda: db.fetchval(UPSTREAM_PROOF_SQL)))
                ours.append(await timed(lambda: db.fetchval(proof_sql)))
                outcome = {}

                async def prune(outcome=outcome):
                    outcome["result"] = await rotate_claim.prune(ctx, lock_timeout=1.0)

                prunes.append(await timed(prune))
                assert outcome["result"].outcome is PruneOutcome.PRUNED, outcome
            rows.append((size, statistics.median(upstream), statistics.median(ours),
                         statistics.median(prunes)))

        idle = []
        for tables in (rotate_lease.LEASE_RING_TABLES, rotate_claim.CLAIM_RING_TABLES):
            always_truncating = dataclasses.replace(tables, clean=lambda slot: "SELECT false")
            medians = []
            for variant in (tables, always_truncating):
                ticks = []
                for _ in range(IDLE_TICKS):
                    started = time.perf_counter()
                    await lease_claim_rings.rotate_ring(ctx, variant)
                    await lease_claim_rings.prune_oldest(ctx, variant)
                    ticks.append((time.perf_counter() - started) * 1000)
                medians.append(statistics.median(ticks))
            idle.append((tables.ring, *medians))
    return rows, idle


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", default=_common.SERVER)
    args = parser.parse_args()
    name = _common.scratch_name("awa_trio_bench_claims")
    try:
        dsn = asyncio.run(_common.create_database(args.server, name, queue_storage=True))
        rows, idle = trio.run(measure, dsn)
    finally:
        asyncio.run(_common.drop_database(args.server, name))
    print(f"claim prune of one sealed slot, median of {REPEATS} (ms)")
    print(f"{'closed claims':>14} {'upstream proof':>15} {'awa_trio proof':>15} {'ratio':>6} {'whole prune':>12}")
    for size, upstream, ours, prune in rows:
        print(f"{size:>14,} {upstream:>15.1f} {ours:>15.1f} {ours / upstream:>6.1f} {prune:>12.1f}")
    print()
    print(f"idle ring tick (rotate + prune), median of {IDLE_TICKS} (ms)")
    print(f"{'ring':>6} {'awa_trio (noop)':>16} {'truncate each tick':>19} {'ratio':>6}")
    for ring, ours, truncating in idle:
        print(f"{ring:>6} {ours:>16.1f} {truncating:>19.1f} {ours / truncating:>6.2f}")


if __name__ == "__main__":
    main()
