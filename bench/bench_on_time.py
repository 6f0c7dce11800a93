"""Jobs on time: how late a scheduled job becomes available, awa_trio beside
upstream's leader (an awa-pg 0.6.1 runtime leading), on each engine, and what
it costs the database. Prints figures, asserts nothing.

Lateness is measured by the database: a bench-only trigger on the table a
promoted job lands in (``awa.jobs_hot`` for an available row, queue
storage's ``ready_entries``) records ``clock_timestamp()`` minus the job's
due time (its run_at, also kept in its args as ``due``). With ``--workers``
each database also gets an awa-pg 0.6.1 worker on the bench queue, whose
handler prints its start minus the due time: end to end, through the
NOTIFY that wakes idle workers.

Each rate inserts ``rate * window`` jobs scheduled far ahead, starts every
leader on a database of its own (at the same time, so the noise of a
shared machine falls on all alike), then moves the jobs' run_at to distinct
times spread over ``window`` seconds from 2 s ahead (one slot per job, at a
random point in it). Cost, over the window: transactions per second of the
leader's database (pg_stat_database; every statement outside an explicit
transaction is one) and CPU of that database's backends (/proc), which are
the leader's (and the awa-pg runtime's worker's, for upstream).

``--idle-cost`` measures instead 100,000 jobs scheduled over the next hour
(about 28 come due a second) for ``--seconds``; with ``--idle-lead 3600``
the hour starts an hour ahead, so nothing comes due while measured.

``--cron`` measures instead cron fires: a schedule firing every second on
each leader's database (awa_trio's ``--periodic-job``, awa-pg's
``periodic()``), for ``--seconds``; a trigger records each fire's job
landing minus the second it belongs to (the fire time, while fires are less
than a second late).

``--baseline DIR`` adds awa_trio as it was before on-time promotion (polling
every promote_interval): DIR holds that version's ``awa_trio`` package, e.g.
``git archive <commit> awa_trio | tar -x -C DIR``.

    python bench/bench_on_time.py [--engine canonical --engine queue_storage]
        [--rate 10 --rate 100 --rate 1000] [--window 60] [--workers]
        [--baseline DIR] [--idle-cost [--seconds 60] [--idle-lead 3600]] [--cron [--seconds 60]]
        [--server URL]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime as dt
import os
import random
import subprocess
import time
from pathlib import Path

import _common
import asyncpg

ENGINES = ("canonical", "queue_storage")
RATES = (10, 100, 1000)
QUEUE = KIND = "bench_on_time"
FAR_AHEAD_SECONDS = 86_400.0
#: The first job falls due this long after its run_at is set: every leader
#: has probed (or polled) at least once by then.
LEAD_SECONDS = 2.0

LANDED_TABLE = "CREATE TABLE bench_landed (job_id bigint, lateness float8)"
LANDED_FUNCTION = """
    CREATE FUNCTION bench_record_landed() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        INSERT INTO bench_landed
        VALUES (NEW.{id}, extract(epoch FROM clock_timestamp()) - (NEW.args->>'due')::float8);
        RETURN NEW;
    END $$
"""
LANDED_TRIGGER = {
    "canonical": """CREATE TRIGGER bench_landed AFTER INSERT ON awa.jobs_hot FOR EACH ROW
                    WHEN (NEW.state = 'available' AND NEW.args ? 'due')
                    EXECUTE FUNCTION bench_record_landed()""",
    "queue_storage": """CREATE TRIGGER bench_landed AFTER INSERT ON awa.ready_entries FOR EACH ROW
                        WHEN (NEW.args ? 'due') EXECUTE FUNCTION bench_record_landed()""",
}
#: Sets each job's run_at (and its ``due`` argument) to $1 + its offset.
SET_DUE_SQL = {
    "canonical": "UPDATE awa.scheduled_jobs SET {assign} WHERE args ? 'offset'",
    "queue_storage": "UPDATE awa.deferred_jobs SET {assign} WHERE args ? 'offset'",
}
ASSIGN_DUE = ("run_at = to_timestamp($1 + (args->>'offset')::float8), "
              "args = args || jsonb_build_object('due', $1 + (args->>'offset')::float8)")
CRON_TRIGGER = {
    table: f"""CREATE TRIGGER bench_cron_landed AFTER INSERT ON {table} FOR EACH ROW
               WHEN (NEW.queue = '{QUEUE}' AND NEW.attempt = 0 AND NOT NEW.args ? 'due') EXECUTE FUNCTION bench_record_cron()"""
    for table in ("awa.jobs_hot", "awa.ready_entries")
}
CRON_FUNCTION = """
    CREATE FUNCTION bench_record_cron() RETURNS trigger LANGUAGE plpgsql AS $$
    DECLARE landed timestamptz := clock_timestamp();
    BEGIN
        INSERT INTO bench_landed VALUES (0, extract(epoch FROM landed - date_trunc('second', landed)));
        RETURN NEW;
    END $$
"""
CRON_EXPRESSION = "* * * * * *"
TRANSACTIONS_SQL = "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = $1"
BACKENDS_SQL = "SELECT pid FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()"
LEADER_LOCK_HELD_SQL = _common.lock_holders_sql("count(*)", database="$1")


@dataclasses.dataclass
class Leader:
    name: str
    dsn: str
    process: subprocess.Popen | None = None
    worker: asyncio.subprocess.Process | None = None
    worker_lines: list[str] = dataclasses.field(default_factory=list)
    cost_start: tuple[float, dict[int, float]] | None = None
    cost: tuple[float, float] | None = None  # transactions/s, backend CPU share

    @property
    def database(self) -> str:
        return _common.name_of(self.dsn)


def start_leader(name: str, dsn: str, baseline: str | None, cron: bool = False) -> subprocess.Popen:
    """An awa_trio leader, from this checkout or (the polling one) from
    ``baseline``: ``-m`` puts the working directory first on sys.path."""
    argv = _common.awa_trio_argv(dsn, "--leader-election-interval", "100ms", "--log-level", "WARNING")
    if cron:
        argv += ["--periodic-job", f"bench_cron={CRON_EXPRESSION};kind=bench_cron;queue={QUEUE}"]
    env = _common.repo_env()
    cwd = _common.ROOT
    if name == "awa_trio (polling)":
        assert baseline is not None
        cwd = Path(baseline).resolve()
        env["PYTHONPATH"] = os.pathsep.join([str(cwd), env["PYTHONPATH"]])
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=cwd)


def runtime_argv(dsn: str, engine: str, *, leads: bool, cron: bool = False) -> list[str]:
    """An awa-pg 0.6.1 runtime with a stamping worker on the bench queue:
    upstream's leader (``leads``), or a worker that never asks for the lock
    in the bench's time (awa_trio holds it anyway)."""
    # canonical_drain keeps a canonical install canonical; auto is what every
    # Awa 0.6 runtime runs on queue storage.
    role = "auto" if engine == "queue_storage" else "canonical_drain"
    options: dict[str, object] = {"cron": CRON_EXPRESSION} if cron else {}
    return _common.awa_pg_runtime(dsn, kind=KIND, queue=QUEUE, workers=20, mode="stamp", role=role,
                                  leader_election_interval_ms=100 if leads else 600_000, **options)


async def insert_jobs(dsn: str, count: int, window: float, lead: float = LEAD_SECONDS) -> None:
    """``count`` jobs far ahead, each with the offset of its own slot of the
    window (a random point in it, so run_at values are distinct), the window
    starting ``lead`` seconds after the run_at values are set."""
    import awa

    slot = window / count
    jobs = [{"offset": lead + (i + random.random()) * slot} for i in range(count)]

    def insert() -> None:
        client = awa.Client(dsn)
        run_at = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=FAR_AHEAD_SECONDS)
        for start in range(0, count, 10_000):
            client.insert_many_copy(jobs[start:start + 10_000], kind=KIND, queue=QUEUE, run_at=run_at)

    await asyncio.to_thread(insert)


async def backend_cpu(conn: asyncpg.Connection, database: str) -> dict[int, float]:
    cpu = {}
    for row in await conn.fetch(BACKENDS_SQL, database):
        try:
            cpu[row["pid"]] = _common.cpu_seconds(row["pid"])
        except (FileNotFoundError, ProcessLookupError):
            pass
    return cpu


async def cost_sample(conn: asyncpg.Connection, database: str) -> tuple[float, dict[int, float]]:
    return float(await conn.fetchval(TRANSACTIONS_SQL, database)), await backend_cpu(conn, database)


def cost_between(start: tuple[float, dict[int, float]], end: tuple[float, dict[int, float]],
                 seconds: float) -> tuple[float, float]:
    cpu = sum(value - start[1].get(pid, 0.0) for pid, value in end[1].items())
    return (end[0] - start[0]) / seconds, cpu / seconds


async def read_worker(leader: Leader) -> None:
    assert leader.worker is not None and leader.worker.stdout is not None
    while line := await leader.worker.stdout.readline():
        leader.worker_lines.append(line.decode(errors="replace"))


async def start_runtime(leader: Leader, engine: str, *, leads: bool, cron: bool = False) -> None:
    leader.worker = await _common.start_process(*runtime_argv(leader.dsn, engine, leads=leads, cron=cron))
    await _common.wait_for_output(leader.worker, "READY")


def quantiles(values: list[float]) -> str:
    if not values:
        return "no jobs"
    ms = [value * 1000 for value in values]
    return " | ".join(f"{_common.nearest_rank(ms, share):.1f}" for share in (0.5, 0.9, 0.99)) + \
        f" | {max(ms):.1f} | {len(ms)}"


async def run_case(server: str, template: str, engine: str, names: list[str], count: int, window: float,
                   baseline: str | None, workers: bool, measure_seconds: float | None = None,
                   lead: float = LEAD_SECONDS, cron: bool = False) -> list[Leader]:
    leaders = [Leader(name, await _common.copy_database(server, template, "awa_trio_bench_on_time"))
               for name in names]
    monitor = await asyncpg.connect(f"{server}/postgres")
    readers = []
    try:
        for leader in leaders:
            conn = await asyncpg.connect(leader.dsn)
            try:
                for sql in (LANDED_TABLE, LANDED_FUNCTION.format(id="id" if engine == "canonical" else "job_id"),
                            LANDED_TRIGGER[engine], CRON_FUNCTION,
                            CRON_TRIGGER["awa.jobs_hot" if engine == "canonical" else "awa.ready_entries"]):
                    await conn.execute(sql)
            finally:
                await conn.close()
            if count:
                await insert_jobs(leader.dsn, count, window, lead)
        for leader in leaders:
            if leader.name == "awa-pg":
                await start_runtime(leader, engine, leads=True, cron=cron)
                readers.append(asyncio.ensure_future(read_worker(leader)))
            else:
                leader.process = start_leader(leader.name, leader.dsn, baseline, cron=cron)
        deadline = time.monotonic() + 60
        for leader in leaders:
            while await monitor.fetchval(LEADER_LOCK_HELD_SQL, leader.database) != 1:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no leader on {leader.database}")
                await asyncio.sleep(0.05)
        if workers:
            for leader in leaders:
                if leader.name != "awa-pg":
                    await start_runtime(leader, engine, leads=False)
                    readers.append(asyncio.ensure_future(read_worker(leader)))
        await asyncio.sleep(1.0)
        for leader in leaders:
            conn = await asyncpg.connect(leader.dsn)
            try:
                base = await conn.fetchval("SELECT extract(epoch FROM now())::float8")
                await conn.execute(SET_DUE_SQL[engine].format(assign=ASSIGN_DUE), base)
            finally:
                await conn.close()
        # Cost over the window, from when the first job falls due.
        await asyncio.sleep(LEAD_SECONDS)
        if cron:  # not the fire each leader enqueues at once on election
            for leader in leaders:
                conn = await asyncpg.connect(leader.dsn)
                try:
                    await conn.execute("DELETE FROM bench_landed")
                finally:
                    await conn.close()
        for leader in leaders:
            leader.cost_start = await cost_sample(monitor, leader.database)
        started = time.monotonic()
        measured = measure_seconds if measure_seconds is not None else window
        await asyncio.sleep(measured)
        elapsed = time.monotonic() - started
        for leader in leaders:
            assert leader.cost_start is not None
            leader.cost = cost_between(leader.cost_start, await cost_sample(monitor, leader.database), elapsed)
        if measure_seconds is None:
            await asyncio.sleep(2.0)  # the last jobs' promotion and handlers
        return leaders
    finally:
        await monitor.close()
        for leader in leaders:
            _common.stop(leader.process)
            if leader.worker is not None:
                await _common.stop_process(leader.worker)
        for reader in readers:
            reader.cancel()


async def lateness_of(leader: Leader) -> list[float]:
    conn = await asyncpg.connect(leader.dsn)
    try:
        return [row[0] for row in await conn.fetch("SELECT lateness FROM bench_landed")]
    finally:
        await conn.close()


def handler_lateness(leader: Leader) -> list[float]:
    return [float(line.split()[2]) for line in leader.worker_lines if line.startswith("LATE ")]


async def lateness_bench(args: argparse.Namespace, engine: str, template: str, names: list[str]) -> None:
    print(f"\n## {engine}: lateness (ms) from run_at to available, by the database's clock")
    header = "| rate | leader | p50 | p90 | p99 | max | jobs | tx/s | backend CPU % |"
    header += " handler start p50 | p99 |"
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    for rate in args.rate or RATES:
        count = int(rate * args.window)
        leaders = await run_case(args.server, template, engine, names, count, args.window, args.baseline,
                                 args.workers)
        for leader in leaders:
            assert leader.cost is not None
            row = (f"| {rate}/s | {leader.name} | {quantiles(await lateness_of(leader))} | "
                   f"{leader.cost[0]:.1f} | {100 * leader.cost[1]:.1f} |")
            ends = handler_lateness(leader)
            row += (f" {_common.nearest_rank(ends, 0.5) * 1000:.1f} | "
                    f"{_common.nearest_rank(ends, 0.99) * 1000:.1f} |" if ends else " - | - |")
            print(row, flush=True)
            await _common.drop_database(args.server, leader.dsn)


async def idle_cost_bench(args: argparse.Namespace, engine: str, template: str, names: list[str]) -> None:
    when = "the next hour" if not args.idle_lead else f"the hour from {args.idle_lead:g} s ahead"
    print(f"\n## {engine}: 100,000 jobs scheduled over {when}, {args.seconds:g} s measured")
    print("| leader | tx/s | backend CPU % | promoted |")
    print("|---|---|---|---|")
    leaders = await run_case(args.server, template, engine, names, 100_000, 3600.0, args.baseline, False,
                             measure_seconds=args.seconds, lead=args.idle_lead or LEAD_SECONDS)
    for leader in leaders:
        assert leader.cost is not None
        print(f"| {leader.name} | {leader.cost[0]:.1f} | {100 * leader.cost[1]:.2f} | "
              f"{len(await lateness_of(leader))} |", flush=True)
        await _common.drop_database(args.server, leader.dsn)


async def cron_bench(args: argparse.Namespace, engine: str, template: str, names: list[str]) -> None:
    print(f"\n## {engine}: lateness (ms) of a per-second cron schedule's fires, {args.seconds:g} s")
    print("| leader | p50 | p90 | p99 | max | fires |")
    print("|---|---|---|---|---|---|")
    leaders = await run_case(args.server, template, engine, names, 0, 1.0, args.baseline, False,
                             measure_seconds=args.seconds, cron=True)
    for leader in leaders:
        print(f"| {leader.name} | {quantiles(await lateness_of(leader))} |", flush=True)
        await _common.drop_database(args.server, leader.dsn)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engine", action="append", choices=ENGINES)
    parser.add_argument("--rate", action="append", type=int, help="jobs per second (default 10, 100, 1000)")
    parser.add_argument("--window", type=float, default=60.0, help="seconds the due times spread over")
    parser.add_argument("--workers", action="store_true", help="end to end, with an awa-pg worker")
    parser.add_argument("--baseline", help="a directory holding awa_trio before on-time promotion")
    parser.add_argument("--leader", action="append", choices=("awa_trio", "awa-pg"),
                        help="leaders to run (default both; --baseline adds the polling awa_trio)")
    parser.add_argument("--idle-cost", action="store_true")
    parser.add_argument("--seconds", type=float, default=60.0, help="measured seconds of --idle-cost")
    parser.add_argument("--idle-lead", type=float, default=0.0,
                        help="--idle-cost: the first job falls due this many seconds ahead (default 2)")
    parser.add_argument("--cron", action="store_true", help="cron fire lateness instead")
    parser.add_argument("--server", default=_common.env_server())
    args = parser.parse_args()
    names = list(args.leader or ("awa_trio", "awa-pg"))
    if args.baseline:
        names.append("awa_trio (polling)")
    for engine in args.engine or ENGINES:
        template = await _common.make_template(args.server, "awa_trio_bench_on_time",
                                               queue_storage=engine == "queue_storage")
        try:
            if args.cron:
                await cron_bench(args, engine, template, names)
            elif args.idle_cost:
                await idle_cost_bench(args, engine, template, names)
            else:
                await lateness_bench(args, engine, template, names)
        finally:
            await _common.drop_database(args.server, template)


if __name__ == "__main__":
    asyncio.run(main())
