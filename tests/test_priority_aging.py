"""priority_aging on a real awa 0.6.1 schema."""

from __future__ import annotations

import datetime as dt

import trio
from conftest import in_thread
from support.contexts import make_context

from awa_trio.engines.canonical import priority_aging

ORIGINAL = "_awa_original_priority"


async def insert_available(awa_client, db, *, priority: int, waited_seconds: float,
                           metadata: dict | None = None) -> int:
    """An awa-pg job, available since ``waited_seconds`` ago."""
    job = await in_thread(
        awa_client.insert, {"n": 1}, kind="aging_probe", queue="default",
        priority=priority, metadata=metadata,
    )
    await db.execute(
        "UPDATE awa.jobs_hot SET run_at = now() - make_interval(secs => $2) WHERE id = $1",
        job.id, waited_seconds,
    )
    return job.id


async def priority_and_metadata(db, job_id: int) -> tuple[int, dict]:
    row = await db.fetchrow("SELECT priority, metadata FROM awa.jobs WHERE id = $1", job_id)
    return row["priority"], row["metadata"]


async def test_waiting_jobs_move_up_one_level_per_pass_keeping_the_first_original(db, awa_client):
    ctx = await make_context(db, priority_aging_interval="60s")
    aged = await insert_available(awa_client, db, priority=3, waited_seconds=120)
    already_stamped = await insert_available(
        awa_client, db, priority=2, waited_seconds=120, metadata={ORIGINAL: 4, "owner": "x"}
    )
    top = await insert_available(awa_client, db, priority=1, waited_seconds=3600)
    fresh = await insert_available(awa_client, db, priority=4, waited_seconds=30)
    running = await insert_available(awa_client, db, priority=3, waited_seconds=3600)
    await db.execute(
        "UPDATE awa.jobs_hot SET state = 'running', attempt = 1, heartbeat_at = now()"
        " WHERE id = $1",
        running,
    )
    future = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    scheduled = (
        await in_thread(awa_client.insert, {"n": 1}, kind="aging_probe", priority=4, run_at=future)
    ).id

    first = await priority_aging.run_once(ctx)
    assert first.aged == 2
    assert first.queues == {"default"}
    assert await priority_and_metadata(db, aged) == (2, {ORIGINAL: 3})
    assert await priority_and_metadata(db, already_stamped) == (1, {ORIGINAL: 4, "owner": "x"})

    second = await priority_aging.run_once(ctx)
    assert second.aged == 1
    # The second aging keeps the value recorded by the first.
    assert await priority_and_metadata(db, aged) == (1, {ORIGINAL: 3})

    third = await priority_aging.run_once(ctx)
    assert third.aged == 0
    assert await priority_and_metadata(db, aged) == (1, {ORIGINAL: 3})

    # Already at the top, not waiting long enough, not available: untouched.
    assert await priority_and_metadata(db, top) == (1, {})
    assert await priority_and_metadata(db, fresh) == (4, {})
    assert await priority_and_metadata(db, running) == (3, {})
    assert await priority_and_metadata(db, scheduled) == (4, {})


async def test_with_its_budget_spent_a_pass_ages_one_batch_per_level(db):
    await db.execute(
        """
        INSERT INTO awa.jobs_hot (kind, queue, priority, run_at)
        SELECT 'aging_probe', 'bulk', 4, now() - interval '10 minutes'
        FROM generate_series(1, 1001)
        """
    )

    result = await priority_aging.run_once(await make_context(db, drain_time_budget="0.001ms"))

    assert result.aged == 1000 and not result.drained
    rows = await db.fetch(
        "SELECT priority, metadata->'_awa_original_priority' AS original, count(*) AS n"
        " FROM awa.jobs_hot GROUP BY 1, 2 ORDER BY 1"
    )
    assert [(r["priority"], r["original"], r["n"]) for r in rows] == [(3, 4, 1000), (4, None, 1)]


async def test_a_job_locked_by_another_transaction_is_skipped_not_waited_for(db, awa_client):
    ctx = await make_context(db)
    locked = await insert_available(awa_client, db, priority=3, waited_seconds=600)
    free = await insert_available(awa_client, db, priority=3, waited_seconds=600)

    async with db.transaction() as conn:
        await conn.execute("SELECT 1 FROM awa.jobs_hot WHERE id = $1 FOR UPDATE", locked)
        with trio.fail_after(10):
            result = await priority_aging.run_once(ctx)

    assert result.aged == 1
    assert await priority_and_metadata(db, locked) == (3, {})
    assert await priority_and_metadata(db, free) == (2, {ORIGINAL: 3})
