"""An operator's DDL beside a busy awa_trio leader, for tests and the bench.

The leader runs every branch at short intervals; a real awa-pg 0.6.1 worker
(maintenance muted, so awa_trio leads) takes jobs whose first attempt hangs
past a 300 ms deadline, so deadline rescues are always due; a producer
inserts a job every 50 ms that comes due 100 ms later, so promotion always
has work. :class:`YieldLog` reads the leader's yields from its log lines.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import random
import re
from contextlib import asynccontextmanager

import trio

from awa_trio import MaintenanceConfig, MaintenanceService
from support.awa_pg import awa_pg_worker

KIND = "ddl_probe"
QUEUE = "ddlq"

BUSY_CONFIG = MaintenanceConfig(
    leader_election_interval=0.3,
    leader_check_interval=0.3,
    promote_interval=0.05,
    heartbeat_rescue_interval=0.1,
    deadline_rescue_interval=0.1,
    callback_rescue_interval=0.1,
    cleanup_interval=0.5,
    queue_stats_interval=0.2,
    dirty_key_recompute_interval=0.2,
    metadata_reconciliation_interval=0.5,
    priority_aging_interval=0.5,
    batch_operations_interval=0.2,
    terminal_count_rollup_interval=0.5,
    cron_sync_interval=0.5,
    cron_eval_interval=0.2,
    queue_rotate_interval=0.2,
    lease_rotate_interval=0.1,
    claim_rotate_interval=0.2,
)

_RESUMED = re.compile(r"^(\S+): resumed after yielding (\d+) times? over ([0-9.]+)s")


class YieldLog(logging.Handler):
    """The leader's yield episodes, from its INFO lines: how often a branch
    gave up a lock wait, and how long each episode held the branch up."""

    def __init__(self) -> None:
        super().__init__(level=logging.INFO)
        self.yields: list[str] = []
        #: (branch, yields, seconds held up) per finished episode.
        self.episodes: list[tuple[str, int, float]] = []
        self.errors: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if ": yielded to a lock on " in message:
            self.yields.append(message)
        elif match := _RESUMED.match(message):
            self.episodes.append((match[1], int(match[2]), float(match[3])))
        elif record.levelno >= logging.ERROR:
            self.errors.append(message)

    def longest_hold_up(self) -> float:
        return max((seconds for _, _, seconds in self.episodes), default=0.0)

    @asynccontextmanager
    async def attached(self):
        logger = logging.getLogger("awa_trio")
        level = logger.level
        logger.setLevel(min(level or logging.INFO, logging.INFO))
        logger.addHandler(self)
        try:
            yield self
        finally:
            logger.removeHandler(self)
            logger.setLevel(level)


class Producer:
    """Inserts a job every ``every`` seconds, due 0.1 to 2 s later, until
    cancelled, so promotion has work all the time. It stops inserting while
    a DDL runs (:meth:`paused`): an application's own insert can deadlock
    with the DDL (awa's insert function against the installer's ALTER
    SEQUENCE, seen here), and these tests judge the leader, not the producer."""

    def __init__(self, client, every: float = 0.05):
        self.client = client
        self.every = every
        self._running = trio.Event()
        self._running.set()
        self._idle = trio.Event()
        self._idle.set()

    @asynccontextmanager
    async def paused(self):
        self._running = trio.Event()
        await self._idle.wait()
        try:
            yield
        finally:
            self._running.set()

    async def run(self) -> None:
        while True:
            await self._running.wait()
            self._idle = trio.Event()
            run_at = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=random.uniform(0.1, 2.0))
            try:
                await trio.to_thread.run_sync(
                    lambda run_at=run_at: self.client.insert({}, kind=KIND, queue=QUEUE, run_at=run_at),
                    abandon_on_cancel=True,
                )
            except Exception:
                pass  # while the schema is gone
            finally:
                self._idle.set()
            await trio.sleep(self.every)


@dataclasses.dataclass
class Busy:
    service: MaintenanceService
    producer: Producer


@asynccontextmanager
async def busy_leader(dsn: str, client, *, config: MaintenanceConfig = BUSY_CONFIG, worker: bool = True):
    """A leading MaintenanceService, an awa-pg worker and a producer."""
    async with trio.open_nursery() as nursery:
        service = MaintenanceService(dsn, config)
        await nursery.start(service.run)
        with trio.fail_after(20):
            await service.wait_until_leader()
        producer = Producer(client)
        nursery.start_soon(producer.run)
        if worker:
            # Muted and never retrying the lock, so awa_trio alone leads,
            # even while it steps down for a schema that is gone.
            args = ["--deadline-ms", "300", "--mute-maintenance", "--role", "auto"]
            args += ["--leader-election-interval-ms", "600000"]
            async with awa_pg_worker(dsn, f"{KIND}:{QUEUE}", behaviour="hang-first", extra_args=args):
                yield Busy(service, producer)
        else:
            yield Busy(service, producer)
        nursery.cancel_scope.cancel()


async def promotion_lag(client, db, *, timeout: float = 20.0) -> float:
    """Seconds from now until a job due 0.1 s from now leaves ``scheduled``:
    the leader promotes again (through awa-pg, so on either engine)."""
    run_at = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=0.1)
    job = await trio.to_thread.run_sync(lambda: client.insert({}, kind=KIND, queue="ddl_idle", run_at=run_at))
    started = trio.current_time()
    with trio.fail_after(timeout):
        while True:
            state = (await trio.to_thread.run_sync(lambda: client.get_job(job.id))).state
            if str(state).rsplit(".", 1)[-1].lower() != "scheduled":
                return trio.current_time() - started - 0.1
            await trio.sleep(0.02)


#: A live runtime ready for queue storage (what enter and finalize wait for),
#: standing in for the queue-storage workers a real transition would start.
INSERT_TARGET_RUNTIME_SQL = """
    INSERT INTO awa.runtime_instances (instance_id, pid, version, started_at, last_seen_at,
        snapshot_interval_ms, healthy, postgres_connected, poll_loop_alive, heartbeat_alive,
        shutting_down, leader, storage_capability, transition_role)
    VALUES (gen_random_uuid(), 1, 'test', now(), now() + interval '1 hour', 10000, true, true, true,
        true, false, false, 'queue_storage', 'queue_storage_target')
"""
