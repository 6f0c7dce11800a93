"""A small mixed cluster for chaos runs (tests and benches): awa_trio
candidates and awa-pg 0.6.1 runtimes as separate processes, a 20 Hz pg_locks
timeline, the flapping loop that keeps deposing the leader, and the checks on
what the cluster did (cron fires, scheduled jobs)."""

from __future__ import annotations

import dataclasses
import functools
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import urllib.parse
from pathlib import Path

import trio

from support.helpers import leader_lock_holders

SUPPORT = Path(__file__).parent
REPO_ROOT = SUPPORT.parent.parent
CANDIDATE_SCRIPT = SUPPORT / "awa_pg_candidate.py"
WORKER_SCRIPT = SUPPORT / "awa_pg_worker.py"

#: application_name of every backend of an awa-pg candidate (sqlx takes it from the URL).
UPSTREAM_APPLICATION_NAME = "chaos awa-pg candidate"
AWA_TRIO_LOCK_NAME = re.compile(r"^awa_trio \S+:(\d+) lock$")

CRON_NAME = "flap_tick"
CRON_QUEUE = "flap_cron"
CRON_EXPR = "* * * * * *"

HOLDER_NAMES_SQL = "SELECT pid, application_name FROM pg_stat_activity WHERE pid = ANY($1::int[])"


def with_application_name(database_url: str, name: str) -> str:
    separator = "&" if "?" in database_url else "?"
    return f"{database_url}{separator}application_name={urllib.parse.quote(name)}"


def child_env() -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    return env


class ManagedProcess:
    """One cluster member: started, SIGKILLed and restarted by the harness;
    any exit the harness did not cause is recorded as unexpected."""

    def __init__(self, label: str, argv: list[str], *, prints_ready: bool = False, upstream: bool = False):
        self.label = label
        self.argv = argv
        self.prints_ready = prints_ready
        self.is_upstream = upstream
        self.process: trio.Process | None = None
        self.lines: list[str] = []
        self.starts = 0
        self.kills = 0
        self.unexpected_exits: list[str] = []
        self._killed_by_harness = False
        self._ready = trio.Event()

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    async def start(self, nursery: trio.Nursery) -> None:
        self._killed_by_harness = False
        self._ready = trio.Event()
        self.process = await trio.lowlevel.open_process(
            self.argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=child_env())
        self.starts += 1
        nursery.start_soon(self._read, self.process)
        nursery.start_soon(self._watch, self.process)

    async def wait_ready(self, timeout: float = 30) -> None:
        """Until READY (awa-pg children print it); others are ready once started."""
        with trio.fail_after(timeout):
            await self._ready.wait()

    def kill(self) -> None:
        assert self.process is not None
        self._killed_by_harness = True
        self.kills += 1
        self.process.send_signal(signal.SIGKILL)

    async def stop(self) -> None:
        """SIGKILL (end of a run: nothing to hand over) and reap."""
        if self.process is not None and self.process.returncode is None:
            self.kill()
        if self.process is not None:
            with trio.move_on_after(5, shield=True):
                await self.process.wait()

    async def _read(self, process: trio.Process) -> None:
        buffer = b""
        async for chunk in process.stdout:
            buffer += chunk
            while b"\n" in buffer:
                raw, buffer = buffer.split(b"\n", 1)
                line = raw.decode(errors="replace")
                self.lines.append(line)
                if line.startswith("READY"):
                    self._ready.set()

    async def _watch(self, process: trio.Process) -> None:
        if not self.prints_ready:
            self._ready.set()
        code = await process.wait()
        if not self._killed_by_harness:
            self.unexpected_exits.append(f"{self.label} exited {code}: {self.lines[-5:]}")


def awa_trio_candidate(label: str, database_url: str, *flags: str, with_cron: bool = True) -> ManagedProcess:
    argv = [sys.executable, "-m", "awa_trio", "--database-url", database_url, "--log-level", "INFO"]
    if with_cron:
        argv += ["--periodic-job", f"{CRON_NAME}={CRON_EXPR};kind={CRON_NAME};queue={CRON_QUEUE}"]
    return ManagedProcess(label, [*argv, *flags])


def awa_pg_candidate(label: str, database_url: str, election_interval_ms: int = 500,
                     with_cron: bool = True) -> ManagedProcess:
    argv = [sys.executable, str(CANDIDATE_SCRIPT), with_application_name(database_url, UPSTREAM_APPLICATION_NAME),
            "--election-interval-ms", str(election_interval_ms)]
    if with_cron:
        argv += ["--periodic", f"{CRON_NAME}={CRON_EXPR}:{CRON_QUEUE}"]
    return ManagedProcess(label, argv, prints_ready=True, upstream=True)


def awa_pg_consumer(label: str, database_url: str, kind: str, queue: str, max_workers: int = 4) -> ManagedProcess:
    """A worker that never leads: maintenance muted and its next election try
    ten minutes away (start it while someone holds the lock)."""
    argv = [sys.executable, str(WORKER_SCRIPT), database_url, "--kind", f"{kind}:{queue}",
            "--max-workers", str(max_workers), "--mute-maintenance",
            "--leader-election-interval-ms", "600000"]
    return ManagedProcess(label, argv, prints_ready=True)


async def lock_owner(admin, members: list[ManagedProcess]) -> tuple[int, ManagedProcess | None] | None:
    """(backend pid, member) holding the leader lock now; None when nobody
    holds it; the member is None when the holder is none of ``members``."""
    holders = await leader_lock_holders(admin)
    if not holders:
        return None
    rows = await admin.fetch(HOLDER_NAMES_SQL, holders)
    for row in rows:
        name = row["application_name"]
        match = AWA_TRIO_LOCK_NAME.match(name)
        for member in members:
            if member.process is None or member.process.returncode is not None:
                continue
            if (match and int(match.group(1)) == member.pid) or (
                    name == UPSTREAM_APPLICATION_NAME and member.is_upstream):
                return row["pid"], member
    return holders[0], None


async def wait_for_new_holder(admin, old: set[int], timeout: float, poll: float = 0.005) -> tuple[float, int]:
    """(trio time, pid) when a holder not in ``old`` appears."""
    with trio.fail_after(timeout):
        while True:
            holders = await leader_lock_holders(admin)
            if holders and not set(holders) & old:
                return trio.current_time(), holders[0]
            await trio.sleep(poll)


async def start_cluster(admin, members: list[ManagedProcess], consumer: ManagedProcess,
                        nursery: trio.Nursery, *, first_leader_within: float) -> None:
    """Start every candidate, wait until one of them holds the lock, then the
    consumer; return once all of them say they are ready."""
    for member in members:
        await member.start(nursery)
    with trio.fail_after(first_leader_within):
        while await lock_owner(admin, members) is None:
            await trio.sleep(0.05)
    await consumer.start(nursery)
    await consumer.wait_ready()
    for member in members:
        await member.wait_ready()


class LockTimeline:
    """pg_locks holders of the leader key sampled at ``hz`` (run it in a nursery)."""

    def __init__(self, db, hz: float = 20):
        self.db = db
        self.period = 1 / hz
        self.samples: list[tuple[float, tuple[int, ...]]] = []

    async def run(self) -> None:
        while True:
            holders = tuple(await leader_lock_holders(self.db))
            self.samples.append((trio.current_time(), holders))
            await trio.sleep(self.period)

    @property
    def doubles(self) -> list[tuple[float, tuple[int, ...]]]:
        return [sample for sample in self.samples if len(sample[1]) > 1]

    def leaderless_episodes(self, since: float = float("-inf")) -> list[float]:
        """Durations from the first sample with no holder to the next sample
        with one (an episode still open at the end runs to the last sample)."""
        episodes, began = [], None
        for when, holders in self.samples:
            if when < since:
                continue
            if not holders and began is None:
                began = when
            elif holders and began is not None:
                episodes.append(when - began)
                began = None
        if began is not None:
            episodes.append(self.samples[-1][0] - began)
        return episodes


#: Statements awa-pg candidates' backends finished since $2, with
#: whether an awa-pg candidate held the leader lock at that sample.
UPSTREAM_ACTIVITY_SQL = """
    SELECT a.state_change, left(a.query, 200) AS query,
           EXISTS (SELECT 1 FROM pg_locks l JOIN pg_stat_activity h USING (pid)
                   WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
                     AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
                     AND (l.classid::bigint << 32 | l.objid::bigint) = $3
                     AND h.application_name = $1) AS upstream_holds
    FROM pg_stat_activity a
    WHERE a.datname = current_database() AND a.application_name = $1 AND a.state_change > $2
      AND a.state <> 'active'
"""
#: Maintenance statements of upstream's leader, by what they touch.
UPSTREAM_MAINTENANCE_WORK = {
    "promote": re.compile(r"scheduled_jobs", re.IGNORECASE),
    "cron fire": re.compile(r"UPDATE\s+awa\.cron_jobs", re.IGNORECASE),
}


class UpstreamActivity:
    """Maintenance statements an awa-pg candidate ran while it did not hold
    the leader lock (upstream 0.6.1 keeps leading after its lock backend
    dies, until its 30 s check fails). Sampled at ``hz``: a lower bound."""

    def __init__(self, db, hz: float = 20):
        self.db = db
        self.period = 1 / hz
        self.without_lock: dict[str, int] = dict.fromkeys(UPSTREAM_MAINTENANCE_WORK, 0)
        self.with_lock: dict[str, int] = dict.fromkeys(UPSTREAM_MAINTENANCE_WORK, 0)

    async def run(self) -> None:
        from awa_trio.leadership import LOCK_KEY

        seen_until = await self.db.fetchval("SELECT clock_timestamp()")
        while True:
            rows = await self.db.fetch(UPSTREAM_ACTIVITY_SQL, UPSTREAM_APPLICATION_NAME, seen_until, LOCK_KEY)
            for row in rows:
                seen_until = max(seen_until, row["state_change"])
                for work, pattern in UPSTREAM_MAINTENANCE_WORK.items():
                    if pattern.search(row["query"]):
                        tally = self.with_lock if row["upstream_holds"] else self.without_lock
                        tally[work] += 1
            await trio.sleep(self.period)


@dataclasses.dataclass
class ChaosEvent:
    at: float
    action: str  # "terminate" (the lock backend) or "sigkill" (the leading process)
    victim: str
    recovery: float  # until pg_locks showed a new holder
    successor: str  # who holds the lock then


async def flap(admin, members: list[ManagedProcess], nursery: trio.Nursery, *, seconds: float,
               period: tuple[float, float] = (2.0, 4.0), rng: random.Random | None = None,
               recovery_timeout: float = 30.0) -> list[ChaosEvent]:
    """For ``seconds``: every ``period`` seconds (uniform), terminate the
    lock backend of the current holder or SIGKILL the leading process and
    start it again at once; returns what was done."""
    rng = rng or random.Random()
    events: list[ChaosEvent] = []
    deadline = trio.current_time() + seconds
    while trio.current_time() + period[0] < deadline:
        await trio.sleep(rng.uniform(*period))
        owner = await lock_owner(admin, members)
        if owner is None:
            continue  # mid-takeover from the last round: nothing to hit
        backend, member = owner
        action = rng.choice(("terminate", "sigkill")) if member is not None else "terminate"
        began = trio.current_time()
        if action == "terminate":
            await admin.fetchval("SELECT pg_terminate_backend($1)", backend)
        else:
            assert member is not None
            member.kill()
            with trio.move_on_after(5):
                assert member.process is not None
                await member.process.wait()
            await member.start(nursery)
        took, _ = await wait_for_new_holder(admin, {backend}, timeout=recovery_timeout)
        successor = await lock_owner(admin, members)
        events.append(ChaosEvent(began, action, member.label if member else f"backend {backend}",
                                 took - began, successor[1].label if successor and successor[1] else "?"))
    return events


async def produce_scheduled(client, kind: str, queue: str, inserted: list[int], *, every: float = 0.05,
                            due_in: float = 0.5) -> None:
    """Insert a job due ``due_in`` seconds ahead every ``every`` seconds
    through awa-pg's client (in a thread; its asyncio API cannot run under
    Trio), until cancelled; an insert that fails (a restarting server) is
    tried again at the next beat."""
    import datetime

    while True:
        run_at = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=due_in)
        try:
            job = await trio.to_thread.run_sync(
                functools.partial(client.insert, {"n": len(inserted)}, kind=kind, queue=queue, run_at=run_at))
        except Exception:
            pass
        else:
            inserted.append(job.id)
        await trio.sleep(every)


# -- what the cluster did ------------------------------------------------------

DUPLICATE_FIRES_SQL = """
    SELECT metadata->>'cron_name' AS name, metadata->>'cron_fire_time' AS fire_time, count(*) AS copies,
           array_agg(id ORDER BY id) AS ids
    FROM awa.jobs WHERE metadata ? 'cron_name'
    GROUP BY 1, 2 HAVING count(*) > 1 ORDER BY 2
"""
FIRES_BETWEEN_SQL = """
    SELECT count(DISTINCT (metadata->>'cron_fire_time')::timestamptz)
    FROM awa.jobs
    WHERE metadata->>'cron_name' = $1
      AND (metadata->>'cron_fire_time')::timestamptz BETWEEN $2 AND $3
"""
SECONDS_BETWEEN_SQL = "SELECT (extract(epoch FROM date_trunc('second', $2::timestamptz)) - extract(epoch FROM date_trunc('second', $1::timestamptz + interval '999999 microseconds')))::int + 1"


MISSING_FIRES_SQL = """
    SELECT expected.at
    FROM generate_series(date_trunc('second', $2::timestamptz + interval '999999 microseconds'),
                         date_trunc('second', $3::timestamptz), interval '1 second') AS expected(at)
    WHERE NOT EXISTS (SELECT 1 FROM awa.jobs WHERE metadata->>'cron_name' = $1
                      AND (metadata->>'cron_fire_time')::timestamptz = expected.at)
    ORDER BY 1
"""


async def missing_fires(admin, since, until, name: str = CRON_NAME) -> list:
    """The per-second fire times between two server times that nobody enqueued."""
    return [row["at"] for row in await admin.fetch(MISSING_FIRES_SQL, name, since, until)]


async def duplicate_fires(admin) -> list:
    return list(await admin.fetch(DUPLICATE_FIRES_SQL))


async def fire_coverage(admin, since, until, name: str = CRON_NAME) -> tuple[int, int]:
    """(distinct per-second fires between two server times, whole seconds in between)."""
    made = await admin.fetchval(FIRES_BETWEEN_SQL, name, since, until)
    expected = await admin.fetchval(SECONDS_BETWEEN_SQL, since, until)
    return made, expected


JOB_OUTCOMES_SQL = """
    SELECT state::text AS state, attempt, count(*) AS jobs FROM awa.jobs
    WHERE kind = $1 GROUP BY 1, 2 ORDER BY 1, 2
"""


async def job_outcomes(admin, kind: str) -> dict[tuple[str, int], int]:
    return {(row["state"], row["attempt"]): row["jobs"] for row in await admin.fetch(JOB_OUTCOMES_SQL, kind)}


async def wait_until_every_job_completed(admin, consumer: ManagedProcess, kind: str, inserted: list[int],
                                        *, poll: float) -> None:
    """Until no job of ``kind`` is left in any other state and the consumer
    has reported every inserted job done (the caller bounds the wait)."""
    while (await admin.fetchval(
            "SELECT count(*) FROM awa.jobs WHERE kind = $1 AND state <> 'completed'", kind)
            or len(done_counts([consumer])) < len(inserted)):
        await trio.sleep(poll)


async def stop_members(members: list[ManagedProcess]) -> list:
    """Stop every process; returns the exits none of them was asked for."""
    unexpected = [exit for member in members for exit in member.unexpected_exits]
    for member in members:
        await member.stop()
    return unexpected


def done_counts(consumers: list[ManagedProcess]) -> dict[int, int]:
    """How many times each job id was completed by a handler (``DONE`` lines)."""
    counts: dict[int, int] = {}
    for consumer in consumers:
        for line in consumer.lines:
            if line.startswith("DONE "):
                job_id = int(line.split()[1])
                counts[job_id] = counts.get(job_id, 0) + 1
    return counts


def summarise(values: list[float]) -> str:
    if not values:
        return "none"
    return (f"n={len(values)} median {statistics.median(values):.3f}s max {max(values):.3f}s "
            f"total {sum(values):.3f}s")
