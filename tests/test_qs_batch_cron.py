"""batch_operations and cron on queue storage: operations submitted with
awa-pg complete with the right rows and real awa-pg workers then run the
changed jobs exactly once; a per-second cron schedule fires through a
running MaintenanceService into queue storage, where awa-pg sees the job."""

from __future__ import annotations

import datetime as dt
import uuid
from collections import Counter

import trio
from conftest import in_thread
from support.awa_pg import awa_pg_worker
from support.contexts import make_context
from support.helpers import leader_lock_holders
from support.qs_dlq import holding_leader_lock

from awa_trio.branch import BranchSpec
from awa_trio.config import MaintenanceConfig
from awa_trio.cron import PeriodicJob
from awa_trio.engines.queue_storage import batch_operations
from awa_trio.registry import default_branches
from awa_trio.service import MaintenanceService

ORIGINAL_PRIORITY = "_awa_original_priority"
ORIGINAL_QUEUE = "_awa_original_queue"
KIND = "qs_batch_probe"

# Where a job lives now on queue storage, read from the tables themselves:
# its live ready entry (ahead of the claim cursor, not tombstoned) or its
# deferred row.
LIVE_JOB_SQL = """
    SELECT 'available' AS state, ready.queue, ready.priority,
           ready.payload -> 'metadata' AS metadata, ready.lane_seq
    FROM awa.ready_entries AS ready
    JOIN awa.queue_claim_heads AS claims
      ON (claims.queue, claims.priority, claims.enqueue_shard)
         = (ready.queue, ready.priority, ready.enqueue_shard)
    WHERE ready.job_id = $1
      AND ready.lane_seq >= awa.sequence_next_value(claims.seq_name)
      AND NOT EXISTS (
          SELECT 1 FROM awa.ready_tombstones AS tomb
          WHERE (tomb.ready_slot, tomb.ready_generation, tomb.queue, tomb.priority,
                 tomb.enqueue_shard, tomb.lane_seq)
              = (ready.ready_slot, ready.ready_generation, ready.queue, ready.priority,
                 ready.enqueue_shard, ready.lane_seq)
      )
    UNION ALL
    SELECT state::text, queue, priority, payload -> 'metadata', NULL
    FROM awa.deferred_jobs
    WHERE job_id = $1
"""


async def live_job(db, job_id: int) -> list[dict]:
    rows = await db.fetch(LIVE_JOB_SQL, job_id)
    return [
        {"state": row["state"], "queue": row["queue"], "priority": row["priority"],
         "metadata": row["metadata"] or {}}
        for row in rows
    ]


async def insert(awa_client, queue: str, *, priority: int = 2, scheduled: bool = False,
                 metadata: dict | None = None) -> int:
    run_at = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1) if scheduled else None
    job = await in_thread(awa_client.insert, {"q": queue}, kind=KIND, queue=queue,
                          priority=priority, run_at=run_at, metadata=metadata)
    return job.id


async def operation_row(db, operation_id: str) -> dict:
    return dict(await db.fetchrow("SELECT * FROM awa.batch_operations WHERE id = $1",
                                  uuid.UUID(operation_id)))


async def item_states(db, operation_id: str) -> dict[int, str]:
    rows = await db.fetch(
        "SELECT job_id, state FROM awa.batch_operation_items WHERE operation_id = $1",
        uuid.UUID(operation_id),
    )
    return {row["job_id"]: row["state"] for row in rows}


async def run_jobs_with_awa_pg(dsn, db, queue: str, job_ids: list[int]) -> Counter:
    """A real awa-pg worker (a follower) runs the queue; returns how often
    each job started once all of ``job_ids`` are done."""
    async with holding_leader_lock(db):
        async with awa_pg_worker(dsn, f"{KIND}:{queue}", extra_args=["--role", "auto"]) as worker:
            with trio.fail_after(30):
                while not set(job_ids) <= {
                    int(line.split()[1]) for line in worker.lines if line.startswith("DONE")
                }:
                    await trio.sleep(0.1)
            await trio.sleep(0.5)  # anything claimed twice would show by now
            return Counter(int(line.split()[1]) for line in worker.lines
                           if line.startswith("START"))


async def test_set_priority_submitted_with_awa_pg_completes_on_queue_storage(
    qs_database_url, qs_db, qs_awa_client
):
    ctx = await make_context(qs_db)
    available = [await insert(qs_awa_client, "bulk", priority=3) for _ in range(2)]
    scheduled = await insert(qs_awa_client, "bulk", priority=4, scheduled=True)
    stamped = await insert(qs_awa_client, "bulk", priority=3, metadata={ORIGINAL_PRIORITY: 4})
    already = await insert(qs_awa_client, "bulk", priority=1)
    elsewhere = await insert(qs_awa_client, "other", priority=3)
    op = await in_thread(qs_awa_client.set_priority, 1, filter={"queue": "bulk"},
                         submitted_by="ops")

    result = await batch_operations.run_once(ctx)

    assert result.claimed and result.operation_id == uuid.UUID(op["id"])
    assert (result.processed, result.skipped, result.errored) == (4, 1, 0)
    assert result.finalized_state == "completed"
    for job_id in available:
        assert await live_job(qs_db, job_id) == [
            {"state": "available", "queue": "bulk", "priority": 1,
             "metadata": {ORIGINAL_PRIORITY: 3}},
        ]
    assert await live_job(qs_db, scheduled) == [
        {"state": "scheduled", "queue": "bulk", "priority": 1,
         "metadata": {ORIGINAL_PRIORITY: 4}},
    ]
    assert (await live_job(qs_db, stamped))[0]["metadata"] == {ORIGINAL_PRIORITY: 4}
    assert await live_job(qs_db, already) == [
        {"state": "available", "queue": "bulk", "priority": 1, "metadata": {}},
    ]
    assert (await live_job(qs_db, elsewhere))[0]["priority"] == 3
    expected_items = {job_id: "processed" for job_id in [*available, scheduled, stamped]}
    expected_items[already] = "skipped"
    assert await item_states(qs_db, op["id"]) == expected_items
    row = await operation_row(qs_db, op["id"])
    assert row["state"] == "completed"
    assert (row["total_matched"], row["processed"], row["skipped"], row["errored"]) == (5, 4, 1, 0)
    seen = await in_thread(qs_awa_client.get_batch_operation, op["id"])
    assert seen["state"] == "completed" and seen["processed"] == 4

    # awa-pg reads the jobs back as changed, and its workers run each
    # available one exactly once (the old entries are tombstoned).
    for job_id in [*available, stamped]:
        job = await in_thread(qs_awa_client.get_job, job_id)
        assert (job.priority, job.queue) == (1, "bulk")
    starts = await run_jobs_with_awa_pg(qs_database_url, qs_db, "bulk",
                                        [*available, stamped, already])
    assert {job_id: starts[job_id] for job_id in [*available, stamped, already]} == dict.fromkeys(
        [*available, stamped, already], 1)
    assert scheduled not in starts


async def test_move_queue_submitted_with_awa_pg_completes_on_queue_storage(
    qs_database_url, qs_db, qs_awa_client
):
    ctx = await make_context(qs_db)
    available = [await insert(qs_awa_client, "src") for _ in range(3)]
    scheduled = await insert(qs_awa_client, "src", scheduled=True)
    # enqueue_many_copy stores no payload at all (NULL), which must survive.
    assert await in_thread(qs_awa_client.enqueue_many_copy, [{"q": "src"}], kind=KIND,
                           queue="src") == 1
    copied = await qs_db.fetchval(
        "SELECT job_id FROM awa.ready_entries WHERE queue = 'src' AND payload IS NULL"
    )
    assert copied is not None
    stay = await insert(qs_awa_client, "keep")
    op = await in_thread(qs_awa_client.move_queue, "dst", priority=3, filter={"queue": "src"})

    result = await batch_operations.run_once(ctx)

    assert result.finalized_state == "completed"
    assert (result.processed, result.skipped, result.errored) == (5, 0, 0)
    moved_metadata = {ORIGINAL_QUEUE: "src", ORIGINAL_PRIORITY: 2}
    for job_id in [*available, copied]:
        assert await live_job(qs_db, job_id) == [
            {"state": "available", "queue": "dst", "priority": 3, "metadata": moved_metadata},
        ]
    assert await live_job(qs_db, scheduled) == [
        {"state": "scheduled", "queue": "dst", "priority": 3, "metadata": moved_metadata},
    ]
    assert (await live_job(qs_db, stay))[0]["queue"] == "keep"
    assert set((await item_states(qs_db, op["id"])).values()) == {"processed"}
    assert (await operation_row(qs_db, op["id"]))["state"] == "completed"

    # A worker of "src" finds nothing; one of "dst" runs every moved job once.
    async with holding_leader_lock(qs_db):
        async with awa_pg_worker(qs_database_url, f"{KIND}:src",
                                 extra_args=["--role", "auto"]) as src_worker:
            await trio.sleep(1.5)
            assert not [line for line in src_worker.lines if line.startswith("START")]
    starts = await run_jobs_with_awa_pg(qs_database_url, qs_db, "dst", [*available, copied])
    assert {job_id: starts[job_id] for job_id in [*available, copied]} == dict.fromkeys(
        [*available, copied], 1)


async def test_a_canonical_runner_leaves_queue_storage_operations_alone(qs_db, qs_awa_client):
    """The canonical module's engine guard: it never applies canonical SQL
    to a queue-storage database (which is why the queue-storage set needs
    its own module)."""
    from awa_trio.engines.canonical import batch_operations as canonical

    await insert(qs_awa_client, "bulk", priority=3)
    op = await in_thread(qs_awa_client.set_priority, 1, filter={"queue": "bulk"})
    result = await canonical.run_once(await make_context(qs_db))
    assert not result.claimed
    assert (await operation_row(qs_db, op["id"]))["state"] == "pending"


def queue_storage_cron_and_batches(config, schema):
    """The registry's queue-storage set, reduced to what this test checks
    (the other queue-storage branches belong to other modules), with the
    queue-storage batch runner."""
    kept = [spec for spec in default_branches(config, schema)
            if spec.name in ("cron_sync", "cron_eval")]
    assert [spec.name for spec in kept] == ["cron_sync", "cron_eval"]
    return [*kept, BranchSpec(batch_operations.NAME, config.batch_operations_interval,
                              batch_operations.run_once)]


async def test_a_per_second_cron_schedule_fires_on_queue_storage_through_the_service(
    qs_database_url, qs_db, qs_awa_client
):
    config = MaintenanceConfig(leader_election_interval=0.5, batch_operations_interval=0.2)
    schedule = PeriodicJob("qs_every_second", "* * * * * *", kind=KIND, queue="cronq",
                           args={"source": "awa_trio"}, tags=["cron"])
    bumped = await insert(qs_awa_client, "later", priority=4)
    op = await in_thread(qs_awa_client.set_priority, 2, filter={"queue": "later"})
    service = MaintenanceService(qs_database_url, config, periodic_jobs=[schedule],
                                 branch_factory=queue_storage_cron_and_batches)
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        with trio.fail_after(60):
            await service.wait_until_leader()
            while not await qs_db.fetchval(
                "SELECT count(*) FROM awa.ready_entries WHERE queue = 'cronq'"
            ):
                await trio.sleep(0.1)
            while (await operation_row(qs_db, op["id"]))["state"] != "completed":
                await trio.sleep(0.1)
            assert await leader_lock_holders(qs_db) == [service.lock_backend_pid]
            assert service.schema.runs_queue_storage
            assert {spec.name for spec in service.branches} == {
                "cron_sync", "cron_eval", "batch_operations"}
        service.stop()

    # The fired job went into queue storage through awa.insert_job_compat,
    # with the cron marks in its metadata, and awa-pg reads it there.
    row = await qs_db.fetchrow(
        "SELECT job_id, kind, args, payload FROM awa.ready_entries WHERE queue = 'cronq'"
        " ORDER BY job_id LIMIT 1"
    )
    assert (row["kind"], row["args"]) == (KIND, {"source": "awa_trio"})
    assert row["payload"]["metadata"]["cron_name"] == "qs_every_second"
    assert row["payload"]["tags"] == ["cron"]
    assert await qs_db.fetchval("SELECT count(*) FROM awa.jobs_hot") == 0  # not canonical
    job = await in_thread(qs_awa_client.get_job, row["job_id"])
    assert (job.kind, job.queue, job.metadata["cron_name"]) == (KIND, "cronq", "qs_every_second")
    mark = await qs_db.fetchval(
        "SELECT last_enqueued_at FROM awa.cron_jobs WHERE name = 'qs_every_second'"
    )
    assert mark is not None
    assert (await live_job(qs_db, bumped))[0]["priority"] == 2
    # And a real awa-pg worker runs it.
    starts = await run_jobs_with_awa_pg(qs_database_url, qs_db, "cronq", [row["job_id"]])
    assert starts[row["job_id"]] == 1


async def test_an_item_waits_for_a_claimer_holding_its_lane_and_is_retried_later(
    qs_database_url, qs_db, qs_awa_client
):
    """A claimer holds the lane's claim head while it claims; re-entering the
    job meanwhile could let the old entry be claimed too. The item waits for
    the head (here past a short lock_timeout), stays pending, and is applied
    on the next tick once the lane is free."""
    from awa_trio.db import QueryError, open_database

    job_id = await insert(qs_awa_client, "lane", priority=3)
    op = await in_thread(qs_awa_client.set_priority, 1, filter={"queue": "lane"})
    async with open_database(qs_database_url, lock_timeout=0.3) as short_db:
        ctx = await make_context(short_db)
        async with qs_db.acquire() as claimer:
            await claimer.execute("BEGIN")
            await claimer.execute(
                "SELECT 1 FROM awa.queue_claim_heads WHERE queue = 'lane' FOR UPDATE"
            )
            try:
                with trio.fail_after(10):
                    await batch_operations.run_once(ctx)
            except QueryError as exc:
                assert exc.sqlstate == "55P03"
            else:
                raise AssertionError("the item did not wait for the claim head")
            await claimer.execute("ROLLBACK")
        assert await item_states(qs_db, op["id"]) == {job_id: "pending"}
        assert (await live_job(qs_db, job_id))[0]["priority"] == 3

        result = await batch_operations.run_once(ctx)
    assert (result.processed, result.finalized_state) == (1, "completed")
    assert (await live_job(qs_db, job_id))[0]["priority"] == 1


async def test_a_cancel_stops_a_queue_storage_chunk_at_the_next_item(qs_db, qs_awa_client):
    jobs = [await insert(qs_awa_client, "bulk", priority=3) for _ in range(4)]
    op = await in_thread(qs_awa_client.set_priority, 1, filter={"queue": "bulk"})
    # The first item's outcome asks for the cancel, as cancel_batch_operation would.
    await qs_db.execute(f"""
        CREATE FUNCTION test_cancel_on_item() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF NEW.job_id = {jobs[0]} AND NEW.state <> 'pending' THEN
                UPDATE awa.batch_operations SET state = 'cancelling'
                WHERE id = NEW.operation_id AND state = 'running';
            END IF;
            RETURN NEW;
        END $$;
        CREATE TRIGGER test_cancel_on_item AFTER UPDATE ON awa.batch_operation_items
            FOR EACH ROW EXECUTE FUNCTION test_cancel_on_item();
    """)

    result = await batch_operations.run_once(await make_context(qs_db))

    assert result.finalized_state == "cancelled"
    assert result.processed == 1
    assert await item_states(qs_db, op["id"]) == {
        jobs[0]: "processed", **dict.fromkeys(jobs[1:], "skipped")}
    assert [(await live_job(qs_db, job_id))[0]["priority"] for job_id in jobs] == [1, 3, 3, 3]
    assert (await operation_row(qs_db, op["id"]))["state"] == "cancelled"
