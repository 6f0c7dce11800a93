"""The SQL of cron: rows in ``awa.cron_jobs`` and the fire statement.

Same contract as Awa's ``awa_model::cron`` (v0.6.1), so awa_trio and Awa's
own leader can take turns on one database:

* registration is an additive upsert: it never deletes rows and never touches
  ``created_at``, ``last_enqueued_at``, ``paused_at`` or ``paused_by``;
* a fire is one statement: a compare-and-set of ``last_enqueued_at`` against
  the value the evaluator read (``IS NOT DISTINCT FROM``, so NULL works) that
  also re-checks the pause, joined to ``awa.insert_job_compat`` (so either
  storage engine gets the job). Two leaders evaluating the same schedule
  serialise on the row lock; the loser's update matches no row and inserts
  nothing. If the insert fails, the mark does not move either.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Any

from ..db import Connection, Database
from ..sql import Statement
from .fire_times import format_fire_time
from .schedules import PeriodicJob

# The eleven definition columns, each a parameter of the same name; EXCLUDED
# replaces them all on conflict. `(xmax = 0)` is true only for a row this
# statement inserted (not updated).
UPSERT_CRON_JOB_SQL = Statement("""
    INSERT INTO awa.cron_jobs (
        name, cron_expr, timezone, kind, queue, args, priority, max_attempts,
        tags, metadata, missed_fire_policy
    )
    VALUES (
        :name, :cron_expr, :timezone, :kind, :queue, :args, :priority, :max_attempts,
        :tags, :metadata, :missed_fire_policy
    )
    ON CONFLICT (name) DO UPDATE SET
        cron_expr = EXCLUDED.cron_expr,
        timezone = EXCLUDED.timezone,
        kind = EXCLUDED.kind,
        queue = EXCLUDED.queue,
        args = EXCLUDED.args,
        priority = EXCLUDED.priority,
        max_attempts = EXCLUDED.max_attempts,
        tags = EXCLUDED.tags,
        metadata = EXCLUDED.metadata,
        missed_fire_policy = EXCLUDED.missed_fire_policy,
        updated_at = now()
    RETURNING (xmax = 0) AS inserted
""")

# Every schedule, whoever registered it, in name order; plus the database
# clock the pass is evaluated against (the same clock that wrote created_at).
LIST_CRON_JOBS_SQL = Statement("""
    SELECT
        name, cron_expr, timezone, kind, queue, args, priority, max_attempts,
        tags, metadata, missed_fire_policy, last_enqueued_at, created_at,
        updated_at, paused_at, paused_by,
        now() AS evaluated_at
    FROM awa.cron_jobs
    ORDER BY name
""")

# :name, :fire_time, :previous_enqueued_at (the last_enqueued_at the
# evaluator read, NULL on first registration), :fire_time_text (the fire time
# as text, the cron_fire_time metadata).
# The job is available now (run_at NULL -> clock_timestamp()), with no unique
# key; the schedule's metadata keys are kept, cron_name/cron_fire_time win.
ATOMIC_ENQUEUE_SQL = Statement("""
    WITH claimed AS (
        UPDATE awa.cron_jobs
        SET last_enqueued_at = :fire_time, updated_at = now()
        WHERE name = :name
          AND last_enqueued_at IS NOT DISTINCT FROM :previous_enqueued_at::timestamptz
          AND paused_at IS NULL
        RETURNING name, kind, queue, args, priority, max_attempts, tags, metadata
    )
    SELECT job.id
    FROM claimed
    CROSS JOIN LATERAL awa.insert_job_compat(
        claimed.kind,
        claimed.queue,
        claimed.args,
        'available'::awa.job_state,
        claimed.priority,
        claimed.max_attempts,
        NULL,
        claimed.metadata
            || jsonb_build_object('cron_name', claimed.name, 'cron_fire_time', :fire_time_text::text),
        claimed.tags,
        NULL,
        NULL
    ) AS job
""")


@dataclasses.dataclass(frozen=True)
class CronJobRow:
    """One row of ``awa.cron_jobs`` (all 16 columns)."""

    name: str
    cron_expr: str
    timezone: str
    kind: str
    queue: str
    args: Any
    priority: int
    max_attempts: int
    tags: tuple[str, ...]
    metadata: Any
    missed_fire_policy: str
    last_enqueued_at: datetime | None
    created_at: datetime
    updated_at: datetime
    paused_at: datetime | None
    paused_by: str | None

    @property
    def is_paused(self) -> bool:
        return self.paused_at is not None

    @classmethod
    def from_record(cls, record: Any) -> CronJobRow:
        values = {field.name: record[field.name] for field in dataclasses.fields(cls)}
        values["tags"] = tuple(values["tags"] or ())
        return cls(**values)


async def upsert_cron_job(db: Database | Connection, job: PeriodicJob) -> bool:
    """Register or update one schedule; True if the row is new."""
    return bool(
        await db.fetchval(
            *UPSERT_CRON_JOB_SQL.bind(
                name=job.name,
                cron_expr=job.cron_expr,
                timezone=job.timezone,
                kind=job.kind,
                queue=job.queue,
                args=job.args,
                priority=job.priority,
                max_attempts=job.max_attempts,
                tags=list(job.tags),
                metadata=job.metadata,
                missed_fire_policy=str(job.missed_fire_policy),
            )
        )
    )


async def list_cron_jobs(db: Database | Connection) -> tuple[datetime | None, list[CronJobRow]]:
    """(database clock, every schedule by name); the clock is None without rows."""
    records = await db.fetch(*LIST_CRON_JOBS_SQL.bind())
    evaluated_at = records[0]["evaluated_at"] if records else None
    return evaluated_at, [CronJobRow.from_record(record) for record in records]


async def atomic_enqueue(
    db: Database | Connection,
    name: str,
    fire_time: datetime,
    previous_enqueued_at: datetime | None,
) -> int | None:
    """Claim one fire and insert its job; the job id, or None if the fire was
    already claimed (another leader moved the mark) or the schedule is paused."""
    job_id = await db.fetchval(
        *ATOMIC_ENQUEUE_SQL.bind(
            name=name,
            fire_time=fire_time,
            previous_enqueued_at=previous_enqueued_at,
            fire_time_text=format_fire_time(fire_time),
        )
    )
    return None if job_id is None else int(job_id)
