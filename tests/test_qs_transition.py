"""The whole staged transition canonical -> queue storage with awa_trio leading
and real awa-pg 0.6.1 runtimes doing the work: prepare, a
``queue_storage_target`` runtime live, enter mixed transition, drain,
finalize. Jobs go in before, during and after; a drain worker is SIGKILLed
mid-job after the flip; awa_trio is restarted mid-transition. Nothing may be
lost or run twice, finalize must pass, and awa_trio must switch branch sets
under the lock it holds.

What upstream 0.6.1 strands here (see awa_trio.engines.canonical.canonical_drain):
canonical rows that come due after the flip (only a canonical-engine leader
promotes them) and the killed worker's canonical job (its rescue writes
through ``awa.jobs``, which then shows only queue storage).

Every wait is on database state or a worker's output, never a fixed sleep.
The one shortcut: a stopped drain runtime's snapshot counts as live for
finalize for 30 s; once its process has exited, the test ages the row
instead of waiting the window out.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import itertools
import logging
import os
import re
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import trio
from support.awa_pg import WorkerProcess
from support.contexts import make_context
from support.helpers import leader_lock_holders

from awa_trio import MaintenanceConfig, MaintenanceService
from awa_trio.db import QueryError
from awa_trio.engines.canonical import canonical_drain

# CI runs these on schema 40 (awa-pg 0.6.9) too.
pytestmark = pytest.mark.queue_storage

WORKER_SCRIPT = Path(__file__).parent / "support" / "awa_pg_transition_worker.py"
QUEUE = "tq"
#: Served first by the drain worker that is killed, so it claims the hanging job.
HANG_QUEUE = "hangq"
#: awa-pg 0.6.1 never refreshes canonical heartbeats, so every canonical job
#: running this long is rescued: longer than any job but the hanging one,
#: longer than the hanging job's claim-to-kill window.
HEARTBEAT_STALENESS = 6.0

CONFIG = MaintenanceConfig(
    leader_election_interval=0.3,
    leader_check_interval=0.3,
    promote_interval=0.1,
    heartbeat_rescue_interval=0.5,
    heartbeat_staleness=HEARTBEAT_STALENESS,
    deadline_rescue_interval=0.5,
    callback_rescue_interval=0.5,
    queue_stats_interval=0.5,
    cleanup_interval=5.0,
)

PREPARE_SQL = "SELECT state FROM awa.storage_prepare('queue_storage', '{\"schema\": \"awa\"}')"
ENTER_MIXED_SQL = "SELECT state FROM awa.storage_enter_mixed_transition()"
FINALIZE_SQL = "SELECT state FROM awa.storage_finalize()"
STATE_SQL = "SELECT state FROM awa.storage_status()"
BACKLOG_SQL = "SELECT awa.canonical_live_backlog()"
#: Jobs of a token on the canonical tables (the view shows one plane at a time).
CANONICAL_JOB_SQL = """
    SELECT id, state::text AS state, attempt, errors FROM awa.jobs_hot WHERE args->>'token' = $1
    UNION ALL
    SELECT id, state::text, attempt, errors FROM awa.scheduled_jobs WHERE args->>'token' = $1
"""
#: Due canonical rows held back until after the flip (see hold_back).
HOLD_BACK_SQL = """
    UPDATE awa.scheduled_jobs SET run_at = now() + interval '1 hour'
    WHERE args->>'token' = ANY($1::text[])
"""
MAKE_DUE_SQL = """
    UPDATE awa.scheduled_jobs SET run_at = now()
    WHERE args->>'token' = ANY($1::text[])
"""
#: A live job on queue storage once routing flipped (the view shows queue storage).
LIVE_JOBS_SQL = """
    SELECT count(*) FROM awa.jobs WHERE state NOT IN ('completed', 'failed', 'cancelled')
"""
#: Ages a dead runtime's snapshot past finalize's liveness window.
AGE_SNAPSHOTS_SQL = """
    UPDATE awa.runtime_instances SET last_seen_at = now() - interval '5 minutes'
    WHERE pid = ANY($1::int[])
"""


class Fleet:
    """awa-pg runtimes in child processes, killed at the end whatever happens."""

    def __init__(self, dsn: str, nursery: trio.Nursery):
        self.dsn = dsn
        self.nursery = nursery
        self.workers: list[WorkerProcess] = []

    async def start(self, role: str, *queues: str) -> WorkerProcess:
        argv = [sys.executable, str(WORKER_SCRIPT), self.dsn, "--role", role]
        for queue in queues:
            argv += ["--queue", queue]
        process = await trio.lowlevel.open_process(
            argv, stdout=subprocess.PIPE, stderr=None, env=dict(os.environ, PYTHONUNBUFFERED="1"))
        worker = WorkerProcess(process)
        self.workers.append(worker)
        self.nursery.start_soon(worker._read)
        await worker.wait_for_line("READY", timeout=30)
        return worker

    async def stop(self, worker: WorkerProcess) -> None:
        """Graceful (SIGTERM), bounded; judged by the process being gone."""
        worker.terminate()
        with trio.move_on_after(10):
            await worker.process.wait()
        if worker.process.returncode is None:
            worker.kill()
            await worker.process.wait()

    async def kill(self, worker: WorkerProcess) -> None:
        worker.kill()
        await worker.process.wait()

    def lines(self, word: str) -> list[tuple[str, int, str, WorkerProcess]]:
        """(token, attempt, kind, worker) of every START or DONE line."""
        seen = []
        for worker in self.workers:
            for line in worker.lines:
                parts = line.split()
                if parts and parts[0] == word:
                    seen.append((parts[1], int(parts[2]), parts[3], worker))
        return seen

    def close(self) -> None:
        for worker in self.workers:
            if worker.process.returncode is None:
                worker.process.send_signal(signal.SIGKILL)


@contextlib.asynccontextmanager
async def fleet_of_workers(dsn: str):
    async with trio.open_nursery() as nursery:
        fleet = Fleet(dsn, nursery)
        try:
            yield fleet
        finally:
            fleet.close()
            with trio.move_on_after(5, shield=True):
                for worker in fleet.workers:
                    await worker.process.wait()
            nursery.cancel_scope.cancel()


class Producer:
    """Inserts through awa-pg (which routes by the storage state) and
    remembers every token it handed out."""

    def __init__(self, client):
        self.client = client
        #: Jobs that must complete (token -> kind).
        self.tokens: dict[str, str] = {}
        self._numbers = itertools.count()

    async def insert(self, phase: str, kind: str, *, queue: str = QUEUE,
                     delay: float | None = None, max_attempts: int = 25,
                     must_complete: bool = True):
        token = f"{phase}-{kind}-{next(self._numbers)}"
        run_at = None
        if delay is not None:
            run_at = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=delay)
        await trio.to_thread.run_sync(lambda: self.client.insert(
            {"token": token}, kind=kind, queue=queue, run_at=run_at, max_attempts=max_attempts))
        if must_complete:
            self.tokens[token] = kind
        return token

    async def insert_many(self, phase: str, counts: dict[str, int], **options) -> list[str]:
        return [await self.insert(phase, kind, **options)
                for kind, count in counts.items() for _ in range(count)]


async def wait_until(check, what: str, timeout: float = 30.0):
    """Poll ``check()`` (sync or async) every 100 ms until it is truthy."""
    with trio.move_on_after(timeout):
        while True:
            value = check()
            if hasattr(value, "__await__"):
                value = await value
            if value:
                return value
            await trio.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


async def start_service(nursery: trio.Nursery, dsn: str) -> MaintenanceService:
    service = MaintenanceService(dsn, CONFIG)
    await nursery.start(service.run)
    with trio.fail_after(15):
        await service.wait_until_leader()
    return service


def branch_names(service: MaintenanceService) -> set[str]:
    return {spec.name for spec in service.branches}


async def wait_for_state(service: MaintenanceService, state: str) -> None:
    await wait_until(lambda: service.schema is not None and service.schema.state == state,
                     f"awa_trio leading on {state}", timeout=15)


async def snapshot_reported(db, worker: WorkerProcess, capability: str) -> bool:
    return bool(await db.fetchval(
        "SELECT count(*) FROM awa.runtime_instances WHERE pid = $1 AND storage_capability = $2",
        worker.process.pid, capability))


async def test_staged_transition_with_awa_pg_loses_no_job(database_url, db, awa_client, caplog):
    caplog.set_level(logging.INFO, logger="awa_trio")
    producer = Producer(awa_client)
    schema_version = await db.fetchval("SELECT max(version) FROM awa.schema_version")
    with trio.fail_after(90):
        async with trio.open_nursery() as services, fleet_of_workers(database_url) as fleet:
            # awa_trio leads first, so no awa-pg runtime ever takes the lock.
            first = await start_service(services, database_url)
            first_lock = first.lock_backend_pid
            assert "priority_aging" in branch_names(first)

            # --- canonical: a drain worker runs the canonical plane throughout.
            drainer = await fleet.start("canonical_drain", QUEUE)
            await producer.insert_many("before", {"ok": 4, "flaky": 2})
            await producer.insert_many("before", {"ok": 2, "flaky": 1}, delay=0.5)
            before_flip = await producer.insert_many("held", {"ok": 2}, delay=3600)

            # --- prepared: routing still canonical, the canonical set goes on.
            await trio.to_thread.run_sync(prepare_queue_storage_schema, database_url)
            assert await db.fetchval(PREPARE_SQL) == "prepared"
            target = await fleet.start("queue_storage_target", QUEUE)
            await wait_until(lambda: snapshot_reported(db, target, "queue_storage"),
                             "the queue_storage_target runtime's snapshot")
            # Canonical rows that come due only after the flip: scheduled
            # ones, and retryable ones (a first attempt failed before it).
            flaky_held = await producer.insert_many("held", {"flaky": 2})
            await wait_until(lambda: all_retryable(db, flaky_held), "held flaky jobs retryable")
            await db.execute(HOLD_BACK_SQL, flaky_held)
            # A canonical flaky job whose first attempt runs after the flip:
            # awa-pg 0.6.1 then writes its retry through awa.jobs, which misses.
            late_first_attempt = await producer.insert_many("late", {"flaky": 1}, delay=3600)
            # The same on its last attempt: the failure must be recorded, not re-run.
            last_attempt = await producer.insert(
                "late", "flaky", delay=3600, max_attempts=1, must_complete=False)
            await producer.insert_many("prepared", {"ok": 3})
            # The worker that dies: the only one serving HANG_QUEUE until the kill.
            doomed = await fleet.start("canonical_drain", HANG_QUEUE)
            hanging = await producer.insert("prepared", "hang_first", queue=HANG_QUEUE)
            await wait_until(lambda: started(fleet, hanging, doomed), "the hanging job claimed")
            # Prepared changes no branch: the canonical term simply goes on.
            assert await db.fetchval(STATE_SQL) == "prepared"
            await wait_for_state(first, "prepared")
            assert "storage moved" not in caplog.text
            assert "priority_aging" in branch_names(first)

            # --- mixed transition: awa_trio switches to both planes, same lock.
            with pytest.raises(QueryError, match="only allowed from mixed_transition"):
                await db.fetchval(FINALIZE_SQL)
            assert await db.fetchval(ENTER_MIXED_SQL) == "mixed_transition"
            await wait_for_state(first, "mixed_transition")
            assert "canonical_drain" in branch_names(first)
            assert "priority_aging" not in branch_names(first)
            assert first.lock_backend_pid == first_lock
            assert await leader_lock_holders(db) == [first_lock]
            assert [leading for _, leading in first.leadership_history] == [True]

            await fleet.kill(doomed)
            killed_at = await db.fetchval("SELECT now()")
            # A drain runtime started after the flip takes over HANG_QUEUE.
            replacement = await fleet.start("canonical_drain", HANG_QUEUE)
            await producer.insert_many("mixed", {"ok": 4, "flaky": 2})
            await producer.insert_many("mixed", {"ok": 2}, delay=1.0)
            with pytest.raises(QueryError, match="canonical live backlog"):
                await db.fetchval(FINALIZE_SQL)

            # --- awa_trio restarts mid-transition; the new one takes over.
            first.stop()
            await wait_until(lambda: not first.is_alive, "the first awa_trio stopped")
            second = await start_service(services, database_url)
            second_lock = second.lock_backend_pid
            assert second.schema.state == "mixed_transition"
            assert "canonical_drain" in branch_names(second)

            # The held canonical rows come due now, after the flip.
            await db.execute(
                MAKE_DUE_SQL, before_flip + flaky_held + late_first_attempt + [last_attempt])

            # --- drain: every canonical row finishes, the drain runtimes stop.
            await wait_until(lambda: backlog_is(db, 0), "canonical backlog drained", timeout=40)
            await wait_until(lambda: "canonical_drain: canonical plane drained" in caplog.text,
                             "awa_trio reporting the canonical plane drained")
            drain_runtimes = [drainer, doomed, replacement]
            await fleet.stop(drainer)
            await fleet.stop(replacement)
            if schema_version == 39:
                # Schema 40 lets drained runtimes stay live through finalize.
                with pytest.raises(QueryError, match="drain-only runtime"):
                    await db.fetchval(FINALIZE_SQL)
                await db.execute(AGE_SNAPSHOTS_SQL, [w.process.pid for w in drain_runtimes])

            # --- finalize: queue storage only; awa_trio drops the canonical drain.
            assert await db.fetchval(FINALIZE_SQL) == "active"
            await wait_for_state(second, "active")
            assert "canonical_drain" not in branch_names(second)
            assert "rotate_queue" in branch_names(second)
            assert second.lock_backend_pid == second_lock
            assert await leader_lock_holders(db) == [second_lock]
            assert [leading for _, leading in second.leadership_history] == [True]

            await producer.insert_many("after", {"ok": 3, "flaky": 1})
            await producer.insert_many("after", {"ok": 1}, delay=0.5)

            await wait_until(lambda: set(done_tokens(fleet)) >= set(producer.tokens),
                             "every job done", timeout=40)
            await wait_until(lambda: live_jobs_are(db, 0), "no live job left on queue storage")
            runtime_pids = {row["pid"] for row in await db.fetch(
                "SELECT pid FROM awa.runtime_instances")}
            second.stop()

    # Every job ran to completion exactly once.
    done = Counter(done_tokens(fleet))
    assert set(done) == set(producer.tokens)
    assert [token for token, count in done.items() if count != 1] == []
    attempts = {token: attempt for token, attempt, _, _ in fleet.lines("DONE")}
    for token, kind in producer.tokens.items():
        assert attempts[token] == (1 if kind == "ok" else 2), (token, attempts[token])

    # The killed worker's job: rescued by awa_trio after the kill, then run
    # by the drain worker started after the flip.
    runs = sorted((attempt, worker) for token, attempt, _, worker in fleet.lines("START")
                  if token == hanging)
    assert [(attempt, worker) for attempt, worker in runs] == [(1, doomed), (2, replacement)]
    [(_, _, _, second_runner)] = [d for d in fleet.lines("DONE") if d[0] == hanging]
    assert second_runner is replacement
    [job] = await db.fetch(CANONICAL_JOB_SQL, hanging)
    assert job["state"] == "completed"
    rescue = job["errors"][0]
    assert "heartbeat stale" in rescue["error"]
    assert datetime.datetime.fromisoformat(rescue["at"]) > killed_at

    # Canonical jobs that came due after the flip ran on the canonical plane
    # under their own ids (promoted there by awa_trio, never moved).
    for token in before_flip + flaky_held:
        [job] = await db.fetch(CANONICAL_JOB_SQL, token)
        assert job["state"] == "completed", token
    assert await db.fetchval(BACKLOG_SQL) == 0
    [(late_token, _, _, late_runner)] = [
        done for done in fleet.lines("DONE") if done[0] in late_first_attempt]
    # The last attempt that failed after the flip ran once and stays failed.
    assert [(attempt, worker) for token, attempt, _, worker in fleet.lines("START")
            if token == last_attempt] == [(1, drainer)]
    [job] = await db.fetch(CANONICAL_JOB_SQL, last_attempt)
    assert (job["state"], job["attempt"]) == ("failed", 1)
    if schema_version == 39:
        # awa-pg 0.6.1 drain runtimes write a failure through awa.jobs, which
        # misses canonical rows after the flip: the drain's rescue recovered
        # the retry (the job stayed canonical) and recorded the last failure.
        assert late_runner is drainer
        [job] = await db.fetch(CANONICAL_JOB_SQL, late_token)
        assert job["state"] == "completed" and "heartbeat stale" in job["errors"][-1]["error"]
        [job] = await db.fetch(CANONICAL_JOB_SQL, last_attempt)
        assert "heartbeat stale" in job["errors"][-1]["error"]
        assert "were on their last attempt; failed them" in caplog.text
    else:
        # awa-pg 0.6.9 (#456): a retry after the flip moves the job to queue
        # storage (fresh id), and the worker records its own last failure.
        assert late_runner is target
        assert await db.fetch(CANONICAL_JOB_SQL, late_token) == []
        [job] = await db.fetch(CANONICAL_JOB_SQL, last_attempt)
        assert "flaky job fails its first attempt" in job["errors"][-1]["error"]

    # awa_trio never registered itself as a runtime (that would block
    # enter-mixed-transition and finalize): every snapshot is an awa-pg worker's.
    assert runtime_pids <= {worker.process.pid for worker in fleet.workers}
    assert os.getpid() not in runtime_pids

    log = caplog.text
    assert "storage state changed from canonical to prepared" in log
    assert "storage moved from canonical (prepared) to queue_storage (mixed_transition)" in log
    assert "storage moved from queue_storage (mixed_transition) to queue_storage (active)" in log
    assert "maintenance branches started on queue_storage (mixed_transition)" in log
    assert "canonical plane: rescued canonical jobs" in log
    assert "canonical plane: promoted" in log
    assert "canonical_drain: canonical plane drained" in log


def prepare_queue_storage_schema(dsn: str) -> None:
    """awa-pg's own schema preparation (only its asyncio client has it)."""
    import awa

    async def prepare() -> None:
        await awa.AsyncClient(dsn).prepare_queue_storage_schema(schema="awa")

    asyncio.run(prepare())


async def all_retryable(db, tokens: list[str]) -> bool:
    rows = await db.fetch(
        "SELECT state::text AS state FROM awa.scheduled_jobs WHERE args->>'token' = ANY($1::text[])",
        tokens)
    return len(rows) == len(tokens) and all(row["state"] == "retryable" for row in rows)


def started(fleet: Fleet, token: str, worker: WorkerProcess) -> bool:
    return any(t == token and w is worker for t, _, _, w in fleet.lines("START"))


def done_tokens(fleet: Fleet) -> list[str]:
    return [token for token, _, _, _ in fleet.lines("DONE")]


async def backlog_is(db, count: int) -> bool:
    return await db.fetchval(BACKLOG_SQL) == count


async def live_jobs_are(db, count: int) -> bool:
    return await db.fetchval(LIVE_JOBS_SQL) == count


# --- the drain report, without workers ------------------------------------------------

MIXED_TRANSITION_SQL = """
    UPDATE awa.storage_transition_state
    SET prepared_engine = 'queue_storage', state = 'mixed_transition',
        details = '{"schema": "awa"}', transition_epoch = transition_epoch + 1
"""


INSERT_RUNTIME_SQL = """
    INSERT INTO awa.runtime_instances (instance_id, pid, version, started_at, last_seen_at,
        snapshot_interval_ms, healthy, postgres_connected, poll_loop_alive, heartbeat_alive,
        shutting_down, leader, storage_capability, transition_role)
    VALUES (gen_random_uuid(), 1, 'test', now(), now(), 10000, true, true, true, true,
        false, false, $1, $2)
"""


async def test_drain_report_warns_when_due_canonical_work_has_no_drain_runtime(
    db, awa_client, caplog
):
    """Due canonical work with no live drain runtime is the one thing the
    leader cannot fix: the report names it on every pass, and says when the
    plane is drained."""
    caplog.set_level(logging.INFO, logger=canonical_drain.__name__)
    await trio.to_thread.run_sync(lambda: awa_client.insert({}, kind="k", queue="q"))
    await trio.to_thread.run_sync(lambda: awa_client.insert(
        {}, kind="k", queue="q",
        run_at=datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=1)))
    await db.execute(MIXED_TRANSITION_SQL)
    ctx = await make_context(db)
    report = canonical_drain.make_report()

    status = await report(ctx)
    assert (status.backlog, status.available, status.deferred, status.deferred_due) == (2, 1, 1, 0)
    assert status.stranded == 1
    assert "1 canonical jobs are due but no canonical_drain runtime is live" in caplog.text

    # A canonical_drain runtime whose last snapshot predates the flip (it
    # still says queue_storage) runs canonical work but does not block finalize.
    await db.execute(INSERT_RUNTIME_SQL, "queue_storage", "canonical_drain")
    caplog.clear()
    status = await report(ctx)
    assert (status.canonical_runners, status.live_drain_runtimes, status.stranded) == (1, 0, 0)
    assert "no canonical_drain runtime" not in caplog.text
    assert "2 live canonical jobs (1 available" in caplog.text
    assert "1 live runtimes run canonical work" in caplog.text
    await db.execute("DELETE FROM awa.runtime_instances")

    # A live drain-only runtime: no warning, one report line per change. It
    # holds finalize back on schema 39 only.
    await db.execute(INSERT_RUNTIME_SQL, "canonical_drain_only", "canonical_drain")
    caplog.clear()
    status = await report(ctx)
    assert status.live_drain_runtimes == (1 if ctx.schema.version == 39 else 0)
    assert (status.canonical_runners, status.stranded) == (1, 0)
    assert "no canonical_drain runtime" not in caplog.text
    caplog.clear()
    await report(ctx)
    assert caplog.text == ""

    await db.execute("DELETE FROM awa.jobs_hot")
    await db.execute("DELETE FROM awa.scheduled_jobs")
    await db.execute("DELETE FROM awa.runtime_instances")
    status = await report(ctx)
    assert status.backlog == 0
    assert "canonical plane drained and no runtime finalize waits for is live" in caplog.text


#: A statement that writes a runtime snapshot.
RUNTIME_SNAPSHOT_WRITE = re.compile(
    r"(INSERT\s+INTO|UPDATE)\s+awa\.runtime_instances", re.IGNORECASE)


def test_only_the_registration_writes_a_runtime_snapshot():
    """A snapshot row with a canonical or drain-only capability blocks
    storage_enter_mixed_transition and storage_finalize: awa_trio writes one
    row, its own, in one module, which withdraws it wherever it would count
    (tests/test_runtime_instance_gates.py); its cleanup only deletes rows
    unseen for a day."""
    package = Path(canonical_drain.__file__).parents[2]  # awa_trio/
    writers = [str(path.relative_to(package)) for path in sorted(package.rglob("*.py"))
               if RUNTIME_SNAPSHOT_WRITE.search(path.read_text())]
    assert writers == ["runtime_instance.py"]
    # The pattern does catch such a statement.
    assert RUNTIME_SNAPSHOT_WRITE.search("insert into awa.runtime_instances (pid) values (1)")


STALE_RUNNING_SQL = """
    UPDATE awa.jobs_hot
    SET state = 'running', attempt = $2, run_lease = 1, attempted_at = now() - interval '1 hour',
        heartbeat_at = now() - interval '1 hour', deadline_at = $3
    WHERE args->>'token' = $1
"""
TOKEN_STATE_SQL = """
    SELECT state::text FROM awa.jobs_hot WHERE args->>'token' = $1
    UNION ALL
    SELECT state::text FROM awa.scheduled_jobs WHERE args->>'token' = $1
"""


@pytest.mark.parametrize("rescue", ["heartbeat", "deadline"])
async def test_drain_rescue_fails_a_last_attempt_and_retries_the_others(db, awa_client, rescue):
    """After the flip a 0.6.1 drain runtime's failure write misses the
    canonical row; the drain's rescue records the failure of a last attempt
    instead of re-running it for ever, and retries the others as usual."""
    for token, max_attempts in (("last", 2), ("more", 3)):
        await trio.to_thread.run_sync(lambda token=token, max_attempts=max_attempts: awa_client.insert(
            {"token": token}, kind="k", queue="q", max_attempts=max_attempts))
    past = datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=5)
    deadline = past if rescue == "deadline" else None
    for token in ("last", "more"):
        await db.execute(STALE_RUNNING_SQL, token, 2, deadline)
    ctx = await make_context(db, heartbeat_staleness=3600 if rescue == "deadline" else 60)
    body = (canonical_drain.rescue_stale_heartbeats if rescue == "heartbeat"
            else canonical_drain.rescue_expired_deadlines)

    result = await body(ctx)

    assert sorted((job.args["token"], job.state) for job in result.rescued) == [
        ("last", "failed"), ("more", "retryable")]
    assert [await db.fetchval(TOKEN_STATE_SQL, token) for token in ("last", "more")] == [
        "failed", "retryable"]
    error = "heartbeat stale" if rescue == "heartbeat" else "hard deadline exceeded"
    [errors] = [job.errors for job in result.rescued if job.args["token"] == "last"]
    assert error in errors[-1]["error"]
    # Nothing else matches on the next pass.
    assert (await body(ctx)).rescued == []


async def test_maintenance_sessions_run_without_jit(db):
    """A JIT-compiled queue-storage rescue pass took 11 s here and could not
    be cancelled, so every term switch of a transition waited for it."""
    assert await db.fetchval("SHOW jit") == "off"
    async with db.transaction() as conn:
        assert await conn.fetchval("SHOW jit") == "off"
