"""Queue-storage rescues against real awa-pg 0.6.1 workers: a SIGKILLed
worker's job, a job past its hard deadline, callbacks that never came.

The workers run with their own rescues muted (they may hold the leader
lock: awa-pg runtimes compete for it), so every rescue here is awa_trio's,
called directly. Where a job must run again, the fresh worker promotes it.
"""

from __future__ import annotations

import signal

import trio
from conftest import in_thread
from support.awa_pg import awa_pg_worker
from support.contexts import make_context
from support.helpers import metric_points
from support.qs_rescue import job

from awa_trio.cli import resolve
from awa_trio.engines.queue_storage import rescue_callbacks, rescue_deadlines, rescue_heartbeats

KIND = "qs_crash_job"


async def rescue_until(ctx, module, job_id: int, *, timeout: float, every: float = 0.25):
    """Run a rescue branch until it rescues ``job_id``; returns its result."""
    with trio.fail_after(timeout):
        while True:
            result = await module.run_once(ctx)
            if any(j.id == job_id for j in result.rescued + result.duplicates_cancelled):
                return result
            await trio.sleep(every)


async def test_killed_worker_job_is_rescued_and_completed_on_attempt_2(
    qs_database_url, qs_db, qs_awa_client, meter_provider
):
    queue = "qs_crash"
    ctx = await make_context(qs_db, meter_provider=meter_provider, heartbeat_staleness=2)
    inserted = await in_thread(qs_awa_client.insert, {"n": 1}, kind=KIND, queue=queue)

    async with awa_pg_worker(qs_database_url, f"{KIND}:{queue}", behaviour="hang-first",
                             extra_args=["--role", "auto", "--mute-maintenance"]) as doomed:
        await doomed.wait_for_line(f"START {inserted.id} 1 ")
        doomed.kill()
        await doomed.process.wait()
    assert doomed.process.returncode == -signal.SIGKILL

    result = await rescue_until(ctx, rescue_heartbeats, inserted.id, timeout=30)
    [rescued] = [j for j in result.rescued if j.id == inserted.id]
    assert rescued.state == "retryable" and rescued.attempt == 1
    row = await job(qs_db, inserted.id)
    assert row["state"] == "retryable"
    assert row["errors"][-1]["error"] == rescue_heartbeats.RECEIPT_ERROR

    # hang-first again: it completes only if the job comes back as attempt 2.
    async with awa_pg_worker(qs_database_url, f"{KIND}:{queue}", behaviour="hang-first",
                             extra_args=["--role", "auto", "--mute-rescue",
                                         "--leader-election-interval-ms", "500"]) as fresh:
        await fresh.wait_for_line(f"DONE {inserted.id} 2 ", timeout=60)
        with trio.fail_after(20):
            # (A running fast-path attempt is not listed in awa.jobs at all.)
            while (row := await job(qs_db, inserted.id)) is None or row["state"] != "completed":
                await trio.sleep(0.1)
        completed = await job(qs_db, inserted.id)
        assert completed["attempt"] == 2
        # The completion is terminal history: a receipt completion batch or a done row.
        assert await qs_db.fetchval(
            "SELECT (SELECT count(*) FROM awa.receipt_completion_batches WHERE $1 = ANY(job_ids))"
            " + (SELECT count(*) FROM awa.done_entries WHERE job_id = $1 AND attempt = 2"
            "    AND state = 'completed')", inserted.id) == 1
    assert not any(line.startswith(f"START {inserted.id} 3") for line in fresh.lines)


async def test_a_job_past_its_deadline_is_rescued_from_a_live_worker(
    qs_database_url, qs_db, qs_awa_client, meter_provider
):
    queue = "qs_deadline"
    ctx = await make_context(qs_db, meter_provider=meter_provider)
    inserted = await in_thread(qs_awa_client.insert, {"n": 1}, kind=KIND, queue=queue)

    async with awa_pg_worker(qs_database_url, f"{KIND}:{queue}", behaviour="hang",
                             extra_args=["--role", "auto", "--mute-maintenance",
                                         "--deadline-ms", "1500"]) as worker:
        await worker.wait_for_line(f"START {inserted.id} 1 ")
        # On the fast claim path the attempt has no lease row: its deadline is the claim's.
        deadline = await qs_db.fetchval(
            "SELECT deadline_at - claimed_at FROM awa.lease_claims WHERE job_id = $1",
            inserted.id)
        assert 1.4 < deadline.total_seconds() <= 1.5
        assert await qs_db.fetchval(
            "SELECT count(*) FROM awa.leases WHERE job_id = $1", inserted.id) == 0
        result = await rescue_until(ctx, rescue_deadlines, inserted.id, timeout=30)

    [rescued] = [j for j in result.rescued if j.id == inserted.id]
    assert rescued.state == "retryable"
    row = await job(qs_db, inserted.id)
    assert row["state"] == "retryable"
    assert row["errors"][-1]["error"] == "hard deadline exceeded"
    assert await qs_db.fetchval(
        "SELECT outcome FROM awa.lease_claim_closures WHERE job_id = $1",
        inserted.id) == "deadline_expired"


async def test_callback_timeouts_retry_fail_or_dead_letter(
    qs_database_url, qs_db, qs_awa_client, meter_provider, metric_reader
):
    """A Python fleet can only get DLQ moves from awa_trio's own switches."""
    config = resolve(
        ["--dlq-enabled-default", "off", "--dlq-queue", "cb_dlq=on"], environ={}
    ).config
    ctx = await make_context(qs_db, config, meter_provider=meter_provider)
    retried = await in_thread(qs_awa_client.insert, {"n": 1}, kind=KIND, queue="cb_retry")
    dead = await in_thread(qs_awa_client.insert, {"n": 2}, kind=KIND, queue="cb_dlq",
                           max_attempts=1)
    failed = await in_thread(qs_awa_client.insert, {"n": 3}, kind=KIND, queue="cb_fail",
                             max_attempts=1)
    ids = {retried.id, dead.id, failed.id}

    async with awa_pg_worker(
        qs_database_url, f"{KIND}:cb_retry", f"{KIND}:cb_dlq", f"{KIND}:cb_fail",
        behaviour="callback",
        extra_args=["--role", "auto", "--mute-maintenance", "--callback-timeout-s", "1"],
    ) as worker:
        for job_id in ids:
            await worker.wait_for_line(f"WAITING {job_id} 1 ")
        # Waiting for a callback, each attempt is a materialised lease (the
        # worker prints WAITING just before its handler returns, so the last
        # lease may commit a moment after the line).
        with trio.fail_after(10):
            while await qs_db.fetchval(
                "SELECT count(*) FROM awa.leases WHERE state = 'waiting_external' "
                "AND job_id = ANY($1::bigint[])", list(ids)) != 3:
                await trio.sleep(0.05)
        rescued: dict[int, str] = {}
        with trio.fail_after(30):
            while set(rescued) != ids:
                result = await rescue_callbacks.run_once(ctx)
                rescued.update({j.id: j.state for j in result.rescued})
                await trio.sleep(0.25)

    assert rescued == {retried.id: "retryable", dead.id: "failed", failed.id: "failed"}
    retry_row = await qs_db.fetchrow(
        "SELECT state::text AS state, run_at > finalized_at AS backs_off "
        "FROM awa.deferred_jobs WHERE job_id = $1", retried.id)
    assert dict(retry_row) == {"state": "retryable", "backs_off": True}

    dlq = await qs_db.fetchrow(
        "SELECT dlq_reason, state::text AS state, attempt FROM awa.dlq_entries WHERE job_id = $1",
        dead.id)
    assert dict(dlq) == {"dlq_reason": "callback_timeout", "state": "failed", "attempt": 1}
    assert await qs_db.fetchval(
        "SELECT count(*) FROM awa.done_entries WHERE job_id = $1", dead.id) == 0
    moved = [(attrs, point.value) for attrs, point in metric_points(metric_reader,
                                                                     "awa.job.dlq_moved")]
    assert moved == [({"awa.job.kind": KIND, "awa.job.queue": "cb_dlq",
                       "awa.dlq.reason": "callback_timeout"}, 1)]

    assert await qs_db.fetchval(
        "SELECT state::text FROM awa.done_entries WHERE job_id = $1", failed.id) == "failed"
    assert await qs_db.fetchval(
        "SELECT count(*) FROM awa.dlq_entries WHERE job_id = $1", failed.id) == 0
    for job_id, state in ((retried.id, "retryable"), (dead.id, "failed"),
                          (failed.id, "failed")):
        row = await job(qs_db, job_id)
        assert row["state"] == state
        assert row["errors"][-1]["error"] == "callback timed out"
    assert await qs_db.fetchval(
        "SELECT count(*) FROM awa.leases WHERE job_id = ANY($1::bigint[])", list(ids)) == 0
