"""One leadership term: the tracker actor, a schema watch, and one supervised
actor per branch.

The branch set follows the database: each term reads ``awa.storage_status()``
and runs the canonical set, the queue-storage set, or the queue-storage set
with the canonical drain (during a staged transition). When the watch sees
the storage move on (an awa-pg runtime finalising a fresh database to queue
storage, a transition entering mixed mode or finishing), that term ends and
the next one, still under the same lock, runs the right set with fresh
tracker state. A move that keeps the set (canonical -> prepared) is logged
and the term goes on. A schema awa_trio cannot maintain at all (dropped, an
unsupported version or engine) raises UnsupportedSchema, which ends the term:
the elector steps down and waits for a supported schema.

Starts everything with ``nursery.start`` (so a failure before an actor is
ready reaches the caller) and reports itself started once, after the first
term's branches are up.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence

import trio

from .branch import BranchSpec, supervise_branch
from .context import MaintenanceContext
from .db import DatabaseError
from .errors import UnsupportedSchema
from .grants import warn_about_missing_privileges
from .logs import connection_recovered
from .schema import (
    SUPPORTED_ENGINES,
    SUPPORTED_SCHEMA_VERSIONS,
    SchemaInfo,
    read_schema,
    unsupported_engine_message,
    unsupported_version_message,
)
from .tracker_actor import TrackerClient, run_tracker

log = logging.getLogger(__name__)

BranchSelector = Callable[[SchemaInfo], Sequence[BranchSpec]]

#: The storage state is read at least this often (``leader_check_interval``
#: if shorter): a staged transition's routing flip or finalize switches the
#: branch set within about a second, so queue-storage work routed after the
#: flip is promoted and rescued at once. One cheap query per second.
STORAGE_POLL_INTERVAL = 1.0


class StorageMoved(Exception):
    """The storage engine or transition state changed under a running term."""

    def __init__(self, old: SchemaInfo, new: SchemaInfo):
        super().__init__(f"storage moved from {describe_storage(old)} to {describe_storage(new)}")
        self.old = old
        self.new = new


def describe_storage(info: SchemaInfo) -> str:
    return f"{info.engine} ({info.state})"


async def run_leader_term(
    ctx: MaintenanceContext,
    select_branches: BranchSelector,
    *,
    on_term_start: Callable[[SchemaInfo, Sequence[BranchSpec], TrackerClient], None] | None = None,
    on_storage_seen: Callable[[SchemaInfo], None] | None = None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Lead until cancelled, one term per storage state."""
    started = False
    while True:
        schema = await read_supported_schema(ctx)
        term_ctx = dataclasses.replace(ctx, schema=schema)
        branches = select_branches(schema)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(watch_schema, term_ctx, on_storage_seen)
                tracker = await nursery.start(run_tracker, ctx.metrics)
                branch_ctx = dataclasses.replace(term_ctx, tracker=tracker)
                if on_term_start is not None:
                    on_term_start(schema, branches, tracker)
                for spec in branches:
                    await nursery.start(supervise_branch, spec, branch_ctx, tracker)
                log.info(
                    "maintenance branches started on %s, schema version %d: %s",
                    describe_storage(schema),
                    schema.version,
                    ", ".join(spec.name for spec in branches),
                )
                # Beside the branches, not before them (a takeover promotes
                # at once): one line naming any privilege the role lacks.
                nursery.start_soon(warn_about_missing_privileges, term_ctx.db, schema)
                if not started:
                    started = True
                    task_status.started()
        except* StorageMoved as group:
            moved = group.exceptions[0]
            log.warning("%s; restarting the leader term with the matching branches", moved)


async def read_supported_schema(ctx: MaintenanceContext) -> SchemaInfo:
    """The schema now, or UnsupportedSchema if awa_trio cannot maintain it."""
    info = await read_schema(ctx.db)
    if info is None or info.version not in SUPPORTED_SCHEMA_VERSIONS:
        raise UnsupportedSchema(unsupported_version_message(None if info is None else info.version))
    if info.engine not in SUPPORTED_ENGINES:
        raise UnsupportedSchema(
            f"storage engine changed from {ctx.schema.engine!r} to {info.engine!r}; "
            + unsupported_engine_message(info.engine)
        )
    return info


async def check_schema_unchanged(ctx: MaintenanceContext, last_seen: SchemaInfo | None = None) -> SchemaInfo:
    """Raise StorageMoved if the branch set chosen for ``ctx.schema`` no
    longer fits (naming ``last_seen``, the state read before, as where it
    moved from), UnsupportedSchema if nothing would."""
    info = await read_supported_schema(ctx)
    if info.branch_set != ctx.schema.branch_set or (
        info.queue_storage_schema != ctx.schema.queue_storage_schema and info.runs_queue_storage
    ):
        raise StorageMoved(last_seen or ctx.schema, info)
    return info


async def watch_schema(
    ctx: MaintenanceContext, on_storage_seen: Callable[[SchemaInfo], None] | None = None
) -> None:
    """Poll the storage state; a move to another branch set ends the term
    (StorageMoved), any other change is logged and reported to
    ``on_storage_seen``."""
    period = min(ctx.config.leader_check_interval, STORAGE_POLL_INTERVAL)
    known = ctx.schema
    while True:
        await trio.sleep(period)
        try:
            info = await check_schema_unchanged(ctx, known)
        except DatabaseError as exc:
            log.warning("schema check failed (will retry): %s", exc)
            continue
        connection_recovered(log.name, log)
        if info.version != known.version:
            log.info(
                "awa schema version changed from %d to %d (still supported)", known.version, info.version
            )
        if info.state != known.state:
            # e.g. canonical -> prepared: the transition has begun, but until
            # routing flips the same branches serve it.
            log.info(
                "storage state changed from %s to %s; the branches stay the same", known.state, info.state
            )
        if info != known and on_storage_seen is not None:
            on_storage_seen(info)
        known = info
