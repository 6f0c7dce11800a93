"""Descriptor and storage-transition gauges, read by queue_stats on either
engine in one statement per tick (two while a staged transition is
prepared: the engine it leads into checks its schema).

* ``awa.queue.info``: one series per declared queue (value 1) carrying its
  descriptor as labels, the join target Awa's Grafana dashboard uses to show
  display names and owners.
* ``awa.job_kind.info``: the same for declared job kinds (labels
  ``awa.job.kind``, ``awa.job_kind.display_name``, ``.description``,
  ``.owner``, ``.docs_url``, ``.tags`` joined by commas; a field a
  descriptor leaves empty has no label).
* ``awa.storage.state`` (1, labels state and engines, no prepared-engine
  label when none is prepared), ``awa.storage.transition_ready`` (action
  ``enter_mixed_transition`` | ``finalize``, 1 or 0),
  ``awa.storage.canonical_live_backlog`` and
  ``awa.storage.live_runtime_capability`` (per capability, all three always).

In Awa (awa-worker 0.6.1) every runtime's snapshot tick records
``awa.job_kind.info``, and every queue-storage-capable one's the four
storage gauges, from awa-model's storage report; awa_trio runs no runtime,
so its leader records them, with awa-worker's meaning:

* a runtime is live while ``last_seen_at`` + max(3 x max(its snapshot
  interval, 1 s), 30 s) has not passed (awa-worker compares in milliseconds;
  ``awa.storage_finalize()`` itself rounds to whole seconds);
* the canonical live backlog is ``awa.canonical_live_backlog()``: every
  ``awa.jobs_hot`` row not completed, failed or cancelled, plus every
  ``awa.scheduled_jobs`` row;
* enter mixed transition is ready in state ``prepared`` with
  ``queue_storage`` prepared, its schema complete (that engine's
  ``prepared_schema_ready``), no live ``canonical`` runtime and at least one
  live runtime with role ``queue_storage_target`` and capability
  ``queue_storage``;
* finalize is ready in ``mixed_transition`` with ``queue_storage`` prepared,
  a backlog of 0, and no live runtime whose capability keeps
  ``awa.storage_finalize()`` waiting (canonical and drain-only on schema 39,
  canonical only from schema 40: see :data:`FINALIZE_BLOCKERS`).

On purpose (docs/differences.md): these are observable gauges over the
snapshot the latest tick read, reported only while the term that read it
leads, so a state, engine or job kind that changed or vanished stops
reporting (synchronous gauges would repeat every label set they ever saw;
``awa.queue.info`` is still one); and on finalised queue storage (active
engine ``queue_storage``, state not ``mixed_transition``) the canonical
tables are not read (a least-privilege role has no grant on them then): the
backlog is reported as 0, which it is by construction once finalize passed
(it checks for 0 under the transition row's lock, and afterwards every
insert routes to queue storage).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..context import MaintenanceContext
from ..metrics import STORAGE_CAPABILITIES, InfoSnapshot

# The runtime vocabulary (which capabilities block which gate, the literals
# the report compares with) is the state-to-engine map's.
from ..schema import (
    ENTER_MIXED_BLOCKERS,
    FINALIZE_BLOCKERS,
    INITIAL_ENGINE,
    STATE_CANONICAL,
    STATE_MIXED_TRANSITION,
    STATE_PREPARED,
    STORAGE_REPORT_LITERALS,
    accepts_transition,
)
from ..sql import Statement
from . import engine_named

#: The job states awa.queue.depth reports (Awa's list, so dashboards match).
DEPTH_STATES = ("available", "running", "failed", "scheduled", "retryable", "waiting_external")


# One row. awa.canonical_live_backlog() is a function (not inlined: it sets
# its search_path), so on finalised queue storage, where the CASE does not
# call it, its tables are never opened and need no grant.
INFO_SQL = Statement(
    """
    WITH status AS (
        SELECT
            state,
            current_engine,
            active_engine,
            prepared_engine,
            COALESCE(NULLIF(details->>'schema', ''), 'awa') AS storage_schema
        FROM awa.storage_status()
    ),
    live_runtime AS (
        SELECT storage_capability, transition_role
        FROM awa.runtime_instances AS runtime
        WHERE runtime.last_seen_at + make_interval(
                secs => GREATEST(3 * GREATEST(runtime.snapshot_interval_ms, 1000), 30000) / 1000.0
              ) >= now()
    )
    SELECT
        (
            SELECT COALESCE(jsonb_agg(jsonb_build_object(
                       'name', queue, 'display_name', display_name, 'description', description,
                       'owner', owner, 'docs_url', docs_url, 'tags', to_jsonb(tags)
                   ) ORDER BY queue), '[]'::jsonb)
            FROM awa.queue_descriptors
        ) AS queues,
        (
            SELECT COALESCE(jsonb_agg(jsonb_build_object(
                       'name', kind, 'display_name', display_name, 'description', description,
                       'owner', owner, 'docs_url', docs_url, 'tags', to_jsonb(tags)
                   ) ORDER BY kind), '[]'::jsonb)
            FROM awa.job_kind_descriptors
        ) AS kinds,
        status.state,
        status.current_engine,
        status.active_engine,
        status.prepared_engine,
        CASE
            WHEN status.active_engine = {target_engine}
                 AND status.state IS DISTINCT FROM 'mixed_transition' THEN NULL
            ELSE awa.canonical_live_backlog()
        END AS canonical_live_backlog,
        status.storage_schema,
        (
            SELECT COALESCE(jsonb_object_agg(capability, live), '{}'::jsonb)
            FROM (
                SELECT storage_capability AS capability, count(*) AS live
                FROM live_runtime
                GROUP BY storage_capability
            ) AS per_capability
        ) AS live_runtime_capability,
        (
            SELECT count(*) FROM live_runtime
            WHERE transition_role = {target_role} AND storage_capability = {target_capability}
        ) AS live_queue_storage_targets
    FROM (SELECT 1) AS always_one_row
    LEFT JOIN status ON true
""",
    **STORAGE_REPORT_LITERALS,
)


def descriptor_attributes(prefix: str, key: str, descriptor: Mapping[str, Any]) -> dict[str, str]:
    """Awa's attribute set: ``key`` (the name), then only the fields a
    descriptor declares, tags joined by commas."""
    attributes = {key: str(descriptor["name"])}
    for field in ("display_name", "description", "owner", "docs_url"):
        value = descriptor.get(field)
        if value:
            attributes[f"{prefix}.{field}"] = str(value)
    tags = descriptor.get("tags") or ()
    if tags:
        attributes[f"{prefix}.tags"] = ",".join(tags)
    return attributes


def storage_snapshot(
    row: Mapping[str, Any], schema_version: int, prepared_schema_ready: bool
) -> InfoSnapshot:
    """The gauges' values from one INFO_SQL row and the prepared engine's
    readiness check (the values Awa's own storage report gives)."""
    state = row["state"] or STATE_CANONICAL
    prepared_engine = row["prepared_engine"]
    live = {capability: 0 for capability in STORAGE_CAPABILITIES}
    for capability, count in (row["live_runtime_capability"] or {}).items():
        live[str(capability)] = int(count)
    backlog = row["canonical_live_backlog"]
    enter_mixed_ready = (
        state == STATE_PREPARED
        and accepts_transition(prepared_engine)
        and prepared_schema_ready
        and sum(live.get(capability, 0) for capability in ENTER_MIXED_BLOCKERS) == 0
        and int(row["live_queue_storage_targets"]) > 0
    )
    blockers = FINALIZE_BLOCKERS.get(schema_version, FINALIZE_BLOCKERS[min(FINALIZE_BLOCKERS)])
    finalize_ready = (
        state == STATE_MIXED_TRANSITION
        and accepts_transition(prepared_engine)
        and backlog is not None
        and int(backlog) == 0
        and sum(live.get(capability, 0) for capability in blockers) == 0
    )
    return InfoSnapshot(
        state=state,
        current_engine=row["current_engine"] or INITIAL_ENGINE,
        active_engine=row["active_engine"] or INITIAL_ENGINE,
        prepared_engine=prepared_engine,
        canonical_live_backlog=int(backlog) if backlog is not None else 0,
        canonical_backlog_read=backlog is not None,
        enter_mixed_transition_ready=enter_mixed_ready,
        finalize_ready=finalize_ready,
        live_runtime_capability=live,
        job_kinds=tuple(
            descriptor_attributes("awa.job_kind", "awa.job.kind", kind) for kind in row["kinds"] or ()
        ),
    )


async def publish_info(ctx: MaintenanceContext) -> InfoSnapshot:
    """Read descriptors and the storage report; publish ``awa.queue.info``
    and replace the snapshot the observable gauges report."""
    row = await ctx.db.fetchrow(*INFO_SQL.bind())
    if row is None:  # the statement always returns one row
        raise RuntimeError("the descriptor and storage reading returned no row")
    for queue in row["queues"] or ():
        ctx.metrics.record_queue_info(
            queue["name"],
            queue.get("display_name"),
            queue.get("description"),
            queue.get("owner"),
            queue.get("docs_url"),
            list(queue.get("tags") or ()),
        )
    snapshot = storage_snapshot(row, ctx.schema.version, await _prepared_schema_ready(ctx, row))
    ctx.metrics.set_info_snapshot(snapshot)
    return snapshot


async def _prepared_schema_ready(ctx: MaintenanceContext, row: Mapping[str, Any]) -> bool:
    """While a staged transition is prepared, whether the engine it leads
    into says its schema is complete (a second statement, in that state
    only, so that no other state loads that engine)."""
    prepared_engine = row["prepared_engine"]
    if row["state"] != STATE_PREPARED or not accepts_transition(prepared_engine):
        return False
    check = engine_named(prepared_engine).prepared_schema_ready
    if check is None:
        return False
    return bool(await ctx.db.fetchval(*check.bind(storage_schema=row["storage_schema"])))
