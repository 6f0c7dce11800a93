"""What the benches share: the server, scratch databases (migrated, or
finalised to queue storage by a real awa-pg runtime), the leader lock as
pg_locks shows it, the awa-pg programs they start, and /proc readings.

Database helpers are asyncio coroutines; a synchronous bench runs them with
``asyncio.run``, a Trio one with ``in_trio`` (a worker thread with a loop of
its own), so every bench creates and drops its databases the same way.
"""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg

ROOT = Path(__file__).resolve().parent.parent
PROGRAMS = Path(__file__).resolve().parent / "programs"
SERVER = "postgresql://postgres@localhost:5432"
#: awa_trio.leadership.LOCK_KEY, Awa's maintenance leader key, written out:
#: importing awa_trio imports trio_asyncio, which replaces asyncio's event
#: loop policy, and the asyncio benches must measure on the stock loop.
LOCK_KEY = 4708303813012965710


def env_server() -> str:
    """The server of the test suite's environment variable, else the local one."""
    return os.environ.get("AWA_TRIO_TEST_SERVER", SERVER)


# -- the leader lock -------------------------------------------------------------


def lock_holders_sql(columns: str, database: str = "current_database()") -> str:
    """SELECT ``columns`` over the granted locks on Awa's leader key (a bigint
    advisory lock shows as classid = high 32 bits, objid = low, objsubid 1)
    in ``database`` (an SQL expression: a parameter, or the current one)."""
    return f"""
    SELECT {columns} FROM pg_locks
    WHERE locktype = 'advisory' AND granted
      AND database = (SELECT oid FROM pg_database WHERE datname = {database})
      AND (classid::bigint << 32 | objid::bigint) = {LOCK_KEY} AND objsubid = 1
"""


#: How many sessions hold the leader lock in the current database (0 or 1).
LOCK_HELD_SQL = lock_holders_sql("count(*)")


# -- databases ---------------------------------------------------------------------


def dsn_of(server: str, name: str) -> str:
    return f"{server}/{name}"


def name_of(dsn_or_name: str) -> str:
    return dsn_or_name.rsplit("/", 1)[-1].split("?", 1)[0]


async def admin(server: str, sql: str) -> None:
    """One statement on the server's ``postgres`` database."""
    conn = await asyncpg.connect(dsn_of(server, "postgres"))
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


def _migrate(dsn: str) -> None:
    import awa

    client = awa.Client(dsn)
    client.migrate()
    del client
    gc.collect()  # closes the client's pool: a template must have no sessions


async def finalise_queue_storage(dsn: str) -> None:
    """A real awa-pg runtime (role ``auto``) finalises a migrated fresh
    install to queue storage, as every default Awa 0.6 install is; judged by
    the database afterwards (the 0.6.1 runtime sometimes crashes at exit).
    The runtime row it leaves is deleted, so copies show no stale runtime."""
    process = await asyncio.create_subprocess_exec(
        *program("finalise_queue_storage", dsn), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        await asyncio.wait_for(process.wait(), 120)
    except TimeoutError:
        process.kill()
        await process.wait()
    conn = await asyncpg.connect(dsn)
    try:
        state = await conn.fetchrow("SELECT active_engine, state FROM awa.storage_status()")
        if tuple(state) != ("queue_storage", "active"):
            raise RuntimeError(f"queue storage not live after the awa-pg runtime: {tuple(state)}")
        await conn.execute("DELETE FROM awa.runtime_instances")
    finally:
        await conn.close()


async def create_database(server: str, name: str, *, queue_storage: bool = False) -> str:
    """``name`` (dropped first if it exists) migrated by awa-pg, finalised to
    queue storage if asked, with no session left on it; returns its DSN."""
    await admin(server, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    await admin(server, f'CREATE DATABASE "{name}"')
    dsn = dsn_of(server, name)
    await asyncio.to_thread(_migrate, dsn)
    if queue_storage:
        await finalise_queue_storage(dsn)
    await admin(server, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        f"WHERE datname = '{name}' AND pid <> pg_backend_pid()")
    return dsn


def scratch_name(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


async def make_template(server: str, prefix: str, *, queue_storage: bool = False) -> str:
    """A migrated template database (one per bench process); returns its name."""
    name = f"{prefix}_tpl_{os.getpid()}"
    await create_database(server, name, queue_storage=queue_storage)
    return name


async def copy_database(server: str, template: str, prefix: str) -> str:
    """A fresh copy of ``template``; returns its DSN."""
    name = scratch_name(prefix)
    await admin(server, f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
    return dsn_of(server, name)


async def drop_database(server: str, dsn_or_name: str) -> None:
    await admin(server, f'DROP DATABASE IF EXISTS "{name_of(dsn_or_name)}" WITH (FORCE)')


async def in_trio(function: Callable[..., Awaitable[Any]], *args: Any, **kwargs: Any) -> Any:
    """Runs one of these asyncio helpers from Trio code, on a worker thread."""
    import trio

    return await trio.to_thread.run_sync(lambda: asyncio.run(function(*args, **kwargs)))


async def wait_until(conn: Any, sql: str, *args: Any, until: Callable[[Any], bool] = bool,
                     timeout: float = 60.0, every: float = 0.01) -> float:
    """Polls ``sql`` every ``every`` seconds until its value satisfies
    ``until``; returns the perf_counter time it did."""
    deadline = time.perf_counter() + timeout
    while True:
        value = await conn.fetchval(sql, *args)
        if until(value):
            return time.perf_counter()
        if time.perf_counter() > deadline:
            raise TimeoutError(f"{sql} never satisfied the wait (last value {value!r})")
        await asyncio.sleep(every)


# -- processes -----------------------------------------------------------------------


def program(name: str, *args: str) -> list[str]:
    """The argv of one of bench/programs/ (awa-pg runtimes and floor leaders)."""
    return [sys.executable, str(PROGRAMS / f"{name}.py"), *args]


def awa_pg_runtime(dsn: str, **options: object) -> list[str]:
    """The argv of an awa-pg 0.6.1 runtime (a worker, and upstream's leader
    when it wins the lock); see programs/awa_pg_runtime.py for ``options``."""
    return program("awa_pg_runtime", dsn, *(f"{key}={value}" for key, value in options.items()))


def awa_trio_argv(dsn: str, *flags: str) -> list[str]:
    return [sys.executable, "-m", "awa_trio", "--database-url", dsn, *flags]


def repo_env() -> dict[str, str]:
    """This environment with the checkout first on PYTHONPATH."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))


def stop(process: subprocess.Popen[Any] | None, sig: int = signal.SIGTERM, timeout: float = 10) -> None:
    """Signals a child and reaps it, killing it if it outlasts ``timeout``."""
    if process is None or process.poll() is not None:
        return
    process.send_signal(sig)
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


async def start_process(*argv: str) -> asyncio.subprocess.Process:
    """An asyncio child whose output (stderr included) is read line by line."""
    return await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )


async def wait_for_output(process: asyncio.subprocess.Process, marker: str, timeout: float = 60) -> None:
    """Until a line of the child's output contains ``marker``."""
    assert process.stdout is not None

    async def read() -> None:
        while True:
            line = await process.stdout.readline()
            if not line:
                raise RuntimeError(f"process exited before {marker!r}")
            if marker in line.decode(errors="replace"):
                return

    await asyncio.wait_for(read(), timeout)


async def drain_output(process: asyncio.subprocess.Process, keep: list[str] | None = None,
                       marker: str = "") -> None:
    """Reads a child's output to the end, so its pipe never fills; lines
    containing ``marker`` go to ``keep``."""
    assert process.stdout is not None
    while line := await process.stdout.readline():
        if keep is not None and marker in (text := line.decode(errors="replace")):
            keep.append(text)


async def stop_process(process: asyncio.subprocess.Process) -> None:
    if process.returncode is None:
        process.terminate()
        try:
            await asyncio.wait_for(process.wait(), 10)
        except TimeoutError:
            process.kill()
            await process.wait()


# -- /proc and figures -----------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a live local process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def process_cost(pid: int) -> tuple[float, float]:
    """(CPU seconds so far, peak RSS in MiB) of a live process, from /proc."""
    cpu = cpu_seconds(pid)
    with open(f"/proc/{pid}/status") as status:
        peak_kib = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
    return cpu, peak_kib / 1024


def nearest_rank(values: list[float], share: float) -> float:
    """The nearest-rank quantile (``share`` from 0 to 1) of unsorted values."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(share * len(ordered)) - 1))]
