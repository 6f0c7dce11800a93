"""The canonical drain: what the leader owes canonical rows while a staged
transition to queue storage is in ``mixed_transition``.

Once routing flips, new work goes to queue storage, but jobs inserted before
the flip still live on the canonical tables, and ``awa.storage_finalize()``
refuses until ``awa.canonical_live_backlog()`` (every non-terminal
``jobs_hot`` row plus every ``scheduled_jobs`` row) is zero. Drain-role
runtimes (``storage_transition_role='canonical_drain'``) claim and run
canonical ``available`` rows; only the leader turns due ``scheduled`` and
``retryable`` rows into ``available`` ones and takes back ``running`` rows
whose worker died.

So the queue-storage leader also promotes and rescues the canonical plane,
on the physical tables: after the flip the ``awa.jobs`` view shows only
queue storage, so a rescue through it updates nothing (``UPDATE 0``). In
detail:

* promotion and the three rescues serve the canonical plane beside the
  queue-storage one, with the canonical branches' statements, which write
  ``awa.jobs_hot`` and ``awa.scheduled_jobs`` directly, never the view (the
  heartbeat and deadline rescues with the variant below). Promoted canonical rows
  stay canonical ``available`` rows under their own id, for drain runtimes
  to claim: moving them to queue storage would give them new
  ids and drop callback wiring (``deferred_jobs`` has no callback columns);
* the heartbeat and deadline rescues of the canonical plane fail an attempt
  that was the job's last (``attempt >= max_attempts``) instead of making
  it retryable. After the flip a 0.6.1 drain runtime records failures, like
  callback parks, through ``awa.jobs``, which misses the canonical row: the
  row stays ``running`` until the rescue takes it. Retrying an exhausted
  attempt there would re-run an always-failing job for ever, and finalize
  could never pass; failing it records what the worker meant to write;
* in-flight registrations, hooks and log lines are keyed by engine as well
  as id (the id sequences overlap): a canonical rescue cancels only an
  attempt registered as canonical, and the drain's own lines say
  "canonical plane";
* the rescues send ``awa:cancel`` notices for the canonical attempts they
  take, as on the canonical engine; but a notice names no engine, and a
  runtime's listener matches ``(job_id, run_lease)`` alone, so an attempt
  whose id and lease a queue-storage attempt also has (a lease, a claim or
  a compact claim item, closed or not) gets none: cancelling the wrong
  attempt would lose its work, while a missing notice only leaves a
  rescued handler running until it returns;
* finished canonical rows past retention are deleted as on the canonical
  engine, so a long drain does not grow ``jobs_hot``;
* the ``canonical_drain`` branch reports the backlog and warns when due
  canonical work has no live drain runtime to run it (the one case the
  leader cannot fix: it would wait there and finalize could never pass).

Nothing is needed in ``prepared`` (routing has not flipped, the canonical set
runs) or after finalize: finalize checks the backlog under the transition
row's lock, and afterwards every insert routes to queue storage and no
canonical row is left to claim, so no live canonical row can appear again.

Concurrent writers: the drain writes no queue-storage table, only
``awa.jobs_hot`` and ``awa.scheduled_jobs``, with the canonical branches'
statements (rows picked ``FOR UPDATE SKIP LOCKED``, so a drain runtime
claiming a row, or a foreign leader's drain, is never waited for and never
meets a row twice).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from ...branch import BranchSpec
from ...config import MaintenanceConfig
from ...context import MaintenanceContext
from ...maintenance.rescue import CANCEL_NOTICES, RescueResult
from ...sql import Statement
from ..base import DrainPasses
from ..states import FINALIZE_BLOCKERS
from . import cleanup as canonical_cleanup
from . import promote, rescue_callbacks, rescue_deadlines, rescue_heartbeats
from .rescue import (
    BATCH_SELECTION,
    HOT_COLUMNS_SQL,
    JOB_COLUMNS_SQL,
    ONE_SELECTION,
    RETRY_TAKEN,
    RescueSweep,
    candidates_sql,
    run_sweep,
)

log = logging.getLogger(__name__)


NAME = "canonical_drain"
#: The plane label in this module's log lines.
PLANE = "canonical plane"

# Where the canonical backlog stands and who can still run it. A runtime is
# live while its last snapshot is younger than three snapshot intervals, at
# least 30 s (the window awa.storage_finalize() applies). Finalize waits for
# live runtimes of the capabilities in :blockers (see FINALIZE_BLOCKERS); runtimes
# that can run canonical work are the canonical and drain-only ones, plus any
# canonical_drain runtime whose last snapshot predates the flip (it then
# still says queue_storage).
DRAIN_STATUS_SQL = Statement("""
    WITH live_runtime AS (
        SELECT storage_capability, transition_role
        FROM awa.runtime_instances AS runtime
        WHERE runtime.last_seen_at + make_interval(
                secs => GREATEST(((GREATEST(runtime.snapshot_interval_ms, 1000) / 1000) * 3)::int, 30)
              ) >= now()
    )
    SELECT
        awa.canonical_live_backlog() AS backlog,
        (SELECT count(*) FROM awa.jobs_hot WHERE state = 'available') AS available,
        (SELECT count(*) FROM awa.jobs_hot WHERE state = 'running') AS running,
        (SELECT count(*) FROM awa.jobs_hot WHERE state = 'waiting_external') AS waiting,
        (SELECT count(*) FROM awa.scheduled_jobs) AS deferred,
        (SELECT count(*) FROM awa.scheduled_jobs WHERE run_at <= now()) AS deferred_due,
        (SELECT min(run_at) FROM awa.scheduled_jobs) AS next_due_at,
        (
            SELECT count(*) FROM live_runtime WHERE storage_capability = ANY(:blockers::text[])
        ) AS live_drain_runtimes,
        (
            SELECT count(*) FROM live_runtime
            WHERE storage_capability IN ('canonical', 'canonical_drain_only')
               OR transition_role = 'canonical_drain'
        ) AS canonical_runners
""")

RunOnce = Callable[[MaintenanceContext], Awaitable[Any]]

# The drain's rescue of running canonical rows: locked candidates whose last
# attempt this was fail in place (failed rows live in jobs_hot); the others
# leave jobs_hot for scheduled_jobs as retryable, exactly as the canonical
# rescue moves them (rescue.RETRY_TAKEN, run_at kept). Heartbeat, deadline and
# every callback column are cleared and one error entry (:error) appended
# either way. {predicate} is the canonical rescue's (with its parameters);
# {selection} is the batch or one id.
_DRAIN_RESCUE_TEMPLATE = """
    WITH candidates AS (
        SELECT id, attempt >= max_attempts AS exhausted
        FROM awa.jobs_hot
        WHERE {predicate}
          {selection}
        FOR UPDATE SKIP LOCKED
    ),
    failed AS (
        UPDATE awa.jobs_hot AS hot
        SET state = 'failed',
            finalized_at = now(),
            heartbeat_at = NULL,
            deadline_at = NULL,
            callback_id = NULL,
            callback_timeout_at = NULL,
            callback_filter = NULL,
            callback_on_complete = NULL,
            callback_on_fail = NULL,
            callback_transform = NULL,
            errors = hot.errors || jsonb_build_object(
                'error', :error::text, 'attempt', hot.attempt, 'at', now())
        FROM candidates
        WHERE hot.id = candidates.id
          AND candidates.exhausted
        RETURNING {hot_columns}
    ),
    taken AS (
        DELETE FROM awa.jobs_hot AS hot
        USING candidates
        WHERE hot.id = candidates.id
          AND NOT candidates.exhausted
        RETURNING hot.*
    ),
    retried AS (
    {retry_taken}
    )
    SELECT * FROM failed
    UNION ALL
    SELECT * FROM retried
"""


#: Cancel notices of canonical attempts, except those whose (id, lease) a
#: queue-storage attempt also has (module docstring).
CANONICAL_PLANE_NOTICES_SQL = Statement(
    CANCEL_NOTICES(
        unless="""NOT EXISTS (
            SELECT 1 FROM {schema}.leases AS lease
            WHERE lease.job_id = attempt.job_id AND lease.run_lease = attempt.run_lease
        )
        AND NOT EXISTS (
            SELECT 1 FROM {schema}.lease_claims AS claims
            WHERE claims.job_id = attempt.job_id AND claims.run_lease = attempt.run_lease
        )
        AND NOT EXISTS (
            SELECT 1
            FROM {schema}.lease_claim_batches AS claim_batches
            CROSS JOIN LATERAL unnest(claim_batches.job_ids, claim_batches.run_leases)
                AS items(job_id, run_lease)
            WHERE claim_batches.job_ids @> ARRAY[attempt.job_id]
              AND items.job_id = attempt.job_id
              AND items.run_lease = attempt.run_lease
        )"""
    )
)


def drain_rescue_sweep(canonical: RescueSweep, *, predicate: str, order_by: str) -> RescueSweep:
    """``canonical``'s sweep with the drain's statements (same name, metric,
    reason, error entries and unique-claim fallback)."""
    retry_taken = RETRY_TAKEN(columns=JOB_COLUMNS_SQL)

    def statement(selection: str) -> Statement:
        return Statement(
            _DRAIN_RESCUE_TEMPLATE,
            predicate=predicate,
            selection=selection,
            hot_columns=HOT_COLUMNS_SQL,
            retry_taken=retry_taken,
        )

    return dataclasses.replace(
        canonical,
        batch_sql=statement(BATCH_SELECTION(order_by=order_by)),
        one_sql=statement(ONE_SELECTION),
        candidates_sql=candidates_sql(predicate, order_by),
        cancel_notices_sql=CANONICAL_PLANE_NOTICES_SQL,
    )


# :staleness in seconds (as the canonical heartbeat rescue).
HEARTBEAT_SWEEP = drain_rescue_sweep(
    rescue_heartbeats.SWEEP, predicate=rescue_heartbeats.PREDICATE, order_by=rescue_heartbeats.ORDER_BY
)
DEADLINE_SWEEP = drain_rescue_sweep(
    rescue_deadlines.SWEEP, predicate=rescue_deadlines.PREDICATE, order_by=rescue_deadlines.ORDER_BY
)


async def rescue_stale_heartbeats(ctx: MaintenanceContext) -> RescueResult:
    return await run_sweep(ctx, HEARTBEAT_SWEEP, staleness=float(ctx.config.heartbeat_staleness))


async def rescue_expired_deadlines(ctx: MaintenanceContext) -> RescueResult:
    return await run_sweep(ctx, DEADLINE_SWEEP)


def drain_pass(name: str, canonical_run_once: RunOnce) -> RunOnce:
    """A canonical branch body run as the drain of the canonical plane."""

    async def run_once(ctx: MaintenanceContext) -> Any:
        result = await canonical_run_once(ctx)
        _log_pass(name, result)
        return result

    run_once.__name__ = f"{name}_canonical_drain"
    run_once.__qualname__ = run_once.__name__
    return run_once


def _log_pass(name: str, result: Any) -> None:
    """A plane-labelled line with the canonical ids touched (they collide
    with queue-storage ids, so a bare id would be ambiguous)."""
    rescued = getattr(result, "rescued", None) or []
    cancelled = getattr(result, "duplicates_cancelled", None) or []
    retried = [job for job in rescued if job.state != "failed"]
    failed = [job for job in rescued if job.state == "failed"]
    if retried:
        log.info("%s: %s: rescued canonical jobs %s", name, PLANE, _ids(retried))
    if failed:
        log.warning(
            "%s: %s: canonical jobs %s were on their last attempt; failed them", name, PLANE, _ids(failed)
        )
    if cancelled:
        log.info("%s: %s: cancelled canonical duplicates %s", name, PLANE, _ids(cancelled))
    promoted = getattr(result, "promoted", None) or {}
    if any(promoted.values()):
        counts = ", ".join(f"{count} {state}" for state, count in promoted.items() if count)
        log.info("%s: %s: promoted %s canonical jobs to available", name, PLANE, counts)


def _ids(jobs: list[Any], limit: int = 20) -> str:
    shown = ", ".join(str(job.id) for job in jobs[:limit])
    return shown + (f" (+{len(jobs) - limit} more)" if len(jobs) > limit else "")


async def delete_finished_canonical_jobs(
    ctx: MaintenanceContext,
) -> canonical_cleanup.CleanupResult:
    """Finished canonical rows past retention (queue storage's cleanup owns
    snapshots, descriptors and batch operations)."""
    result = canonical_cleanup.CleanupResult()
    await canonical_cleanup.delete_expired_jobs(ctx, result)
    return result


@dataclasses.dataclass(frozen=True)
class DrainStatus:
    backlog: int
    available: int
    running: int
    waiting: int
    deferred: int
    deferred_due: int
    next_due_at: Any
    #: Live runtimes that keep awa.storage_finalize() waiting (FINALIZE_BLOCKERS).
    live_drain_runtimes: int
    #: Live runtimes that claim canonical work.
    canonical_runners: int

    @property
    def stranded(self) -> int:
        """Canonical jobs ready to run that no live runtime can claim."""
        if self.canonical_runners:
            return 0
        return self.available + self.deferred_due

    @property
    def summary(self) -> tuple[int, ...]:
        """What changes a report line (next_due_at alone does not)."""
        return (
            self.backlog,
            self.available,
            self.running,
            self.waiting,
            self.deferred,
            self.live_drain_runtimes,
            self.canonical_runners,
        )


async def read_drain_status(ctx: MaintenanceContext) -> DrainStatus:
    blockers = FINALIZE_BLOCKERS.get(ctx.schema.version, FINALIZE_BLOCKERS[39])
    row = await ctx.db.fetchone(*DRAIN_STATUS_SQL.bind(blockers=list(blockers)))
    return DrainStatus(
        **{
            field: row[field]
            for field in (
                "backlog",
                "available",
                "running",
                "waiting",
                "deferred",
                "deferred_due",
                "next_due_at",
                "live_drain_runtimes",
                "canonical_runners",
            )
        }
    )


def make_report() -> RunOnce:
    """The ``canonical_drain`` branch body for one leader term: reports the
    canonical backlog when it changes, and warns on every pass while due
    canonical work has no live drain runtime."""
    last: list[tuple[int, ...] | None] = [None]

    async def run_once(ctx: MaintenanceContext) -> DrainStatus:
        status = await read_drain_status(ctx)
        if status.stranded:
            log.warning(
                "%s: %d canonical jobs are due but no canonical_drain runtime is live to run "
                "them; start one (storage_transition_role='canonical_drain'): until then they "
                "wait and awa.storage_finalize() cannot pass",
                NAME,
                status.stranded,
            )
        if status.summary != last[0]:  # one line per change, not per pass
            last[0] = status.summary
            _log_status(status)
        return status

    return run_once


def _log_status(status: DrainStatus) -> None:
    if status.backlog:
        log.info(
            "%s: %d live canonical jobs (%d available, %d running, %d waiting for callbacks, "
            "%d scheduled or retryable, next due %s); %d live runtimes run canonical work",
            NAME,
            status.backlog,
            status.available,
            status.running,
            status.waiting,
            status.deferred,
            status.next_due_at,
            status.canonical_runners,
        )
    elif status.live_drain_runtimes:
        log.info(
            "%s: canonical plane drained; awa.storage_finalize() passes once the %d live "
            "runtimes it waits for stop and their last snapshots age out (30 s at least)",
            NAME,
            status.live_drain_runtimes,
        )
    else:
        log.info(
            "%s: canonical plane drained and no runtime finalize waits for is live: "
            "awa.storage_finalize() can pass",
            NAME,
        )


def report_branch(config: MaintenanceConfig) -> BranchSpec:
    """The ``canonical_drain`` branch for one term. Read-only, so it shares
    the queue-stats cadence (a report, like them)."""
    return BranchSpec(NAME, config.queue_stats_interval, make_report(), run_immediately=True)


def drain_passes() -> DrainPasses:
    """What the canonical plane still needs while it drains: promotion and
    the three rescues (otherwise rows are stranded; the heartbeat and
    deadline rescues fail exhausted attempts here), the deletion of finished
    canonical rows, and the report."""
    return DrainPasses(
        promote=drain_pass(promote.NAME, promote.run_once),
        rescue_heartbeats=drain_pass(rescue_heartbeats.NAME, rescue_stale_heartbeats),
        rescue_deadlines=drain_pass(rescue_deadlines.NAME, rescue_expired_deadlines),
        rescue_callbacks=drain_pass(rescue_callbacks.NAME, rescue_callbacks.run_once),
        cleanup=delete_finished_canonical_jobs,
        report=report_branch,
    )
