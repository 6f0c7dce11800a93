"""Promotion and the three rescues over random jobs with random unique keys
and masks, on the real schema and its claim triggers: invariants that must
hold whatever the mix.

* nothing is lost: the same ids exist after the pass;
* no wedge: every job a branch was due to move has moved, been cancelled as
  a duplicate, or been reported skipped (and is then untouched);
* a job no branch was due to move is untouched, column for column;
* the claim table says exactly what the jobs' states and masks say (these
  branches write the base tables, bypassing the ``awa.jobs`` view);
* a duplicate is cancelled only when its target state claims its key.

Examples run one at a time in their own Trio run (Hypothesis drives a plain
function); every example starts from empty job tables.
"""

from __future__ import annotations

import dataclasses

import asyncpg
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.contexts import make_context

from awa_trio.db import UniqueViolation, open_database
from awa_trio.engines.canonical import promote, rescue_callbacks, rescue_deadlines, rescue_heartbeats

STATE_BITS = {
    "scheduled": 0, "available": 1, "running": 2, "completed": 3,
    "retryable": 4, "failed": 5, "cancelled": 6, "waiting_external": 7,
}
STALENESS = 60.0

# Situations a job can be in, and the branch that is due to move it.
SITUATIONS = {
    "scheduled_due": "promote", "scheduled_later": None,
    "retryable_due": "promote", "retryable_later": None,
    "available": None, "completed": None,
    "running_fresh": None, "running_stale": "heartbeat", "running_past_deadline": "deadline",
    "waiting_expired": "callback", "waiting_expired_last_attempt": "callback", "waiting": None,
}
# Where a moved job ends up, per branch (the callback rescue: see its row).
TARGETS = {"promote": {"available"}, "heartbeat": {"retryable"}, "deadline": {"retryable"},
           "callback": {"retryable", "failed"}}
DUPLICATE_ERRORS = {
    "promote": promote.DUPLICATE_ERROR,
    "heartbeat": rescue_heartbeats.DUPLICATE_ERROR,
    "deadline": rescue_deadlines.DUPLICATE_ERROR,
    "callback": rescue_callbacks.DUPLICATE_ERROR,
}

INSERT_SCHEDULED_SQL = """
    INSERT INTO awa.scheduled_jobs (kind, queue, state, run_at, attempt, unique_key, unique_states)
    VALUES ('prop', 'q', $1::awa.job_state, now() + make_interval(secs => $2), $3, $4, $5)
    RETURNING id
"""
INSERT_HOT_SQL = """
    INSERT INTO awa.jobs_hot (
        kind, queue, state, attempt, max_attempts, run_lease, attempted_at, finalized_at,
        heartbeat_at, deadline_at, callback_id, callback_timeout_at, unique_key, unique_states)
    VALUES (
        'prop', 'q', $1::awa.job_state, $2::smallint, $3::smallint, $2::bigint,
        now() - interval '10 minutes',
        CASE WHEN $1 = 'completed' THEN now() END,
        now() + make_interval(secs => $4), now() + make_interval(secs => $5),
        CASE WHEN $1 = 'waiting_external' THEN gen_random_uuid() END,
        now() + make_interval(secs => $6), $7, $8)
    RETURNING id
"""
SNAPSHOT_SQL = """
    SELECT * FROM awa.jobs_hot
    UNION ALL
    SELECT * FROM awa.scheduled_jobs
"""


@dataclasses.dataclass(frozen=True)
class JobSpec:
    situation: str
    key: bytes | None
    mask: int
    #: Spread of run_at / heartbeat / timeout ages, so the orders differ.
    age: int


job_specs = st.builds(
    JobSpec,
    situation=st.sampled_from(sorted(SITUATIONS)),
    key=st.sampled_from([None, b"\x01", b"\x02"]),
    mask=st.integers(0, 255),
    age=st.integers(1, 50),
)


def claims(mask: int, state: str) -> bool:
    """awa.job_state_in_bitmask: bit 0 is the leftmost of bit(8)."""
    return bool(mask & (0x80 >> STATE_BITS[state]))


def bits(mask: int) -> asyncpg.BitString:
    return asyncpg.BitString(format(mask, "08b"))


async def insert(db, spec: JobSpec) -> int | None:
    """The job as described, or None when the claim trigger refuses it."""
    key, mask = spec.key, bits(spec.mask) if spec.key is not None else None
    s = spec.situation
    try:
        if s.startswith(("scheduled", "retryable")):
            state = s.split("_")[0]
            offset = -spec.age if s.endswith("_due") else 3600 + spec.age
            return await db.fetchval(INSERT_SCHEDULED_SQL, state, float(offset),
                                     1 if state == "retryable" else 0, key, mask)
        heartbeat, deadline, timeout = -1.0, 3600.0, 3600.0
        state, attempt, max_attempts = s, 1, 5
        if s.startswith("running"):
            state = "running"
            if s == "running_stale":
                heartbeat = -STALENESS - spec.age
            if s == "running_past_deadline":
                deadline = -float(spec.age)
        elif s.startswith("waiting"):
            state = "waiting_external"
            if s != "waiting":
                timeout = -float(spec.age)
            if s == "waiting_expired_last_attempt":
                attempt = max_attempts
        elif s == "available":
            attempt = 0
        return await db.fetchval(INSERT_HOT_SQL, state, attempt, max_attempts,
                                 heartbeat, deadline, timeout, key, mask)
    except UniqueViolation:
        return None


async def run_example(database_url: str, specs: list[JobSpec]) -> None:
    async with open_database(database_url, pool_size=2) as db:
        await db.execute("TRUNCATE awa.jobs_hot, awa.scheduled_jobs, awa.job_unique_claims")
        jobs = {}
        for spec in specs:
            job_id = await insert(db, spec)
            if job_id is not None:
                jobs[job_id] = spec
        before = {r["id"]: dict(r) for r in await db.fetch(SNAPSHOT_SQL)}
        ctx = await make_context(db, heartbeat_staleness=STALENESS)
        results = {
            "promote": await promote.run_once(ctx),
            "heartbeat": await rescue_heartbeats.run_once(ctx),
            "deadline": await rescue_deadlines.run_once(ctx),
            "callback": await rescue_callbacks.run_once(ctx),
        }
        after = {r["id"]: dict(r) for r in await db.fetch(SNAPSHOT_SQL)}
        claim_rows = {(bytes(r["unique_key"]), r["job_id"])
                      for r in await db.fetch("SELECT unique_key, job_id FROM awa.job_unique_claims")}

    assert set(after) == set(before) == set(jobs), "jobs lost or invented"
    cancelled = {branch: {job.id for job in result.duplicates_cancelled}
                 for branch, result in results.items()}
    skipped = {branch: set(result.skipped) for branch, result in results.items()}
    for job_id, spec in jobs.items():
        branch = SITUATIONS[spec.situation]
        old, new = before[job_id], after[job_id]
        if branch is None:
            assert new == old, f"job {job_id} ({spec}) was not due, yet changed"
            continue
        if job_id in skipped[branch]:
            assert new == old, f"skipped job {job_id} changed"
            continue
        if job_id in cancelled[branch]:
            assert new["state"] == "cancelled"
            assert new["errors"][-1]["error"] == DUPLICATE_ERRORS[branch]
            target = "available" if branch == "promote" else (
                "failed" if spec.situation == "waiting_expired_last_attempt" else "retryable")
            assert spec.key is not None and claims(spec.mask, target), (
                f"job {job_id} cancelled though {target} does not claim its key")
            continue
        assert new["state"] in TARGETS[branch], f"job {job_id} ({spec}) not moved: {new['state']}"
        assert new["attempt"] == old["attempt"] and new["run_lease"] == old["run_lease"]

    expected_claims = {
        (bytes(job["unique_key"]), job_id)
        for job_id, job in after.items()
        if job["unique_key"] is not None and job["unique_states"] is not None
        and claims(int(job["unique_states"].as_string().replace(" ", ""), 2), job["state"])
    }
    assert claim_rows == expected_claims, "claim table disagrees with the jobs' states"
    keys = [key for key, _ in claim_rows]
    assert len(keys) == len(set(keys)), "a key is claimed twice"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(specs=st.lists(job_specs, min_size=1, max_size=14))
def test_promotion_and_rescues_keep_every_invariant(database_url, specs):
    trio.run(run_example, database_url, specs)
