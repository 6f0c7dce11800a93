"""Helpers for takeover, driver-error and chaos tests: backends by
application name, snapshot sampling, and awa_trio processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from contextlib import asynccontextmanager

import trio

BACKENDS_SQL = """
    SELECT pid FROM pg_stat_activity
    WHERE datname = current_database() AND application_name LIKE $1 AND pid <> pg_backend_pid()
"""
TERMINATE_SQL = "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM unnest($1::int[]) AS pid"


async def backend_pids(db, application_name_like: str) -> list[int]:
    """Backends of this database whose application_name matches (LIKE)."""
    return [row["pid"] for row in await db.fetch(BACKENDS_SQL, application_name_like)]


async def terminate_backends(db, pids: list[int]) -> int:
    """pg_terminate_backend each pid, in one statement; how many were signalled."""
    if not pids:
        return 0
    return await db.fetchval(TERMINATE_SQL, pids)

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
#: Election connections of any awa_trio process (`awa_trio <host>:<pid> lock`), for LIKE.
LOCK_APPLICATION_NAME = "awa_trio % lock"

#: One row per backend of this database whose application_name matches:
#: whether it holds a snapshot, how old its transaction is, what it waits on.
SNAPSHOT_SAMPLE_SQL = """
    SELECT pid, backend_xmin IS NOT NULL AS holds_snapshot,
           COALESCE(extract(epoch FROM clock_timestamp() - xact_start), 0)::float8 AS xact_age,
           wait_event_type
    FROM pg_stat_activity
    WHERE datname = current_database() AND application_name LIKE $1 AND pid <> pg_backend_pid()
"""


class SnapshotStats:
    """What sampling a set of backends saw."""

    def __init__(self) -> None:
        self.samples = 0
        self.with_snapshot = 0
        self.oldest_snapshot = 0.0
        self.lock_waits = 0
        self.max_backends = 0

    def add(self, rows) -> None:
        self.samples += 1
        self.max_backends = max(self.max_backends, len(rows))
        for row in rows:
            if row["holds_snapshot"]:
                self.with_snapshot += 1
                self.oldest_snapshot = max(self.oldest_snapshot, row["xact_age"])
            if row["wait_event_type"] == "Lock":
                self.lock_waits += 1

    def __repr__(self) -> str:
        return (f"SnapshotStats(samples={self.samples}, with_snapshot={self.with_snapshot}, "
                f"oldest_snapshot={self.oldest_snapshot:.3f}s, lock_waits={self.lock_waits}, "
                f"max_backends={self.max_backends})")


async def sample_snapshots(db, application_name_like: str, seconds: float, hz: float = 20) -> SnapshotStats:
    """Sample pg_stat_activity for the matching backends at ``hz``."""
    stats = SnapshotStats()
    deadline = trio.current_time() + seconds
    while trio.current_time() < deadline:
        stats.add(await db.fetch(SNAPSHOT_SAMPLE_SQL, application_name_like))
        await trio.sleep(1 / hz)
    return stats


class LockSampler:
    """Counts granted holders of the leader lock at ``hz`` (run it in a nursery)."""

    def __init__(self, db, hz: float = 20):
        self.db = db
        self.period = 1 / hz
        self.samples = 0
        self.max_holders = 0
        self.doubles: list[list[int]] = []

    async def run(self) -> None:
        from support.helpers import leader_lock_holders

        while True:
            holders = await leader_lock_holders(self.db)
            self.samples += 1
            self.max_holders = max(self.max_holders, len(holders))
            if len(holders) > 1:
                self.doubles.append(holders)
            await trio.sleep(self.period)


async def wait_for_new_holder(db, old_holders: list[int], timeout: float, poll: float = 0.005) -> float:
    """Poll pg_locks until the leader lock has a holder not in ``old_holders``;
    returns trio.current_time() at that moment."""
    from support.helpers import leader_lock_holders

    with trio.fail_after(timeout):
        while True:
            holders = await leader_lock_holders(db)
            if holders and not set(holders) & set(old_holders):
                return trio.current_time()
            await trio.sleep(poll)


class AwaTrioProcess:
    """``python -m awa_trio`` in a child process, its log lines collected."""

    def __init__(self, process: trio.Process):
        self.process = process
        self.lines: list[str] = []

    @property
    def pid(self) -> int:
        return self.process.pid

    async def _read(self) -> None:
        buffer = b""
        async for chunk in self.process.stderr:
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                self.lines.append(line.decode(errors="replace"))

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.process.send_signal(signal.SIGTERM)


@asynccontextmanager
async def awa_trio_process(database_url: str, *flags: str):
    """Start the CLI on ``database_url``; SIGKILL it on exit if still running."""
    argv = [sys.executable, "-m", "awa_trio", "--database-url", database_url, "--log-level", "INFO",
            *flags]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO_ROOT, env.get("PYTHONPATH")]))
    async with trio.open_nursery() as nursery:
        process = await trio.lowlevel.open_process(
            argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
        child = AwaTrioProcess(process)
        nursery.start_soon(child._read)
        try:
            yield child
        finally:
            if process.returncode is None:
                process.kill()
            with trio.move_on_after(5, shield=True):
                await process.wait()
            nursery.cancel_scope.cancel()


async def wait_for_election_backends(db, count: int, timeout: float = 20) -> list[int]:
    """Wait until ``count`` election connections (leaders and followers) exist."""
    with trio.fail_after(timeout):
        while True:
            pids = await backend_pids(db, LOCK_APPLICATION_NAME)
            if len(pids) >= count:
                return pids
            await trio.sleep(0.02)
