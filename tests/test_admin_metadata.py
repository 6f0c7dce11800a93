"""recompute_dirty_admin_metadata and refresh_admin_metadata on a real awa schema (39 or 40)."""

from __future__ import annotations

from conftest import in_thread
from support.contexts import make_context
from support.helpers import dirty_admin_keys

from awa_trio.engines.canonical import admin_metadata


async def insert_jobs(awa_client, kind: str, queue: str, count: int) -> list[int]:
    return [
        (await in_thread(awa_client.insert, {"i": i}, kind=kind, queue=queue)).id
        for i in range(count)
    ]


async def queue_counts(db) -> dict[str, tuple[int, int, int]]:
    rows = await db.fetch(
        "SELECT queue, available, running, completed FROM awa.queue_state_counts ORDER BY queue"
    )
    return {r["queue"]: (r["available"], r["running"], r["completed"]) for r in rows}


async def kind_counts(db) -> dict[str, int]:
    rows = await db.fetch("SELECT kind, ref_count FROM awa.job_kind_catalog")
    return {r["kind"]: r["ref_count"] for r in rows}


dirty_keys = dirty_admin_keys


async def test_recompute_drains_dirty_keys_into_the_cache(db, awa_client):
    ctx = await make_context(db)
    qa_jobs = await insert_jobs(awa_client, "echo", "qa", 3)
    await insert_jobs(awa_client, "other", "qb", 1)
    assert await dirty_keys(db) == ({"qa", "qb"}, {"echo", "other"})
    assert await queue_counts(db) == {}

    result = await admin_metadata.run_recompute_dirty(ctx)

    assert result == admin_metadata.RecomputeDirtyResult(keys_recomputed=4)
    assert await dirty_keys(db) == (set(), set())
    assert await queue_counts(db) == {"qa": (3, 0, 0), "qb": (1, 0, 0)}
    assert await kind_counts(db) == {"echo": 3, "other": 1}
    assert (await admin_metadata.run_recompute_dirty(ctx)).keys_recomputed == 0

    # A state change marks its queue dirty again; the next pass picks it up.
    await db.execute(
        "UPDATE awa.jobs_hot SET state = 'running', attempt = 1, heartbeat_at = now()"
        " WHERE id = $1",
        qa_jobs[0],
    )
    await db.execute(
        "UPDATE awa.jobs_hot SET state = 'completed', attempt = 1, finalized_at = now()"
        " WHERE id = $1",
        qa_jobs[1],
    )
    assert (await admin_metadata.run_recompute_dirty(ctx)).keys_recomputed == 1
    assert await queue_counts(db) == {"qa": (1, 1, 1), "qb": (1, 0, 0)}


async def test_refresh_rebuilds_a_drifted_cache_from_the_job_tables(db, awa_client):
    ctx = await make_context(db)
    await insert_jobs(awa_client, "echo", "qa", 2)
    await admin_metadata.run_recompute_dirty(ctx)
    # Drift that no dirty key will ever repair.
    await db.execute("UPDATE awa.queue_state_counts SET available = 999 WHERE queue = 'qa'")
    await db.execute("UPDATE awa.job_kind_catalog SET ref_count = 999 WHERE kind = 'echo'")
    assert (await admin_metadata.run_recompute_dirty(ctx)).keys_recomputed == 0
    assert await queue_counts(db) == {"qa": (999, 0, 0)}

    await admin_metadata.run_refresh(ctx)

    assert await queue_counts(db) == {"qa": (2, 0, 0)}
    assert await kind_counts(db) == {"echo": 2}
