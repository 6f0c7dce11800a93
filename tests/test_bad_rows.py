"""Bad rows on the canonical engine: odd payloads, malformed ``errors``
arrays, 1 MB arguments and 200-character queue names go through promotion,
the three rescues and cleanup; each bad row is handled, or logged once and
skipped, and the good jobs of the same tick are handled as usual.

Bad rows are written with SQL, as a buggy producer (or a hand edit) could
write them; good jobs are inserted by awa-pg and only moved in time with SQL.
Where PostgreSQL itself refuses a row, the test asserts the refusal.
"""

from __future__ import annotations

import datetime as dt
import json
import logging

import pytest
import trio
from conftest import in_thread
from support.contexts import make_context
from support.helpers import metric_points, status_report

from awa_trio import MaintenanceConfig, MaintenanceService
from awa_trio.config import RetentionPolicy
from awa_trio.db import QueryError
from awa_trio.engines.canonical import (
    admin_metadata,
    cleanup,
    promote,
    queue_stats,
    rescue_callbacks,
    rescue_deadlines,
    rescue_heartbeats,
)
from awa_trio.metrics import ATTR_JOB_QUEUE, ATTR_JOB_STATE, QUEUE_DEPTH

QUEUE = "bad_rows"
LONG_QUEUE = "q" * 200
ONE_MB_ARGS = json.dumps({"blob": "x" * 1_000_000})
HOUR = dt.timedelta(hours=1)
HOUR_S = 3600.0

#: (args, metadata) as JSON text: valid jsonb, but not the object a producer writes.
ODD_PAYLOADS = {
    "json_null": ("null", "null"),
    "scalars": ('"just text"', "42"),
    "arrays": ("[1, 2]", "[1, 2]"),
    "string_metadata": ("{}", '"text"'),
    "one_mb_args": (ONE_MB_ARGS, "{}"),
}
#: ``errors`` arrays (JSON text per element, None for an SQL NULL element;
#: None for the whole column: it is nullable).
ODD_ERRORS = {
    "sql_null_column": None,
    "odd_elements": ['"a string"', "42", "null", None, "[1, 2]", '{"no_error_key": true}'],
}
#: A two-dimensional jsonb[]: PostgreSQL cannot append an element to it.
TWO_DIMENSIONAL_ERRORS = """ARRAY[ARRAY['{"error": "a"}'::jsonb, '{"error": "b"}'::jsonb]]"""

# How each pass finds its candidates: the table and column values (SQL).
RUNNING = {"state": "'running'", "attempt": "1", "run_lease": "1",
           "attempted_at": "now() - interval '10 minutes'",
           "run_at": "now() - interval '11 minutes'"}  # fmt: skip
ARRANGEMENTS = {
    "heartbeat": ("awa.jobs_hot", {**RUNNING, "heartbeat_at": "now() - interval '10 minutes'",
                                   "deadline_at": "now() + interval '1 hour'"}),
    "deadline": ("awa.jobs_hot", {**RUNNING, "heartbeat_at": "now()",
                                  "deadline_at": "now() - interval '1 minute'"}),
    "callback": ("awa.jobs_hot", {**RUNNING, "state": "'waiting_external'",
                                  "callback_id": "gen_random_uuid()",
                                  "callback_timeout_at": "now() - interval '1 minute'"}),
    "scheduled": ("awa.scheduled_jobs", {"state": "'scheduled'",
                                         "run_at": "now() - interval '1 minute'"}),
    "retryable": ("awa.scheduled_jobs", {"state": "'retryable'", "attempt": "1", "run_lease": "1",
                                         "run_at": "now() - interval '1 minute'"}),
    "expired": ("awa.jobs_hot", {"state": "'completed'", "attempt": "1",
                                 "finalized_at": "now() - interval '30 days'"}),
}  # fmt: skip
RESCUES = {
    "heartbeat": (rescue_heartbeats, rescue_heartbeats.RESCUE_ERROR),
    "deadline": (rescue_deadlines, rescue_deadlines.RESCUE_ERROR),
    "callback": (rescue_callbacks, rescue_callbacks.RESCUE_ERROR),
}

# Payload columns as text, so a comparison sees exactly what is stored.
ROW_SQL = """
    SELECT tableoid::regclass::text AS table_name, state::text AS state, queue,
           md5(args::text) AS args_md5, metadata::text AS metadata,
           errors::text[] AS errors, progress::text AS progress
    FROM awa.jobs_hot WHERE id = $1
    UNION ALL
    SELECT tableoid::regclass::text, state::text, queue,
           md5(args::text), metadata::text, errors::text[], progress::text
    FROM awa.scheduled_jobs WHERE id = $1
"""


async def insert_raw(db, arrangement: str, *, args: str = "{}", metadata: str = "{}",
                     errors: list[str | None] | str | None = (), queue: str = QUEUE,
                     progress: str | None = None) -> int:
    """One row written straight into awa's tables. ``errors`` is a list of
    JSON texts (None: an SQL NULL element), None (an SQL NULL column) or an
    SQL expression."""
    table, columns = ARRANGEMENTS[arrangement]
    names = ["kind", "queue", "args", "metadata", "progress", *columns]
    values = ["'bad_row'", "$1", "$2::text::jsonb", "$3::text::jsonb", "$4::text::jsonb",
              *columns.values()]
    params: list[object] = [queue, args, metadata, progress]
    names.append("errors")
    if isinstance(errors, str):
        values.append(errors)
    else:
        params.append(None if errors is None else list(errors))
        values.append(f"${len(params)}::text[]::jsonb[]")
    return await db.fetchval(
        f"INSERT INTO {table} ({', '.join(names)}) VALUES ({', '.join(values)}) RETURNING id",
        *params,
    )


async def insert_good(db, awa_client, arrangement: str, count: int = 3,
                      queue: str = "good") -> list[int]:
    """Jobs inserted by awa-pg, then moved to where ``arrangement`` wants them."""
    table, columns = ARRANGEMENTS[arrangement]
    later = dt.datetime.now(dt.UTC) + HOUR
    ids = []
    for n in range(count):
        run_at = later if table == "awa.scheduled_jobs" else None
        job = await in_thread(awa_client.insert, {"good": n}, kind="good", queue=queue,
                              run_at=run_at)
        ids.append(job.id)
    assignments = ", ".join(f"{name} = {value}" for name, value in columns.items())
    await db.execute(f"UPDATE {table} SET {assignments} WHERE id = ANY($1::bigint[])", ids)
    return ids


async def row(db, job_id: int) -> dict | None:
    record = await db.fetchrow(ROW_SQL, job_id)
    return None if record is None else dict(record)


def problems(caplog) -> list[logging.LogRecord]:
    """Warnings and errors, and anything with a traceback."""
    return [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]


def rescued_count(reader, kind: str) -> int:
    return sum(point.value for attributes, point in metric_points(reader, "awa.maintenance.rescues")
               if attributes["awa.rescue.kind"] == kind)


# -- NULL payloads -------------------------------------------------------------


@pytest.mark.parametrize("column", ["args", "metadata", "kind", "queue", "tags"])
@pytest.mark.parametrize("table", ["awa.jobs_hot", "awa.scheduled_jobs"])
async def test_postgres_refuses_sql_null_payload_columns(db, table, column):
    """args, metadata (and kind, queue, tags) are NOT NULL: no writer can
    leave them NULL, so maintenance never meets such a row. errors and
    progress may be NULL; the tests below feed those through every pass."""
    columns = {"kind": "'k'", "queue": "'q'", "args": "'{}'", "metadata": "'{}'", "tags": "'{}'",
               "state": "'scheduled'" if table == "awa.scheduled_jobs" else "'available'"}
    columns[column] = "NULL"
    with pytest.raises(QueryError) as refused:
        await db.execute(f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join(columns.values())})")
    assert refused.value.sqlstate == "23502"  # not_null_violation
    await db.execute(
        f"INSERT INTO {table} (kind, state, errors, progress) VALUES "
        f"('k', {columns['state']}, NULL, NULL)"
    )


# -- promotion -------------------------------------------------------------------


@pytest.mark.parametrize("state", ["scheduled", "retryable"])
async def test_promotion_moves_odd_payloads_unchanged_beside_good_jobs(db, awa_client, caplog, state):
    ctx = await make_context(db)
    bad = [await insert_raw(db, state, args=args, metadata=metadata)
           for args, metadata in ODD_PAYLOADS.values()]
    bad += [await insert_raw(db, state, errors=errors) for errors in ODD_ERRORS.values()]
    bad.append(await insert_raw(db, state, errors=TWO_DIMENSIONAL_ERRORS))
    good = await insert_good(db, awa_client, state)
    before = {job_id: await row(db, job_id) for job_id in bad + good}

    result = await promote.run_once(ctx)

    assert result.promoted[state] == len(bad) + len(good)
    for job_id, old in before.items():
        new = await row(db, job_id)
        assert (new["table_name"], new["state"]) == ("awa.jobs_hot", "available")
        assert {k: new[k] for k in ("args_md5", "metadata", "errors", "progress")} == {
            k: old[k] for k in ("args_md5", "metadata", "errors", "progress")
        }
    assert problems(caplog) == []


async def test_a_row_a_trigger_or_constraint_refuses_is_skipped_and_the_batch_promoted(
    db, awa_client, caplog
):
    """A site's own CHECK on jobs_hot (or a trigger raising) refuses one
    due row, which fails the whole batch statement: the batch goes row by
    row, that row is logged and stays scheduled, the others are promoted."""
    ctx = await make_context(db)
    await db.execute("ALTER TABLE awa.jobs_hot ADD CONSTRAINT site_no_poison "
                     "CHECK (args::text NOT LIKE '%poison%') NOT VALID")
    poisoned = await insert_raw(db, "scheduled", args='{"poison": true}')
    good = await insert_good(db, awa_client, "scheduled", count=5)

    result = await promote.run_once(ctx)

    assert result.promoted["scheduled"] == len(good)
    assert result.skipped == [poisoned]
    assert (await row(db, poisoned))["table_name"] == "awa.scheduled_jobs"
    for job_id in good:
        assert (await row(db, job_id))["state"] == "available"
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and f"job {poisoned}" in errors[0] and "site_no_poison" in errors[0]


# -- rescues ---------------------------------------------------------------------


@pytest.mark.parametrize("kind", list(RESCUES))
async def test_rescue_takes_odd_payloads_and_errors_beside_good_jobs(
    db, awa_client, caplog, meter_provider, metric_reader, kind
):
    """Every odd row is rescued like a good one: payload unchanged, the
    rescue's error appended after whatever ``errors`` held."""
    ctx = await make_context(db, meter_provider=meter_provider, heartbeat_staleness=60)
    module, error = RESCUES[kind]
    bad = [await insert_raw(db, kind, args=args, metadata=metadata, progress="null")
           for args, metadata in ODD_PAYLOADS.values()]
    bad += [await insert_raw(db, kind, errors=errors) for errors in ODD_ERRORS.values()]
    good = await insert_good(db, awa_client, kind)
    before = {job_id: await row(db, job_id) for job_id in bad + good}

    result = await module.run_once(ctx)

    assert sorted(job.id for job in result.rescued) == sorted(bad + good)
    assert result.skipped == []
    for job_id, old in before.items():
        new = await row(db, job_id)
        assert (new["table_name"], new["state"]) == ("awa.scheduled_jobs", "retryable")
        assert (new["args_md5"], new["metadata"], new["progress"]) == (
            old["args_md5"], old["metadata"], old["progress"])
        *kept, added = new["errors"]
        assert kept == (old["errors"] or [])
        assert json.loads(added)["error"] == error
    assert rescued_count(metric_reader, RESCUES[kind][0].METRIC_KIND) == len(bad) + len(good)
    assert problems(caplog) == []


@pytest.mark.parametrize("kind", list(RESCUES))
async def test_a_row_whose_errors_cannot_be_appended_to_is_skipped_and_the_rest_rescued(
    db, awa_client, caplog, kind
):
    """A two-dimensional ``errors`` array refuses the rescue's append
    (SQLSTATE 22000), which fails the whole batch statement: the batch goes
    row by row, that row is logged and left as it is, every other row is
    rescued, at every pass."""
    ctx = await make_context(db, heartbeat_staleness=60)
    module, _ = RESCUES[kind]
    poisoned = await insert_raw(db, kind, errors=TWO_DIMENSIONAL_ERRORS)
    good = await insert_good(db, awa_client, kind)
    before = await row(db, poisoned)

    result = await module.run_once(ctx)

    assert sorted(job.id for job in result.rescued) == sorted(good)
    assert result.skipped == [poisoned]
    assert await row(db, poisoned) == before
    for job_id in good:
        assert (await row(db, job_id))["state"] == "retryable"
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1, errors
    assert f"job {poisoned}" in errors[0] and "one-dimensional" in errors[0]
    assert not [r for r in caplog.records if r.exc_info]

    # The next pass: more good work arrives; the poisoned row still blocks none of it.
    caplog.clear()
    more = await insert_good(db, awa_client, kind)
    again = await module.run_once(ctx)
    assert sorted(job.id for job in again.rescued) == sorted(more)
    assert again.skipped == [poisoned]
    assert len([r for r in caplog.records if r.levelno >= logging.ERROR]) == 1


# -- cleanup -------------------------------------------------------------------


async def test_cleanup_deletes_expired_bad_rows_and_keeps_young_ones(db, awa_client, caplog):
    ctx = await make_context(
        db, completed_retention="24h", failed_retention="72h",
        queue_retention_overrides={LONG_QUEUE: RetentionPolicy(completed=HOUR_S, failed=HOUR_S)},
    )
    expired = [await insert_raw(db, "expired", args=args, metadata=metadata)
               for args, metadata in ODD_PAYLOADS.values()]
    expired += [await insert_raw(db, "expired", errors=errors) for errors in ODD_ERRORS.values()]
    expired.append(await insert_raw(db, "expired", errors=TWO_DIMENSIONAL_ERRORS))
    expired.append(await insert_raw(db, "expired", queue=LONG_QUEUE))
    expired += await insert_good(db, awa_client, "expired")
    # Young: inside retention (the override keeps an hour for the long queue).
    young = await insert_good(db, awa_client, "expired")
    young.append(await insert_raw(db, "expired", args=ONE_MB_ARGS, queue=LONG_QUEUE))
    young.append(await insert_raw(db, "expired", errors=TWO_DIMENSIONAL_ERRORS))
    await db.execute("UPDATE awa.jobs_hot SET finalized_at = now() - interval '30 minutes' "
                     "WHERE id = ANY($1::bigint[])", young)

    result = await cleanup.run_once(ctx)

    assert result.failed_steps == []
    assert result.total_jobs_deleted == len(expired)
    assert result.jobs_deleted_by_queue == {LONG_QUEUE: 1}
    for job_id in expired:
        assert await row(db, job_id) is None
    for job_id in young:
        assert (await row(db, job_id))["state"] == "completed"
    assert problems(caplog) == []


# -- 200-character queue names -------------------------------------------------


async def test_a_200_character_queue_is_promoted_rescued_and_counted(
    db, awa_client, meter_provider, metric_reader, caplog
):
    """200 characters is the longest queue name Awa accepts, but
    ``awa.notify_new_job`` on ``jobs_hot`` cannot NOTIFY ``awa:<queue>`` for
    it (channel names stop at 63 bytes, SQLSTATE 22023), so an insert that
    fires the trigger fails. Promotion must still make such jobs available,
    and the jobs of other queues in the same batch."""
    ctx = await make_context(db, meter_provider=meter_provider, heartbeat_staleness=60)
    later = dt.datetime.now(dt.UTC) + HOUR
    long_due = (await in_thread(awa_client.insert, {"n": 1}, kind="long", queue=LONG_QUEUE,
                                run_at=later)).id
    good_due = await insert_good(db, awa_client, "scheduled")
    await db.execute("UPDATE awa.scheduled_jobs SET run_at = now() - interval '1 minute' "
                     "WHERE id = $1", long_due)
    long_stale = (await in_thread(awa_client.insert, {"n": 2}, kind="long", queue=LONG_QUEUE)).id
    table, columns = ARRANGEMENTS["heartbeat"]
    await db.execute(
        f"UPDATE {table} SET {', '.join(f'{k} = {v}' for k, v in columns.items())} WHERE id = $1",
        long_stale,
    )

    promoted = await promote.run_once(ctx)
    rescued = await rescue_heartbeats.run_once(ctx)

    assert promoted.promoted["scheduled"] == 1 + len(good_due)
    assert LONG_QUEUE in promoted.queues
    assert promoted.skipped == []
    assert (await row(db, long_due))["state"] == "available"
    for job_id in good_due:
        assert (await row(db, job_id))["state"] == "available"
    assert [job.id for job in rescued.rescued] == [long_stale]
    # Promoted again after the rescue: the rescued job is due at once.
    again = await promote.run_once(ctx)
    assert again.promoted["retryable"] == 1
    assert (await row(db, long_stale))["state"] == "available"
    # Claimable by a worker, as any available job (run_at is not in the future).
    assert await db.fetchval(
        "SELECT count(*) FROM awa.jobs_hot WHERE queue = $1 AND state = 'available' "
        "AND run_at <= clock_timestamp()", LONG_QUEUE) == 2

    while (await admin_metadata.run_recompute_dirty(ctx)).keys_recomputed:
        pass
    await queue_stats.run_once(ctx)
    depth = {(a[ATTR_JOB_QUEUE], a[ATTR_JOB_STATE]): p.value
             for a, p in metric_points(metric_reader, QUEUE_DEPTH)}
    assert depth[(LONG_QUEUE, "available")] == 2
    assert depth[("good", "available")] == len(good_due)
    assert problems(caplog) == []


async def test_status_command_reports_a_200_character_queue_backlog(database_url, db, awa_client):
    later = dt.datetime.now(dt.UTC) + HOUR
    for _ in range(2):
        job = await in_thread(awa_client.insert, {"n": 1}, kind="long", queue=LONG_QUEUE, run_at=later)
        await db.execute("UPDATE awa.scheduled_jobs SET run_at = now() - interval '1 minute' "
                         "WHERE id = $1", job.id)
    await insert_raw(db, "heartbeat", queue=LONG_QUEUE, args=ONE_MB_ARGS)
    await db.execute(
        "INSERT INTO awa.cron_jobs (name, cron_expr, kind, queue) VALUES ('long', '0 3 * * *', 'k', $1)",
        LONG_QUEUE,
    )

    report = await status_report(database_url)
    assert report["due_not_promoted"]["scheduled"]["jobs"] == 2
    assert report["rescue_backlog"]["stale_heartbeats"] == 1
    [cron] = report["cron"]
    assert cron["queue"] == LONG_QUEUE and cron["next_fire"]


# -- with awa_trio leading ------------------------------------------------------


async def test_a_leader_handles_every_bad_row_and_keeps_every_branch_running(
    database_url, db, awa_client, caplog, meter_provider, metric_reader
):
    """The same rows under a running MaintenanceService with short intervals:
    good jobs of every pass are handled, the poisoned rows are logged (never
    with a traceback), and no branch crashes or stops."""
    caplog.set_level(logging.INFO)
    poisoned = {kind: await insert_raw(db, kind, errors=TWO_DIMENSIONAL_ERRORS) for kind in RESCUES}
    kinds = (*RESCUES, "scheduled", "expired")
    jobs = {kind: [await insert_raw(db, kind, args=args, metadata=metadata, queue=LONG_QUEUE)
                   for args, metadata in ODD_PAYLOADS.values()]
            + await insert_good(db, awa_client, kind) for kind in kinds}
    handled = [job_id for ids in jobs.values() for job_id in ids]
    config = MaintenanceConfig(
        leader_election_interval=0.2, promote_interval=0.1, heartbeat_rescue_interval=0.2,
        deadline_rescue_interval=0.2, callback_rescue_interval=0.2, cleanup_interval=0.2,
        heartbeat_staleness=60, completed_retention="1h",
    )
    service = MaintenanceService(database_url, config, meter_provider=meter_provider)

    async def settled() -> bool:
        """Every handled job available (the rescued ones promoted again) or deleted."""
        return not await db.fetchval(
            "SELECT count(*) FROM awa.jobs WHERE id = ANY($1::bigint[]) AND state <> 'available'",
            handled)

    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        with trio.fail_after(10):
            await service.wait_until_leader()
            while not await settled():
                await trio.sleep(0.05)
        await trio.sleep(0.5)  # a few more passes over the poisoned rows
        nursery.cancel_scope.cancel()

    for job_id in jobs["expired"]:
        assert await row(db, job_id) is None
    for kind in (*RESCUES, "scheduled"):
        for job_id in jobs[kind]:
            assert (await row(db, job_id))["state"] == "available", kind
    for kind, job_id in poisoned.items():
        state = (await row(db, job_id))["state"]
        assert state == ("waiting_external" if kind == "callback" else "running")
    assert not [r for r in caplog.records if r.exc_info], "a branch logged a traceback"
    assert "crashed" not in caplog.text
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors and all(any(f"job {job_id}" in m for job_id in poisoned.values()) for m in errors)
    # A row skipped every tick is a failure an operator must see: the three
    # rescues count it as branch errors (issue 16), and no other branch does.
    branch_errors = metric_points(metric_reader, "awa_trio.branch.errors")
    failing = {attributes["awa.maintenance.branch"] for attributes, point in branch_errors if point.value}
    assert failing == {"rescue_stale_heartbeats", "rescue_expired_deadlines", "rescue_expired_callbacks"}


# -- cron rows -------------------------------------------------------------------

CRON_JOBS_OF_SQL = """
    SELECT metadata ->> 'cron_name' AS name, count(DISTINCT metadata ->> 'cron_fire_time') AS fires
    FROM awa.jobs WHERE metadata ? 'cron_name' GROUP BY 1
"""


async def test_postgres_refuses_an_unknown_cron_policy(db):
    with pytest.raises(QueryError) as refused:
        await db.execute("INSERT INTO awa.cron_jobs (name, cron_expr, kind, missed_fire_policy) "
                         "VALUES ('p', '* * * * *', 'k', 'sometimes')")
    assert refused.value.sqlstate == "23514"


async def test_bad_cron_rows_are_logged_once_and_skipped_while_good_ones_keep_firing(
    database_url, db, caplog
):
    """Rows a buggy writer (or an older table, without the policy CHECK)
    could hold, evaluated by a leader every 0.2 s for a few seconds: each
    bad row gets one ERROR line (the passes after it are DEBUG), its mark
    never moves, and the good schedules beside it fire every second."""
    caplog.set_level(logging.DEBUG, logger="awa_trio.cron.branches")
    await db.execute("ALTER TABLE awa.cron_jobs DROP CONSTRAINT cron_jobs_missed_fire_policy_check")
    rows = {
        "a_bad_expr": {"cron_expr": "'61 * * * *'"},
        "b_bad_zone": {"timezone": "'Mars/Olympus'"},
        "c_bad_policy": {"missed_fire_policy": "'sometimes'"},
        "d_null_metadata": {"metadata": "'null'"},
        "e_array_metadata": {"metadata": "'[1, 2]'"},
        "f_bad_priority": {"priority": "9"},
        "g_too_many_tags": {"tags": "(SELECT array_agg('t' || n) FROM generate_series(1, 21) AS n)"},
        "h_long_kind": {"kind": "repeat('k', 201)"},
        "i_long_queue": {"queue": f"'{LONG_QUEUE}'"},
        "j_null_args": {"args": "'null'"},
        "z_good": {},
    }
    bad = {"a_bad_expr": "invalid cron expression", "b_bad_zone": "unknown timezone",
           "c_bad_policy": "invalid missed fire policy", "d_null_metadata": "must be a JSON object",
           "e_array_metadata": "must be a JSON object", "f_bad_priority": "priority must be between",
           "g_too_many_tags": "at most 20 values", "h_long_kind": "kind length"}
    for name, columns in rows.items():
        values = {"cron_expr": "'* * * * * *'", "kind": "'tick'",
                  "created_at": "now() - interval '1 hour'", **columns}
        await db.execute(f"INSERT INTO awa.cron_jobs (name, {', '.join(values)}) "
                         f"VALUES ('{name}', {', '.join(values.values())})")
    service = MaintenanceService(
        database_url, MaintenanceConfig(leader_election_interval=0.2, cron_eval_interval=0.2),
        disabled_branches=["promote_scheduled"],
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        with trio.fail_after(10):
            await service.wait_until_leader()
            while (dict(await db.fetch(CRON_JOBS_OF_SQL)).get("z_good") or 0) < 3:
                await trio.sleep(0.1)
        nursery.cancel_scope.cancel()

    fired = dict(await db.fetch(CRON_JOBS_OF_SQL))
    assert fired.keys() == {"i_long_queue", "j_null_args", "z_good"}
    assert fired["i_long_queue"] >= 2
    assert await db.fetchval("SELECT count(*) FROM awa.jobs WHERE args = 'null'::jsonb") >= 2
    marks = dict(await db.fetch("SELECT name, last_enqueued_at FROM awa.cron_jobs"))
    for name, reason in bad.items():
        assert marks[name] is None, name
        said = [r for r in caplog.records if f"{name!r}" in r.getMessage()]
        errors = [r.getMessage() for r in said if r.levelno == logging.ERROR]
        assert len(errors) == 1, (name, errors)
        assert reason in errors[0], errors[0]
        # Seen again at every later pass, quietly.
        assert len([r for r in said if r.levelno == logging.DEBUG]) >= 2, name
    assert not [r for r in caplog.records if r.exc_info]


async def test_a_cron_problem_is_said_again_after_the_row_was_fine(db, caplog):
    from awa_trio.cron.branches import ProblemLog, evaluate_schedules

    await db.execute("INSERT INTO awa.cron_jobs (name, cron_expr, kind, timezone, created_at) "
                     "VALUES ('s', '0 3 * * *', 'k', 'Mars/Olympus', now())")
    problems = ProblemLog()

    def errors() -> int:
        return len([r for r in caplog.records if r.levelno == logging.ERROR])

    await evaluate_schedules(db, problems=problems)
    await evaluate_schedules(db, problems=problems)
    assert errors() == 1
    await db.execute("UPDATE awa.cron_jobs SET timezone = 'UTC'")
    assert (await evaluate_schedules(db, problems=problems)).invalid == []
    await db.execute("UPDATE awa.cron_jobs SET timezone = 'Mars/Olympus'")
    await evaluate_schedules(db, problems=problems)
    assert errors() == 2
