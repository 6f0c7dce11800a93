"""One leadership term: the tracker actor plus one supervised actor per branch.

Starts everything with ``nursery.start`` (so a failure before an actor is
ready reaches the caller), reports itself started, then waits. It ends only
by cancellation (lock lost, shutdown) or by LeadershipAbandoned from a
branch that keeps crashing.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence

import trio

from .branch import BranchSpec, supervise_branch
from .context import MaintenanceContext
from .tracker_actor import run_tracker

log = logging.getLogger(__name__)


async def run_leader_term(
    ctx: MaintenanceContext,
    branches: Sequence[BranchSpec],
    *,
    task_status=trio.TASK_STATUS_IGNORED,
) -> None:
    async with trio.open_nursery() as nursery:
        tracker = await nursery.start(run_tracker, ctx.metrics)
        term_ctx = dataclasses.replace(ctx, tracker=tracker)
        for spec in branches:
            await nursery.start(supervise_branch, spec, term_ctx, tracker)
        log.info("maintenance branches started: %s", ", ".join(spec.name for spec in branches))
        task_status.started()
