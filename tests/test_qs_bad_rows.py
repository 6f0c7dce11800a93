"""Bad rows on queue storage: NULL and odd payloads, malformed ``errors``,
1 MB arguments and 200-character queue names through promotion, the
three rescues, DLQ cleanup, queue stats and the status
command; each bad row is handled and the good jobs beside it too.

Queue storage keeps metadata, tags, errors and progress in one nullable
``payload`` column (awa-pg's ``enqueue_many_copy`` writes NULL there); a bad
payload is written with SQL into the row a job sits in, as a buggy writer
could.
"""

from __future__ import annotations

import datetime as dt
import json
import logging

import pytest
import trio
from support.contexts import make_context
from support.helpers import metric_points, status_report
from support.qs_dlq import add_bulk_dlq_rows, dlq_ids
from support.qs_jobs import insert_scheduled, make_due
from support.qs_rescue import (
    age_claims,
    claim,
    deferred_retryable,
    expire_deadlines,
    insert_jobs,
    materialise,
)

from awa_trio import MaintenanceConfig, MaintenanceService
from awa_trio.db import QueryError
from awa_trio.engines.queue_storage import (
    cleanup,
    promote,
    queue_stats,
    rescue_callbacks,
    rescue_deadlines,
    rescue_heartbeats,
)
from awa_trio.metrics import QUEUE_DEPTH

LONG_QUEUE = "q" * 200
ONE_MB_ARGS = json.dumps({"blob": "x" * 1_000_000})
STALENESS = 60.0
#: Payloads as JSON text (None: SQL NULL, what enqueue_many_copy writes).
ODD_PAYLOADS = [
    None,
    "null",
    '"just text"',
    "[1, 2]",
    '{"metadata": [1, 2], "errors": "oops", "tags": "not a list", "progress": 7}',
    '{"metadata": null, "errors": [null, 1, "text", [2], {"no_error_key": true}]}',
]
#: (args, queue) of the other odd rows.
ODD_ROWS = [("null", "bad_rows"), ('"text"', "bad_rows"), (ONE_MB_ARGS, "bad_rows"), ("{}", LONG_QUEUE)]

# From the table itself: Awa's awa.jobs view cannot read a payload whose
# tags is not an array (jsonb_array_elements_text refuses a scalar).
JOB_TEXT_SQL = """
    SELECT state::text AS state, queue, md5(args::text) AS args_md5, payload -> 'errors' AS errors
    FROM awa.deferred_jobs WHERE job_id = $1
"""


async def available_jobs(qs_db, qs_awa_client, count: int, queue: str) -> list[int]:
    """``count`` available jobs of ``queue``. A 200-character queue cannot
    take an available job from awa-pg or ``awa.insert_job_compat`` (their
    NOTIFY ``awa:<queue>`` is longer than 63 bytes, see the test below), so
    jobs are scheduled by awa-pg and promoted by awa_trio, which cuts the
    channel to what LISTEN hears."""
    if len(f"awa:{queue}".encode()) <= 63:
        return await insert_jobs(qs_db, count, queue=queue)
    before = {r["job_id"] for r in await qs_db.fetch("SELECT job_id FROM awa.ready_entries")}
    await insert_scheduled(qs_awa_client, count, queue=queue)
    await make_due(qs_db, f"queue = '{queue}'")
    await promote.run_once(await make_context(qs_db))
    rows = await qs_db.fetch("SELECT job_id FROM awa.ready_entries WHERE queue = $1", queue)
    return sorted({r["job_id"] for r in rows} - before)


def problems(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]


@pytest.mark.parametrize("table", ["awa.deferred_jobs", "awa.dlq_entries"])
async def test_postgres_refuses_sql_null_args_on_queue_storage(qs_db, table):
    """args is NOT NULL in every queue-storage table; payload may be NULL
    (the tests below feed NULL payloads through every pass)."""
    columns = {
        "awa.deferred_jobs": "state, run_at) VALUES (nextval('awa.job_id_seq'), 'k', 'q', {args}, 2, "
                             "'scheduled', now())",
        "awa.dlq_entries": "dlq_reason, original_run_lease) VALUES (nextval('awa.job_id_seq'), 'k', "
                           "'q', {args}, 2, 'test', 1)",
    }[table]
    insert = f"INSERT INTO {table} (job_id, kind, queue, args, priority, payload, " + columns
    with pytest.raises(QueryError) as refused:
        await qs_db.execute(insert.format(args="NULL").replace("2, ", "2, NULL, ", 1))
    assert refused.value.sqlstate == "23502"
    await qs_db.execute(insert.format(args="'{}'").replace("2, ", "2, NULL, ", 1))


async def test_promotion_moves_null_and_odd_payloads_beside_good_jobs(qs_ctx, qs_db, qs_awa_client, caplog):
    await insert_scheduled(qs_awa_client, 3, queue="nulls", null_payload=True)
    await insert_scheduled(qs_awa_client, 3, queue="good")
    await insert_scheduled(qs_awa_client, len(ODD_PAYLOADS), queue="odd")
    await insert_scheduled(qs_awa_client, 1, queue=LONG_QUEUE)
    odd_ids = [r["job_id"] for r in await qs_db.fetch(
        "SELECT job_id FROM awa.deferred_jobs WHERE queue = 'odd' ORDER BY job_id")]
    for job_id, payload in zip(odd_ids, ODD_PAYLOADS, strict=True):
        await qs_db.execute("UPDATE awa.deferred_jobs SET payload = $2::text::jsonb WHERE job_id = $1",
                            job_id, payload)
    for args, queue in ODD_ROWS:
        await qs_db.execute("UPDATE awa.deferred_jobs SET args = $1::text::jsonb, queue = $2 WHERE job_id = "
                            "(SELECT min(job_id) FROM awa.deferred_jobs WHERE queue = 'good')", args, queue)
        await insert_scheduled(qs_awa_client, 1, queue="good")
    before = {r["job_id"]: (r["args_md5"], r["payload"]) for r in await qs_db.fetch(
        "SELECT job_id, md5(args::text) AS args_md5, payload::text AS payload FROM awa.deferred_jobs")}
    await make_due(qs_db)

    result = await promote.run_once(qs_ctx)

    assert sum(result.promoted.values()) == len(before)
    assert LONG_QUEUE in result.queues
    assert await qs_db.fetchval("SELECT count(*) FROM awa.deferred_jobs") == 0
    after = {r["job_id"]: (r["args_md5"], r["payload"]) for r in await qs_db.fetch(
        "SELECT job_id, md5(args::text) AS args_md5, payload::text AS payload FROM awa.ready_entries")}
    assert after.keys() == before.keys()
    for job_id, (args_md5, payload) in before.items():
        # An empty payload is stored as NULL, as upstream stores it.
        assert after[job_id] == (args_md5, None if payload in ("{}", "null") else payload)
    assert problems(caplog) == []


@pytest.mark.parametrize("kind", ["heartbeat", "deadline", "callback"])
async def test_rescue_takes_odd_payloads_beside_good_jobs(
    qs_db, qs_awa_client, meter_provider, metric_reader, caplog, kind
):
    ctx = await make_context(qs_db, meter_provider=meter_provider, heartbeat_staleness=STALENESS)
    module = {"heartbeat": rescue_heartbeats, "deadline": rescue_deadlines,
              "callback": rescue_callbacks}[kind]
    good = await insert_jobs(qs_db, 3, queue="good")
    odd = await insert_jobs(qs_db, len(ODD_PAYLOADS), queue="odd")
    for job_id, payload in zip(odd, ODD_PAYLOADS, strict=True):
        await qs_db.execute("UPDATE awa.ready_entries SET payload = $2::text::jsonb WHERE job_id = $1",
                            job_id, payload)
    for args, queue in ODD_ROWS:
        [job_id] = await available_jobs(qs_db, qs_awa_client, 1, queue)
        await qs_db.execute("UPDATE awa.ready_entries SET args = $2::text::jsonb WHERE job_id = $1",
                            job_id, args)
        odd.append(job_id)
    for queue in ("good", "odd", "bad_rows", LONG_QUEUE):
        count = await qs_db.fetchval("SELECT count(*) FROM awa.ready_entries WHERE queue = $1", queue)
        await claim(qs_db, queue, count, deadline=300)
    arguments = {job_id: await qs_db.fetchval("SELECT md5(args::text) FROM awa.ready_entries "
                                              "WHERE job_id = $1", job_id) for job_id in good + odd}
    if kind == "heartbeat":
        await age_claims(qs_db, STALENESS * 2)
    elif kind == "deadline":
        await expire_deadlines(qs_db, good + odd)
    else:
        # A worker registered a callback: its attempt is a lease row waiting_external.
        await materialise(qs_db, good + odd)
        await qs_db.execute(
            "UPDATE awa.leases SET state = 'waiting_external', callback_id = gen_random_uuid(), "
            "callback_timeout_at = clock_timestamp() - interval '1 second', heartbeat_at = NULL")

    result = await module.run_once(ctx)

    assert sorted(job.id for job in result.rescued) == sorted(good + odd)
    for job_id in good + odd:
        job = dict(await qs_db.fetchrow(JOB_TEXT_SQL, job_id))
        assert job["state"] == "retryable", job_id
        assert job["args_md5"] == arguments[job_id]
        # errors is a JSON array again, the rescue's entry last.
        errors = job["errors"]
        assert isinstance(errors, list) and errors[-1]["attempt"] == 1
    [odd_errors] = [json.loads(p)["errors"] for p in ODD_PAYLOADS[-1:]]
    kept = (await qs_db.fetchrow(JOB_TEXT_SQL, odd[len(ODD_PAYLOADS) - 1]))["errors"]
    assert kept[:-1] == odd_errors
    rescued = sum(p.value for _, p in metric_points(metric_reader, "awa.maintenance.rescues"))
    assert rescued == len(good + odd)
    assert problems(caplog) == []


async def test_dlq_cleanup_purges_odd_rows_and_keeps_young_ones(qs_db, caplog):
    ctx = await make_context(qs_db, dlq_retention=3600)
    old = await add_bulk_dlq_rows(qs_db, "bad_rows", len(ODD_PAYLOADS) + 3, dt.timedelta(days=2))
    for job_id, payload in zip(old, ODD_PAYLOADS, strict=False):
        await qs_db.execute("UPDATE awa.dlq_entries SET payload = $2::text::jsonb WHERE job_id = $1",
                            job_id, payload)
    await qs_db.execute("UPDATE awa.dlq_entries SET args = $2::text::jsonb, queue = $3 WHERE job_id = $1",
                        old[-1], ONE_MB_ARGS, LONG_QUEUE)
    await qs_db.execute("UPDATE awa.dlq_entries SET args = 'null' WHERE job_id = $1", old[-2])
    young = await add_bulk_dlq_rows(qs_db, LONG_QUEUE, 2, dt.timedelta(minutes=5))

    result = await cleanup.run_once(ctx)

    assert result.total_dlq_purged == len(old)
    assert await dlq_ids(qs_db) == young
    assert result.failed_steps == []
    assert problems(caplog) == []


async def test_awa_refuses_an_available_job_in_a_200_character_queue(qs_db, qs_awa_client):
    """Awa's own producers NOTIFY ``awa:<queue>`` for an available job, and
    PostgreSQL refuses channel names over 63 bytes (SQLSTATE 22023): such a
    job can only enter as scheduled, and awa_trio's promotion makes it
    available."""
    with pytest.raises(QueryError) as refused:
        await insert_jobs(qs_db, 1, queue=LONG_QUEUE)
    assert refused.value.sqlstate == "22023"
    with pytest.raises(Exception, match="channel name too long"):
        await trio.to_thread.run_sync(lambda: qs_awa_client.insert({"n": 1}, kind="k", queue=LONG_QUEUE))
    assert len(await available_jobs(qs_db, qs_awa_client, 2, LONG_QUEUE)) == 2


async def test_a_200_character_queue_is_counted_and_reported_by_status(
    qs_database_url, qs_db, qs_awa_client, meter_provider, metric_reader
):
    ctx = await make_context(qs_db, meter_provider=meter_provider, heartbeat_staleness=STALENESS)
    await available_jobs(qs_db, qs_awa_client, 3, LONG_QUEUE)
    await claim(qs_db, LONG_QUEUE, 1, deadline=300)
    await age_claims(qs_db, STALENESS * 2)
    await insert_scheduled(qs_awa_client, 2, queue=LONG_QUEUE)
    await make_due(qs_db)

    await queue_stats.run_once(ctx)
    depth = {(a["awa.job.queue"], a["awa.job.state"]): p.value
             for a, p in metric_points(metric_reader, QUEUE_DEPTH)}
    assert depth[(LONG_QUEUE, "available")] == 2
    assert depth[(LONG_QUEUE, "running")] == 1
    assert depth[(LONG_QUEUE, "scheduled")] == 2

    report = await status_report(qs_database_url)
    assert report["engine"] == "queue_storage"
    assert report["due_not_promoted"]["scheduled"]["jobs"] == 2

    # A payload Awa's own awa.jobs view cannot read (tags not an array)
    # fails the rescue-backlog query, which reads that view; the rest of the
    # report is still given.
    await qs_db.execute("UPDATE awa.deferred_jobs SET payload = '{\"tags\": \"x\"}' WHERE job_id = "
                        "(SELECT min(job_id) FROM awa.deferred_jobs)")
    report = await status_report(qs_database_url)
    assert report["due_not_promoted"]["scheduled"]["jobs"] == 2
    assert "cannot extract elements from a scalar" in report["rescue_backlog"]["error"]


async def test_a_leader_on_queue_storage_handles_odd_rows_without_a_branch_error(
    qs_database_url, qs_db, qs_awa_client, meter_provider, metric_reader, caplog
):
    """The odd rows under a running MaintenanceService: scheduled ones are
    promoted, stale claims rescued (retryable, with backoff), and no branch
    logs a traceback or counts an error."""
    caplog.set_level(logging.INFO)
    await insert_scheduled(qs_awa_client, 2, queue="nulls", null_payload=True)
    await insert_scheduled(qs_awa_client, len(ODD_PAYLOADS), queue="odd")
    await insert_scheduled(qs_awa_client, 2, queue=LONG_QUEUE)
    odd = [r["job_id"] for r in await qs_db.fetch("SELECT job_id FROM awa.deferred_jobs WHERE queue = 'odd'")]
    for job_id, payload in zip(odd, ODD_PAYLOADS, strict=True):
        await qs_db.execute("UPDATE awa.deferred_jobs SET payload = $2::text::jsonb WHERE job_id = $1",
                            job_id, payload)
    await qs_db.execute("UPDATE awa.deferred_jobs SET args = $1::text::jsonb WHERE job_id = $2",
                        ONE_MB_ARGS, odd[0])
    await make_due(qs_db)
    scheduled = await qs_db.fetchval("SELECT count(*) FROM awa.deferred_jobs")
    stale = await insert_jobs(qs_db, 3, queue="stale")
    await qs_db.execute("UPDATE awa.ready_entries SET payload = '{\"metadata\": [1], \"errors\": 1}' "
                        "WHERE job_id = $1", stale[0])
    await claim(qs_db, "stale", 3, deadline=300)
    await age_claims(qs_db, STALENESS * 2)
    config = MaintenanceConfig(
        leader_election_interval=0.2, promote_interval=0.1, heartbeat_rescue_interval=0.2,
        heartbeat_staleness=STALENESS,
    )
    service = MaintenanceService(qs_database_url, config, meter_provider=meter_provider)

    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        with trio.fail_after(15):
            await service.wait_until_leader()
            while await qs_db.fetchval("SELECT count(*) FROM awa.ready_entries WHERE queue <> 'stale'") < scheduled:
                await trio.sleep(0.05)
            while len(await deferred_retryable(qs_db, stale)) < len(stale):
                await trio.sleep(0.05)
        nursery.cancel_scope.cancel()

    assert await qs_db.fetchval("SELECT count(*) FROM awa.deferred_jobs WHERE state = 'scheduled'") == 0
    assert not [r for r in caplog.records if r.exc_info], "a branch logged a traceback"
    assert problems(caplog) == []
    assert sum(point.value for _, point in metric_points(metric_reader, "awa_trio.branch.errors")) == 0
