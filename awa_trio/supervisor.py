"""One leadership term: the tracker actor, a schema watch, and one supervised
actor per branch.

Starts everything with ``nursery.start`` (so a failure before an actor is
ready reaches the caller), reports itself started, then waits. It ends only
by cancellation (lock lost, shutdown), by LeadershipAbandoned from a branch
that keeps crashing, or by UnsupportedSchema when the database moved to a
schema or storage engine these branches must not touch (an Awa runtime with
``storage_transition_role="auto"`` finalising to queue storage, a staged
transition, an upgrade). Maintaining a database with the wrong branches
would be worse than not maintaining it, so that error stops the service.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence

import trio

from .branch import BranchSpec, supervise_branch
from .context import MaintenanceContext
from .db import DatabaseError
from .errors import UnsupportedSchema
from .schema import SUPPORTED_ENGINES, SUPPORTED_SCHEMA_VERSIONS, SchemaInfo, read_schema
from .schema import unsupported_engine_message, unsupported_version_message
from .tracker_actor import run_tracker

log = logging.getLogger(__name__)


async def run_leader_term(
    ctx: MaintenanceContext,
    branches: Sequence[BranchSpec],
    *,
    task_status=trio.TASK_STATUS_IGNORED,
) -> None:
    await check_schema_unchanged(ctx)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch_schema, ctx)
        tracker = await nursery.start(run_tracker, ctx.metrics)
        term_ctx = dataclasses.replace(ctx, tracker=tracker)
        for spec in branches:
            await nursery.start(supervise_branch, spec, term_ctx, tracker)
        log.info("maintenance branches started: %s", ", ".join(spec.name for spec in branches))
        task_status.started()


async def check_schema_unchanged(ctx: MaintenanceContext) -> SchemaInfo:
    """Raise UnsupportedSchema if the schema or engine is no longer one the
    running branches were chosen for."""
    info = await read_schema(ctx.db)
    if info is None or info.version not in SUPPORTED_SCHEMA_VERSIONS:
        raise UnsupportedSchema(unsupported_version_message(info and info.version))
    if info.engine != ctx.schema.engine:
        if info.engine not in SUPPORTED_ENGINES:
            raise UnsupportedSchema(
                f"storage engine changed from {ctx.schema.engine!r} to {info.engine!r}; "
                + unsupported_engine_message(info.engine)
            )
        raise UnsupportedSchema(
            f"storage engine changed from {ctx.schema.engine!r} to {info.engine!r}; restart awa_trio"
        )
    if info.version != ctx.schema.version:
        log.info("awa schema version changed from %d to %d (still supported)",
                 ctx.schema.version, info.version)
    return info


async def watch_schema(ctx: MaintenanceContext) -> None:
    while True:
        await trio.sleep(ctx.config.leader_check_interval)
        try:
            await check_schema_unchanged(ctx)
        except DatabaseError as exc:
            log.warning("schema check failed (will retry): %s", exc)
