"""``awa:cancel`` notices: every attempt a rescue takes away from its worker
gets ``{"job_id": <id>, "run_lease": <lease>}`` on the channel every Awa
runtime listens on, committed with the rescue.

At the SQL level, a listening connection receives exactly the payloads of
the rescued attempts (ids and leases compared with the rows), on both
engines, through the batch and the row-by-row paths, and nothing when the
rescue's transaction rolls back. With a real awa-pg 0.6.1 worker, awa_trio
leading: a handler that ignores its hard deadline is cancelled on its
worker, and attempt 2 starts only after attempt 1's handler has returned.
"""

from __future__ import annotations

import dataclasses
import json
from contextlib import asynccontextmanager
from datetime import datetime

import trio
from conftest import in_thread
from support.awa_pg import awa_pg_worker
from support.contexts import make_context as make_qs_context
from support.helpers import leader_lock_holders
from support.qs_rescue import age_claims, claim, insert_jobs, states
from test_rescue import db_now, insert_running, insert_waiting, job_snapshot, make_context
from test_rescue_fallback import MASK_WITHOUT_RUNNING, superseded_pair

from awa_trio.config import MaintenanceConfig
from awa_trio.engines.canonical import canonical_drain, rescue_callbacks, rescue_heartbeats
from awa_trio.engines.queue_storage import rescue_heartbeats as qs_rescue_heartbeats
from awa_trio.schema import STATE_MIXED_TRANSITION
from awa_trio.service import MaintenanceService

#: Upstream's channel (awa-worker cancel_listener.rs), written out: the contract.
CANCEL_CHANNEL = "awa:cancel"
STALENESS = 60.0
SENTINEL = "sentinel"


class Listener:
    """A connection LISTENing on ``awa:cancel``: the payloads it received."""

    def __init__(self, db):
        self.db = db
        self.payloads: list[str] = []
        self._arrived = trio.Event()

    def _on_payload(self, payload: str) -> None:
        self.payloads.append(payload)
        self._arrived.set()
        self._arrived = trio.Event()

    async def drain(self) -> list[tuple[int, int]]:
        """Everything committed before now: a sentinel notice is sent and
        awaited (notices arrive in commit order). Returns the (job_id,
        run_lease) pairs received since the last drain, in order."""
        await self.db.execute("SELECT pg_notify($1, $2)", CANCEL_CHANNEL, SENTINEL)
        with trio.fail_after(10):
            while SENTINEL not in self.payloads:
                await self._arrived.wait()
        received, self.payloads = self.payloads[: self.payloads.index(SENTINEL)], []
        pairs = []
        for payload in received:
            notice = json.loads(payload)
            # The listener deserialises both as i64: JSON numbers, nothing else.
            assert set(notice) == {"job_id", "run_lease"}, payload
            assert all(type(value) is int for value in notice.values()), payload
            pairs.append((notice["job_id"], notice["run_lease"]))
        return pairs


@asynccontextmanager
async def listening(db):
    conn = await db.connect_dedicated()
    try:
        listener = Listener(db)
        await conn.listen(CANCEL_CHANNEL, listener._on_payload)
        yield listener
    finally:
        await conn.close()


# -- SQL level: canonical engine --------------------------------------------


async def test_a_canonical_heartbeat_rescue_notifies_exactly_the_rescued_attempts(db):
    ctx = await make_context(db)
    now = await db_now(db)
    stale = [await insert_running(db, now, run_lease=lease, attempt=attempt)
             for lease, attempt in ((1, 1), (4, 2), (9, 3))]
    fresh = await insert_running(db, now, heartbeat_at=now, run_lease=5)
    # Waiting for a callback (its callback is stale too): not this branch's.
    waiting = await insert_waiting(db, now, run_lease=2)

    async with listening(db) as listener:
        result = await rescue_heartbeats.run_once(ctx)
        received = await listener.drain()

    assert sorted(j.id for j in result.rescued) == sorted(stale)
    rows = {job_id: await job_snapshot(db, job_id) for job_id in [*stale, fresh, waiting]}
    assert sorted(received) == sorted((job_id, rows[job_id]["run_lease"]) for job_id in stale)
    assert sorted(received) == sorted(zip(stale, (1, 4, 9), strict=True))
    assert all(rows[job_id]["state"] == "retryable" for job_id in stale)
    assert rows[fresh]["state"] == "running" and rows[waiting]["state"] == "waiting_external"
    assert result.cancel_notices == 3


async def test_the_row_by_row_fallback_notifies_its_rescues_and_its_duplicate_cancellation(
    db, awa_client
):
    """A unique-claim conflict sends the batch row by row: the innocent row's
    rescue and the superseded duplicate's cancellation each notify, in their
    own transactions."""
    ctx = await make_context(db, MaintenanceConfig(heartbeat_staleness=STALENESS))
    now = await db_now(db)
    innocent = await insert_running(db, now, run_lease=3)
    first, newer = await superseded_pair(db, awa_client, 1, MASK_WITHOUT_RUNNING)

    async with listening(db) as listener:
        result = await rescue_heartbeats.run_once(ctx)
        received = await listener.drain()

    assert result.row_by_row
    assert [j.id for j in result.duplicates_cancelled] == [first]
    assert [j.id for j in result.rescued] == [innocent]
    assert (await job_snapshot(db, first))["state"] == "cancelled"
    assert sorted(received) == sorted([(innocent, 3), (first, 1)])
    assert newer not in {job_id for job_id, _ in received}


async def test_a_callback_timeout_rescue_sends_no_notice(db):
    ctx = await make_context(db)
    now = await db_now(db)
    expired = await insert_waiting(db, now, run_lease=4)

    async with listening(db) as listener:
        result = await rescue_callbacks.run_once(ctx)
        received = await listener.drain()

    assert [j.id for j in result.rescued] == [expired]
    assert received == []


FAIL_AT_COMMIT_SQL = """
    CREATE FUNCTION public.refuse_commit() RETURNS trigger LANGUAGE plpgsql AS
    $$ BEGIN RAISE EXCEPTION 'refused at commit'; END $$;
    CREATE CONSTRAINT TRIGGER refuse_commit AFTER INSERT ON awa.scheduled_jobs
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION public.refuse_commit();
"""


async def test_a_rescue_that_rolls_back_sends_nothing_and_its_retry_sends_all(db):
    """A deferred trigger fails the rescue's COMMIT, after its notices were
    queued: the rows stay running and no notice arrives; once the trigger is
    gone, the next pass rescues them and every notice arrives."""
    ctx = await make_context(db)
    now = await db_now(db)
    stale = [await insert_running(db, now, run_lease=lease) for lease in (2, 6)]
    await db.execute(FAIL_AT_COMMIT_SQL)

    async with listening(db) as listener:
        try:
            await rescue_heartbeats.run_once(ctx)
        except Exception as exc:  # the branch runner logs it and goes on
            assert "refused at commit" in str(exc)
        assert await listener.drain() == []
        for job_id in stale:
            assert (await job_snapshot(db, job_id))["state"] == "running"

        await db.execute("DROP TRIGGER refuse_commit ON awa.scheduled_jobs")
        result = await rescue_heartbeats.run_once(ctx)
        assert sorted(await listener.drain()) == sorted(zip(stale, (2, 6), strict=True))
    assert sorted(j.id for j in result.rescued) == sorted(stale)


# -- SQL level: queue storage ------------------------------------------------


async def open_claims(db, job_ids: list[int]) -> list[tuple[int, int]]:
    """(job_id, run_lease) of the claims of these jobs: row claims and compact items."""
    records = await db.fetch(
        """
        SELECT job_id, run_lease FROM awa.lease_claims WHERE job_id = ANY($1::bigint[])
        UNION ALL
        SELECT items.job_id, items.run_lease
        FROM awa.lease_claim_batches AS batches
        CROSS JOIN LATERAL unnest(batches.job_ids, batches.run_leases) AS items(job_id, run_lease)
        WHERE items.job_id = ANY($1::bigint[])
        """,
        job_ids,
    )
    return sorted((record["job_id"], record["run_lease"]) for record in records)


async def test_a_queue_storage_heartbeat_rescue_notifies_exactly_the_rescued_attempts(
    qs_db, meter_provider
):
    """Row claims (a deadline) and compact claim items (none), a unique
    duplicate cancelled in the same statement, a fresh claim left alone."""
    ctx = await make_qs_context(qs_db, meter_provider=meter_provider,
                                heartbeat_staleness=STALENESS)
    row_claimed = await insert_jobs(qs_db, 2, queue="with_deadline")
    await claim(qs_db, "with_deadline", 2, deadline=300)
    compact = await insert_jobs(qs_db, 3, queue="compact")
    await claim(qs_db, "compact", 3, deadline=0)
    key = b"account:7"
    [conflicted] = await insert_jobs(qs_db, 1, queue="uq", unique_key=key,
                                     unique_states="00001000")
    await claim(qs_db, "uq", 1, deadline=0)
    [newer] = await insert_jobs(qs_db, 1, queue="uq_newer", unique_key=key,
                                unique_states="01001000")
    taken = row_claimed + compact + [conflicted]
    attempts = await open_claims(qs_db, taken)
    assert len(attempts) == len(taken)
    await age_claims(qs_db, STALENESS * 2)
    [fresh] = await insert_jobs(qs_db, 1, queue="fresh")
    await claim(qs_db, "fresh", 1, deadline=300)

    async with listening(qs_db) as listener:
        result = await qs_rescue_heartbeats.run_once(ctx)
        received = await listener.drain()

    assert [j.id for j in result.duplicates_cancelled] == [conflicted]
    assert sorted(j.id for j in result.rescued) == sorted(row_claimed + compact)
    assert sorted(received) == attempts
    assert sorted((j.id, j.run_lease) for j in result.rescued + result.duplicates_cancelled) == attempts
    assert (await states(qs_db, [conflicted, newer, fresh]))[conflicted] == "cancelled"
    assert fresh not in {job_id for job_id, _ in received}
    assert result.cancel_notices == len(taken)


# -- a real awa-pg worker, awa_trio leading -----------------------------------

KIND = "cancel_probe"
QUEUE = "cancel_probe"
DEADLINE_MS = 1000
CONFIG = MaintenanceConfig(
    deadline_rescue_interval=0.5,
    promote_interval=0.25,
    leader_election_interval=0.5,
)


def ledger(worker, job_id: int) -> dict[int, tuple[float, float]]:
    """attempt -> (start, end) of each handler run of ``job_id`` (RAN lines)."""
    runs = {}
    for line in worker.lines:
        words = line.split()
        if words[0] == "RAN" and int(words[1]) == job_id:
            runs[int(words[2])] = (float(words[4]), float(words[5]))
    return runs


JOB_STATE_SQL = "SELECT state::text FROM awa.jobs WHERE id = $1"


async def deadline_cancels_the_running_handler(dsn, db, client, deadline_sql, role):
    """awa_trio leads; the worker's handler loops until it is cancelled; the
    job's hard deadline passes; awa_trio's deadline rescue must reach it."""
    service = MaintenanceService(dsn, CONFIG)
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        with trio.fail_after(120):
            await service.wait_until_leader()
            async with awa_pg_worker(
                dsn, f"{KIND}:{QUEUE}", behaviour="until-cancelled-first",
                extra_args=["--role", role, "--mute-maintenance",
                            "--deadline-ms", str(DEADLINE_MS)],
            ) as worker:
                job = await in_thread(client.insert, {"n": 1}, kind=KIND, queue=QUEUE)
                await worker.wait_for_line(f"START {job.id} 1 ")
                deadline_at: datetime = await db.fetchval(deadline_sql, job.id)
                cancelled_line = await worker.wait_for_line(f"CANCELLED {job.id} 1 ", timeout=30)
                await worker.wait_for_line(f"DONE {job.id} 2 ", timeout=60)
                await worker.wait_for_line(f"RAN {job.id} 2 ")
                # (The worker flushes completions in batches: wait before it stops.)
                while await db.fetchval(JOB_STATE_SQL, job.id) != "completed":
                    await trio.sleep(0.05)
                assert await leader_lock_holders(db) == [service.lock_backend_pid]
                runs = ledger(worker, job.id)
        service.stop()

    seen_at = float(cancelled_line.split()[-1])
    # The notice is what stopped it: within one rescue interval (+1 s) of the deadline.
    assert seen_at - deadline_at.timestamp() <= CONFIG.deadline_rescue_interval + 1.0
    assert sorted(runs) == [1, 2]
    (start_1, end_1), (start_2, _end_2) = runs[1], runs[2]
    assert start_1 <= seen_at
    assert end_1 >= seen_at
    # Never two executions at once: attempt 2 starts after attempt 1 returned.
    assert start_2 >= end_1, (runs, worker.lines)
    return job.id, seen_at


async def test_a_handler_past_its_deadline_is_cancelled_on_its_worker(database_url, db, awa_client):
    job_id, seen_at = await deadline_cancels_the_running_handler(
        database_url, db, awa_client,
        "SELECT deadline_at FROM awa.jobs_hot WHERE id = $1 AND state = 'running'",
        role="canonical_drain",
    )
    final = await job_snapshot(db, job_id)
    assert final["state"] == "completed"
    assert final["attempt"] == 2 and final["run_lease"] == 2
    [entry] = final["errors"]
    assert (entry["error"], entry["attempt"]) == ("hard deadline exceeded", 1)
    # The rescue committed before the handler saw the cancel.
    assert datetime.fromisoformat(entry["at"]).timestamp() <= seen_at


async def test_a_queue_storage_handler_past_its_deadline_is_cancelled_on_its_worker(
    qs_database_url, qs_db, qs_awa_client
):
    job_id, seen_at = await deadline_cancels_the_running_handler(
        qs_database_url, qs_db, qs_awa_client,
        "SELECT deadline_at FROM awa.lease_claims WHERE job_id = $1",
        role="auto",
    )
    row = await qs_db.fetchrow(
        "SELECT state::text AS state, attempt, errors FROM awa.jobs WHERE id = $1", job_id)
    assert row["state"] == "completed"
    assert row["attempt"] == 2
    [entry] = json.loads(row["errors"]) if isinstance(row["errors"], str) else row["errors"]
    assert (entry["error"], entry["attempt"]) == ("hard deadline exceeded", 1)
    assert datetime.fromisoformat(entry["at"]).timestamp() <= seen_at


async def test_during_a_transition_no_notice_names_an_attempt_of_the_other_plane(
    qs_db, meter_provider
):
    """The two planes' ids overlap and a notice names no engine: a rescue on
    either plane sends none for a (job_id, run_lease) that a live attempt of
    the other plane also has, and the others as usual."""
    ctx = await make_qs_context(qs_db, meter_provider=meter_provider,
                                heartbeat_staleness=STALENESS)
    # Both planes hold live attempts only in a mixed transition, the state
    # the queue-storage rescue reads to decide whether to look at the other.
    ctx = dataclasses.replace(ctx, schema=dataclasses.replace(ctx.schema, state=STATE_MIXED_TRANSITION))
    qs_ids = await insert_jobs(qs_db, 3, queue="mixed")
    await claim(qs_db, "mixed", 3, deadline=0)
    [(shared_id, shared_lease), (qs_alone, qs_lease), (claimed_too, claimed_lease)] = (
        await open_claims(qs_db, qs_ids))
    await age_claims(qs_db, STALENESS * 2)
    now = await db_now(qs_db)
    # Canonical rows of the drain: one with a queue-storage attempt's very id
    # and lease (fresh: its worker lives), one stale twin of another attempt,
    # one stale with an id no queue-storage job has.
    await insert_running(qs_db, now, id=shared_id, run_lease=shared_lease, heartbeat_at=now)
    await insert_running(qs_db, now, id=claimed_too, run_lease=claimed_lease)
    canonical_alone = await insert_running(qs_db, now, id=max(qs_ids) + 100, run_lease=1)

    async with listening(qs_db) as listener:
        canonical = await canonical_drain.rescue_stale_heartbeats(ctx)
        from_canonical = await listener.drain()
        queue_storage = await qs_rescue_heartbeats.run_once(ctx)
        from_queue_storage = await listener.drain()

    assert sorted(j.id for j in canonical.rescued) == sorted([claimed_too, canonical_alone])
    # The canonical twin's notice would cancel queue-storage attempt (claimed_too, lease).
    assert from_canonical == [(canonical_alone, 1)]
    assert sorted(j.id for j in queue_storage.rescued) == sorted(qs_ids)
    # shared_id's canonical row is still running with that lease: no notice for it.
    assert sorted(from_queue_storage) == sorted([(qs_alone, qs_lease), (claimed_too, claimed_lease)])


async def test_the_queue_storage_row_by_row_fallback_notifies_each_committed_row(
    qs_db, meter_provider
):
    """A stray deferred row fails the whole batch (its notices roll back with
    it); redone row by row, each rescue and the poisoned row's cancellation
    notify once, from their own savepoints."""
    ctx = await make_qs_context(qs_db, meter_provider=meter_provider,
                                heartbeat_staleness=STALENESS)
    ids = await insert_jobs(qs_db, 3, queue="poison")
    await claim(qs_db, "poison", 3, deadline=300)
    attempts = await open_claims(qs_db, ids)
    await age_claims(qs_db, STALENESS * 2)
    await qs_db.execute(
        "INSERT INTO awa.deferred_jobs (job_id, kind, queue, state, priority, run_at, run_lease) "
        "VALUES ($1, 'stray', 'stray', 'scheduled', 2, now() + interval '1 hour', 99)", ids[1])

    async with listening(qs_db) as listener:
        result = await qs_rescue_heartbeats.run_once(ctx)
        received = await listener.drain()

    assert result.row_by_row_batches == 1
    assert [j.id for j in result.duplicates_cancelled] == [ids[1]]
    assert sorted(received) == attempts
    assert len(received) == len(set(received))


async def test_a_duplicate_cancelled_at_its_deadline_is_cancelled_on_its_worker(
    database_url, db, awa_client
):
    """Attempt 1 runs past its deadline while a newer duplicate (parked in a
    queue no worker serves) holds the unique claim it would re-enter: the
    deadline rescue cancels it as a superseded duplicate (#388 fallback),
    and that cancellation reaches the handler too. It never runs again."""
    unique = {"by_args": True, "by_queue": False, "states": MASK_WITHOUT_RUNNING}
    service = MaintenanceService(database_url, CONFIG)
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        with trio.fail_after(120):
            await service.wait_until_leader()
            async with awa_pg_worker(
                database_url, f"{KIND}:{QUEUE}", behaviour="until-cancelled-first",
                extra_args=["--mute-maintenance", "--deadline-ms", str(DEADLINE_MS)],
            ) as worker:
                first = await in_thread(awa_client.insert, {"n": 1}, kind=KIND, queue=QUEUE,
                                        unique_opts=unique)
                await worker.wait_for_line(f"START {first.id} 1 ")
                deadline_at = await db.fetchval(
                    "SELECT deadline_at FROM awa.jobs_hot WHERE id = $1", first.id)
                newer = await in_thread(awa_client.insert, {"n": 1}, kind=KIND, queue="parked",
                                        unique_opts=unique)
                cancelled_line = await worker.wait_for_line(f"CANCELLED {first.id} 1 ", timeout=30)
                await worker.wait_for_line(f"RAN {first.id} 1 ")
                await trio.sleep(4 * CONFIG.promote_interval)
                lines = list(worker.lines)
        service.stop()

    seen_at = float(cancelled_line.split()[-1])
    assert seen_at - deadline_at.timestamp() <= CONFIG.deadline_rescue_interval + 1.0
    row = await job_snapshot(db, first.id)
    assert row["state"] == "cancelled"
    assert row["errors"][-1]["error"].startswith("rescued as duplicate")
    assert (await job_snapshot(db, newer.id))["state"] == "available"
    assert not any(line.startswith(f"START {first.id} 2") for line in lines)
