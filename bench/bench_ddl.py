"""How long an operator's DDL holds maintenance up, and what a busy leader
costs the DDL (issue 28).

    python bench/bench_ddl.py [--resets 5] [--alter-rounds 3] [--server URL]
    python bench/bench_ddl.py --transition   # migrate from nothing, prepare, enter, finalize

Each DDL runs on a fresh database twice: with no leader, then beside a busy
awa_trio leader (tests/support/ddl.py: every branch at short intervals, an
awa-pg worker whose jobs need deadline rescues, a producer keeping promotion
due). Printed per DDL: its duration (median and longest), whether any run
failed, the leader's yields (lock waits it gave up after
statement_lock_timeout), the longest yield episode of any branch (from the
first yield to the next body that ran through) and how long after the DDL a
job that came due was promoted.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import _common
import trio

ROOT = Path(__file__).resolve().parent.parent
# This checkout's awa_trio (the leader runs in this process), and the tests' support.
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from support.ddl import BUSY_CONFIG, YieldLog, busy_leader, promotion_lag

TABLES_SQL = """
    SELECT format('%I.%I', n.nspname, c.relname)
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE n.nspname = ANY($1::text[]) AND c.relkind IN ('r', 'p') AND NOT c.relispartition
"""


async def installer_resets(dsn: str, db, client, count: int) -> list[float]:
    took = []
    for _ in range(count):
        started = time.monotonic()
        await trio.to_thread.run_sync(lambda: client.install_queue_storage(schema="awa_ddl", reset=True))
        took.append(time.monotonic() - started)
        await trio.sleep(0.2)
    return took


async def alter_every_table(dsn: str, db, client, rounds: int) -> list[float]:
    schema = await db.fetchval("SELECT details->>'schema' FROM awa.storage_status()") or "awa"
    tables = [row[0] for row in await db.fetch(TABLES_SQL, sorted({"awa", schema}))]
    took = []
    for round_ in range(rounds):
        started = time.monotonic()
        async with db.transaction() as conn:
            for table in tables if round_ % 2 else tables[::-1]:
                await conn.execute(f"ALTER TABLE {table} ADD COLUMN bench_{round_} integer")
        took.append(time.monotonic() - started)
        await trio.sleep(0.2)
    return took


async def measure(server: str, template: str, ddl, count: int, leader: bool) -> dict:
    import awa

    from awa_trio.db import open_database

    dsn = await _common.in_trio(_common.copy_database, server, template, "bench_ddl")
    try:
        client = awa.Client(dsn)
        failures = 0
        async with open_database(dsn) as db, YieldLog().attached() as yields:
            if leader:
                async with busy_leader(dsn, client) as busy:
                    await trio.sleep(1.0)
                    try:
                        async with busy.producer.paused():
                            took = await ddl(dsn, db, client, count)
                    except Exception as exc:
                        failures, took = 1, [float("nan")]
                        print(f"  DDL failed: {exc}")
                    lag = await promotion_lag(client, db)
            else:
                took, lag = await ddl(dsn, db, client, count), None
        return {
            "took": took,
            "failures": failures,
            "yields": len(yields.yields) + sum(n - 1 for _, n, _ in yields.episodes),
            "episodes": len(yields.episodes),
            "hold_up": yields.longest_hold_up(),
            "lag": lag,
        }
    finally:
        await _common.in_trio(_common.drop_database, server, dsn)


def report(name: str, quiet: dict, busy: dict) -> None:
    print(f"{name}:")
    print(
        f"  no leader:   median {statistics.median(quiet['took']):.2f} s, longest {max(quiet['took']):.2f} s"
    )
    print(
        f"  busy leader: median {statistics.median(busy['took']):.2f} s, longest {max(busy['took']):.2f} s, "
        f"{busy['failures']} failed; {busy['yields']} yields in {busy['episodes']} episodes, longest "
        f"held up {busy['hold_up']:.2f} s; a due job promoted {busy['lag']:.2f} s after the DDL",
        flush=True,
    )


async def yields_without_ddl(server: str, template: str, timeout: float, seconds: float) -> int:
    """Yields of a busy leader in ``seconds`` with no DDL at all: its
    statements waiting on each other's and the worker's locks."""
    import awa

    dsn = await _common.in_trio(_common.copy_database, server, template, "bench_ddl")
    try:
        config = BUSY_CONFIG.replace(statement_lock_timeout=timeout)
        async with YieldLog().attached() as yields, busy_leader(dsn, awa.Client(dsn), config=config):
            await trio.sleep(seconds)
        return len(yields.yields) + sum(n - 1 for _, n, _ in yields.episodes)
    finally:
        await _common.in_trio(_common.drop_database, server, dsn)


async def wait_until_leading(service, engine: str, timeout: float = 60.0) -> None:
    with trio.fail_after(timeout):
        while not (service.is_leader and service.schema is not None and service.schema.engine == engine):
            await trio.sleep(0.02)


async def migrate_and_transition(server: str, template: str) -> None:
    """The awa schema dropped and migrated from nothing under a busy leader,
    then prepare, enter and finalize: each step's duration, and how long
    after it the leader leads the new state and a due job is promoted."""
    import asyncio

    import awa
    from support.ddl import INSERT_TARGET_RUNTIME_SQL

    from awa_trio.db import open_database

    prepare = "SELECT state FROM awa.storage_prepare('queue_storage', '{\"schema\": \"awa\"}')"
    dsn = await _common.in_trio(_common.copy_database, server, template, "bench_ddl")

    async def step(name: str, busy, run, engine: str) -> None:
        started = time.monotonic()
        async with busy.producer.paused():
            await run()
        took = time.monotonic() - started
        await wait_until_leading(busy.service, engine)
        leading = time.monotonic() - started - took
        async with open_database(dsn) as fresh:  # a client of the new schema's types
            lag = await promotion_lag(awa.Client(dsn), fresh)
        lag = max(lag, 0.0)
        print(f"{name}: {took:.2f} s; the leader led the new state {leading:.2f} s after it, "
              f"a due job promoted {lag:.2f} s after that", flush=True)

    try:
        async with open_database(dsn) as db:
            async with busy_leader(dsn, awa.Client(dsn)) as busy:
                await trio.sleep(1.0)

                async def drop_and_migrate() -> None:
                    await db.execute("DROP SCHEMA awa CASCADE")
                    await trio.to_thread.run_sync(lambda: awa.Client(dsn).migrate())

                await step("DROP SCHEMA awa CASCADE, then awa-pg's migrate() (canonical)", busy,
                           drop_and_migrate, "canonical")
            async with open_database(dsn) as db2, busy_leader(dsn, awa.Client(dsn)) as busy:
                await trio.sleep(1.0)

                async def prepare_step() -> None:
                    await trio.to_thread.run_sync(lambda: asyncio.run(
                        awa.AsyncClient(dsn).prepare_queue_storage_schema(schema="awa")))
                    await db2.execute(prepare)

                await step("prepare (awa-pg's schema preparation, storage_prepare)", busy, prepare_step,
                           "canonical")
            async with open_database(dsn) as db3:
                await db3.execute(INSERT_TARGET_RUNTIME_SQL)
                await db3.execute("DELETE FROM awa.runtime_instances WHERE transition_role <> 'queue_storage_target'")
                async with busy_leader(dsn, awa.Client(dsn), worker=False) as busy:
                    await trio.sleep(1.0)

                    async def enter() -> None:
                        await db3.execute("DELETE FROM awa.jobs_hot; DELETE FROM awa.scheduled_jobs")
                        await db3.execute("SELECT awa.storage_enter_mixed_transition()")

                    await step("enter mixed transition", busy, enter, "queue_storage")
                    with trio.fail_after(30):
                        while await db3.fetchval("SELECT awa.canonical_live_backlog()") != 0:
                            await trio.sleep(0.1)

                    async def finalize() -> None:
                        await db3.execute("SELECT awa.storage_finalize()")

                    await step("finalize", busy, finalize, "queue_storage")
    finally:
        await _common.in_trio(_common.drop_database, server, dsn)


async def main(args: argparse.Namespace) -> None:
    template = await _common.in_trio(_common.make_template, args.server, "bench_ddl_tpl")
    qs_template = await _common.in_trio(
        _common.make_template, args.server, "bench_ddl_qtpl", queue_storage=True
    )
    try:
        for timeout in args.baseline:
            for tpl, engine in ((template, "canonical"), (qs_template, "queue storage")):
                count = await yields_without_ddl(args.server, tpl, timeout, args.baseline_seconds)
                print(
                    f"no DDL, statement_lock_timeout {timeout * 1000:g} ms, {engine}: "
                    f"{count} yields in {args.baseline_seconds:g} s",
                    flush=True,
                )
        if args.baseline:
            return
        if args.transition:
            await migrate_and_transition(args.server, template)
            return
        for name, ddl, count, templates in (
            (f"installer reset=True x{args.resets}", installer_resets, args.resets, [template]),
            (
                f"ALTER TABLE ADD COLUMN on every table, one transaction, x{args.alter_rounds}",
                alter_every_table,
                args.alter_rounds,
                [template, qs_template],
            ),
        ):
            for tpl in templates:
                label = name + (" (queue storage)" if tpl == qs_template else " (canonical)")
                quiet = await measure(args.server, tpl, ddl, count, leader=False)
                busy = await measure(args.server, tpl, ddl, count, leader=True)
                report(label, quiet, busy)
    finally:
        for tpl in (template, qs_template):
            await _common.in_trio(_common.drop_database, args.server, tpl)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--resets", type=int, default=5)
    parser.add_argument("--alter-rounds", type=int, default=3)
    parser.add_argument("--server", default=_common.env_server())
    parser.add_argument(
        "--baseline",
        type=float,
        action="append",
        default=[],
        help="instead: yields of the busy leader without DDL at this statement_lock_timeout (s)",
    )
    parser.add_argument("--baseline-seconds", type=float, default=30.0)
    parser.add_argument(
        "--transition", action="store_true", help="instead: migrate from nothing, prepare, enter, finalize"
    )
    trio.run(main, parser.parse_args())
