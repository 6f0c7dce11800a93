"""One leadership term: the tracker actor, a schema watch, and one supervised
actor per branch.

The branch set follows the database: each term reads ``awa.storage_status()``
and runs the set :mod:`awa_trio.engines` picks for that state (the leading
engine's set, or during a staged transition its variant with the previous
engine's drain folded in). When the watch sees
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

from .branch import BranchSlot, BranchSpec, supervise_branch
from .context import MaintenanceContext
from .db import DatabaseError, LockTimeout
from .engines import engine_for
from .errors import UnsupportedSchema
from .grants import warn_about_missing_privileges
from .live import LiveSettings
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
from .work_summary import WorkSummary

log = logging.getLogger(__name__)

BranchSelector = Callable[[SchemaInfo], Sequence[BranchSpec]]

#: The storage state is read at least this often (``leader_check_interval``
#: if shorter): a staged transition's routing flip or finalize switches the
#: branch set within about a second, so queue-storage work routed after the
#: flip is promoted and rescued at once. One cheap query per second.
STORAGE_POLL_INTERVAL = 1.0


@dataclasses.dataclass
class LeaderTerm:
    """What the running term shows its service (/status, the gauges): handed
    over once through ``task_status.started`` and kept current by the term
    as the storage state moves and reloads apply."""

    schema: SchemaInfo
    branches: tuple[BranchSpec, ...]
    tracker: TrackerClient


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
    live: LiveSettings | None = None,
    task_status: trio.TaskStatus[LeaderTerm] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Lead until cancelled, one term per storage state; reports a
    LeaderTerm once the first term's branches are up. With ``live``, each
    term follows its reloads and pauses (:func:`follow_live_settings`)."""
    term: LeaderTerm | None = None
    while True:
        schema = await read_supported_schema(ctx)
        if live is not None:
            ctx = dataclasses.replace(ctx, config=live.config, periodic_jobs=live.periodic_jobs)
        term_ctx = dataclasses.replace(ctx, schema=schema)
        branches = select_branches(schema)
        try:
            async with trio.open_nursery() as nursery:
                tracker = await nursery.start(run_tracker, ctx.metrics)
                first = term is None
                if term is None:
                    term = LeaderTerm(schema, tuple(branches), tracker)
                else:  # the same object, so the service's reference stays current
                    term.schema, term.branches, term.tracker = schema, tuple(branches), tracker
                nursery.start_soon(watch_schema, term_ctx, term)
                branch_ctx = dataclasses.replace(term_ctx, tracker=tracker)
                work = WorkSummary()
                nursery.start_soon(work.log_every)
                slots: dict[str, BranchSlot] = {}
                for spec in branches:
                    slot = slots[spec.name] = BranchSlot(spec, branch_ctx, work)
                    slot.paused = live is not None and spec.name in live.paused
                    await nursery.start(run_slot, slot, tracker)
                log.info(
                    "maintenance branches started on %s, schema version %d: %s",
                    describe_storage(schema),
                    schema.version,
                    ", ".join(spec.name for spec in branches),
                )
                if live is not None:
                    nursery.start_soon(
                        follow_live_settings, live, slots, branch_ctx, select_branches, term, work
                    )
                # Beside the branches, not before them (a takeover promotes
                # at once): one line naming any privilege the role lacks.
                nursery.start_soon(warn_about_missing_privileges, term_ctx.db, schema)
                if first:
                    task_status.started(term)
        except* StorageMoved as group:
            moved = group.exceptions[0]
            log.warning("%s; restarting the leader term with the matching branches", moved)


async def run_slot(
    slot: BranchSlot, tracker: TrackerClient, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
    """One branch actor, in a cancel scope of its own (a reload may disable it)."""
    with slot.cancel_scope:
        await supervise_branch(slot.spec, slot.ctx, tracker, slot=slot, task_status=task_status)


async def follow_live_settings(
    live: LiveSettings,
    slots: dict[str, BranchSlot],
    branch_ctx: MaintenanceContext,
    select_branches: BranchSelector,
    term: LeaderTerm,
    work: WorkSummary | None = None,
) -> None:
    """Apply every reload and pause to this term's branch actors in place:
    a disabled branch is cancelled, an enabled one started, the others get
    their new spec and context for their next tick. The tracker actor (all
    hysteresis and prune backoff) and the lock stay as they are."""
    generation = live.generation
    async with trio.open_nursery() as nursery:
        while True:
            await live.changed.wait()
            for name, slot in slots.items():
                slot.paused = name in live.paused
            if live.generation == generation:
                continue  # a pause or resume only
            generation = live.generation
            ctx = dataclasses.replace(branch_ctx, config=live.config, periodic_jobs=live.periodic_jobs)
            wanted = {spec.name: spec for spec in select_branches(ctx.schema)}
            for name in [name for name in slots if name not in wanted]:
                slots.pop(name).cancel_scope.cancel(reason="branch disabled by a reload")
                log.info("%s: stopped (disabled by config generation %d)", name, generation)
            for name, spec in wanted.items():
                if name in slots:
                    slots[name].update(spec, ctx)
                    continue
                slot = slots[name] = BranchSlot(spec, ctx, work)
                slot.paused = name in live.paused
                await nursery.start(run_slot, slot, term.tracker)
                log.info("%s: started (enabled by config generation %d)", name, generation)
            term.branches = tuple(wanted.values())


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
        info.queue_storage_schema != ctx.schema.queue_storage_schema and engine_for(info).uses_storage_schema
    ):
        raise StorageMoved(last_seen or ctx.schema, info)
    return info


async def watch_schema(ctx: MaintenanceContext, term: LeaderTerm | None = None) -> None:
    """Poll the storage state; a move to another branch set ends the term
    (StorageMoved), any other change is logged and shown in ``term``."""
    period = min(ctx.config.leader_check_interval, STORAGE_POLL_INTERVAL)
    known = ctx.schema
    while True:
        await trio.sleep(period)
        try:
            info = await check_schema_unchanged(ctx, known)
        except LockTimeout as exc:
            # A migration holds the schema's tables: give way, as the branches do.
            log.info("schema check yielded to a lock on %s (will retry)", exc.relation or "a table")
            continue
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
        if info != known and term is not None:
            term.schema = info
        known = info
