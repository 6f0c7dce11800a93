"""cleanup on a real awa 0.6.1 schema: which rows go, which stay, and limits."""

from __future__ import annotations

import logging
import uuid

import trio
from conftest import in_thread
from support.contexts import make_context

from awa_trio.config import RetentionPolicy
from awa_trio.engines.canonical import cleanup

HOUR = 3600


async def insert_job(awa_client, queue: str = "default") -> int:
    job = await in_thread(awa_client.insert, {"n": 1}, kind="cleanup_probe", queue=queue)
    return job.id


async def finish(db, job_id: int, state: str, age_hours: float) -> None:
    """Make an awa-pg job terminal, finalised ``age_hours`` ago."""
    await db.execute(
        """
        UPDATE awa.jobs_hot
        SET state = $2::awa.job_state, attempt = 1,
            finalized_at = now() - make_interval(secs => $3)
        WHERE id = $1
        """,
        job_id, state, age_hours * HOUR,
    )


async def insert_finished(db, queue: str, state: str, age_hours: float, count: int) -> list[int]:
    rows = await db.fetch(
        """
        INSERT INTO awa.jobs_hot (kind, queue, state, attempt, finalized_at)
        SELECT 'cleanup_probe', $1, $2::awa.job_state, 1, now() - make_interval(secs => $3)
        FROM generate_series(1, $4)
        RETURNING id
        """,
        queue, state, age_hours * HOUR, count,
    )
    return [row["id"] for row in rows]


async def job_ids(db) -> set[int]:
    return {row["id"] for row in await db.fetch("SELECT id FROM awa.jobs")}


async def test_finished_jobs_past_retention_are_deleted_by_state(db, awa_client):
    ctx = await make_context(db, completed_retention="24h", failed_retention="72h")
    jobs = {}
    for name, state, age in [
        ("completed_old", "completed", 25),
        ("completed_young", "completed", 23),
        ("failed_old", "failed", 73),
        ("failed_young", "failed", 71),
        ("cancelled_old", "cancelled", 73),
        # Older than completed_retention, but cancelled jobs follow failed_retention.
        ("cancelled_mid", "cancelled", 25),
    ]:
        jobs[name] = await insert_job(awa_client)
        await finish(db, jobs[name], state, age)
    # Old but not finished: never cleanup's business.
    jobs["available_old"] = await insert_job(awa_client)
    await db.execute(
        "UPDATE awa.jobs_hot SET created_at = now() - interval '100 hours',"
        " run_at = now() - interval '100 hours' WHERE id = $1",
        jobs["available_old"],
    )
    jobs["running"] = await insert_job(awa_client)
    await db.execute(
        "UPDATE awa.jobs_hot SET state = 'running', attempt = 1, heartbeat_at = now(),"
        " finalized_at = now() - interval '100 hours' WHERE id = $1",
        jobs["running"],
    )
    assert await job_ids(db) == set(jobs.values())

    result = await cleanup.run_once(ctx)

    assert result.jobs_deleted == 3
    assert result.failed_steps == []
    assert await job_ids(db) == {
        jobs[name]
        for name in ("completed_young", "failed_young", "cancelled_mid", "available_old", "running")
    }


async def test_with_its_budget_spent_each_retention_pass_takes_one_batch_per_tick(db):
    ctx = await make_context(
        db,
        cleanup_batch_size=2,
        drain_time_budget="0.001ms",
        queue_retention_overrides={"fast": RetentionPolicy(completed="1h", failed="1h")},
    )
    await insert_finished(db, "default", "completed", 30, 3)
    await insert_finished(db, "fast", "completed", 2, 3)

    first = await cleanup.run_once(ctx)
    second = await cleanup.run_once(ctx)
    third = await cleanup.run_once(ctx)

    assert (first.jobs_deleted, first.jobs_deleted_by_queue) == (2, {"fast": 2})
    assert (second.jobs_deleted, second.jobs_deleted_by_queue) == (1, {"fast": 1})
    assert (third.jobs_deleted, third.jobs_deleted_by_queue) == (0, {"fast": 0})
    assert await job_ids(db) == set()
    assert first.unfinished_steps == ["finished jobs (global pass)", "finished jobs (queue 'fast')"]


async def test_a_retention_pass_drains_its_backlog_in_batches_within_one_tick(db):
    ctx = await make_context(
        db,
        cleanup_batch_size=2,
        queue_retention_overrides={"fast": RetentionPolicy(completed="1h", failed="1h")},
    )
    await insert_finished(db, "default", "completed", 30, 5)
    await insert_finished(db, "default", "failed", 100, 2)
    await insert_finished(db, "fast", "completed", 2, 3)
    kept = await insert_finished(db, "fast", "completed", 0.5, 1)

    result = await cleanup.run_once(ctx)

    assert (result.jobs_deleted, result.jobs_deleted_by_queue) == (7, {"fast": 3})
    assert result.unfinished_steps == [] and result.failed_steps == []
    assert await job_ids(db) == set(kept)


async def test_queue_retention_override_replaces_global_retention_for_that_queue(db, awa_client):
    ctx = await make_context(
        db,
        completed_retention="24h",
        failed_retention="72h",
        queue_retention_overrides={
            "fast": RetentionPolicy(completed="1h", failed="1h"),
            "archive": RetentionPolicy(completed="7d", failed="7d"),
        },
    )
    jobs = {}
    for name, queue, state, age in [
        ("fast_completed_2h", "fast", "completed", 2),
        ("fast_failed_2h", "fast", "failed", 2),
        ("fast_cancelled_2h", "fast", "cancelled", 2),
        ("fast_completed_30m", "fast", "completed", 0.5),
        ("default_completed_2h", "default", "completed", 2),
        ("default_failed_2h", "default", "failed", 2),
        # The global pass would delete this one; the queue's 7d policy keeps it.
        ("archive_completed_25h", "archive", "completed", 25),
        ("archive_completed_8d", "archive", "completed", 8 * 24),
    ]:
        jobs[name] = await insert_job(awa_client, queue)
        await finish(db, jobs[name], state, age)

    result = await cleanup.run_once(ctx)

    assert result.jobs_deleted == 0
    assert result.jobs_deleted_by_queue == {"archive": 1, "fast": 3}
    assert await job_ids(db) == {
        jobs[name]
        for name in (
            "fast_completed_30m", "default_completed_2h", "default_failed_2h",
            "archive_completed_25h",
        )
    }


INSERT_RUNTIME_SQL = """
    INSERT INTO awa.runtime_instances (
        instance_id, pid, version, started_at, last_seen_at, snapshot_interval_ms,
        healthy, postgres_connected, poll_loop_alive, heartbeat_alive,
        shutting_down, leader
    )
    VALUES ($1, 1, '0.6.1', now() - make_interval(secs => $2), now() - make_interval(secs => $2),
            10000, true, true, true, true, false, false)
"""


async def runtime_ids(db) -> set[uuid.UUID]:
    rows = await db.fetch("SELECT instance_id FROM awa.runtime_instances")
    return {row["instance_id"] for row in rows}


async def test_runtime_snapshots_unseen_past_retention_are_deleted(db):
    dead, quiet, live = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    await db.execute(INSERT_RUNTIME_SQL, dead, 25 * HOUR)
    await db.execute(INSERT_RUNTIME_SQL, quiet, 1 * HOUR)
    await db.execute(INSERT_RUNTIME_SQL, live, 5)

    default = await cleanup.run_once(await make_context(db))
    assert default.runtime_snapshots_deleted == 1
    assert await runtime_ids(db) == {quiet, live}

    shorter = await cleanup.run_once(await make_context(db, runtime_snapshot_retention="30m"))
    assert shorter.runtime_snapshots_deleted == 1
    assert await runtime_ids(db) == {live}


async def descriptor_names(db) -> tuple[set[str], set[str]]:
    queues = {row["queue"] for row in await db.fetch("SELECT queue FROM awa.queue_descriptors")}
    kinds = {row["kind"] for row in await db.fetch("SELECT kind FROM awa.job_kind_descriptors")}
    return queues, kinds


async def test_stale_descriptors_are_deleted_unless_retention_is_zero(db):
    for name, age_days in (("stale", 31), ("fresh", 29)):
        await db.execute(
            "INSERT INTO awa.queue_descriptors (queue, descriptor_hash, last_seen_at)"
            " VALUES ($1, 'h', now() - make_interval(days => $2))",
            f"queue_{name}", age_days,
        )
        await db.execute(
            "INSERT INTO awa.job_kind_descriptors (kind, descriptor_hash, last_seen_at)"
            " VALUES ($1, 'h', now() - make_interval(days => $2))",
            f"kind_{name}", age_days,
        )

    disabled = await cleanup.run_once(await make_context(db, descriptor_retention=0))
    assert (disabled.queue_descriptors_deleted, disabled.job_kind_descriptors_deleted) == (0, 0)
    assert await descriptor_names(db) == (
        {"queue_stale", "queue_fresh"}, {"kind_stale", "kind_fresh"}
    )

    default = await cleanup.run_once(await make_context(db))  # 30 days
    assert (default.queue_descriptors_deleted, default.job_kind_descriptors_deleted) == (1, 1)
    assert await descriptor_names(db) == ({"queue_fresh"}, {"kind_fresh"})


INSERT_BATCH_OPERATION_SQL = """
    INSERT INTO awa.batch_operations (
        id, op_kind, filter, spec, state, finalized_at, retention_until
    )
    SELECT gen_random_uuid(), 'set_priority', '{}'::jsonb,
           '{"op_kind": "set_priority", "priority": 1}'::jsonb, $1,
           CASE WHEN $1 IN ('completed', 'cancelled', 'failed') THEN now() - interval '91 days' END,
           now() + make_interval(secs => $2) - make_interval(secs => g)
    FROM generate_series(1, $3) AS g
    RETURNING id
"""


async def batch_operation_ids(db) -> set[uuid.UUID]:
    return {row["id"] for row in await db.fetch("SELECT id FROM awa.batch_operations")}


async def test_expired_batch_operations_are_deleted_only_when_finished(db, awa_client):
    # One operation exactly as awa-pg submits it, finished by its runner long ago.
    submitted = await in_thread(awa_client.set_priority, 1, filter={"queue": "default"})
    via_awa_pg = uuid.UUID(submitted["id"])
    job_id = await insert_job(awa_client)
    await db.execute(
        "INSERT INTO awa.batch_operation_items (operation_id, job_id, state)"
        " VALUES ($1, $2, 'processed')",
        via_awa_pg, job_id,
    )
    await db.execute(
        "UPDATE awa.batch_operations SET state = 'completed',"
        " finalized_at = now() - interval '91 days',"
        " retention_until = now() - interval '1 day' WHERE id = $1",
        via_awa_pg,
    )
    expired = {}
    for state in ("completed", "cancelled", "failed", "running", "cancelling", "pending"):
        rows = await db.fetch(INSERT_BATCH_OPERATION_SQL, state, -HOUR, 1)
        expired[state] = rows[0]["id"]
    [not_yet] = [row["id"] for row in await db.fetch(
        INSERT_BATCH_OPERATION_SQL, "completed", HOUR, 1
    )]
    no_retention = uuid.uuid4()
    await db.execute(
        "INSERT INTO awa.batch_operations (id, op_kind, filter, spec, state, finalized_at)"
        " VALUES ($1, 'set_priority', '{}', '{\"op_kind\": \"set_priority\", \"priority\": 1}',"
        " 'completed', now() - interval '91 days')",
        no_retention,
    )

    result = await cleanup.run_once(await make_context(db))

    assert result.batch_operations_deleted == 4
    assert await batch_operation_ids(db) == {
        expired["running"], expired["cancelling"], expired["pending"], not_yet, no_retention,
    }
    # Its items went with it.
    assert await db.fetchval("SELECT count(*) FROM awa.batch_operation_items") == 0


async def test_expired_batch_operations_are_deleted_1000_per_batch_oldest_first(db):
    rows = await db.fetch(INSERT_BATCH_OPERATION_SQL, "completed", -2 * HOUR, 1001)
    # retention_until falls as g grows: the latest one is the first row inserted,
    # so a pass that ignored retention order would delete it first.
    latest = rows[0]["id"]
    one_batch_per_tick = await make_context(db, drain_time_budget="0.001ms")

    first = await cleanup.run_once(one_batch_per_tick)
    assert first.batch_operations_deleted == 1000
    assert await batch_operation_ids(db) == {latest}

    second = await cleanup.run_once(one_batch_per_tick)
    assert second.batch_operations_deleted == 1
    assert await batch_operation_ids(db) == set()

    # With a budget, one tick drains both batches.
    await db.fetch(INSERT_BATCH_OPERATION_SQL, "completed", -2 * HOUR, 1001)
    drained = await cleanup.run_once(await make_context(db))
    # One (short) batch of finished jobs, two of batch operations.
    assert (drained.batch_operations_deleted, drained.batches) == (1001, 3)
    assert await batch_operation_ids(db) == set()


async def test_a_failing_step_is_logged_and_the_other_steps_still_run(db, caplog):
    await insert_finished(db, "default", "completed", 30, 1)
    await db.execute(INSERT_RUNTIME_SQL, uuid.uuid4(), 25 * HOUR)
    await db.execute(
        "INSERT INTO awa.queue_descriptors (queue, descriptor_hash, last_seen_at)"
        " VALUES ('gone', 'h', now() - interval '31 days')"
    )
    await db.fetch(INSERT_BATCH_OPERATION_SQL, "completed", -HOUR, 1)
    # A real fault in the middle step: its table is not where awa put it.
    await db.execute("ALTER TABLE awa.runtime_instances RENAME TO runtime_instances_moved")

    with caplog.at_level(logging.INFO, logger="awa_trio.engines.canonical.cleanup"):
        result = await cleanup.run_once(await make_context(db))

    assert result.failed_steps == ["runtime snapshots"]
    assert result.jobs_deleted == 1
    assert result.queue_descriptors_deleted == 1
    assert result.batch_operations_deleted == 1
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1
    assert errors[0].getMessage().startswith("cleanup: failed to delete runtime snapshots [42P01]")
    assert await db.fetchval("SELECT count(*) FROM awa.runtime_instances_moved") == 1


async def test_a_finished_job_locked_by_another_transaction_is_skipped_not_waited_for(db):
    ctx = await make_context(db)
    locked, _free = await insert_finished(db, "default", "failed", 100, 2)

    async with db.transaction() as conn:
        # E.g. an operator retrying the failed job right now.
        await conn.execute("SELECT 1 FROM awa.jobs_hot WHERE id = $1 FOR UPDATE", locked)
        with trio.fail_after(10):
            result = await cleanup.run_once(ctx)

    assert result.jobs_deleted == 1
    assert await job_ids(db) == {locked}
