"""Jobs on time: a branch with ``next_wake`` runs at the next due time its
last pass reported, not only at its grid ticks (MockClock, no database); and
promote_scheduled on both engines probes the next run_at and promotes a job
near it, waking the queue's listeners (real database, awa-pg producer)."""

import dataclasses
import datetime as dt
import types

import trio
from conftest import in_thread
from support.helpers import metric_points
from support.qs_jobs import Listener

from awa_trio import MaintenanceConfig, MaintenanceService
from awa_trio.branch import BranchSlot, BranchSpec, run_branch
from awa_trio.engines.canonical import promote
from awa_trio.engines.queue_storage import promote as qs_promote
from awa_trio.metrics import MaintenanceMetrics
from awa_trio.tracker import TickDecision
from awa_trio.tracker_actor import run_tracker

CTX = types.SimpleNamespace(config=MaintenanceConfig())


class CountingTracker:
    """Lets every body run and keeps what the branch reported."""

    def __init__(self, run=True):
        self.run = run
        self.begun, self.finished = [], []

    async def begin_tick(self, branch, interval, *, cooldown=True):
        self.begun.append(trio.current_time())
        return TickDecision(run=self.run)

    async def finish_tick(self, branch, duration, error=None):
        self.finished.append(duration)


def hinting_spec(interval, hints, body_seconds=0.0, **kwargs):
    """A branch whose n-th body reports ``hints[n]`` (seconds after that
    body started; None: nothing known) as its next due time."""
    starts = []

    async def run_once(ctx):
        starts.append(trio.current_time())
        hint = hints[len(starts) - 1] if len(starts) <= len(hints) else None
        due = None if hint is None else trio.current_time() + hint
        await trio.sleep(body_seconds)
        return due

    spec = BranchSpec("hinted", interval, run_once, next_wake=lambda due: due, **kwargs)
    return spec, starts


async def run_for(seconds, spec, tracker, slot=None):
    with trio.move_on_after(seconds):
        await run_branch(spec, CTX, tracker, slot)


async def test_a_branch_wakes_at_the_reported_due_time_and_keeps_its_grid(autojump_clock):
    spec, starts = hinting_spec(1.0, [0.3, 0.2, None, 5.0], run_immediately=True)
    await run_for(3.5, spec, CountingTracker())
    # 0 (at once), 0.3 and 0.5 (early), then the grid 1, 2, 3: the hint of
    # 5 s at 1 lies past the next tick, which comes first.
    assert [round(t, 6) for t in starts] == [0, 0.3, 0.5, 1, 2, 3]


async def test_without_next_wake_the_grid_alone_decides(autojump_clock):
    spec, starts = hinting_spec(1.0, [0.3, 0.3], run_immediately=True)
    spec = dataclasses.replace(spec, next_wake=None)
    await run_for(2.5, spec, CountingTracker())
    assert [round(t, 6) for t in starts] == [0, 1, 2]


async def test_early_wakes_keep_the_minimum_gap_after_the_previous_start(autojump_clock):
    spec, starts = hinting_spec(1.0, [0.0, -1.0, 0.001, 0.0], run_immediately=True, min_wake_gap=0.01)
    await run_for(0.5, spec, CountingTracker())
    # A due time already past, or closer than the gap, waits for the gap.
    assert [round(t, 6) for t in starts][:5] == [0, 0.01, 0.02, 0.03, 0.04]


async def test_every_early_pass_goes_through_the_tracker(autojump_clock):
    spec, starts = hinting_spec(1.0, [0.1, 0.1, 0.1], run_immediately=True)
    tracker = CountingTracker()
    await run_for(0.95, spec, tracker)
    assert len(starts) == 4 and len(tracker.begun) == 4 and len(tracker.finished) == 4


async def test_a_skipped_pass_reports_nothing_and_leaves_the_grid_to_wake_it(autojump_clock):
    spec, starts = hinting_spec(1.0, [0.1, 0.1], run_immediately=True)
    tracker = CountingTracker(run=False)
    await run_for(2.5, spec, tracker)
    assert starts == [] and [round(t, 6) for t in tracker.begun] == [0, 1, 2]


async def test_a_failed_body_wakes_at_its_next_tick(autojump_clock, caplog):
    from awa_trio.db import DatabaseError

    starts = []

    async def run_once(ctx):
        starts.append(trio.current_time())
        raise DatabaseError("boom")

    spec = BranchSpec("hinted", 1.0, run_once, run_immediately=True, next_wake=lambda due: 0.0)
    ctx = types.SimpleNamespace(config=MaintenanceConfig(), metrics=MaintenanceMetrics())
    with trio.move_on_after(2.5):
        await run_branch(spec, ctx, CountingTracker())
    assert [round(t, 6) for t in starts] == [0, 1, 2]


async def test_an_early_pass_that_overruns_counts_towards_the_tracker_hysteresis(autojump_clock):
    """Every early pass takes 0.5 s against a 0.1 s interval: the tracker
    sees each one, flips to delayed after three, and its cooldown then
    skips ticks (the skipped ones report no due time, so the grid wakes)."""
    spec, starts = hinting_spec(0.1, [0.0] * 100, body_seconds=0.5, run_immediately=True)
    async with trio.open_nursery() as nursery:
        tracker = await nursery.start(run_tracker, MaintenanceMetrics())
        await run_for(3.0, spec, tracker)
        snapshot = await tracker.snapshot()
        nursery.cancel_scope.cancel()
    assert snapshot["hinted"]["delayed"]
    assert snapshot["hinted"]["skipped_ticks"] > 0
    # Back to back while on time (0, 0.5, 1.0), the flip skips the fourth.
    assert [round(t, 6) for t in starts[:3]] == [0, 0.5, 1.0]
    assert starts[3] > 1.5


async def test_a_reloaded_interval_keeps_the_pending_early_wake(autojump_clock):
    spec, starts = hinting_spec(10.0, [3.0, None, None])
    slot = BranchSlot(spec, CTX)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(run_branch, spec, CTX, CountingTracker(), slot)
        await trio.sleep(11)  # the grid body at 10 says: next due at 13
        slot.update(dataclasses.replace(spec, interval=20.0), CTX)  # next tick 10 + 20
        await trio.sleep(25)
        nursery.cancel_scope.cancel()
    assert [round(t, 6) for t in starts] == [10, 13, 30]


# -- the database: probes and a job promoted near its run_at ---------------------


def plan_text(rows):
    return "\n".join(row[0] for row in rows)


async def insert_at(awa_client, run_at, queue="ontime"):
    job = await in_thread(awa_client.insert, {"n": 1}, kind="ontime", queue=queue, run_at=run_at)
    return job.id


async def test_the_canonical_probe_is_an_index_probe_per_state(db):
    plan = plan_text(await db.fetch("EXPLAIN " + promote.DUE_STATES_SQL.render()))
    for state in ("scheduled", "retryable"):
        assert f"idx_awa_scheduled_jobs_run_at_{state}" in plan
    assert "Seq Scan" not in plan and "Sort" not in plan


async def test_the_queue_storage_probe_is_an_index_probe_per_state(qs_db, qs_awa_client):
    """With many rows ahead (where a paused-queue filter inside the search
    made the planner scan and sort them all)."""
    from support.qs_jobs import insert_scheduled

    await insert_scheduled(qs_awa_client, 20_000, queue="ahead")
    await qs_db.execute("ANALYZE awa.deferred_jobs")
    # The paused-queue list is read from queue_meta (a handful of rows).
    plan = plan_text(await qs_db.fetch("EXPLAIN " + qs_promote.DUE_STATES_SQL.render("awa")))
    assert plan.count("idx_awa_deferred_due") == 4
    assert "Seq Scan on deferred_jobs" not in plan and "Sort" not in plan


async def test_the_probe_reports_the_next_due_time_of_either_state(maintenance_ctx, db, awa_client):
    assert (await promote.run_once(maintenance_ctx)).next_due_at is None
    now = dt.datetime.now(dt.UTC)
    await insert_at(awa_client, now + dt.timedelta(hours=1))
    retry_soon = await insert_at(awa_client, now + dt.timedelta(hours=1))
    await db.execute(
        "UPDATE awa.scheduled_jobs SET state = 'retryable', run_at = now() + interval '90 seconds' WHERE id = $1",
        retry_soon,
    )
    before = trio.current_time()
    result = await promote.run_once(maintenance_ctx)
    assert result.total == 0
    assert before + 85 < result.next_due_at < trio.current_time() + 90


async def test_the_queue_storage_probe_leaves_paused_queues_out(qs_ctx, qs_db, qs_awa_client):
    now = dt.datetime.now(dt.UTC)
    await insert_at(qs_awa_client, now + dt.timedelta(seconds=60), queue="paused")
    await insert_at(qs_awa_client, now + dt.timedelta(seconds=600), queue="running")
    await trio.to_thread.run_sync(qs_awa_client.pause_queue, "paused")
    before = trio.current_time()
    result = await qs_promote.run_once(qs_ctx)
    assert before + 590 < result.next_due_at < trio.current_time() + 600


async def running_leader(database_url, meter_provider, task_status=trio.TASK_STATUS_IGNORED):
    """A leader whose poll alone would not promote for a minute: only an
    early wake promotes a job due a second or two after it starts."""
    service = MaintenanceService(
        database_url,
        MaintenanceConfig(promote_interval=60.0, leader_election_interval=0.2),
        meter_provider=meter_provider,
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        await service.wait_until_leader()
        task_status.started(nursery.cancel_scope)


LANDED_TRIGGER = """
    CREATE TABLE landed (id bigint, landed_at timestamptz, due_at timestamptz);
    CREATE FUNCTION record_landed() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        INSERT INTO landed VALUES (NEW.{id}, clock_timestamp(), NEW.run_at);
        RETURN NEW;
    END $$;
    CREATE TRIGGER record_landed AFTER INSERT ON {table}
        FOR EACH ROW WHEN (NEW.{state_check}) EXECUTE FUNCTION record_landed();
"""


async def promoted_at_its_run_at(database_url, db, awa_client, meter_provider, metric_reader, trigger):
    """Scheduled three seconds ahead, before a leader with a poll of a
    minute is elected: its first pass (at once) learns the run_at, and the
    job lands (recorded by a trigger, as the bench measures it) without
    waiting for the poll; the queue's listeners are notified, and the
    lateness histogram has it."""
    await db.execute(trigger)
    run_at = await db.fetchval("SELECT now() + interval '3 seconds'")
    job_id = await insert_at(awa_client, run_at)
    async with Listener(database_url, ["awa:ontime"]) as listener, trio.open_nursery() as nursery:
        leader = await nursery.start(running_leader, database_url, meter_provider)
        assert not await db.fetchval("SELECT count(*) FROM landed")
        with trio.fail_after(20):  # the poll would take 60 s
            while not await db.fetchval("SELECT count(*) FROM landed"):
                await trio.sleep(0.05)
        assert await listener.wait_for("awa:ontime")
        leader.cancel()
    landed = await db.fetchrow("SELECT id, landed_at FROM landed")
    assert landed["id"] == job_id and landed["landed_at"] >= run_at
    lateness = metric_points(metric_reader, "awa_trio.promote.lateness")
    assert [(attrs, point.count) for attrs, point in lateness] == [({"awa.job.state": "scheduled"}, 1)]
    assert lateness[0][1].min >= 0


async def test_a_job_is_promoted_at_its_run_at_not_at_the_next_poll(
    database_url, db, awa_client, meter_provider, metric_reader
):
    trigger = LANDED_TRIGGER.format(id="id", table="awa.jobs_hot", state_check="state = 'available'")
    await promoted_at_its_run_at(database_url, db, awa_client, meter_provider, metric_reader, trigger)


async def test_a_queue_storage_job_is_promoted_at_its_run_at_not_at_the_next_poll(
    qs_database_url, qs_db, qs_awa_client, meter_provider, metric_reader
):
    trigger = LANDED_TRIGGER.format(id="job_id", table="awa.ready_entries", state_check="job_id IS NOT NULL")
    await promoted_at_its_run_at(qs_database_url, qs_db, qs_awa_client, meter_provider, metric_reader, trigger)


def test_the_promote_branch_wakes_early_on_both_engines():
    from awa_trio.engines.canonical.registry import canonical_branches
    from awa_trio.engines.queue_storage.registry import queue_storage_branches

    config = MaintenanceConfig(promote_min_gap="25ms")
    for branches in (canonical_branches(config), queue_storage_branches(config)):
        (spec,) = [spec for spec in branches if spec.name == "promote_scheduled"]
        assert spec.next_wake is not None and spec.min_wake_gap == 0.025 and spec.run_immediately
    assert MaintenanceConfig().promote_min_gap == 0.010


# -- cron_eval wakes at the next fire ---------------------------------------------


async def test_a_pass_reports_the_next_fire_of_the_schedules_it_read(db):
    from awa_trio.cron import PeriodicJob
    from awa_trio.cron.branches import evaluate_schedules
    from awa_trio.cron.store import upsert_cron_job

    now = (await db.fetchval("SELECT now()")).replace(microsecond=0)
    hourly = PeriodicJob("hourly", "0 * * * *", kind="tick")
    every_ten = PeriodicJob("every_ten_seconds", "*/10 * * * * *", kind="tick")
    paused = PeriodicJob("paused", "* * * * * *", kind="tick")
    for job in (hourly, every_ten, paused):
        await upsert_cron_job(db, job)
    await db.execute("UPDATE awa.cron_jobs SET last_enqueued_at = $1", now)
    await db.execute("UPDATE awa.cron_jobs SET paused_at = now() WHERE name = 'paused'")

    result = await evaluate_schedules(db, now=now)
    assert result.enqueued == []
    next_ten = now + dt.timedelta(seconds=10 - now.second % 10)
    assert result.next_fire == next_ten

    # Enqueued this pass: the next fire is the one after it.
    result = await evaluate_schedules(db, now=next_ten)
    assert [(name, fire) for name, _, fire in result.enqueued] == [("every_ten_seconds", next_ten)]
    assert result.next_fire == next_ten + dt.timedelta(seconds=10)


async def test_a_running_leader_fires_each_second_with_an_eval_tick_of_a_minute(database_url, db):
    """cron_eval's tick is a minute: only waking at each fire enqueues a
    per-second schedule's fires one after another, each once. (Registered
    before the leader starts: its first pass must see the row.)"""
    from awa_trio.cron import PeriodicJob
    from awa_trio.cron.store import upsert_cron_job

    job = PeriodicJob("every_second", "* * * * * *", kind="tick")
    await upsert_cron_job(db, job)
    service = MaintenanceService(
        database_url,
        MaintenanceConfig(cron_eval_interval=60.0, leader_election_interval=0.2),
        periodic_jobs=[job],
    )
    count_sql = "SELECT count(*) FROM awa.jobs WHERE metadata->>'cron_name' = 'every_second'"
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        await service.wait_until_leader()
        with trio.fail_after(20):
            while await db.fetchval(count_sql) < 4:
                await trio.sleep(0.05)
        nursery.cancel_scope.cancel()
    fires = [row[0] for row in await db.fetch(
        "SELECT metadata->>'cron_fire_time' FROM awa.jobs WHERE metadata->>'cron_name' = 'every_second'"
        " ORDER BY id")]
    assert len(fires) == len(set(fires)) >= 4


def test_a_mixed_transition_wakes_at_the_earlier_plane():
    """During a staged transition promotion serves both planes in one body,
    whose result holds one PromoteResult per plane (None: that plane failed)."""
    from awa_trio.engines.queue_storage.planes import PlaneResults
    from awa_trio.maintenance.promotion import PromoteResult
    from awa_trio.registry import default_branches
    from awa_trio.schema import QUEUE_STORAGE, SchemaInfo

    mixed = SchemaInfo(version=39, engine=QUEUE_STORAGE, state="mixed_transition")
    (spec,) = [s for s in default_branches(MaintenanceConfig(), mixed) if s.name == "promote_scheduled"]
    assert spec.next_wake(PlaneResults(PromoteResult(next_due_at=7.0), PromoteResult(next_due_at=5.0))) == 5.0
    assert spec.next_wake(PlaneResults(None, PromoteResult(next_due_at=5.0))) == 5.0
    assert spec.next_wake(PlaneResults(PromoteResult(), None)) is None


async def test_a_pass_at_the_forecast_run_at_promotes_first_and_probes_after(
    maintenance_ctx, db, awa_client, monkeypatch
):
    """Woken for a run_at the previous probe reported, the pass runs that
    state's batch before its probe: the job is promoted one round trip
    sooner, and the probe then reports what comes after it."""
    run_at = await db.fetchval("SELECT now() + interval '1 second'")
    job_id = await insert_at(awa_client, run_at)
    forecast = await promote.run_once(maintenance_ctx)
    assert forecast.total == 0 and forecast.next_due_at is not None
    await trio.sleep_until(forecast.next_due_at)

    sent = []
    for method in ("fetch", "fetchone"):
        original = getattr(maintenance_ctx.db, method)

        async def recording(sql, *args, original=original):
            sent.append(sql)
            return await original(sql, *args)

        monkeypatch.setattr(maintenance_ctx.db, method, recording)
    result = await promote.run_once(maintenance_ctx)

    assert result.promoted["scheduled"] == 1 and result.next_due_at is None
    assert sent[:2] == [promote.PROMOTE_DUE_SQL["scheduled"].render(), promote.DUE_STATES_SQL.render()]
    assert await db.fetchval("SELECT state::text FROM awa.jobs_hot WHERE id = $1", job_id) == "available"
