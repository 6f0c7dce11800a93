"""Arrange and inspect running attempts on a queue-storage test database.

Jobs are inserted with ``awa.insert_job_compat`` (Awa's own engine-routing
producer, what SQL producers and cron use) and claimed with
``awa.claim_ready_runtime`` (the claim function awa-pg's runtime calls), so
attempts sit exactly where a real worker's would: a row claim in
``lease_claims`` when the queue has a deadline, an item of a compact
``lease_claim_batches`` row when it has none.
"""

from __future__ import annotations

from typing import Any

INSERT_JOBS_SQL = """
    SELECT array_agg(id ORDER BY id)
    FROM generate_series(1, $1::int) AS n
    CROSS JOIN LATERAL awa.insert_job_compat(
        p_kind => $2,
        p_queue => $3,
        p_args => jsonb_build_object('n', n),
        p_state => 'available',
        p_priority => 2::smallint,
        p_max_attempts => $4::smallint,
        p_run_at => NULL,
        p_metadata => '{}'::jsonb,
        p_tags => '{}'::text[],
        p_unique_key => $5::bytea,
        p_unique_states => $6::text::bit(8),
        p_ordering_key => NULL
    ) AS job
"""

# Claim, then advance the lane's claim cursor past what was claimed, as the
# runtime does after every claim (advance_claim_cursors).
CLAIM_SQL = """
    WITH claimed AS MATERIALIZED (
        SELECT job_id, run_lease, claim_slot, receipt_id, claim_batch_id,
               queue, lane_priority, enqueue_shard, lane_seq
        FROM awa.claim_ready_runtime($1, $2, $3, 0)
    ),
    advanced AS (
        SELECT awa.set_sequence_next(heads.seq_name, max(claimed.lane_seq) + 1)
        FROM claimed
        JOIN awa.queue_claim_heads AS heads
          ON heads.queue = claimed.queue
         AND heads.priority = claimed.lane_priority
         AND heads.enqueue_shard = claimed.enqueue_shard
        GROUP BY heads.seq_name
    )
    SELECT job_id, run_lease, claim_slot, receipt_id, claim_batch_id,
           (SELECT count(*) FROM advanced) AS lanes_advanced
    FROM claimed
"""

JOB_SQL = """
    SELECT id, state::text AS state, attempt, max_attempts, run_at, errors, run_lease
    FROM awa.jobs
    WHERE id = $1
"""

# Every attempt still open: claimed, with no closure evidence and no successor row.
OPEN_ATTEMPTS_SQL = """
    WITH attempts AS (
        SELECT claim_slot, job_id, run_lease, receipt_id FROM awa.lease_claims
        UNION ALL
        SELECT batches.claim_slot, items.job_id, items.run_lease, items.receipt_id
        FROM awa.lease_claim_batches AS batches
        CROSS JOIN LATERAL unnest(batches.job_ids, batches.run_leases, batches.receipt_ids)
            AS items(job_id, run_lease, receipt_id)
    )
    SELECT array_agg(attempts.job_id ORDER BY attempts.job_id)
    FROM attempts
    WHERE NOT EXISTS (
            SELECT 1 FROM awa.lease_claim_closures AS c
            WHERE c.claim_slot = attempts.claim_slot AND c.job_id = attempts.job_id
              AND c.run_lease = attempts.run_lease)
      AND NOT EXISTS (
            SELECT 1 FROM awa.lease_claim_closure_batches AS b
            WHERE b.claim_slot = attempts.claim_slot AND b.receipt_ranges @> attempts.receipt_id)
      AND ($1::bigint[] IS NULL OR attempts.job_id = ANY($1::bigint[]))
"""


async def insert_jobs(
    db,
    count: int,
    *,
    kind: str = "rescue_probe",
    queue: str = "qs_rescue",
    max_attempts: int = 25,
    unique_key: bytes | None = None,
    unique_states: str | None = None,
) -> list[int]:
    ids = await db.fetchval(
        INSERT_JOBS_SQL, count, kind, queue, max_attempts, unique_key, unique_states
    )
    return list(ids)


async def claim(db, queue: str, count: int, *, deadline: float = 300.0) -> list[Any]:
    """Claim ``count`` jobs of ``queue`` (``deadline`` 0: compact claims)."""
    claimed: list[Any] = []
    for _ in range(count + 20):
        if len(claimed) >= count:
            break
        claimed += await db.fetch(CLAIM_SQL, queue, count - len(claimed), deadline)
    assert len(claimed) == count, f"claimed {len(claimed)} of {count}"
    return claimed


async def age_claims(db, seconds: float) -> None:
    """Pretend every claim (and heartbeat) happened ``seconds`` earlier."""
    shift = "make_interval(secs => $1)"
    await db.execute(f"UPDATE awa.lease_claims SET claimed_at = claimed_at - {shift}", seconds)
    await db.execute(
        f"UPDATE awa.lease_claim_batches SET claimed_at = claimed_at - {shift}", seconds)
    await db.execute(
        f"UPDATE awa.attempt_state SET heartbeat_at = heartbeat_at - {shift}", seconds)


async def expire_deadlines(db, job_ids: list[int]) -> None:
    await db.execute(
        "UPDATE awa.lease_claims SET deadline_at = clock_timestamp() - interval '1 second' "
        "WHERE job_id = ANY($1::bigint[])", job_ids)


async def job(db, job_id: int):
    return await db.fetchrow(JOB_SQL, job_id)


async def states(db, job_ids: list[int]) -> dict[int, str]:
    rows = await db.fetch(
        "SELECT id, state::text AS state FROM awa.jobs WHERE id = ANY($1::bigint[])", job_ids)
    return {row["id"]: row["state"] for row in rows}


async def open_attempts(db, job_ids: list[int] | None = None) -> list[int]:
    return list(await db.fetchval(OPEN_ATTEMPTS_SQL, job_ids) or [])


async def deferred_retryable(db, job_ids: list[int] | None = None) -> list[int]:
    ids = await db.fetchval(
        "SELECT array_agg(job_id ORDER BY job_id) FROM awa.deferred_jobs "
        "WHERE state = 'retryable' AND ($1::bigint[] IS NULL OR job_id = ANY($1::bigint[]))",
        job_ids)
    return list(ids or [])


# What a worker does when an attempt needs mutable state (upstream's
# ensure_running_leases_from_receipts): a `leases` row in the current lease
# slot, and the claim marked materialised.
MATERIALISE_SQL = """
    WITH ring AS (
        SELECT current_slot, generation FROM awa.lease_ring_state WHERE singleton
    ),
    claims AS (
        UPDATE awa.lease_claims AS claims
        SET materialized_at = clock_timestamp()
        WHERE job_id = ANY($1::bigint[])
        RETURNING claims.*
    )
    INSERT INTO awa.leases (
        lease_slot, lease_generation, ready_slot, ready_generation, job_id, queue, state,
        priority, attempt, run_lease, max_attempts, lane_seq, enqueue_shard, heartbeat_at,
        deadline_at, attempted_at
    )
    SELECT ring.current_slot, ring.generation, claims.ready_slot, claims.ready_generation,
           claims.job_id, claims.queue, 'running', claims.priority, claims.attempt,
           claims.run_lease, claims.max_attempts, claims.lane_seq, claims.enqueue_shard,
           clock_timestamp() - make_interval(secs => $2), claims.deadline_at, claims.claimed_at
    FROM claims CROSS JOIN ring
"""


async def materialise(db, job_ids: list[int], *, heartbeat_age: float = 0.0) -> None:
    """Give these row-claimed attempts a lease row (heartbeat ``heartbeat_age`` s old)."""
    await db.execute(MATERIALISE_SQL, job_ids, heartbeat_age)
