"""Who holds the unique claim a job collided with: for the operator's log
when a rescue or a promotion has to cancel a duplicate."""

from __future__ import annotations

import logging

from ...context import MaintenanceContext
from ...db import DatabaseError
from ...sql import Statement

log = logging.getLogger(__name__)

# The claim of the job's key held by any other job (at most one exists).
CLAIM_HOLDER_SQL = Statement("""
    SELECT claim.job_id
    FROM awa.job_unique_claims AS claim
    JOIN (
        SELECT unique_key FROM awa.jobs_hot WHERE id = :job_id
        UNION ALL
        SELECT unique_key FROM awa.scheduled_jobs WHERE id = :job_id
    ) AS job ON claim.unique_key = job.unique_key
    WHERE claim.job_id <> :job_id
    LIMIT 1
""")


async def unique_claim_holder(ctx: MaintenanceContext, job_id: int) -> int | None:
    """Best effort: only for the log line."""
    try:
        holder = await ctx.db.fetchval(*CLAIM_HOLDER_SQL.bind(job_id=job_id))
        return None if holder is None else int(holder)
    except DatabaseError as exc:
        log.debug("claim holder lookup for job %d failed: %s", job_id, exc)
        return None


def holder_text(holder: int | None) -> str:
    return "(unknown)" if holder is None else str(holder)
