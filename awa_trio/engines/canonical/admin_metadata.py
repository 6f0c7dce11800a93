"""recompute_dirty_admin_metadata and refresh_admin_metadata: keep Awa's admin
cache (per-queue state counts, queue and kind catalogs) current.

Triggers on ``awa.jobs_hot`` and ``awa.scheduled_jobs`` mark the queues and
kinds a statement touched as dirty. The frequent branch (every 2 s) drains up
to 100 dirty queues and 100 dirty kinds and recomputes their cached rows
exactly; the slow one (every 60 s) rebuilds the whole cache from the base
tables as a safety net against drift. Both are Awa's own SQL functions,
called as they are (they serialise each other with an advisory lock). The
dashboards and ``queue_stats`` read this cache.

Neither runs on queue storage, which keeps its counts another way.
"""

from __future__ import annotations

import dataclasses
import logging

from ...body import BodyResult
from ...context import MaintenanceContext
from ...sql import Statement

log = logging.getLogger(__name__)

RECOMPUTE_DIRTY_NAME = "recompute_dirty_admin_metadata"
REFRESH_NAME = "refresh_admin_metadata"
#: Dirty queues (and, separately, dirty kinds) drained per call, as Awa's leader does.
DIRTY_KEY_BATCH_SIZE = 100

# Returns how many dirty keys (queues + kinds) it drained; 0 when idle.
RECOMPUTE_DIRTY_ADMIN_METADATA_SQL = Statement("SELECT awa.recompute_dirty_admin_metadata(:batch_size)")
# Returns void; also discards every pending dirty key.
REFRESH_ADMIN_METADATA_SQL = Statement("SELECT awa.refresh_admin_metadata()")


@dataclasses.dataclass
class RecomputeDirtyResult(BodyResult):
    #: Dirty queue and kind keys drained and recomputed this pass.
    keys_recomputed: int = 0


async def run_recompute_dirty(ctx: MaintenanceContext) -> RecomputeDirtyResult:
    result = RecomputeDirtyResult()
    result.keys_recomputed = int(
        await ctx.db.fetchval(*RECOMPUTE_DIRTY_ADMIN_METADATA_SQL.bind(batch_size=DIRTY_KEY_BATCH_SIZE)) or 0
    )
    # Routine upkeep every 2 s under any write traffic: debug, not info.
    if result.keys_recomputed:
        log.debug("%s: recomputed %d dirty admin metadata keys", RECOMPUTE_DIRTY_NAME, result.keys_recomputed)
    return result


async def run_refresh(ctx: MaintenanceContext) -> None:
    await ctx.db.execute(*REFRESH_ADMIN_METADATA_SQL.bind())
    log.debug("%s: admin metadata rebuilt from the job tables", REFRESH_NAME)
