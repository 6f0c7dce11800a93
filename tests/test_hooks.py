"""Rescue side effects: the hooks dispatcher (detached, bounded, nothing
leaks), follow-up jobs after a committed rescue, and in-flight cancellation
of exactly the rescued attempt."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

import pytest
import trio
import trio.testing
from test_rescue import db_now, insert_running, insert_waiting, job_snapshot, make_context

from awa_trio.branch import BranchSpec
from awa_trio.config import MaintenanceConfig
from awa_trio.engines.canonical import rescue_callbacks, rescue_deadlines, rescue_heartbeats
from awa_trio.hooks import FollowUpJob, Hooks, JobRescued, RescueReason
from awa_trio.jobs import JobRow
from awa_trio.service import MaintenanceService

EPOCH = datetime(2024, 1, 1, tzinfo=UTC)


def job(job_id: int = 1, kind: str = "k", run_lease: int = 1) -> JobRow:
    return JobRow(
        id=job_id, kind=kind, queue="q", args={}, state="retryable", priority=2, attempt=1,
        max_attempts=25, run_at=EPOCH, heartbeat_at=None, deadline_at=None, attempted_at=EPOCH,
        finalized_at=EPOCH, created_at=EPOCH, errors=[], metadata={}, tags=[], unique_key=None,
        unique_states=None, callback_id=None, callback_timeout_at=None, callback_filter=None,
        callback_on_complete=None, callback_on_fail=None, callback_transform=None,
        run_lease=run_lease, progress=None,
    )


def rescued(job_id: int = 1, kind: str = "k") -> JobRescued:
    return JobRescued(job(job_id, kind), RescueReason.STALE_HEARTBEAT)


# -- dispatcher (no database; virtual clock) -----------------------------------


async def test_dispatcher_runs_sync_and_async_handlers_of_the_event_kind(autojump_clock):
    hooks = Hooks()
    calls: list[tuple[str, int]] = []
    hooks.on_event("k", lambda event: calls.append(("sync", event.job.id)))

    @hooks.on_event("k")
    async def async_handler(event):
        await trio.sleep(1)
        calls.append(("async", event.job.id))

    hooks.on_event("other", lambda event: calls.append(("other", event.job.id)))

    async with trio.open_nursery() as nursery:
        await nursery.start(hooks.run, MaintenanceConfig())
        assert hooks.publish([rescued(1), rescued(2)]) == 0
        await trio.sleep(5)
        nursery.cancel_scope.cancel()
    assert sorted(calls) == [("async", 1), ("async", 2), ("sync", 1), ("sync", 2)]
    assert not hooks.is_running


async def test_failing_and_hanging_handlers_are_logged_and_bounded(autojump_clock, caplog):
    hooks = Hooks()
    finished: list[int] = []
    cancelled: list[int] = []

    def failing(event):
        raise RuntimeError("handler bug")

    async def hanging(event):
        try:
            await trio.sleep_forever()
        finally:
            cancelled.append(event.job.id)

    hooks.on_event("k", failing)
    hooks.on_event("k", hanging)
    hooks.on_event("k", lambda event: finished.append(event.job.id))
    config = MaintenanceConfig(hook_timeout=10)

    async with trio.open_nursery() as nursery:
        await nursery.start(hooks.run, config)
        hooks.publish([rescued(7, "k")])
        await trio.sleep(1)
        # The others ran while the hanging one still runs.
        assert finished == [7] and cancelled == []
        await trio.sleep(10)
        assert cancelled == [7]
        nursery.cancel_scope.cancel()

    failures = [r for r in caplog.records if "failed" in r.getMessage()]
    assert len(failures) == 1
    assert "JobRescued handler" in failures[0].getMessage()
    assert "for k job 7" in failures[0].getMessage()
    assert failures[0].exc_info[0] is RuntimeError
    timeouts = [r.getMessage() for r in caplog.records if "hook_timeout" in r.getMessage()]
    assert len(timeouts) == 1 and "hanging" in timeouts[0] and "k job 7" in timeouts[0]


async def test_full_queue_drops_events_with_a_counted_warning(caplog):
    hooks = Hooks()
    release = trio.Event()

    async def blocked(event):
        await release.wait()

    hooks.on_event("k", blocked)
    config = MaintenanceConfig(hook_queue_size=2, hook_concurrency=1)
    async with trio.open_nursery() as nursery:
        await nursery.start(hooks.run, config)
        hooks.publish([rescued(1)])
        await trio.testing.wait_all_tasks_blocked()
        # The dispatcher takes #2 and waits for a handler slot; #3 and #4 fill
        # the queue; #5 and #6 are dropped (publish never waits: it is synchronous).
        assert hooks.publish([rescued(n) for n in range(2, 7)]) == 2
        release.set()
        nursery.cancel_scope.cancel()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        "hooks: event queue full (hook_queue_size 2); dropped 2 of 5 events (2 dropped since start)"
    ]


async def test_publishing_without_a_dispatcher_neither_blocks_nor_fails(caplog):
    hooks = Hooks()
    hooks.on_event("k", lambda event: None)
    with caplog.at_level(logging.DEBUG, logger="awa_trio.hooks"):
        assert hooks.publish([rescued(1, "k"), rescued(2, "no_handlers")]) == 1
    assert "no dispatcher running; dropped 1 events" in caplog.text


async def test_stopping_the_dispatcher_cancels_running_handlers(autojump_clock):
    hooks = Hooks()
    outcome: list[str] = []

    async def slow(event):
        try:
            await trio.sleep(3600)
            outcome.append("finished")
        except trio.Cancelled:
            outcome.append("cancelled")
            raise

    hooks.on_event("k", slow)
    async with trio.open_nursery() as nursery:
        await nursery.start(hooks.run, MaintenanceConfig(hook_timeout=7200))
        hooks.publish([rescued()])
        await trio.sleep(1)
        nursery.cancel_scope.cancel()
    assert outcome == ["cancelled"]

    async with trio.open_nursery() as nursery:
        await nursery.start(hooks.run, MaintenanceConfig())
        with pytest.raises(RuntimeError, match="already being dispatched"):
            await hooks.run(MaintenanceConfig())
        nursery.cancel_scope.cancel()


# -- registration and the in-flight registry -----------------------------------


def test_in_flight_registry_calls_only_the_matching_attempt(caplog):
    hooks = Hooks()
    calls: list[str] = []
    hooks.in_flight.register(1, 2, lambda: calls.append("1/2"))
    hooks.in_flight.register(1, 1, lambda: calls.append("1/1 earlier attempt"))

    def broken():
        raise RuntimeError("callback bug")

    hooks.in_flight.register(1, 2, broken)
    hooks.in_flight.register(1, 2, lambda: calls.append("1/2 second"))
    assert hooks.cancel_in_flight([job(1, run_lease=2), job(3, run_lease=2)]) == 1
    assert calls == ["1/2", "1/2 second"]
    assert "cancel callback for job 1 (run_lease 2) failed" in caplog.text

    with hooks.in_flight.register(5, 1, lambda: calls.append("5/1")) as registration:
        assert (5, 1) in hooks.in_flight
    assert (5, 1) not in hooks.in_flight
    registration.unregister()  # idempotent
    assert not hooks.in_flight.cancel(5, 1)


def test_follow_up_factories_stack_and_are_validated():
    hooks = Hooks()
    hooks.on_rescued_enqueue("k", lambda job, reason: FollowUpJob("a", {"id": job.id}))
    hooks.on_rescued_enqueue("k", lambda job, reason: None)
    hooks.on_rescued_enqueue("k", lambda job, reason: [FollowUpJob("b"), FollowUpJob("c")])
    assert [f.kind for f in hooks.follow_ups_for(job(), RescueReason.STALE_HEARTBEAT)] == [
        "a", "b", "c"
    ]
    assert hooks.follow_ups_for(job(kind="other"), RescueReason.STALE_HEARTBEAT) == []

    hooks.on_rescued_enqueue("bad", lambda job, reason: [{"kind": "x"}])
    with pytest.raises(TypeError, match="expected FollowUpJob"):
        hooks.follow_ups_for(job(kind="bad"), RescueReason.STALE_HEARTBEAT)
    with pytest.raises(ValueError):
        FollowUpJob("")
    with pytest.raises(ValueError):
        hooks.on_event("", lambda event: None)
    with pytest.raises(TypeError):
        hooks.on_event("k", "not callable")


# -- follow-up jobs after a committed rescue (database) ------------------------

FOLLOW_UPS_SQL = """
    SELECT kind, queue, args, state, priority, max_attempts, metadata, tags, run_at
    FROM awa.jobs
    WHERE kind LIKE 'follow_%'
    ORDER BY id
"""


async def test_follow_up_jobs_are_inserted_after_the_rescue(db):
    hooks = Hooks()
    later = datetime.now(UTC) + timedelta(hours=1)
    hooks.on_rescued_enqueue("rescue_test", lambda job, reason: [
        FollowUpJob("follow_audit", {"job_id": job.id, "reason": reason}, queue="audit",
                    priority=1, max_attempts=3, metadata={"origin": "rescue"}, tags=["r"]),
        FollowUpJob("follow_later", {"job_id": job.id}, run_at=later),
    ])
    hooks.on_rescued_enqueue("unrelated", lambda job, reason: FollowUpJob("follow_wrong"))
    ctx = await make_context(db, hooks=hooks)
    now = await db_now(db)
    first = await insert_running(db, now)
    second = await insert_running(db, now, heartbeat_at=now, deadline_at=now - timedelta(seconds=1))

    heartbeat_result = await rescue_heartbeats.run_once(ctx)
    deadline_result = await rescue_deadlines.run_once(ctx)

    rows = [dict(r) for r in await db.fetch(FOLLOW_UPS_SQL)]
    assert [(r["kind"], r["args"], r["state"]) for r in rows] == [
        ("follow_audit", {"job_id": first, "reason": "stale_heartbeat"}, "available"),
        ("follow_later", {"job_id": first}, "scheduled"),
        ("follow_audit", {"job_id": second, "reason": "deadline_exceeded"}, "available"),
        ("follow_later", {"job_id": second}, "scheduled"),
    ]
    audit = rows[0]
    assert (audit["queue"], audit["priority"], audit["max_attempts"]) == ("audit", 1, 3)
    assert audit["metadata"] == {"origin": "rescue"} and audit["tags"] == ["r"]
    assert rows[1]["run_at"] == later
    assert heartbeat_result.follow_ups_inserted == 2 == deadline_result.follow_ups_inserted
    assert heartbeat_result.follow_up_failures == 0


async def test_failing_follow_ups_are_logged_and_the_rescue_stands(db, caplog):
    hooks = Hooks()
    # Priority 9 is refused by awa.insert_job_compat (23514): the whole job's
    # follow-ups roll back together, the valid one included.
    hooks.on_rescued_enqueue("rescue_test", lambda job, reason: [
        FollowUpJob("follow_ok", {"job_id": job.id}),
        FollowUpJob("follow_bad", priority=9),
    ])

    def broken_factory(job, reason):
        raise RuntimeError("factory bug")

    hooks.on_rescued_enqueue("other_kind", broken_factory)
    hooks.on_rescued_enqueue("third_kind", lambda job, reason: FollowUpJob("follow_fine"))
    ctx = await make_context(db, hooks=hooks)
    now = await db_now(db)
    bad_insert = await insert_running(db, now)
    bad_factory = await insert_running(db, now, kind="other_kind")
    fine = await insert_running(db, now, kind="third_kind")

    result = await rescue_heartbeats.run_once(ctx)

    for job_id in (bad_insert, bad_factory, fine):
        assert (await job_snapshot(db, job_id))["state"] == "retryable"
    assert [r["kind"] for r in await db.fetch(FOLLOW_UPS_SQL)] == ["follow_fine"]
    assert result.follow_up_failures == 2 and result.follow_ups_inserted == 1
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert any(f"inserting 2 follow-up jobs for rescue_test job {bad_insert} failed" in m
               and "the rescue stands" in m for m in errors)
    assert any(f"follow-up factory for other_kind job {bad_factory} failed" in m for m in errors)


async def run_and_collect_events(hooks: Hooks, ctx, branch, expected: int) -> tuple[object, list]:
    """One pass of ``branch`` with the dispatcher running; the events its
    handlers received."""
    seen: list = []
    hooks.on_event("rescue_test", seen.append)
    async with trio.open_nursery() as nursery:
        await nursery.start(hooks.run, ctx.config)
        result = await branch.run_once(ctx)
        with trio.fail_after(5):
            while len(seen) < expected:
                await trio.sleep(0.01)
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    return result, seen


async def test_callback_rescue_publishes_expired_callback_events_and_enqueues_follow_ups(db):
    """Both outcomes of an expired callback (retried, and failed on its last
    attempt) are rescues: handlers hear of them with reason expired_callback
    and each gets its follow-up job, the failed one included."""
    hooks = Hooks()
    hooks.on_rescued_enqueue("rescue_test", lambda job, reason: FollowUpJob(
        "follow_audit", {"job_id": job.id, "reason": reason, "state": job.state}))
    ctx = await make_context(db, hooks=hooks)
    now = await db_now(db)
    retried = await insert_waiting(db, now, attempt=1, max_attempts=3)
    exhausted = await insert_waiting(db, now, attempt=3, max_attempts=3)

    result, seen = await run_and_collect_events(hooks, ctx, rescue_callbacks, expected=2)

    assert (await job_snapshot(db, retried))["state"] == "retryable"
    assert (await job_snapshot(db, exhausted))["state"] == "failed"
    assert all(type(event) is JobRescued for event in seen)
    assert sorted((event.job.id, event.job.state, event.reason) for event in seen) == [
        (retried, "retryable", RescueReason.EXPIRED_CALLBACK),
        (exhausted, "failed", RescueReason.EXPIRED_CALLBACK),
    ]
    assert all(event.reason is RescueReason.EXPIRED_CALLBACK for event in seen)
    rows = [dict(r) for r in await db.fetch(FOLLOW_UPS_SQL)]
    assert sorted((r["kind"], r["state"], r["args"]["job_id"], r["args"]["reason"],
                   r["args"]["state"]) for r in rows) == [
        ("follow_audit", "available", retried, "expired_callback", "retryable"),
        ("follow_audit", "available", exhausted, "expired_callback", "failed"),
    ]
    assert result.follow_ups_inserted == 2 and result.follow_up_failures == 0
    assert result.events_dropped == 0


@pytest.mark.parametrize(
    ("branch", "overdue", "reason"),
    [
        (rescue_heartbeats, lambda now: {}, RescueReason.STALE_HEARTBEAT),
        (rescue_deadlines,
         lambda now: {"heartbeat_at": now, "deadline_at": now - timedelta(seconds=1)},
         RescueReason.DEADLINE_EXCEEDED),
    ],
    ids=["heartbeat", "deadline"],
)
async def test_running_rescues_publish_events_with_their_own_reason(db, branch, overdue, reason):
    """The reason tells a handler why its job was taken away; each branch
    must name its own."""
    hooks = Hooks()
    ctx = await make_context(db, hooks=hooks)
    now = await db_now(db)
    job_id = await insert_running(db, now, **overdue(now))

    result, seen = await run_and_collect_events(hooks, ctx, branch, expected=1)

    assert [job.id for job in result.rescued] == [job_id]
    assert [(type(event), event.job.id, event.job.state) for event in seen] == [
        (JobRescued, job_id, "retryable")
    ]
    assert seen[0].reason is reason


# -- in-flight cancellation from the rescue branches (database) -----------------


async def test_in_flight_callback_fires_for_the_rescued_attempt_only(db):
    hooks = Hooks()
    calls: list[str] = []
    ctx = await make_context(db, hooks=hooks)
    now = await db_now(db)
    stale = await insert_running(db, now, run_lease=3)
    overdue = await insert_running(db, now, heartbeat_at=now, run_lease=1,
                                   deadline_at=now - timedelta(seconds=1))
    healthy = await insert_running(db, now, heartbeat_at=now)
    waiting = await insert_waiting(db, now)
    hooks.in_flight.register(stale, 3, lambda: calls.append("stale lease 3"))
    hooks.in_flight.register(stale, 2, lambda: calls.append("stale lease 2 (wrong)"))
    hooks.in_flight.register(overdue, 1, lambda: calls.append("overdue lease 1"))
    hooks.in_flight.register(healthy, 1, lambda: calls.append("healthy (not rescued)"))
    hooks.in_flight.register(waiting, 1, lambda: calls.append("waiting (not running)"))

    assert (await rescue_heartbeats.run_once(ctx)).cancelled_in_flight == 1
    assert calls == ["stale lease 3"]
    assert (await rescue_deadlines.run_once(ctx)).cancelled_in_flight == 1
    assert calls == ["stale lease 3", "overdue lease 1"]
    callback_result = await rescue_callbacks.run_once(ctx)
    assert [j.id for j in callback_result.rescued] == [waiting]
    assert callback_result.cancelled_in_flight == 0
    assert calls == ["stale lease 3", "overdue lease 1"]


# -- a running service: handlers never delay maintenance -----------------------


async def test_slow_and_failing_handlers_do_not_delay_the_next_rescue_pass(
    database_url, db, caplog
):
    hooks = Hooks()
    started: dict[int, trio.Event] = {}
    outcome: dict[int, str] = {}

    def failing(event):
        raise RuntimeError("handler bug")

    async def sleeps_for_minutes(event):
        started[event.job.id].set()
        try:
            await trio.sleep(600)
            outcome[event.job.id] = "finished"
        except trio.Cancelled:
            outcome[event.job.id] = "cancelled"
            raise

    hooks.on_event("rescue_test", failing)
    hooks.on_event("rescue_test", sleeps_for_minutes)
    config = MaintenanceConfig(
        heartbeat_staleness=1, heartbeat_rescue_interval=0.2, leader_election_interval=0.2,
        hook_timeout=900,
    )
    heartbeat_branch = BranchSpec(
        rescue_heartbeats.NAME, config.heartbeat_rescue_interval, rescue_heartbeats.run_once)
    service = MaintenanceService(
        database_url, config, hooks=hooks, branch_factory=lambda config, schema: [heartbeat_branch])

    async def wait_until_retryable(job_id: int) -> None:
        while (await job_snapshot(db, job_id))["state"] != "retryable":
            await trio.sleep(0.05)

    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        with trio.fail_after(15):
            await service.wait_until_leader()
            now = await db_now(db)
            first = await insert_running(db, now)
            started[first] = trio.Event()
            await wait_until_retryable(first)
            await started[first].wait()

            second = await insert_running(db, now)
            started[second] = trio.Event()
            await wait_until_retryable(second)
            await started[second].wait()
        # The first job's handler is still sleeping: the branch never waited for it.
        assert outcome == {}
        service.stop()

    # Stopping the service cancelled both handlers: nothing outlives it.
    assert outcome == {first: "cancelled", second: "cancelled"}
    failures = [r.getMessage() for r in caplog.records
                if r.levelno == logging.ERROR and "handler" in r.getMessage()]
    assert any(f"rescue_test job {first} failed" in m for m in failures)
    assert any(f"rescue_test job {second} failed" in m for m in failures)
