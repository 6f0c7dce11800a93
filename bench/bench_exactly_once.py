"""Exactly-once soak and what maintenance costs a producer, per leader (issue 15).

For each leader in turn (upstream's: an awa-pg 0.6.1 runtime; then
awa_trio, ``python -m awa_trio``), on a fresh database of the chosen engine:
one awa-pg worker (never leading) runs three queues and writes each
(job id, attempt) it runs to a ledger; a producer (awa-pg's AsyncClient)
enqueues the mixed workload at a steady rate: ``insert_many_copy`` batches
and single ``insert`` calls, with retries (RetryAfter on attempt 1),
terminal failures (two failed attempts), 0.3 s jobs and callbacks completed
0.2 s after they park. Afterwards the ledger is compared with what was
inserted, by id.

Prints, per leader:
- jobs lost (an expected attempt never ran) and runs doubled;
- inserts per second the producer achieved, and p50/p99 latency of its
  COPY batches and single inserts;
- the share of ``pg_stat_activity`` samples (every 50 ms) in which a
  leader's backend waits on a producer's, or a producer's on a leader's
  (``pg_blocking_pids``);
- the longest queue-ring stall (queue storage) and the peak terminal
  history (done rows on queue storage, terminal rows of jobs_hot on
  canonical), sampled every second.

    python bench/bench_exactly_once.py [--seconds 600] [--rate 250]
        [--engine queue_storage|canonical] [--short-intervals]
        [--leaders awa-pg,awa_trio] [--server postgresql://postgres@localhost:5432]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import random
import statistics
import sys
import time
from pathlib import Path

import _common
import asyncpg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from support.ledger import (
    CREATE_LEDGER_SQL,
    LIVE_STATES,
    MIXED,
    RUN_COUNT_SQL,
    RUNS_SQL,
    Inserted,
    judge,
    worker_command,
)
from support.qs_load import RingSamples

# Importing awa_trio imports trio_asyncio, which replaces asyncio's event loop
# policy: this bench's figures in bench/README.md were measured with it in place.
import awa_trio  # noqa: F401

QUEUES = ["soak_a", "soak_b", "soak_c"]
TICK = 0.2
SINGLES_PER_TICK = 2
#: The issue's short ring intervals (ms): queue, lease, claim, promote, rollup.
SHORT_INTERVALS_MS = {"queue": 200, "lease": 100, "claim": 200, "promote": 100, "rollup": 500}
ROLES = {"producer": "bench_producer", "worker": "bench_worker", "leader": "bench_leader"}

ACTIVITY_SQL = """
    SELECT pid, application_name, pg_blocking_pids(pid) AS blockers,
           coalesce(wait_event_type || ':' || wait_event, 'cpu') AS wait
    FROM pg_stat_activity
    WHERE datname = current_database() AND state <> 'idle' AND pid <> pg_backend_pid()
"""
APPLICATIONS_SQL = "SELECT pid, application_name FROM pg_stat_activity WHERE datname = current_database()"
LIVE_COUNT_SQL = "SELECT count(*) FROM awa.jobs WHERE state::text = ANY($1::text[])"
TERMINAL_HISTORY_SQL = {
    "queue_storage": "SELECT count(*) FROM awa.done_entries",
    "canonical": "SELECT count(*) FROM awa.jobs_hot WHERE state IN ('completed', 'failed', 'cancelled')",
}
QUEUE_GENERATION_SQL = "SELECT generation AS queue, 0 AS lease, 0 AS claim, 0 AS done_rows FROM awa.queue_ring_state"

def as_role(dsn: str, role: str) -> str:
    """The DSN with an application_name that tells the role's backends apart."""
    return f"{dsn}{'&' if '?' in dsn else '?'}application_name={ROLES[role]}"


def role_of(application_name: str) -> str:
    if application_name.startswith("awa_trio") or application_name == ROLES["leader"]:
        return "leader"
    for role, name in ROLES.items():
        if application_name == name:
            return role
    return "other"


async def start_leader(kind: str, dsn: str, role: str, short: bool) -> asyncio.subprocess.Process:
    if kind == "awa-pg":
        options = {}
        if short:
            options = {
                "queue_storage_queue_rotate_interval_ms": SHORT_INTERVALS_MS["queue"],
                "queue_storage_lease_rotate_interval_ms": SHORT_INTERVALS_MS["lease"],
                "queue_storage_claim_rotate_interval_ms": SHORT_INTERVALS_MS["claim"],
                "promote_interval_ms": SHORT_INTERVALS_MS["promote"],
                "terminal_count_rollup_interval_ms": SHORT_INTERVALS_MS["rollup"],
            }
        leader = await _common.start_process(*worker_command(
            as_role(dsn, "leader"), ["bench_leader_idle"], role=role, lead=True, workers=1,
            start_options=options))
        await _common.wait_for_output(leader, "READY")
        conn = await asyncpg.connect(dsn)
        try:
            for _ in range(300):
                if await conn.fetchval(_common.LOCK_HELD_SQL):
                    break
                await asyncio.sleep(0.1)
        finally:
            await conn.close()
    else:
        argv = _common.awa_trio_argv(dsn, "--failed-retention", "1h")
        if short:
            argv += [
                "--queue-rotate-interval", f"{SHORT_INTERVALS_MS['queue']}ms",
                "--lease-rotate-interval", f"{SHORT_INTERVALS_MS['lease']}ms",
                "--claim-rotate-interval", f"{SHORT_INTERVALS_MS['claim']}ms",
                "--promote-interval", f"{SHORT_INTERVALS_MS['promote']}ms",
                "--terminal-count-rollup-interval", f"{SHORT_INTERVALS_MS['rollup']}ms",
            ]
        leader = await _common.start_process(*argv)
        await _common.wait_for_output(leader, "elected maintenance leader")
    return leader


class Producer:
    """awa-pg's AsyncClient enqueueing the mix at a steady rate."""

    def __init__(self, dsn: str, rate: int):
        import awa

        self.client = awa.AsyncClient(as_role(dsn, "producer"))
        self.batch = max(1, int(rate * TICK) - SINGLES_PER_TICK)
        self.inserted = Inserted()
        self.latency: dict[str, list[float]] = {"copy": [], "single": []}
        self.rng = random.Random(15)
        self.elapsed = 0.0

    async def run(self, seconds: float) -> None:
        started = time.monotonic()
        tick = 0
        while time.monotonic() - started < seconds:
            queue = QUEUES[tick % len(QUEUES)]
            for kind, count in collections.Counter(MIXED.kinds(self.batch, self.rng)).items():
                options = {"max_attempts": 2} if kind == "fail" else {}
                began = time.monotonic()
                jobs = await self.client.insert_many_copy(
                    [{"n": n} for n in range(count)], kind=kind, queue=queue, **options)
                self.latency["copy"].append(time.monotonic() - began)
                self.inserted.add(jobs, kind)
            for kind in MIXED.kinds(SINGLES_PER_TICK, self.rng):
                options = {"max_attempts": 2} if kind == "fail" else {}
                began = time.monotonic()
                job = await self.client.insert({"n": 0}, kind=kind, queue=queue, **options)
                self.latency["single"].append(time.monotonic() - began)
                self.inserted.add([job], kind)
            tick += 1
            await asyncio.sleep(max(0.0, started + tick * TICK - time.monotonic()))
        self.elapsed = time.monotonic() - started


class Sampler:
    """Contention every 50 ms; ring generation and terminal history too."""

    def __init__(self, engine: str):
        self.engine = engine
        self.samples = 0
        self.leader_waits_on_producer = 0
        self.producer_waits_on_leader = 0
        self.producer_active = 0
        #: What the producer's active statements were doing, by wait event.
        self.producer_waits: collections.Counter = collections.Counter()
        self.ring = RingSamples()
        self.terminal_history: list[int] = []
        #: CPU seconds of each server backend seen, and its role.
        self.backend_cpu: dict[int, float] = {}
        self.backend_role: dict[int, str] = {}

    async def run(self, dsn: str, stop_event: asyncio.Event) -> None:
        conn = await asyncpg.connect(dsn)
        roles: dict[int, str] = {}
        last_history = 0.0
        try:
            while not stop_event.is_set():
                rows = await conn.fetch(ACTIVITY_SQL)
                if any(row["pid"] not in roles for row in rows):
                    roles = {r["pid"]: role_of(r["application_name"] or "") for r in await conn.fetch(APPLICATIONS_SQL)}
                self.count(rows, roles)
                now = time.monotonic()
                if self.engine == "queue_storage":
                    self.ring.add(now, await conn.fetchrow(QUEUE_GENERATION_SQL))
                if now - last_history >= 1:
                    self.terminal_history.append(await conn.fetchval(TERMINAL_HISTORY_SQL[self.engine]))
                    self.read_backend_cpu(roles)
                    last_history = now
                await asyncio.sleep(0.05)
        finally:
            await conn.close()

    def read_backend_cpu(self, roles: dict[int, str]) -> None:
        """The server runs on this machine: a backend's CPU time is in /proc
        (kept per pid, as a pooled connection may close before the end)."""
        for pid, role in roles.items():
            seconds = process_cpu_seconds(pid)
            if seconds is not None:
                self.backend_cpu[pid] = seconds
                self.backend_role[pid] = role

    def server_cpu(self, role: str) -> float:
        return sum(cpu for pid, cpu in self.backend_cpu.items() if self.backend_role[pid] == role)

    def count(self, rows, roles: dict[int, str]) -> None:
        self.samples += 1
        leader_waits = producer_waits = producer_active = False
        for row in rows:
            role = roles.get(row["pid"], "other")
            blockers = {roles.get(pid, "other") for pid in row["blockers"]}
            producer_active |= role == "producer"
            if role == "producer":
                self.producer_waits[row["wait"]] += 1
            leader_waits |= role == "leader" and "producer" in blockers
            producer_waits |= role == "producer" and "leader" in blockers
        self.leader_waits_on_producer += leader_waits
        self.producer_waits_on_leader += producer_waits
        self.producer_active += producer_active

    def share(self, count: int) -> str:
        return f"{100 * count / max(1, self.samples):.1f} %"


def process_cpu_seconds(pid: int) -> float | None:
    """User plus system CPU time of a local process, or None once it is gone."""
    try:
        return _common.cpu_seconds(pid)
    except OSError:
        return None


async def settle(dsn: str, expected: int, timeout: float) -> None:
    """Until every expected run is in the ledger (the awa.jobs view, which
    says what is live, costs seconds to minutes on a large queue-storage
    database: it is asked once the ledger is complete)."""
    conn = await asyncpg.connect(dsn)
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if await conn.fetchval(RUN_COUNT_SQL) >= expected:
                break
            await asyncio.sleep(1)
        await asyncio.sleep(5)  # a run doubled late, or a completion still in flight, has time to show
    finally:
        await conn.close()


async def run_one(kind: str, args) -> dict:
    dsn = await _common.create_database(args.server, _common.scratch_name("awa_trio_bench_eo"),
                                        queue_storage=args.engine == "queue_storage")
    role = "auto" if args.engine == "queue_storage" else "canonical_drain"
    processes, drains = [], []
    try:
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute(CREATE_LEDGER_SQL)
        finally:
            await conn.close()
        leader = await start_leader(kind, dsn, role, args.short_intervals)
        processes.append(leader)
        # awa_trio logs the first yield of each episode (statement_lock_timeout).
        yields: list[str] = []
        drains.append(asyncio.ensure_future(_common.drain_output(leader, yields, ": yielded to a lock")))
        worker = await _common.start_process(*worker_command(as_role(dsn, "worker"), QUEUES, role=role))
        processes.append(worker)
        await _common.wait_for_output(worker, "READY")
        drains.append(asyncio.ensure_future(_common.drain_output(worker)))

        producer = Producer(dsn, args.rate)
        sampler = Sampler(args.engine)
        stop_event = asyncio.Event()
        sampling = asyncio.ensure_future(sampler.run(dsn, stop_event))
        await producer.run(args.seconds)
        stop_event.set()
        await sampling
        leader_cpu = process_cpu_seconds(leader.pid)
        await settle(dsn, producer.inserted.expected_total(), timeout=180)
        conn = await asyncpg.connect(dsn)
        try:
            verdict = judge(producer.inserted, await conn.fetch(RUNS_SQL))
            live = await conn.fetchval(LIVE_COUNT_SQL, list(LIVE_STATES))
        finally:
            await conn.close()
        if yields:
            by_branch = collections.Counter(line.split(" yielded to a lock on ")[0].rsplit(" ", 1)[-1] + " on "
                                            + line.split(" yielded to a lock on ")[1].split(" held by")[0]
                                            for line in yields)
            print(f"{kind} yield episodes: {dict(by_branch)}")
        return {"leader": kind, "producer": producer, "sampler": sampler, "verdict": verdict, "live": live,
                "leader_cpu": leader_cpu, "yields": len(yields)}
    finally:
        for process in processes:
            await _common.stop_process(process)
        await _common.drop_database(args.server, dsn)


def percentile(values: list[float], q: float) -> float:
    if len(values) < 2:
        return values[0] if values else 0.0
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


def report(results: list[dict], args) -> None:
    intervals = "the issue's short intervals" if args.short_intervals else "default intervals"
    print(f"\nexactly-once soak on {args.engine}: {args.rate} jobs/s for {args.seconds:g} s, {intervals}, "
          f"mix {MIXED}\n")
    print("| measure | " + " | ".join(r["leader"] for r in results) + " |")
    print("| --- |" + " --- |" * len(results))

    def row(label: str, cell) -> None:
        print(f"| {label} | " + " | ".join(cell(r) for r in results) + " |")

    row("jobs inserted", lambda r: str(r["verdict"].inserted))
    row("jobs lost", lambda r: str(len(r["verdict"].lost_jobs)))
    row("runs doubled", lambda r: str(len(r["verdict"].doubled)))
    row("jobs left live", lambda r: str(r["live"]))
    row("inserts per second", lambda r: f"{r['verdict'].inserted / r['producer'].elapsed:.1f}")
    for call in ("copy", "single"):
        row(f"{call} enqueue p50 / p99",
            lambda r, call=call: f"{1000 * percentile(r['producer'].latency[call], 50):.1f} / "
                                 f"{1000 * percentile(r['producer'].latency[call], 99):.1f} ms")
    row("samples: leader waits on producer",
        lambda r: r["sampler"].share(r["sampler"].leader_waits_on_producer))
    row("samples: producer waits on leader",
        lambda r: r["sampler"].share(r["sampler"].producer_waits_on_leader))
    row("samples: producer statement active", lambda r: r["sampler"].share(r["sampler"].producer_active))
    row("leader yield episodes (statement_lock_timeout)", lambda r: str(r["yields"]))
    row("leader process CPU (load window)", lambda r: f"{r['leader_cpu']:.1f} s")
    for role in ("leader", "producer", "worker"):
        row(f"server CPU of {role} backends", lambda r, role=role: f"{r['sampler'].server_cpu(role):.1f} s")
    if args.engine == "queue_storage":
        row("queue ring: longest stall", lambda r: f"{r['sampler'].ring.longest_stall('queue'):.2f} s")
    row("peak terminal history (rows)", lambda r: str(max(r["sampler"].terminal_history, default=0)))
    for r in results:
        waits = r["sampler"].producer_waits
        total = max(1, sum(waits.values()))
        print(f"\n{r['leader']}: producer statements by wait: "
              + ", ".join(f"{name} {100 * n / total:.0f} %" for name, n in waits.most_common(6)))
    for r in results:
        if not r["verdict"].exactly_once:
            print(f"\n{r['leader']}: {r['verdict'].describe()}")


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rate", type=int, default=250)
    parser.add_argument("--seconds", type=float, default=600)
    parser.add_argument("--engine", choices=("queue_storage", "canonical"), default="queue_storage")
    parser.add_argument("--short-intervals", action="store_true",
                        help="queue/lease/claim rotation 200/100/200 ms, promotion 100 ms, rollup 500 ms")
    parser.add_argument("--server", default=_common.env_server())
    parser.add_argument("--leaders", default="awa-pg,awa_trio")
    parser.add_argument("--rounds", type=int, default=1,
                        help="repeat, reversing the leaders' order every other round; medians of the rates")
    args = parser.parse_args()
    leaders = args.leaders.split(",")
    rates: dict[str, list[float]] = {kind: [] for kind in leaders}
    for round_number in range(args.rounds):
        order = leaders if round_number % 2 == 0 else leaders[::-1]
        results = [await run_one(kind, args) for kind in order]
        report(results, args)
        for r in results:
            rates[r["leader"]].append(r["verdict"].inserted / r["producer"].elapsed)
    if args.rounds > 1:
        print(f"\ninserts per second over {args.rounds} rounds (median; each round): "
              + "; ".join(f"{kind} {statistics.median(values):.1f} ({', '.join(f'{v:.1f}' for v in values)})"
                          for kind, values in rates.items()))


if __name__ == "__main__":
    asyncio.run(main())
