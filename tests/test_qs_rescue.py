"""Queue-storage rescues on the real schema (attempts claimed with awa's own
claim function; real-worker scenarios are in test_qs_worker_crash.py)."""

from __future__ import annotations

import pytest
import trio
from support.contexts import make_context
from support.helpers import metric_points
from support.qs_rescue import (
    age_claims,
    claim,
    deferred_retryable,
    expire_deadlines,
    insert_jobs,
    job,
    materialise,
    open_attempts,
    states,
)

from awa_trio.engines.queue_storage import rescue_deadlines, rescue_heartbeats
from awa_trio.hooks import FollowUpJob, Hooks, JobCancelled, JobRescued, RescueReason
from awa_trio.jobs import QUEUE_STORAGE

STALENESS = 60.0


def rescues_by_kind(reader) -> dict[str, int]:
    return {
        attributes["awa.rescue.kind"]: point.value
        for attributes, point in metric_points(reader, "awa.maintenance.rescues")
    }


async def test_stale_row_and_compact_receipt_claims_are_rescued_with_backoff(
    qs_db, meter_provider, metric_reader
):
    ctx = await make_context(qs_db, meter_provider=meter_provider, heartbeat_staleness=STALENESS)
    row_jobs = await insert_jobs(qs_db, 2, queue="with_deadline")
    compact_jobs = await insert_jobs(qs_db, 2, queue="no_deadline")
    await claim(qs_db, "with_deadline", 2, deadline=300)
    await claim(qs_db, "no_deadline", 2, deadline=0)
    await age_claims(qs_db, STALENESS * 2)
    fresh = await insert_jobs(qs_db, 1, queue="no_deadline")
    await claim(qs_db, "no_deadline", 1, deadline=0)

    result = await rescue_heartbeats.run_once(ctx)

    rescued = row_jobs + compact_jobs
    assert sorted(j.id for j in result.rescued) == rescued
    assert all(j.engine == QUEUE_STORAGE and j.state == "retryable" for j in result.rescued)
    assert await deferred_retryable(qs_db) == rescued
    for job_id in rescued:
        row = await job(qs_db, job_id)
        assert row["state"] == "retryable" and row["attempt"] == 1
        assert row["errors"][-1]["error"] == rescue_heartbeats.RECEIPT_ERROR
    # Backoff, not "run again at once".
    assert await qs_db.fetchval(
        "SELECT bool_and(run_at > finalized_at) FROM awa.deferred_jobs") is True
    # Each attempt closed in its own ledger: row claims explicitly, compact ones in a batch.
    assert await qs_db.fetchval(
        "SELECT array_agg(job_id ORDER BY job_id) FROM awa.lease_claim_closures "
        "WHERE outcome = 'rescued'") == row_jobs
    assert await qs_db.fetchval(
        "SELECT sum(closed_count) FROM awa.lease_claim_closure_batches "
        "WHERE outcome = 'rescued'") == 2
    assert await qs_db.fetchval(
        "SELECT count(*) FROM awa.lease_claims WHERE closed_at IS NULL") == 0
    # The fresh claim is untouched (awa.jobs does not list fast-path claims at all).
    assert await open_attempts(qs_db) == fresh
    assert rescues_by_kind(metric_reader) == {"heartbeat": 4}

    # A second pass finds nothing left to rescue.
    again = await rescue_heartbeats.run_once(ctx)
    assert again.rescued == [] and again.batches == 1


async def test_a_heartbeat_in_attempt_state_keeps_a_claim_alive(qs_db, meter_provider):
    ctx = await make_context(qs_db, meter_provider=meter_provider, heartbeat_staleness=STALENESS)
    ids = await insert_jobs(qs_db, 2, queue="hb")
    claimed = await claim(qs_db, "hb", 2, deadline=0)
    await age_claims(qs_db, STALENESS * 2)
    alive = claimed[0]
    await qs_db.execute(
        "INSERT INTO awa.attempt_state (job_id, run_lease, heartbeat_at) "
        "VALUES ($1, $2, clock_timestamp())", alive["job_id"], alive["run_lease"])

    result = await rescue_heartbeats.run_once(ctx)

    assert [j.id for j in result.rescued] == [claimed[1]["job_id"]]
    assert await open_attempts(qs_db) == [alive["job_id"]]
    assert set(ids) == {c["job_id"] for c in claimed}


async def test_stale_and_expired_leases_are_rescued_and_their_claims_closed(
    qs_db, meter_provider, metric_reader
):
    """Materialised attempts (a leases row beside the claim) go through the
    lease side; the claim they came from is closed too."""
    ctx = await make_context(qs_db, meter_provider=meter_provider, heartbeat_staleness=STALENESS)
    stale, alive, overdue = await insert_jobs(qs_db, 3, queue="leased")
    await claim(qs_db, "leased", 3, deadline=300)
    await materialise(qs_db, [stale], heartbeat_age=STALENESS * 2)
    await materialise(qs_db, [alive, overdue])
    await qs_db.execute(
        "UPDATE awa.leases SET deadline_at = clock_timestamp() - interval '1 second' "
        "WHERE job_id = $1", overdue)
    # Progress reported by the worker travels with the rescued job.
    await qs_db.execute(
        "INSERT INTO awa.attempt_state (job_id, run_lease, progress) VALUES ($1, 1, $2)",
        stale, {"percent": 40})

    heartbeats = await rescue_heartbeats.run_once(ctx)
    deadlines = await rescue_deadlines.run_once(ctx)

    assert [j.id for j in heartbeats.rescued] == [stale]
    assert heartbeats.rescued[0].progress == {"percent": 40}
    assert heartbeats.rescued[0].errors[-1]["error"] == rescue_heartbeats.LEASE_ERROR
    assert [j.id for j in deadlines.rescued] == [overdue]
    assert await qs_db.fetchval(
        "SELECT array_agg(job_id ORDER BY job_id) FROM awa.leases") == [alive]
    assert await deferred_retryable(qs_db) == [stale, overdue]
    assert await qs_db.fetchval(
        "SELECT payload -> 'progress' FROM awa.deferred_jobs WHERE job_id = $1",
        stale) == {"percent": 40}
    # The claims behind the leases are closed by the rescue ('rescue'), not left open.
    assert await qs_db.fetchval(
        "SELECT array_agg(job_id ORDER BY job_id) FROM awa.lease_claim_closures "
        "WHERE outcome = 'rescue'") == [stale, overdue]
    assert await open_attempts(qs_db) == [alive]
    assert await qs_db.fetchval("SELECT count(*) FROM awa.attempt_state") == 0
    assert rescues_by_kind(metric_reader) == {"heartbeat": 1, "deadline": 1}


async def test_claims_whose_completion_lock_is_held_are_skipped(qs_db, meter_provider):
    ctx = await make_context(qs_db, meter_provider=meter_provider, heartbeat_staleness=STALENESS)
    row_ids = await insert_jobs(qs_db, 2, queue="locked_rows")
    compact_ids = await insert_jobs(qs_db, 2, queue="locked_compact")
    rows = await claim(qs_db, "locked_rows", 2, deadline=300)
    compact = await claim(qs_db, "locked_compact", 2, deadline=0)
    await age_claims(qs_db, STALENESS * 2)
    held = [rows[0], compact[0]]

    async with qs_db.transaction() as worker:
        # What a worker holds while it completes these two attempts.
        for attempt in held:
            await worker.execute(
                "SELECT pg_advisory_xact_lock(hashtextextended("
                "format('awa.receipt.complete:%s:%s', $1::bigint, $2::bigint), 0))",
                attempt["job_id"], attempt["run_lease"])
        during = await rescue_heartbeats.run_once(ctx)
        assert sorted(j.id for j in during.rescued) == sorted(
            [rows[1]["job_id"], compact[1]["job_id"]])
        assert await open_attempts(qs_db) == sorted(a["job_id"] for a in held)

    after = await rescue_heartbeats.run_once(ctx)
    assert sorted(j.id for j in after.rescued) == sorted(a["job_id"] for a in held)
    assert await deferred_retryable(qs_db) == sorted(row_ids + compact_ids)


async def test_expired_receipt_deadlines_are_rescued(qs_db, meter_provider, metric_reader):
    ctx = await make_context(qs_db, meter_provider=meter_provider)
    ids = await insert_jobs(qs_db, 3, queue="deadlines")
    await claim(qs_db, "deadlines", 3, deadline=300)
    await expire_deadlines(qs_db, ids[:2])

    result = await rescue_deadlines.run_once(ctx)

    assert sorted(j.id for j in result.rescued) == ids[:2]
    for job_id in ids[:2]:
        row = await job(qs_db, job_id)
        assert row["state"] == "retryable"
        assert row["errors"][-1]["error"] == "hard deadline exceeded"
    assert await qs_db.fetchval(
        "SELECT array_agg(job_id ORDER BY job_id) FROM awa.lease_claim_closures "
        "WHERE outcome = 'deadline_expired'") == ids[:2]
    assert await open_attempts(qs_db) == ids[2:]
    assert rescues_by_kind(metric_reader) == {"deadline": 2}


async def test_unique_claim_conflict_cancels_that_row_and_the_sweep_goes_on(
    qs_db, meter_provider, metric_reader
):
    ctx = await make_context(qs_db, meter_provider=meter_provider, heartbeat_staleness=STALENESS)
    key = b"charge:42"
    # Claims only `retryable`: running, the job holds no claim.
    [conflicted] = await insert_jobs(qs_db, 1, queue="uq", unique_key=key, unique_states="00001000")
    [plain] = await insert_jobs(qs_db, 1, queue="uq")
    await claim(qs_db, "uq", 2, deadline=0)
    # A newer duplicate takes the claim while the first one runs.
    [newer] = await insert_jobs(qs_db, 1, queue="uq_newer", unique_key=key,
                                unique_states="01001000")
    assert await qs_db.fetchval(
        "SELECT job_id FROM awa.job_unique_claims WHERE unique_key = $1", key) == newer
    await age_claims(qs_db, STALENESS * 2)

    result = await rescue_heartbeats.run_once(ctx)

    assert [j.id for j in result.duplicates_cancelled] == [conflicted]
    assert [j.id for j in result.rescued] == [plain]
    assert (await states(qs_db, [conflicted, plain, newer])) == {
        conflicted: "cancelled", plain: "retryable", newer: "available"}
    done = await qs_db.fetchrow(
        "SELECT state::text AS state, payload FROM awa.done_entries WHERE job_id = $1", conflicted)
    assert done["state"] == "cancelled"
    assert done["payload"]["errors"][-1]["error"] == rescue_heartbeats.DUPLICATE_ERROR
    assert done["payload"]["errors"][-1]["terminal"] is True
    # The holder keeps its claim.
    assert await qs_db.fetchval(
        "SELECT job_id FROM awa.job_unique_claims WHERE unique_key = $1", key) == newer
    # Counted like upstream: the terminal row has its count delta.
    assert await qs_db.fetchval(
        "SELECT sum(terminal_delta) FROM awa.queue_terminal_count_deltas WHERE queue = 'uq'") == 1
    assert rescues_by_kind(metric_reader) == {
        "heartbeat": 1, "heartbeat_duplicate_cancelled": 1}


async def test_a_row_that_fails_its_batch_is_redone_alone_under_a_savepoint(
    qs_db, meter_provider
):
    """A stray deferred row for one job makes the batch insert fail with
    23505 (deferred_jobs_pkey): the batch is redone row by row, that row
    becomes a cancelled terminal row, the others are rescued."""
    ctx = await make_context(qs_db, meter_provider=meter_provider, heartbeat_staleness=STALENESS)
    ids = await insert_jobs(qs_db, 3, queue="poison")
    await claim(qs_db, "poison", 3, deadline=300)
    await age_claims(qs_db, STALENESS * 2)
    poisoned = ids[1]
    await qs_db.execute(
        "INSERT INTO awa.deferred_jobs (job_id, kind, queue, state, priority, run_at, run_lease) "
        "VALUES ($1, 'stray', 'stray', 'scheduled', 2, now() + interval '1 hour', 99)", poisoned)

    result = await rescue_heartbeats.run_once(ctx)

    assert result.row_by_row_batches == 1
    assert sorted(j.id for j in result.rescued) == [ids[0], ids[2]]
    assert [j.id for j in result.duplicates_cancelled] == [poisoned]
    assert await qs_db.fetchval(
        "SELECT state::text FROM awa.done_entries WHERE job_id = $1", poisoned) == "cancelled"
    assert await open_attempts(qs_db) == []


async def test_hooks_follow_ups_and_in_flight_cancellation_on_queue_storage(
    qs_db, meter_provider
):
    hooks = Hooks()
    events: list = []
    hooks.on_event("hooked", events.append)
    hooks.on_rescued_enqueue(
        "hooked",
        lambda job, reason: FollowUpJob(
            "audit", {"rescued": job.id, "engine": job.engine, "reason": str(reason)},
            queue="audits"),
    )
    ctx = await make_context(qs_db, meter_provider=meter_provider, hooks=hooks,
                             heartbeat_staleness=STALENESS)
    [job_id] = await insert_jobs(qs_db, 1, kind="hooked", queue="hooks")
    [attempt] = await claim(qs_db, "hooks", 1, deadline=0)
    await age_claims(qs_db, STALENESS * 2)
    cancelled: list[str] = []
    hooks.in_flight.register(job_id, attempt["run_lease"], lambda: cancelled.append("qs"),
                             engine=QUEUE_STORAGE)
    # The canonical job with the same id is another job: it must be left alone.
    hooks.in_flight.register(job_id, attempt["run_lease"], lambda: cancelled.append("canonical"))

    async with trio.open_nursery() as nursery:
        await nursery.start(hooks.run, ctx.config)
        result = await rescue_heartbeats.run_once(ctx)
        with trio.fail_after(5):
            while not events:
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()

    assert cancelled == ["qs"] and result.cancelled_in_flight == 1
    assert result.follow_ups_inserted == 1
    [event] = events
    assert isinstance(event, JobRescued) and event.reason is RescueReason.STALE_HEARTBEAT
    assert event.job.id == job_id and event.job.engine == QUEUE_STORAGE
    follow_up = await qs_db.fetchrow(
        "SELECT kind, queue, args, state::text AS state FROM awa.jobs WHERE kind = 'audit'")
    assert dict(follow_up) == {
        "kind": "audit", "queue": "audits", "state": "available",
        "args": {"rescued": job_id, "engine": "queue_storage", "reason": "stale_heartbeat"},
    }
    # It went to queue storage, the live engine.
    assert await qs_db.fetchval("SELECT count(*) FROM awa.ready_entries WHERE kind = 'audit'") == 1


async def test_a_duplicate_cancellation_is_an_event_and_cancels_the_attempt(qs_db, meter_provider):
    hooks = Hooks()
    events: list = []
    hooks.on_event("dup", events.append)
    ctx = await make_context(qs_db, meter_provider=meter_provider, hooks=hooks,
                             heartbeat_staleness=STALENESS)
    [job_id] = await insert_jobs(qs_db, 1, kind="dup", queue="dups", unique_key=b"k",
                                 unique_states="00001000")
    [attempt] = await claim(qs_db, "dups", 1, deadline=0)
    await insert_jobs(qs_db, 1, kind="dup", queue="dups_newer", unique_key=b"k",
                      unique_states="01001000")
    await age_claims(qs_db, STALENESS * 2)
    cancelled = []
    hooks.in_flight.register(job_id, attempt["run_lease"], lambda: cancelled.append(1),
                             engine=QUEUE_STORAGE)

    async with trio.open_nursery() as nursery:
        await nursery.start(hooks.run, ctx.config)
        await rescue_heartbeats.run_once(ctx)
        with trio.fail_after(5):
            while not events:
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()

    [event] = events
    assert isinstance(event, JobCancelled) and event.job.state == "cancelled"
    assert event.reason == rescue_heartbeats.DUPLICATE_ERROR
    assert cancelled == [1]


BATCH = 40
BACKLOG = 11 * BATCH + 7  # more than ten batches


async def make_backlog(db) -> list[int]:
    ids = await insert_jobs(db, BACKLOG, queue="backlog")
    await claim(db, "backlog", BACKLOG, deadline=0)
    await age_claims(db, STALENESS * 2)
    return ids


async def test_a_backlog_of_more_than_ten_batches_drains_in_one_tick(qs_db, meter_provider):
    ctx = await make_context(qs_db, meter_provider=meter_provider, heartbeat_staleness=STALENESS,
                             rescue_batch_size=BATCH, drain_time_budget=60,
                             heartbeat_rescue_interval=120)
    ids = await make_backlog(qs_db)

    result = await rescue_heartbeats.run_once(ctx)

    assert result.batches == 12 and result.drained
    assert len(result.rescued) == BACKLOG
    assert await deferred_retryable(qs_db) == ids
    assert await open_attempts(qs_db) == []


async def test_a_tiny_budget_drains_the_backlog_one_batch_per_tick(qs_db, meter_provider):
    ctx = await make_context(qs_db, meter_provider=meter_provider, heartbeat_staleness=STALENESS,
                             rescue_batch_size=BATCH, drain_time_budget=0.001)
    ids = await make_backlog(qs_db)

    ticks = []
    while True:
        result = await rescue_heartbeats.run_once(ctx)
        ticks.append(len(result.rescued))
        rescued_so_far = await deferred_retryable(qs_db)
        assert len(rescued_so_far) == sum(ticks)
        if result.drained:
            break
        assert result.batches == 1
    assert ticks == [BATCH] * 11 + [7]
    assert await deferred_retryable(qs_db) == ids
    assert await open_attempts(qs_db) == []


async def test_cancelling_a_drain_leaves_every_batch_applied_or_untouched(qs_db, meter_provider):
    ctx = await make_context(qs_db, meter_provider=meter_provider, heartbeat_staleness=STALENESS,
                             rescue_batch_size=BATCH, drain_time_budget=60,
                             heartbeat_rescue_interval=120)
    ids = await make_backlog(qs_db)

    async def cancel_once_a_batch_committed(scope: trio.CancelScope) -> None:
        while not await deferred_retryable(qs_db):
            await trio.sleep(0.005)
        scope.cancel()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(cancel_once_a_batch_committed, nursery.cancel_scope)
        await rescue_heartbeats.run_once(ctx)
        pytest.fail("the drain finished before it could be cancelled")

    rescued = await deferred_retryable(qs_db)
    still_open = await open_attempts(qs_db)
    assert 0 < len(rescued) < BACKLOG
    assert sorted(rescued + still_open) == ids
    assert len(rescued) % BATCH == 0
    # Nothing half-done: every rescued job has its closure, no open one has a successor.
    closed = await qs_db.fetchval(
        "SELECT coalesce(sum(closed_count), 0) FROM awa.lease_claim_closure_batches")
    assert closed == len(rescued)
    rest = await rescue_heartbeats.run_once(ctx)
    assert len(rest.rescued) == len(still_open)
    assert await deferred_retryable(qs_db) == ids


def test_in_flight_registrations_are_keyed_by_engine():
    """Canonical and queue-storage ids collide during a transition."""
    hooks = Hooks()
    calls: list[str] = []
    canonical = hooks.in_flight.register(7, 1, lambda: calls.append("canonical"))
    hooks.in_flight.register(7, 1, lambda: calls.append("qs"), engine=QUEUE_STORAGE)

    assert (7, 1) in hooks.in_flight
    assert ("canonical", 7, 1) in hooks.in_flight and (QUEUE_STORAGE, 7, 1) in hooks.in_flight
    assert canonical.engine == "canonical"
    assert hooks.in_flight.cancel(7, 1, engine=QUEUE_STORAGE) and calls == ["qs"]
    assert hooks.in_flight.cancel(7, 1) and calls == ["qs", "canonical"]
    canonical.unregister()
    assert (7, 1) not in hooks.in_flight and (QUEUE_STORAGE, 7, 1) in hooks.in_flight
    with pytest.raises(ValueError):
        hooks.in_flight.register(7, 1, print, engine="sqlite")
