"""Exactly-once by id: what a producer inserted against what the workers ran.

The producer (awa-pg's own client) keeps the id of every job it inserts and
the attempts that job must run; the worker (support/awa_pg_ledger_worker.py,
a real awa-pg runtime) writes ``(job_id, attempt)`` to a ledger table each
time a handler starts. Comparing the two by id finds a lost job (an attempt
that never ran) or a doubled one (an attempt that ran twice, or an attempt
that should not exist), which counts of terminal rows can hide.

Shared by tests/test_exactly_once.py and bench/bench_exactly_once.py.
"""

from __future__ import annotations

import collections
import dataclasses
import random
import sys
from pathlib import Path

LEDGER_WORKER_SCRIPT = Path(__file__).with_name("awa_pg_ledger_worker.py")

CREATE_LEDGER_SQL = """
    CREATE SCHEMA IF NOT EXISTS awa_test_ledger;
    CREATE TABLE IF NOT EXISTS awa_test_ledger.runs (
        job_id bigint NOT NULL,
        attempt int NOT NULL,
        kind text NOT NULL,
        ran_at timestamptz NOT NULL DEFAULT clock_timestamp()
    );
"""

#: Attempts each kind runs (``fail`` is inserted with max_attempts 2).
ATTEMPTS = {"ok": 1, "retry": 2, "fail": 2, "slow": 1, "callback": 1}
FAIL_MAX_ATTEMPTS = 2
#: States from which a job still has to run or finish.
LIVE_STATES = ("available", "running", "scheduled", "retryable", "waiting_external")


@dataclasses.dataclass(frozen=True)
class Mix:
    """Share of each kind in a producer batch (the rest is ``ok``)."""

    retry: float = 0.05
    fail: float = 0.0
    slow: float = 0.0
    callback: float = 0.0

    def kinds(self, count: int, rng: random.Random) -> list[str]:
        weights = {"retry": self.retry, "fail": self.fail, "slow": self.slow, "callback": self.callback}
        kinds = []
        for _ in range(count):
            roll, kind = rng.random(), "ok"
            for name, share in weights.items():
                if roll < share:
                    kind = name
                    break
                roll -= share
            kinds.append(kind)
        return kinds


#: The richer mix of the soak: retries, terminal failures, slow jobs, callbacks.
MIXED = Mix(retry=0.05, fail=0.02, slow=0.03, callback=0.02)


@dataclasses.dataclass
class Inserted:
    """Every job a producer inserted: id -> kind."""

    kinds: dict[int, str] = dataclasses.field(default_factory=dict)

    def add(self, jobs, kind: str) -> None:
        for job in jobs:
            self.kinds[job.id] = kind

    def expected_runs(self) -> collections.Counter:
        return collections.Counter(
            (job_id, attempt)
            for job_id, kind in self.kinds.items()
            for attempt in range(1, ATTEMPTS[kind] + 1)
        )

    def expected_total(self) -> int:
        return sum(ATTEMPTS[kind] for kind in self.kinds.values())


def insert_batch(client, inserted: Inserted, *, queue: str, size: int, mix: Mix, rng: random.Random,
                 single: bool = False) -> int:
    """One producer step with awa-pg's sync client: ``size`` jobs of the mix,
    one ``insert_many_copy`` per kind, or (``single``) one ``insert`` each."""
    by_kind = collections.Counter(mix.kinds(size, rng))
    for kind, count in by_kind.items():
        options = {"max_attempts": FAIL_MAX_ATTEMPTS} if kind == "fail" else {}
        if single:
            jobs = [client.insert({"n": n}, kind=kind, queue=queue, **options) for n in range(count)]
        else:
            jobs = client.insert_many_copy([{"n": n} for n in range(count)], kind=kind, queue=queue,
                                           **options)
        inserted.add(jobs, kind)
    return size


RUNS_SQL = "SELECT job_id, attempt FROM awa_test_ledger.runs"
RUN_COUNT_SQL = "SELECT count(*) FROM awa_test_ledger.runs"
LIVE_JOBS_SQL = "SELECT id AS job_id, state::text AS state FROM awa.jobs WHERE state::text = ANY($1::text[])"


@dataclasses.dataclass
class Verdict:
    inserted: int
    expected_runs: int
    ran: int
    #: (job id, attempt) that never ran.
    lost: list[tuple[int, int]]
    #: (job id, attempt) that ran more often than once, or should not have run.
    doubled: list[tuple[int, int]]

    @property
    def lost_jobs(self) -> list[int]:
        return sorted({job_id for job_id, _attempt in self.lost})

    @property
    def exactly_once(self) -> bool:
        return not self.lost and not self.doubled

    def describe(self) -> str:
        return (
            f"{self.inserted} jobs inserted, {self.expected_runs} runs expected, {self.ran} ran: "
            f"{len(self.lost_jobs)} jobs lost (first ids {self.lost_jobs[:20]}), "
            f"{len(self.doubled)} runs doubled (first {sorted(self.doubled)[:20]})"
        )


def judge(inserted: Inserted, runs) -> Verdict:
    """Compare the ledger rows (``job_id``, ``attempt``) with what was inserted."""
    expected = inserted.expected_runs()
    actual = collections.Counter((row["job_id"], row["attempt"]) for row in runs)
    lost = sorted(key for key in expected if key not in actual)
    doubled = sorted(key for key, count in actual.items() if count > expected.get(key, 0))
    return Verdict(
        inserted=len(inserted.kinds),
        expected_runs=sum(expected.values()),
        ran=sum(actual.values()),
        lost=lost,
        doubled=doubled,
    )


def worker_command(dsn: str, queues: list[str], *, role: str = "auto", lead: bool = False,
                   workers: int = 16, start_options: dict[str, int] | None = None) -> list[str]:
    command = [sys.executable, str(LEDGER_WORKER_SCRIPT), dsn, "--role", role, "--workers", str(workers)]
    for queue in queues:
        command += ["--queue", queue]
    if lead:
        command.append("--lead")
    for name, value in (start_options or {}).items():
        command += ["--start-option", f"{name}={value}"]
    return command
