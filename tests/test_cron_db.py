"""Cron against a real awa database: the upsert, the compare-and-set fire,
and evaluator passes (run_once called directly)."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

import trio

from awa_trio.config import MaintenanceConfig
from awa_trio.context import MaintenanceContext
from awa_trio.cron import CRON_EVAL, CRON_SYNC, PeriodicJob, cron_branches, format_fire_time
from awa_trio.cron import branches as cron_branches_module
from awa_trio.cron.branches import evaluate_cron_schedules, evaluate_schedules, sync_periodic_jobs
from awa_trio.cron.store import atomic_enqueue, list_cron_jobs, upsert_cron_job
from awa_trio.db import open_database
from awa_trio.metrics import MaintenanceMetrics
from awa_trio.schema import CANONICAL, SchemaInfo

JOBS_OF_SQL = """
    SELECT id, kind, queue, args, state::text AS state, priority, max_attempts, tags, metadata
    FROM awa.jobs
    WHERE metadata->>'cron_name' = $1
    ORDER BY id
"""
CRON_ROW_SQL = "SELECT * FROM awa.cron_jobs WHERE name = $1"


def context(db, *jobs: PeriodicJob) -> MaintenanceContext:
    return MaintenanceContext.standalone(
        db=db, config=MaintenanceConfig(), metrics=MaintenanceMetrics(),
        schema=SchemaInfo(version=39, engine=CANONICAL), periodic_jobs=jobs,
    )


async def register(db, job: PeriodicJob, *, last_enqueued_at=None, created_ago=None) -> None:
    await upsert_cron_job(db, job)
    if last_enqueued_at is not None:
        await db.execute("UPDATE awa.cron_jobs SET last_enqueued_at = $2 WHERE name = $1",
                         job.name, last_enqueued_at)
    if created_ago is not None:
        await db.execute("UPDATE awa.cron_jobs SET created_at = now() - $2::interval WHERE name = $1",
                         job.name, created_ago)


async def database_now(db) -> datetime:
    return await db.fetchval("SELECT now()")


def whole_second(instant: datetime) -> datetime:
    return instant.replace(microsecond=0)


REPORT = PeriodicJob(
    "nightly_report", "0 2 * * *", kind="nightly_report", queue="reports",
    args={"format": "pdf"}, priority=3, max_attempts=7, tags=["t1", "t2"],
    metadata={"src": "test", "cron_name": "overwritten"}, timezone="Europe/London",
    missed_fire_policy="catch_up",
)


# -- sync ----------------------------------------------------------------------------


async def test_sync_inserts_every_column_and_reports_new_rows(db, caplog):
    caplog.set_level(logging.INFO, logger="awa_trio.cron")
    result = await sync_periodic_jobs(context(db, REPORT))
    assert (result.upserted, result.registered, result.failed) == (1, ["nightly_report"], 0)
    row = await db.fetchrow(CRON_ROW_SQL, "nightly_report")
    assert dict(row) | {"created_at": None, "updated_at": None} == {
        "name": "nightly_report", "cron_expr": "0 2 * * *", "timezone": "Europe/London",
        "kind": "nightly_report", "queue": "reports", "args": {"format": "pdf"}, "priority": 3,
        "max_attempts": 7, "tags": ["t1", "t2"], "metadata": {"src": "test", "cron_name": "overwritten"},
        "missed_fire_policy": "catch_up", "last_enqueued_at": None, "created_at": None,
        "updated_at": None, "paused_at": None, "paused_by": None,
    }
    assert "cron_sync: registered 1 new periodic jobs: nightly_report" in caplog.text
    again = await sync_periodic_jobs(context(db, REPORT))
    assert (again.upserted, again.registered) == (1, [])


async def test_sync_updates_the_definition_and_keeps_pause_mark_and_other_rows(db):
    other = PeriodicJob("registered_elsewhere", "@hourly", kind="other")
    await upsert_cron_job(db, other)
    await register(db, REPORT, last_enqueued_at=datetime(2026, 1, 1, 2, tzinfo=UTC))
    await db.execute("UPDATE awa.cron_jobs SET paused_at = now(), paused_by = 'ops' WHERE name = $1",
                     REPORT.name)
    before = await db.fetchrow(CRON_ROW_SQL, REPORT.name)

    changed = PeriodicJob(REPORT.name, "*/5 * * * *", kind="nightly_report_v2", queue="q2",
                          args={"format": "csv"}, tags=["t3"])
    await sync_periodic_jobs(context(db, changed))

    after = await db.fetchrow(CRON_ROW_SQL, REPORT.name)
    assert (after["cron_expr"], after["kind"], after["queue"], after["args"], after["tags"],
            after["timezone"], after["missed_fire_policy"], after["priority"]) == (
        "*/5 * * * *", "nightly_report_v2", "q2", {"format": "csv"}, ["t3"], "UTC", "coalesce", 2)
    for kept in ("paused_at", "paused_by", "last_enqueued_at", "created_at"):
        assert after[kept] == before[kept], kept
    assert after["updated_at"] > before["updated_at"]
    assert await db.fetchval(CRON_ROW_SQL, other.name) == other.name  # never deleted


async def test_sync_goes_on_after_a_failing_schedule(db, caplog):
    # A CHECK on the table stands in for a failure the definition cannot foresee.
    await db.execute("ALTER TABLE awa.cron_jobs ADD CONSTRAINT no_bad_kind CHECK (kind <> 'bad')")
    bad = PeriodicJob("a_bad", "@daily", kind="bad")
    good = PeriodicJob("b_good", "@daily", kind="good")
    result = await sync_periodic_jobs(context(db, bad, good))
    assert (result.upserted, result.failed) == (1, 1)
    assert await db.fetchval("SELECT array_agg(name) FROM awa.cron_jobs") == ["b_good"]
    assert "cron_sync: failed to sync periodic job 'a_bad'" in caplog.text


# -- the compare-and-set fire ------------------------------------------------------------


async def test_atomic_enqueue_inserts_one_job_then_refuses_the_same_previous_value(db):
    await upsert_cron_job(db, REPORT)
    fire = datetime(2026, 11, 30, 17, 21, 24, tzinfo=UTC)

    job_id = await atomic_enqueue(db, REPORT.name, fire, None)
    assert job_id is not None
    assert await atomic_enqueue(db, REPORT.name, fire, None) is None  # already claimed
    assert await atomic_enqueue(db, REPORT.name, fire + timedelta(days=1), None) is None

    (job,) = await db.fetch(JOBS_OF_SQL, REPORT.name)
    assert dict(job) == {
        "id": job_id, "kind": "nightly_report", "queue": "reports", "args": {"format": "pdf"},
        "state": "available", "priority": 3, "max_attempts": 7, "tags": ["t1", "t2"],
        "metadata": {"src": "test", "cron_name": "nightly_report",
                     "cron_fire_time": "2026-11-30 17:21:24+00"},
    }
    assert (await db.fetchrow(CRON_ROW_SQL, REPORT.name))["last_enqueued_at"] == fire
    # Chained on the new mark, the next fire goes through.
    assert await atomic_enqueue(db, REPORT.name, fire + timedelta(days=1), fire) is not None


async def test_fire_time_text_does_not_depend_on_the_session_time_zone(db):
    await upsert_cron_job(db, REPORT)
    fire = datetime(2026, 11, 30, 17, 21, 24, tzinfo=UTC)
    async with db.acquire() as conn:
        await conn.execute("SET TIME ZONE 'Pacific/Auckland'")
        try:
            assert await conn.fetchval("SELECT $1::timestamptz::text", fire) == "2026-12-01 06:21:24+13"
            await atomic_enqueue(conn, REPORT.name, fire, None)
        finally:
            await conn.execute("RESET TIME ZONE")
    (job,) = await db.fetch(JOBS_OF_SQL, REPORT.name)
    assert job["metadata"]["cron_fire_time"] == "2026-11-30 17:21:24+00"
    # ...which is exactly PostgreSQL's own text of the instant in a UTC session.
    async with db.acquire() as conn:
        await conn.execute("SET TIME ZONE 'UTC'")
        try:
            assert await conn.fetchval("SELECT $1::timestamptz::text", fire) == format_fire_time(fire)
        finally:
            await conn.execute("RESET TIME ZONE")


async def test_paused_schedule_enqueues_nothing_and_keeps_its_mark(db):
    job = PeriodicJob("every_second", "* * * * * *", kind="tick", missed_fire_policy="catch_up")
    last = whole_second(await database_now(db)) - timedelta(seconds=5)
    await register(db, job, last_enqueued_at=last)
    await db.execute("UPDATE awa.cron_jobs SET paused_at = now(), paused_by = 'ops' WHERE name = $1",
                     job.name)

    result = await evaluate_schedules(db)
    assert (result.paused, result.enqueued) == (1, [])
    assert (await db.fetchrow(CRON_ROW_SQL, job.name))["last_enqueued_at"] == last
    assert await db.fetch(JOBS_OF_SQL, job.name) == []
    # The fire statement re-checks the pause too (a pause between list and fire).
    assert await atomic_enqueue(db, job.name, last + timedelta(seconds=1), last) is None

    await db.execute("UPDATE awa.cron_jobs SET paused_at = NULL, paused_by = NULL WHERE name = $1",
                     job.name)
    resumed = await evaluate_schedules(db)
    assert len(resumed.enqueued) >= 5  # catch_up replays the paused seconds


# -- evaluator passes ------------------------------------------------------------------


async def test_new_minute_schedule_fires_without_waiting_for_the_next_minute(db, caplog):
    caplog.set_level(logging.DEBUG, logger="awa_trio.cron")
    job = PeriodicJob("every_minute", "* * * * *", kind="tick")
    await sync_periodic_jobs(context(db, job))
    created_at = (await db.fetchrow(CRON_ROW_SQL, job.name))["created_at"]
    before = await database_now(db)

    result = await evaluate_cron_schedules(context(db, job))

    after = await database_now(db)
    (enqueued,) = result.enqueued
    name, job_id, fire = enqueued
    assert name == "every_minute"
    # The current minute's fire, at once (not the next minute boundary).
    assert fire in {before.replace(second=0, microsecond=0), after.replace(second=0, microsecond=0)}
    assert created_at - timedelta(minutes=1) <= fire <= after
    assert (await db.fetchrow(CRON_ROW_SQL, job.name))["last_enqueued_at"] == fire
    # Each fire is a DEBUG line (a schedule of every second would flood INFO).
    [fire_line] = [r for r in caplog.records if "enqueued periodic job" in r.getMessage()]
    assert fire_line.levelno == logging.DEBUG
    assert fire_line.getMessage() == (f"cron_eval: enqueued periodic job 'every_minute' as job {job_id} "
                                      f"for fire time {format_fire_time(fire)}")
    # Nothing more until the next minute.
    assert (await evaluate_schedules(db, now=fire + timedelta(seconds=59))).enqueued == []


async def test_catch_up_enqueues_missed_fires_in_order_chaining_the_mark(db, caplog):
    job = PeriodicJob("every_second", "* * * * * *", kind="tick", missed_fire_policy="catch_up")
    now = whole_second(await database_now(db))
    await register(db, job, last_enqueued_at=now - timedelta(seconds=10))

    result = await evaluate_schedules(db, now=now)

    fires = [fire for _, _, fire in result.enqueued]
    assert fires == [now - timedelta(seconds=n) for n in range(9, -1, -1)]
    jobs = await db.fetch(JOBS_OF_SQL, job.name)
    assert [j["metadata"]["cron_fire_time"] for j in jobs] == [format_fire_time(f) for f in fires]
    assert (await db.fetchrow(CRON_ROW_SQL, job.name))["last_enqueued_at"] == now

    # At the limit, the rest waits for the next pass, with a warning.
    await register(db, job, last_enqueued_at=now - timedelta(seconds=10))
    limited = await evaluate_schedules(db, now=now, limit=4)
    assert [fire for _, _, fire in limited.enqueued] == fires[:4]
    assert limited.limited == [job.name]
    assert "cron_eval: schedule 'every_second' reached the catch-up limit of 4" in caplog.text


async def test_coalesce_enqueues_only_the_latest_fire_after_an_outage(db):
    job = PeriodicJob("every_second", "* * * * * *", kind="tick")
    now = whole_second(await database_now(db))
    await register(db, job, last_enqueued_at=now - timedelta(days=1))
    result = await evaluate_schedules(db, now=now)
    assert [fire for _, _, fire in result.enqueued] == [now]


async def test_invalid_rows_are_logged_and_skipped_while_the_others_fire(db, caplog):
    # Rows another tool may have written; the policy CHECK is dropped to
    # simulate an older or hand-edited table.
    await db.execute("ALTER TABLE awa.cron_jobs DROP CONSTRAINT cron_jobs_missed_fire_policy_check")
    await db.execute("""
        INSERT INTO awa.cron_jobs (name, cron_expr, timezone, kind, missed_fire_policy, created_at) VALUES
            ('a_bad_expr', '61 * * * *', 'UTC', 'k', 'coalesce', now() - interval '1 hour'),
            ('b_bad_zone', '* * * * * *', 'Mars/Olympus', 'k', 'coalesce', now() - interval '1 hour'),
            ('c_bad_policy', '* * * * * *', 'UTC', 'k', 'sometimes', now() - interval '1 hour'),
            ('d_croner_w', '0 0 15W * *', 'UTC', 'k', 'coalesce', now() - interval '1 hour'),
            ('e_good', '* * * * * *', 'UTC', 'k', 'coalesce', now() - interval '1 hour')
    """)
    result = await evaluate_schedules(db)
    assert result.invalid == ["a_bad_expr", "b_bad_zone", "c_bad_policy", "d_croner_w"]
    assert [name for name, _, _ in result.enqueued] == ["e_good"]
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert errors == [
        "cron_eval: skipping schedule 'a_bad_expr': invalid cron expression '61 * * * *': "
        "'61' is out of range 0-59 in the minute field",
        "cron_eval: skipping schedule 'b_bad_zone': unknown timezone 'Mars/Olympus' "
        "(use an IANA name such as 'UTC' or 'Europe/London')",
        "cron_eval: skipping schedule 'c_bad_policy': invalid missed fire policy 'sometimes' "
        "(use 'coalesce' or 'catch_up')",
        "cron_eval: skipping schedule 'd_croner_w': invalid cron expression '0 0 15W * *': "
        "'15W': W (closest weekday) is not supported; croner's W can move the fire into the "
        "neighbouring month",
    ]
    for name in result.invalid:
        assert (await db.fetchrow(CRON_ROW_SQL, name))["last_enqueued_at"] is None


async def test_a_failing_insert_stops_that_schedule_only(db, caplog):
    # awa.insert_job_compat rejects priority 9 (written straight into the row).
    await register(db, PeriodicJob("a_broken", "* * * * * *", kind="k"), created_ago=timedelta(hours=1))
    await db.execute("UPDATE awa.cron_jobs SET priority = 9 WHERE name = 'a_broken'")
    await register(db, PeriodicJob("b_fine", "* * * * * *", kind="k"), created_ago=timedelta(hours=1))

    result = await evaluate_schedules(db)

    assert result.failed == ["a_broken"]
    assert [name for name, _, _ in result.enqueued] == ["b_fine"]
    assert (await db.fetchrow(CRON_ROW_SQL, "a_broken"))["last_enqueued_at"] is None
    assert "cron_eval: failed to enqueue periodic job 'a_broken' for fire time" in caplog.text
    assert "priority must be between 1 and 4" in caplog.text


async def test_two_evaluators_racing_never_enqueue_a_fire_twice(db, database_url):
    """Two leaders (split brain) on separate pools, evaluating concurrently."""
    jobs = [PeriodicJob(f"race_{n}", "* * * * * *", kind="tick", missed_fire_policy="catch_up")
            for n in range(3)]
    start = whole_second(await database_now(db)) - timedelta(seconds=30)
    for job in jobs:
        await register(db, job, last_enqueued_at=start)

    results = []
    async with open_database(database_url) as other_db:
        async def evaluate_repeatedly(database) -> None:
            for _ in range(4):
                results.append(await evaluate_schedules(database))
                await trio.sleep(0.05)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(evaluate_repeatedly, db)
            nursery.start_soon(evaluate_repeatedly, other_db)

    total_jobs = 0
    for job in jobs:
        fire_texts = [j["metadata"]["cron_fire_time"] for j in await db.fetch(JOBS_OF_SQL, job.name)]
        total_jobs += len(fire_texts)
        assert len(fire_texts) == len(set(fire_texts)), "a fire was enqueued twice"
        row = await db.fetchrow(CRON_ROW_SQL, job.name)
        span = int((row["last_enqueued_at"] - start).total_seconds())
        # Every second from the mark to the last fire, each exactly once.
        assert sorted(fire_texts) == [format_fire_time(start + timedelta(seconds=n))
                                      for n in range(1, span + 1)]
    # Each job was reported by exactly one evaluator; the other saw its CAS miss.
    assert sum(len(result.enqueued) for result in results) == total_jobs
    assert any(result.claimed_elsewhere for result in results)


async def test_list_returns_every_row_with_the_database_clock(db):
    await upsert_cron_job(db, PeriodicJob("b", "@daily", kind="k"))
    await upsert_cron_job(db, PeriodicJob("a", "@hourly", kind="k", tags=["x"]))
    evaluated_at, rows = await list_cron_jobs(db)
    assert [row.name for row in rows] == ["a", "b"]
    assert rows[0].tags == ("x",) and not rows[0].is_paused
    assert abs(evaluated_at - await database_now(db)) < timedelta(seconds=5)


def test_branch_specs():
    config = MaintenanceConfig(cron_sync_interval=30, cron_eval_interval=0.5)
    sync, evaluate = cron_branches(config)
    assert (sync.name, sync.interval, sync.run_immediately, sync.cooldown) == (CRON_SYNC, 30, True, True)
    assert (evaluate.name, evaluate.interval, evaluate.run_immediately, evaluate.cooldown) == (
        CRON_EVAL, 0.5, True, False)


async def test_a_compare_and_set_miss_stops_that_schedule_only(db, monkeypatch):
    """Another leader moves one schedule's mark between this evaluator's list
    and its enqueue: that schedule's pass ends at the miss (no fire chained
    on a stale mark), and the other schedules still fire."""
    start = whole_second(await database_now(db)) - timedelta(seconds=5)
    for name in ("a_contended", "b_free"):
        await register(db, PeriodicJob(name, "* * * * * *", kind="tick", missed_fire_policy="catch_up"),
                       last_enqueued_at=start)
    moved_to = start + timedelta(seconds=3)
    real_list = cron_branches_module.list_cron_jobs

    async def list_then_lose_the_race(database):
        listed = await real_list(database)
        await db.execute("UPDATE awa.cron_jobs SET last_enqueued_at = $1 WHERE name = 'a_contended'",
                         moved_to)
        return listed

    monkeypatch.setattr(cron_branches_module, "list_cron_jobs", list_then_lose_the_race)
    result = await evaluate_schedules(db)

    assert result.claimed_elsewhere == ["a_contended"]
    assert await db.fetch(JOBS_OF_SQL, "a_contended") == []
    assert (await db.fetchrow(CRON_ROW_SQL, "a_contended"))["last_enqueued_at"] == moved_to
    free_fires = [fire for name, _, fire in result.enqueued if name == "b_free"]
    assert free_fires[0] == start + timedelta(seconds=1) and len(free_fires) >= 5
    assert len(await db.fetch(JOBS_OF_SQL, "b_free")) == len(free_fires)


async def test_marks_no_clock_reaches_are_logged_and_skipped(db, caplog):
    """'infinity' and the ends of the calendar, which a hand edit or another
    tool may leave, cost only their own schedule."""
    every_second = "* * * * * *"
    for name in ("a_infinite", "b_year_9999", "c_year_1", "d_good"):
        await register(db, PeriodicJob(name, every_second, kind="k"), created_ago=timedelta(hours=1))
    await db.execute("UPDATE awa.cron_jobs SET last_enqueued_at = 'infinity' WHERE name = 'a_infinite'")
    await db.execute("UPDATE awa.cron_jobs SET last_enqueued_at = '9999-12-31 23:59:59+00' "
                     "WHERE name = 'b_year_9999'")
    await db.execute("UPDATE awa.cron_jobs SET created_at = '0001-01-01 00:00:30+00' WHERE name = 'c_year_1'")

    result = await evaluate_schedules(db)

    assert [name for name, _, _ in result.enqueued] == ["d_good"]
    assert set(result.invalid) <= {"a_infinite", "b_year_9999", "c_year_1"}
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert all(message.startswith("cron_eval: skipping schedule") for message in errors)
    assert {name for name in ("a_infinite", "b_year_9999", "c_year_1")
            if any(repr(name) in message for message in errors)} == set(result.invalid)
    assert "a_infinite" in result.invalid
