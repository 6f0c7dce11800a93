"""Upstream's storage-transition gauges and awa.job_kind.info, published by
the queue_stats tick (awa_trio.engines.queue_info): values in every storage state,
runtime liveness as upstream's report counts it, only the latest label sets,
and nothing while not leading."""

from __future__ import annotations

import dataclasses
import datetime as dt

import pytest
import trio
from conftest import in_thread
from support.contexts import make_context
from support.helpers import metric_points

from awa_trio import MaintenanceConfig, MaintenanceService
from awa_trio.engines import queue_info
from awa_trio.engines.canonical import queue_stats
from awa_trio.engines.queue_info import publish_info
from awa_trio.engines.queue_storage import queue_stats as qs_queue_stats
from awa_trio.metrics import (
    ATTR_STORAGE_ACTION,
    ATTR_STORAGE_CAPABILITY,
    JOB_KIND_INFO,
    STORAGE_CANONICAL_LIVE_BACKLOG,
    STORAGE_LIVE_RUNTIME_CAPABILITY,
    STORAGE_STATE,
    STORAGE_TRANSITION_READY,
    InfoSnapshot,
    MaintenanceMetrics,
)

STORAGE_GAUGES = (
    STORAGE_STATE,
    STORAGE_TRANSITION_READY,
    STORAGE_CANONICAL_LIVE_BACKLOG,
    STORAGE_LIVE_RUNTIME_CAPABILITY,
    JOB_KIND_INFO,
)
PREPARE_SQL = "SELECT state FROM awa.storage_prepare('queue_storage', '{\"schema\": \"awa\"}')"
ENTER_MIXED_SQL = "SELECT state FROM awa.storage_enter_mixed_transition()"
# A runtime's snapshot row, as awa-pg's publisher writes it; $1 seconds old.
RUNTIME_SQL = """
    INSERT INTO awa.runtime_instances (
        instance_id, hostname, pid, version, started_at, last_seen_at, snapshot_interval_ms,
        healthy, postgres_connected, poll_loop_alive, heartbeat_alive, shutting_down, leader,
        storage_capability, transition_role)
    VALUES (gen_random_uuid(), 'gauges-test', 4242, '0.6.1', now() - interval '1 hour',
            now() - make_interval(secs => $1), $2, true, true, true, true, false, false, $3, $4)
    RETURNING instance_id
"""
KIND_SQL = """
    INSERT INTO awa.job_kind_descriptors (kind, display_name, owner, tags, descriptor_hash)
    VALUES ($1, $2, $3, $4::text[], 'h')
"""


async def runtime(db, capability: str, role: str = "auto", *, age: float = 0.0, interval_ms: int = 10_000):
    return await db.fetchval(RUNTIME_SQL, age, interval_ms, capability, role)


def gauges(reader) -> dict:
    """Every storage gauge and job-kind series as plain values."""
    found: dict = {name: {} for name in STORAGE_GAUGES}
    data = {name: metric_points(reader, name) for name in STORAGE_GAUGES}
    found[STORAGE_STATE] = [attrs for attrs, point in data[STORAGE_STATE] if point.value == 1]
    assert len(found[STORAGE_STATE]) == len(data[STORAGE_STATE])
    found[STORAGE_TRANSITION_READY] = {
        attrs[ATTR_STORAGE_ACTION]: point.value for attrs, point in data[STORAGE_TRANSITION_READY]
    }
    found[STORAGE_CANONICAL_LIVE_BACKLOG] = [point.value for _, point in data[STORAGE_CANONICAL_LIVE_BACKLOG]]
    found[STORAGE_LIVE_RUNTIME_CAPABILITY] = {
        attrs[ATTR_STORAGE_CAPABILITY]: point.value for attrs, point in data[STORAGE_LIVE_RUNTIME_CAPABILITY]
    }
    found[JOB_KIND_INFO] = sorted(
        (attrs for attrs, point in data[JOB_KIND_INFO] if point.value == 1), key=lambda a: a["awa.job.kind"]
    )
    return found


def state_labels(state: str, current: str, active: str, prepared: str | None) -> list[dict]:
    labels = {
        "awa.storage.state": state,
        "awa.storage.current_engine": current,
        "awa.storage.active_engine": active,
    }
    if prepared is not None:
        labels["awa.storage.prepared_engine"] = prepared
    return [labels]


def nothing(reader) -> bool:
    return all(metric_points(reader, name) == [] for name in STORAGE_GAUGES)


async def test_canonical_state_backlog_and_live_runtimes(db, awa_client, meter_provider, metric_reader):
    ctx = await make_context(db, meter_provider=meter_provider)
    # Live canonical work: available, scheduled, running; finished rows do not count.
    for _ in range(2):
        await in_thread(awa_client.insert, {}, kind="gauge_probe", queue="gq")

    later = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    await in_thread(awa_client.insert, {}, kind="gauge_probe", queue="gq", run_at=later)
    finished = await in_thread(awa_client.insert, {}, kind="gauge_probe", queue="gq")
    await db.execute(
        "UPDATE awa.jobs_hot SET state = 'completed', attempt = 1, finalized_at = now() WHERE id = $1",
        finished.id,
    )
    # Liveness: 3 x the snapshot interval, at least 30 s.
    await runtime(db, "canonical", age=25)  # live (window 30 s)
    await runtime(db, "canonical", age=35)  # stale
    await runtime(db, "queue_storage", age=50, interval_ms=20_000)  # live (window 60 s)
    await runtime(db, "canonical_drain_only", age=65, interval_ms=20_000)  # stale
    await runtime(db, "queue_storage", age=35, interval_ms=500)  # stale: 500 ms counts as 1 s, window 30 s

    await queue_stats.run_once(ctx)

    found = gauges(metric_reader)
    assert found[STORAGE_STATE] == state_labels("canonical", "canonical", "canonical", None)
    assert found[STORAGE_TRANSITION_READY] == {"enter_mixed_transition": 0, "finalize": 0}
    assert found[STORAGE_CANONICAL_LIVE_BACKLOG] == [3]
    assert found[STORAGE_LIVE_RUNTIME_CAPABILITY] == {
        "canonical": 1,
        "canonical_drain_only": 0,
        "queue_storage": 1,
    }
    assert found[JOB_KIND_INFO] == []


async def test_prepared_is_ready_to_enter_mixed_only_with_a_live_queue_storage_target(
    db, meter_provider, metric_reader
):
    ctx = await make_context(db, meter_provider=meter_provider)
    assert await db.fetchval(PREPARE_SQL) == "prepared"
    prepared = state_labels("prepared", "canonical", "canonical", "queue_storage")

    # No runtime at all; then an auto runtime (queue_storage capable, not a target).
    await publish_info(ctx)
    found = gauges(metric_reader)
    assert found[STORAGE_STATE] == prepared
    assert found[STORAGE_TRANSITION_READY] == {"enter_mixed_transition": 0, "finalize": 0}
    await runtime(db, "queue_storage", "auto")
    await publish_info(ctx)
    assert gauges(metric_reader)[STORAGE_TRANSITION_READY]["enter_mixed_transition"] == 0
    # A target that stopped reporting does not count.
    stale_target = await runtime(db, "queue_storage", "queue_storage_target", age=120)
    await publish_info(ctx)
    assert gauges(metric_reader)[STORAGE_TRANSITION_READY]["enter_mixed_transition"] == 0

    # A live queue_storage_target: ready, as the SQL gate agrees below.
    await db.execute(
        "UPDATE awa.runtime_instances SET last_seen_at = now() WHERE instance_id = $1", stale_target
    )
    await queue_stats.run_once(ctx)
    found = gauges(metric_reader)
    assert found[STORAGE_TRANSITION_READY] == {"enter_mixed_transition": 1, "finalize": 0}
    assert found[STORAGE_LIVE_RUNTIME_CAPABILITY] == {
        "canonical": 0,
        "canonical_drain_only": 0,
        "queue_storage": 2,
    }

    # A live canonical-only runtime blocks it again.
    canonical = await runtime(db, "canonical")
    await publish_info(ctx)
    assert gauges(metric_reader)[STORAGE_TRANSITION_READY]["enter_mixed_transition"] == 0
    await db.execute("DELETE FROM awa.runtime_instances WHERE instance_id = $1", canonical)
    await publish_info(ctx)
    assert gauges(metric_reader)[STORAGE_TRANSITION_READY]["enter_mixed_transition"] == 1
    assert await db.fetchval(ENTER_MIXED_SQL) == "mixed_transition"


async def test_prepared_with_an_incomplete_schema_is_not_ready(db, meter_provider, metric_reader):
    ctx = await make_context(db, meter_provider=meter_provider)
    # A prepared schema that does not exist (nothing was installed there).
    await db.fetchval(
        "SELECT state FROM awa.storage_prepare('queue_storage', '{\"schema\": \"awa_gauges_none\"}')"
    )
    await runtime(db, "queue_storage", "queue_storage_target")
    snapshot = await publish_info(ctx)
    assert snapshot.state == "prepared" and not snapshot.enter_mixed_transition_ready
    assert gauges(metric_reader)[STORAGE_TRANSITION_READY]["enter_mixed_transition"] == 0


@pytest.mark.parametrize(
    "damage",
    [
        "ALTER TABLE awa.ready_segments RENAME TO ready_segments_gone",
        "ALTER TABLE awa.lease_claim_closure_batches DROP COLUMN receipt_ranges",
    ],
    ids=["a relation missing", "a column missing"],
)
async def test_prepared_schema_missing_one_piece_is_not_ready(db, meter_provider, metric_reader, damage):
    ctx = await make_context(db, meter_provider=meter_provider)
    assert await db.fetchval(PREPARE_SQL) == "prepared"
    await runtime(db, "queue_storage", "queue_storage_target")
    assert (await publish_info(ctx)).enter_mixed_transition_ready
    await db.execute(damage)
    snapshot = await publish_info(ctx)
    assert not snapshot.enter_mixed_transition_ready
    assert gauges(metric_reader)[STORAGE_TRANSITION_READY]["enter_mixed_transition"] == 0


async def test_mixed_transition_finalize_waits_for_the_backlog_and_blocking_runtimes(
    db, awa_client, meter_provider, metric_reader
):
    job = await in_thread(awa_client.insert, {}, kind="gauge_probe", queue="gq")
    assert await db.fetchval(PREPARE_SQL) == "prepared"
    target = await runtime(db, "queue_storage", "queue_storage_target")
    assert await db.fetchval(ENTER_MIXED_SQL) == "mixed_transition"
    ctx = await make_context(db, meter_provider=meter_provider)
    assert ctx.schema.in_mixed_transition
    mixed = state_labels("mixed_transition", "canonical", "queue_storage", "queue_storage")

    await qs_queue_stats.run_once(ctx)
    found = gauges(metric_reader)
    assert found[STORAGE_STATE] == mixed
    assert found[STORAGE_CANONICAL_LIVE_BACKLOG] == [1]
    assert found[STORAGE_TRANSITION_READY] == {"enter_mixed_transition": 0, "finalize": 0}

    # The canonical job finishes: the backlog is 0 and finalize is ready.
    await db.execute(
        "UPDATE awa.jobs_hot SET state = 'completed', attempt = 1, finalized_at = now() WHERE id = $1", job.id
    )
    await qs_queue_stats.run_once(ctx)
    found = gauges(metric_reader)
    assert found[STORAGE_CANONICAL_LIVE_BACKLOG] == [0]
    assert found[STORAGE_TRANSITION_READY] == {"enter_mixed_transition": 0, "finalize": 1}
    assert found[STORAGE_LIVE_RUNTIME_CAPABILITY] == {
        "canonical": 0,
        "canonical_drain_only": 0,
        "queue_storage": 1,
    }

    # A live drain-only runtime blocks finalize on schema 39 (Awa 0.6.1), not from 40.
    drain = await runtime(db, "canonical_drain_only", "canonical_drain")
    await publish_info(ctx)
    blocks = "canonical_drain_only" in queue_info.FINALIZE_BLOCKERS[ctx.schema.version]
    assert gauges(metric_reader)[STORAGE_TRANSITION_READY]["finalize"] == (0 if blocks else 1)
    await db.execute("DELETE FROM awa.runtime_instances WHERE instance_id = $1", drain)
    # A live canonical runtime blocks it on every schema.
    await runtime(db, "canonical")
    await publish_info(ctx)
    assert gauges(metric_reader)[STORAGE_TRANSITION_READY]["finalize"] == 0
    await db.execute("DELETE FROM awa.runtime_instances WHERE instance_id <> $1", target)
    await publish_info(ctx)
    assert gauges(metric_reader)[STORAGE_TRANSITION_READY]["finalize"] == 1
    # The SQL gate agrees.
    assert await db.fetchval("SELECT state FROM awa.storage_finalize()") == "active"


async def test_finalised_queue_storage_reads_no_canonical_table(qs_db, qs_ctx, metric_reader):
    # A canonical row that cannot exist after finalize: were the canonical
    # tables read, the backlog would say 1.
    await qs_db.execute(
        "INSERT INTO awa.jobs_hot (kind, queue, args, state, priority, max_attempts, run_at)"
        " VALUES ('gauge_probe', 'gq', '{}', 'available', 2, 25, now())"
    )
    status = await qs_db.fetchrow(
        "SELECT current_engine, active_engine, prepared_engine FROM awa.storage_status()"
    )
    await qs_queue_stats.run_once(qs_ctx)
    found = gauges(metric_reader)
    assert found[STORAGE_STATE] == state_labels(
        "active", status["current_engine"], status["active_engine"], status["prepared_engine"]
    )
    assert status["active_engine"] == "queue_storage"
    assert found[STORAGE_CANONICAL_LIVE_BACKLOG] == [0]
    assert found[STORAGE_TRANSITION_READY] == {"enter_mixed_transition": 0, "finalize": 0}
    assert found[STORAGE_LIVE_RUNTIME_CAPABILITY] == {
        "canonical": 0,
        "canonical_drain_only": 0,
        "queue_storage": 0,
    }
    assert not qs_ctx.metrics.info_snapshot().canonical_backlog_read


async def test_job_kind_info_reports_only_the_kinds_declared_now(db, meter_provider, metric_reader):
    ctx = await make_context(db, meter_provider=meter_provider)
    await db.execute(KIND_SQL, "send_email", "Send email", "growth", ["mail", "critical"])
    await db.execute(KIND_SQL, "bare_kind", None, None, [])
    await queue_stats.run_once(ctx)
    assert gauges(metric_reader)[JOB_KIND_INFO] == [
        {"awa.job.kind": "bare_kind"},
        {
            "awa.job.kind": "send_email",
            "awa.job_kind.display_name": "Send email",
            "awa.job_kind.owner": "growth",
            "awa.job_kind.tags": "mail,critical",
        },
    ]
    await db.execute("DELETE FROM awa.job_kind_descriptors WHERE kind = 'send_email'")
    await db.execute("UPDATE awa.job_kind_descriptors SET owner = 'ops' WHERE kind = 'bare_kind'")
    await queue_stats.run_once(ctx)
    assert gauges(metric_reader)[JOB_KIND_INFO] == [
        {"awa.job.kind": "bare_kind", "awa.job_kind.owner": "ops"}
    ]
    # A state change replaces the state series (no old label set left).
    await db.fetchval(PREPARE_SQL)
    await queue_stats.run_once(ctx)
    assert [labels["awa.storage.state"] for labels in gauges(metric_reader)[STORAGE_STATE]] == ["prepared"]


def test_the_snapshot_is_reported_only_in_the_term_that_read_it(meter_provider, metric_reader):
    metrics = MaintenanceMetrics(meter_provider)
    leadership = {"now": (False, None)}
    metrics.observe_leadership(lambda: leadership["now"])
    snapshot = InfoSnapshot(
        state="canonical",
        current_engine="canonical",
        active_engine="canonical",
        prepared_engine=None,
        canonical_live_backlog=0,
        canonical_backlog_read=True,
        enter_mixed_transition_ready=False,
        finalize_ready=False,
        live_runtime_capability={"canonical": 0},
        job_kinds=({"awa.job.kind": "k"},),
    )
    metrics.set_info_snapshot(snapshot)  # read by a follower (lock lost meanwhile): dropped
    assert nothing(metric_reader)
    leadership["now"] = (True, 100.0)
    assert nothing(metric_reader)
    metrics.set_info_snapshot(snapshot)
    assert gauges(metric_reader)[STORAGE_CANONICAL_LIVE_BACKLOG] == [0]
    assert gauges(metric_reader)[JOB_KIND_INFO] == [{"awa.job.kind": "k"}]
    leadership["now"] = (False, 100.0)
    assert nothing(metric_reader)
    leadership["now"] = (True, 200.0)  # a later term: the old snapshot is not its own
    assert nothing(metric_reader)
    metrics.set_info_snapshot(dataclasses.replace(snapshot, canonical_live_backlog=4))
    assert gauges(metric_reader)[STORAGE_CANONICAL_LIVE_BACKLOG] == [4]
    metrics.clear_info_snapshot()
    assert nothing(metric_reader)


async def lead_and_stop(url: str, reader, expected_state: str) -> None:
    config = MaintenanceConfig(
        leader_election_interval=0.2, leader_check_interval=0.5, queue_stats_interval=0.2
    )
    service = MaintenanceService(url, config, meter_provider=reader.meter_provider)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(service.run)
            await service.wait_until_leader()
            while not metric_points(reader.reader, STORAGE_STATE):
                await trio.sleep(0.05)
            found = gauges(reader.reader)
            assert [labels["awa.storage.state"] for labels in found[STORAGE_STATE]] == [expected_state]
            assert set(found[STORAGE_TRANSITION_READY]) == {"enter_mixed_transition", "finalize"}
            service.stop()
    assert not service.is_leader
    assert nothing(reader.reader)


@dataclasses.dataclass
class Reader:
    meter_provider: object
    reader: object


async def test_a_canonical_leader_reports_while_it_leads_and_nothing_after(
    database_url, meter_provider, metric_reader
):
    await lead_and_stop(database_url, Reader(meter_provider, metric_reader), "canonical")


async def test_a_queue_storage_leader_reports_while_it_leads_and_nothing_after(
    qs_database_url, meter_provider, metric_reader
):
    await lead_and_stop(qs_database_url, Reader(meter_provider, metric_reader), "active")
