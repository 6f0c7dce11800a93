"""An idle leader, awa_trio against upstream's (an awa-pg 0.6.1 runtime with
one idle worker slot), on each engine, every branch at its default tick.

Both leaders run at the same time, each on a fresh database of its own, so
the noise of a shared machine falls on both alike. For each leader process,
from /proc: CPU (user + system) over the whole run (start-up included) and
from 5 s in, peak RSS, and wake-ups per second from 5 s in (voluntary
context switches over all its threads: each time the process sleeps, it
later wakes, and on this kind of machine a wake-up costs more CPU than the
Python that runs after it); for each database, from pg_stat_database:
transactions per second from 5 s in (every statement outside an explicit
transaction is one; pg_stat_statements is not assumed to be loaded).

Two more processes bound what is left: the "asyncio floor" (asyncpg on
plain asyncio sending awa_trio's idle round trips at awa_trio's ticks and
nothing else, the cheapest Python leader we can think of) and the "trio
floor" (the same loops on Trio through awa_trio's bridge, awa_trio.db: the
cost of the stack before any maintenance logic). See FLOOR_TICKS.

    python bench/bench_idle.py [--seconds 120] [--rounds 3] [--engine canonical --engine queue_storage]
                               [--server postgresql://postgres@localhost:5432]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import _common
import asyncpg

ENGINES = ("canonical", "queue_storage")
LEADERS = ("awa-pg", "awa_trio", "asyncio floor", "trio floor")
STARTUP_SECONDS = 5.0

# The floors (programs/floor_asyncio.py, programs/floor_trio.py) hold the lock
# and send awa_trio's idle round trips at awa_trio's ticks (counted with
# log_statement = all: canonical, per second, 4 at the 250 ms promotion tick,
# 3 at the 1 s ticks of cron evaluation, the batch runner and the schema
# watch, 1 every 2 s for the dirty admin keys; queue storage 4 + 4 at 250 ms
# for promotion and the lease ring, 5 at 1 s for the claim and queue rings,
# cron, the batch runner and the schema watch). Each loop has a connection of
# its own, as each branch borrows one, and its statement is SELECT 1: the
# client's cost of a round trip hardly depends on its SQL.
FLOOR_TICKS = {
    "canonical": [(0.25, 1), (1.0, 3), (2.0, 1)],
    "queue_storage": [(0.25, 2), (1.0, 5)],
}
LEADER_LOCK_HELD_SQL = _common.lock_holders_sql("count(*)", database="$1")

TRANSACTIONS_SQL = "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = $1"


@dataclasses.dataclass
class Sample:
    cpu: float
    peak_rss: float
    wakeups: int
    transactions: int


@dataclasses.dataclass
class LeaderRun:
    database: str
    process: subprocess.Popen
    after_startup: Sample | None = None
    end: Sample | None = None


def voluntary_switches(pid: int) -> int:
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            status = (task / "status").read_text()
        except FileNotFoundError:  # a thread that just ended
            continue
        total += next(
            int(line.split()[1]) for line in status.splitlines() if line.startswith("voluntary_ctxt")
        )
    return total


async def sample(conn: asyncpg.Connection, run: LeaderRun) -> Sample:
    cpu, peak = _common.process_cost(run.process.pid)
    return Sample(
        cpu,
        peak,
        voluntary_switches(run.process.pid),
        int(await conn.fetchval(TRANSACTIONS_SQL, run.database)),
    )


async def make_database(server: str, engine: str) -> str:
    dsn = await _common.create_database(server, _common.scratch_name("awa_trio_bench_idle"),
                                        queue_storage=engine == "queue_storage")
    return _common.name_of(dsn)


FLOOR_LEADERS = {"asyncio floor": "floor_asyncio", "trio floor": "floor_trio"}


def start_leader(kind: str, engine: str, dsn: str) -> subprocess.Popen:
    if kind == "awa_trio":
        argv = _common.awa_trio_argv(dsn, "--leader-election-interval", "100ms", "--log-level", "WARNING")
    elif kind in FLOOR_LEADERS:
        argv = _common.program(FLOOR_LEADERS[kind], dsn, json.dumps(FLOOR_TICKS[engine]), str(_common.LOCK_KEY))
    else:
        # canonical_drain keeps a canonical install canonical; auto is the
        # default role, which on queue storage is what every Awa 0.6 runtime runs.
        role = "auto" if engine == "queue_storage" else "canonical_drain"
        argv = _common.awa_pg_runtime(dsn, role=role, leader_election_interval_ms=100)
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


async def run_engine(server: str, engine: str, seconds: float) -> dict[str, LeaderRun]:
    """Both leaders side by side on fresh databases of ``engine``."""
    databases = {kind: await make_database(server, engine) for kind in LEADERS}
    runs: dict[str, LeaderRun] = {}
    conn = await asyncpg.connect(f"{server}/postgres")
    try:
        started = time.monotonic()
        for kind in LEADERS:
            runs[kind] = LeaderRun(databases[kind], start_leader(kind, engine, f"{server}/{databases[kind]}"))
        for run in runs.values():
            while await conn.fetchval(LEADER_LOCK_HELD_SQL, run.database) != 1:
                if time.monotonic() - started > 60:
                    raise TimeoutError(f"no leader on {run.database}")
                await asyncio.sleep(0.05)
        await asyncio.sleep(max(0.0, started + STARTUP_SECONDS - time.monotonic()))
        for run in runs.values():
            run.after_startup = await sample(conn, run)
        await asyncio.sleep(max(0.0, started + seconds - time.monotonic()))
        for run in runs.values():
            run.end = await sample(conn, run)
        return runs
    finally:
        await conn.close()
        for run in runs.values():
            run.process.terminate()
        for run in runs.values():
            try:
                run.process.wait(10)
            except subprocess.TimeoutExpired:
                run.process.kill()
        for name in databases.values():
            await _common.drop_database(server, name)


def measures(run: LeaderRun, seconds: float) -> list[float]:
    assert run.after_startup is not None and run.end is not None
    window = seconds - STARTUP_SECONDS
    return [
        run.end.cpu,
        run.end.cpu - run.after_startup.cpu,
        run.end.peak_rss,
        (run.end.wakeups - run.after_startup.wakeups) / window,
        (run.end.transactions - run.after_startup.transactions) / window,
    ]


def print_table(engine: str, seconds: float, rounds: list[dict[str, LeaderRun]]) -> None:
    """One row per measure; with several rounds, each cell is the median of
    the rounds (and each ratio the median of the rounds' ratios)."""
    labels = (
        ("CPU, start-up included", "s", 2),
        (f"CPU, from {STARTUP_SECONDS:g} s in", "s", 2),
        ("peak RSS", "MiB", 1),
        ("wake-ups per second", "/s", 1),
        ("transactions per second", "/s", 1),
    )
    figures = [{kind: measures(runs[kind], seconds) for kind in LEADERS} for runs in rounds]
    others = [kind for kind in LEADERS if kind != "awa-pg"]
    shown = f"median of {len(rounds)} rounds" if len(rounds) > 1 else "one round"
    print(f"\nidle leader on {engine}, {seconds:g} s, default ticks, side by side, {shown}\n")
    print("| measure | awa-pg 0.6.1 | " + " | ".join(f"{kind} | ratio" for kind in others) + " |")
    print("| --- | --- |" + " --- | --- |" * len(others))
    for row, (label, unit, digits) in enumerate(labels):
        theirs = [round_["awa-pg"][row] for round_ in figures]
        cells = [f"{statistics.median(theirs):.{digits}f} {unit}"]
        for kind in others:
            if kind in FLOOR_LEADERS and label.startswith("transactions"):
                cells += ["-", "-"]  # an always-busy backend flushes its counts only at exit
                continue
            values = [round_[kind][row] for round_ in figures]
            ratios = [value / their for value, their in zip(values, theirs, strict=True) if their]
            ratio = f"{statistics.median(ratios):.2f}x" if ratios else "-"
            cells += [f"{statistics.median(values):.{digits}f} {unit}", ratio]
        print(f"| {label} | " + " | ".join(cells) + " |")


def compile_like_a_wheel_install() -> None:
    """pip compiles an installed wheel's modules; an editable checkout run
    with PYTHONDONTWRITEBYTECODE (as on this project's machines) compiles
    every module again at each start, about 45 ms of CPU that no installed
    leader pays. awa-pg comes from a wheel, so both start as installed."""
    package = Path(__file__).resolve().parent.parent / "awa_trio"
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(package)], check=True)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=120)
    parser.add_argument("--engine", action="append", choices=ENGINES)
    parser.add_argument("--rounds", type=int, default=1, help="repeat and print medians")
    parser.add_argument(
        "--server", default=_common.env_server()
    )
    args = parser.parse_args()
    compile_like_a_wheel_install()
    for engine in args.engine or ENGINES:
        rounds = [await run_engine(args.server, engine, args.seconds) for _ in range(args.rounds)]
        print_table(engine, args.seconds, rounds)


if __name__ == "__main__":
    asyncio.run(main())
