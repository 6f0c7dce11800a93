"""OpenTelemetry instruments, with Awa's names, units and attributes
so existing Awa dashboards keep working.

Uses the global meter provider unless one is passed in (tests pass an SDK
provider with an in-memory reader).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping

from opentelemetry import metrics as otel_metrics

from .engines import states

METER_NAME = "awa"

# Metric names (awa-metrics v0.6.1 `names`).
MAINTENANCE_RESCUES = "awa.maintenance.rescues"
MAINTENANCE_PROMOTE_BATCHES = "awa.maintenance.promote_batches"
MAINTENANCE_PROMOTE_BATCH_SIZE = "awa.maintenance.promote_batch_size"
MAINTENANCE_PROMOTE_DURATION = "awa.maintenance.promote_duration"
MAINTENANCE_BRANCH_DURATION = "awa.maintenance.branch.duration"
MAINTENANCE_BRANCH_OVERRUN = "awa.maintenance.branch.overrun"
MAINTENANCE_ROTATE_ATTEMPTS = "awa.maintenance.rotate.attempts"
MAINTENANCE_ROTATE_SKIPPED_ROWS = "awa.maintenance.rotate.skipped_rows"
MAINTENANCE_PRUNE_ATTEMPTS = "awa.maintenance.prune.attempts"
MAINTENANCE_PRUNE_SKIPPED_ROWS = "awa.maintenance.prune.skipped_rows"
# Awa main (0.7.0-alpha, #442): successful prunes, by ring and phase.
MAINTENANCE_PRUNE_DURATION = "awa.maintenance.prune.duration"
RING_CURRENT_SLOT = "awa.ring.current_slot"
RING_GENERATION = "awa.ring.generation"
QUEUE_DEPTH = "awa.queue.depth"
QUEUE_LAG = "awa.queue.lag"
QUEUE_INFO = "awa.queue.info"
JOB_KIND_INFO = "awa.job_kind.info"
# In Awa, every queue-storage-capable runtime's snapshot tick publishes these.
STORAGE_STATE = "awa.storage.state"
STORAGE_TRANSITION_READY = "awa.storage.transition_ready"
STORAGE_CANONICAL_LIVE_BACKLOG = "awa.storage.canonical_live_backlog"
STORAGE_LIVE_RUNTIME_CAPABILITY = "awa.storage.live_runtime_capability"
JOB_DLQ_MOVED = "awa.job.dlq_moved"
JOB_DLQ_PURGED = "awa.job.dlq_purged"
JOB_DLQ_DEPTH = "awa.job.dlq_depth"

# awa_trio's own (Prometheus: awa_trio_leader, awa_trio_term_started_seconds,
# awa_trio_branch_errors_total, awa_trio_branch_yields_total).
TRIO_LEADER = "awa_trio.leader"
TRIO_TERM_STARTED = "awa_trio.term_started"
TRIO_BRANCH_ERRORS = "awa_trio.branch.errors"
TRIO_BRANCH_YIELDS = "awa_trio.branch.yields"
TRIO_BRANCH_PAUSED = "awa_trio.branch.paused"
TRIO_CONFIG_GENERATION = "awa_trio.config.generation"
TRIO_PROMOTE_LATENESS = "awa_trio.promote.lateness"

# Attribute keys.
ATTR_BRANCH = "awa.maintenance.branch"
ATTR_RESCUE_KIND = "awa.rescue.kind"
ATTR_JOB_STATE = "awa.job.state"
ATTR_JOB_QUEUE = "awa.job.queue"
ATTR_JOB_KIND = "awa.job.kind"
ATTR_DLQ_REASON = "awa.dlq.reason"
ATTR_RING = "awa.ring"
ATTR_RING_OUTCOME = "awa.ring.outcome"
ATTR_RING_BLOCKER = "awa.ring.blocker"
ATTR_RING_REASON = "awa.ring.reason"
ATTR_MAINTENANCE_PHASE = "awa.maintenance.phase"
ATTR_STORAGE_STATE = "awa.storage.state"
ATTR_STORAGE_CURRENT_ENGINE = "awa.storage.current_engine"
ATTR_STORAGE_ACTIVE_ENGINE = "awa.storage.active_engine"
ATTR_STORAGE_PREPARED_ENGINE = "awa.storage.prepared_engine"
ATTR_STORAGE_ACTION = "awa.storage.action"
ATTR_STORAGE_CAPABILITY = "awa.storage.capability"

#: awa.storage.transition_ready's actions.
ACTION_ENTER_MIXED_TRANSITION = "enter_mixed_transition"
ACTION_FINALIZE = "finalize"
#: Capabilities awa.storage.live_runtime_capability always reports (0 when
#: none): Awa's runtime vocabulary, kept with the state-to-engine map.
STORAGE_CAPABILITIES = states.STORAGE_CAPABILITIES
#: Phases of awa.maintenance.prune.duration, in the order they run.
PRUNE_PHASES = ("lock", "truncate", "commit")

DURATION_BUCKETS_SECONDS = (
    0.001,
    0.005,
    0.010,
    0.025,
    0.050,
    0.100,
    0.250,
    0.500,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)
#: Buckets of awa_trio.promote.lateness: milliseconds when on time, up to a
#: poll interval and beyond when not.
LATENESS_BUCKETS_SECONDS = (0.001, 0.0025, 0.005, 0.010, 0.025, 0.050, 0.100, 0.250, 0.5, 1.0, 5.0, 30.0)


@dataclasses.dataclass(frozen=True)
class InfoSnapshot:
    """What the descriptor and storage gauges report, as queue_stats last
    read it (see :mod:`awa_trio.engines.queue_info`). Observed, never pushed: only
    the latest label sets are reported, and only in the term that read them."""

    state: str
    current_engine: str
    active_engine: str
    prepared_engine: str | None
    #: ``awa.canonical_live_backlog()``; 0 without reading it on finalised
    #: queue storage (see ``canonical_backlog_read``).
    canonical_live_backlog: int
    canonical_backlog_read: bool
    enter_mixed_transition_ready: bool
    finalize_ready: bool
    #: Live runtimes per storage capability (every STORAGE_CAPABILITIES key).
    live_runtime_capability: Mapping[str, int]
    #: Attributes of one awa.job_kind.info series per declared job kind.
    job_kinds: tuple[Mapping[str, str], ...] = ()
    #: The leadership term (its start time) that read it; set by the metrics.
    term: float | None = None


class MaintenanceMetrics:
    """Every instrument the maintenance leader records."""

    def __init__(self, meter_provider: otel_metrics.MeterProvider | None = None):
        meter = otel_metrics.get_meter(METER_NAME, meter_provider=meter_provider)
        self.rescues = meter.create_counter(
            MAINTENANCE_RESCUES, unit="{job}", description="Number of jobs rescued by maintenance"
        )
        self.promote_batches = meter.create_counter(
            MAINTENANCE_PROMOTE_BATCHES,
            unit="{batch}",
            description="Number of scheduled/retryable promotion batches",
        )
        self.promote_batch_size = meter.create_histogram(
            MAINTENANCE_PROMOTE_BATCH_SIZE, unit="{job}", description="Promotion batch size"
        )
        self.promote_duration = meter.create_histogram(
            MAINTENANCE_PROMOTE_DURATION, unit="s", description="Promotion batch duration"
        )
        self.branch_duration = meter.create_histogram(
            MAINTENANCE_BRANCH_DURATION,
            unit="s",
            description="Per-branch wall-clock duration of a maintenance branch body",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS_SECONDS,
        )
        self.branch_overrun = meter.create_counter(
            MAINTENANCE_BRANCH_OVERRUN,
            unit="{episode}",
            description="Maintenance branch overrun episodes: a branch fired after its "
            "previous run exceeded its tick interval",
        )
        self.queue_depth = meter.create_gauge(
            QUEUE_DEPTH, unit="{job}", description="Current number of jobs per queue and state"
        )
        self.queue_lag = meter.create_gauge(
            QUEUE_LAG, unit="s", description="Age of the oldest available job per queue"
        )
        self.rotate_attempts = meter.create_counter(
            MAINTENANCE_ROTATE_ATTEMPTS,
            unit="{attempt}",
            description="Ring rotation attempts by ring/outcome/blocker",
        )
        self.rotate_skipped_rows = meter.create_histogram(
            MAINTENANCE_ROTATE_SKIPPED_ROWS,
            unit="{row}",
            description="Rows in the busy slot that blocked a ring rotation",
        )
        self.prune_attempts = meter.create_counter(
            MAINTENANCE_PRUNE_ATTEMPTS,
            unit="{attempt}",
            description="Ring prune attempts by ring/outcome/reason",
        )
        self.prune_skipped_rows = meter.create_histogram(
            MAINTENANCE_PRUNE_SKIPPED_ROWS,
            unit="{row}",
            description="Magnitude of the reason count on a SkippedActive prune",
        )
        self.prune_duration = meter.create_histogram(
            MAINTENANCE_PRUNE_DURATION,
            unit="s",
            description="Successful ring prune latency by ring and database phase (lock/truncate/commit)",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS_SECONDS,
        )
        self.ring_current_slot = meter.create_gauge(
            RING_CURRENT_SLOT,
            unit="{slot}",
            description="Current slot index per ring (queue/lease/claim)",
        )
        self.ring_generation = meter.create_gauge(
            RING_GENERATION,
            unit="{generation}",
            description="Current ring generation per ring; derivative is rotations/sec",
        )
        self.queue_info = meter.create_gauge(
            QUEUE_INFO,
            unit="1",
            description="Declared queue descriptor (always 1); labels carry display name, owner, tags",
        )
        self.dlq_moved = meter.create_counter(
            JOB_DLQ_MOVED, unit="{job}", description="Number of jobs moved into the Dead Letter Queue"
        )
        self.dlq_purged = meter.create_counter(
            JOB_DLQ_PURGED, unit="{job}", description="Number of DLQ rows deleted"
        )
        self.dlq_depth = meter.create_gauge(
            JOB_DLQ_DEPTH, unit="{job}", description="Current Dead Letter Queue depth per queue"
        )
        self.branch_errors = meter.create_counter(
            TRIO_BRANCH_ERRORS,
            unit="{error}",
            description="Branch bodies that failed (database error, timeout or crash), by branch",
        )
        self.promote_lateness = meter.create_histogram(
            TRIO_PROMOTE_LATENESS,
            unit="s",
            description="Seconds from a job's run_at to its promotion (batches), by state",
            explicit_bucket_boundaries_advisory=LATENESS_BUCKETS_SECONDS,
        )
        self.branch_yields = meter.create_counter(
            TRIO_BRANCH_YIELDS,
            unit="{yield}",
            description="Branch bodies that gave up a lock wait after statement_lock_timeout "
            "(someone else's lock, e.g. an operator's DDL) and retry at the next tick, by branch",
        )
        #: Set by the service: () -> (is_leader, unix time the term started or None).
        self._leadership: Callable[[], tuple[bool, float | None]] | None = None
        meter.create_observable_gauge(
            TRIO_LEADER,
            callbacks=[self._observe_leader],
            unit="1",
            description="1 while this awa_trio process holds the maintenance lock, else 0",
        )
        meter.create_observable_gauge(
            TRIO_TERM_STARTED,
            callbacks=[self._observe_term_start],
            unit="s",
            description="Unix time the current leadership term started (absent while following)",
        )
        #: Set by the service: () -> (config generation, paused per running
        #: branch), or None while following.
        self._live_settings: Callable[[], tuple[int, dict[str, bool]] | None] | None = None
        meter.create_observable_gauge(
            TRIO_BRANCH_PAUSED,
            callbacks=[self._observe_paused],
            unit="1",
            description="1 while an operator has paused this branch on the leader, 0 while it runs",
        )
        meter.create_observable_gauge(
            TRIO_CONFIG_GENERATION,
            callbacks=[self._observe_generation],
            unit="1",
            description="Generation of the settings in force on the leader (1 at start, +1 per reload)",
        )
        #: Read by the observable gauges below; replaced by queue_stats.
        self._info_snapshot: InfoSnapshot | None = None
        meter.create_observable_gauge(
            JOB_KIND_INFO,
            callbacks=[self._observe_job_kind_info],
            unit="{kind}",
            description="Declared job-kind descriptors (always 1; use as a label-join target)",
        )
        meter.create_observable_gauge(
            STORAGE_STATE,
            callbacks=[self._observe_storage_state],
            unit="{state}",
            description="Current storage transition state and engine combination (always 1)",
        )
        meter.create_observable_gauge(
            STORAGE_TRANSITION_READY,
            callbacks=[self._observe_transition_ready],
            unit="{state}",
            description="Storage transition readiness by action (1 = ready, 0 = blocked)",
        )
        meter.create_observable_gauge(
            STORAGE_CANONICAL_LIVE_BACKLOG,
            callbacks=[self._observe_canonical_live_backlog],
            unit="{job}",
            description="Current canonical live backlog during a storage transition",
        )
        meter.create_observable_gauge(
            STORAGE_LIVE_RUNTIME_CAPABILITY,
            callbacks=[self._observe_live_runtime_capability],
            unit="{runtime}",
            description="Current live runtime count by reported storage capability",
        )
        # A synchronous gauge reports its last value until told otherwise, so
        # a queue that drained or vanished would show its old lag or depth
        # forever (and an alert on it would never clear). These remember what
        # was published, to set it back to zero.
        self._queues_with_depth: set[str] = set()
        self._queues_with_lag: set[str] = set()

    def record_branch_duration(self, branch: str, seconds: float) -> None:
        self.branch_duration.record(seconds, {ATTR_BRANCH: branch})

    def record_branch_error(self, branch: str) -> None:
        self.branch_errors.add(1, {ATTR_BRANCH: branch})

    def record_branch_yield(self, branch: str) -> None:
        self.branch_yields.add(1, {ATTR_BRANCH: branch})

    def observe_leadership(self, source: Callable[[], tuple[bool, float | None]]) -> None:
        self._leadership = source

    def _observe_leader(self, options: object) -> Iterable[otel_metrics.Observation]:
        if self._leadership is None:
            return []
        return [otel_metrics.Observation(1 if self._leadership()[0] else 0)]

    def _observe_term_start(self, options: object) -> Iterable[otel_metrics.Observation]:
        if self._leadership is None:
            return []
        leading, started = self._leadership()
        return [otel_metrics.Observation(started)] if leading and started else []

    def observe_live_settings(self, source: Callable[[], tuple[int, dict[str, bool]] | None]) -> None:
        self._live_settings = source

    def _observe_paused(self, options: object) -> Iterable[otel_metrics.Observation]:
        reading = self._live_settings() if self._live_settings is not None else None
        if reading is None:
            return []
        return [
            otel_metrics.Observation(1 if paused else 0, {ATTR_BRANCH: branch})
            for branch, paused in reading[1].items()
        ]

    def _observe_generation(self, options: object) -> Iterable[otel_metrics.Observation]:
        reading = self._live_settings() if self._live_settings is not None else None
        return [] if reading is None else [otel_metrics.Observation(reading[0])]

    # -- descriptor and storage snapshot (observable gauges) -------------------

    def set_info_snapshot(self, snapshot: InfoSnapshot | None) -> None:
        """Replace what the job-kind and storage gauges report. Stamped with
        the current term: reported only while that term leads. Read outside
        a term (the lock was lost meanwhile), it is dropped."""
        if snapshot is not None and self._leadership is not None:
            leading, started = self._leadership()
            snapshot = dataclasses.replace(snapshot, term=started) if leading else None
        self._info_snapshot = snapshot

    def clear_info_snapshot(self) -> None:
        self._info_snapshot = None

    def info_snapshot(self) -> InfoSnapshot | None:
        """The snapshot to report now: none unless the term that read it
        still leads (any snapshot, without a leadership source)."""
        snapshot = self._info_snapshot
        if snapshot is None or self._leadership is None:
            return snapshot
        leading, started = self._leadership()
        return snapshot if leading and started == snapshot.term else None

    def _observe_job_kind_info(self, options: object) -> Iterable[otel_metrics.Observation]:
        snapshot = self.info_snapshot()
        if snapshot is None:
            return []
        return [otel_metrics.Observation(1, dict(attributes)) for attributes in snapshot.job_kinds]

    def _observe_storage_state(self, options: object) -> Iterable[otel_metrics.Observation]:
        snapshot = self.info_snapshot()
        if snapshot is None:
            return []
        attributes = {
            ATTR_STORAGE_STATE: snapshot.state,
            ATTR_STORAGE_CURRENT_ENGINE: snapshot.current_engine,
            ATTR_STORAGE_ACTIVE_ENGINE: snapshot.active_engine,
        }
        if snapshot.prepared_engine is not None:  # Awa's own report leaves the label out then
            attributes[ATTR_STORAGE_PREPARED_ENGINE] = snapshot.prepared_engine
        return [otel_metrics.Observation(1, attributes)]

    def _observe_transition_ready(self, options: object) -> Iterable[otel_metrics.Observation]:
        snapshot = self.info_snapshot()
        if snapshot is None:
            return []
        return [
            otel_metrics.Observation(
                int(snapshot.enter_mixed_transition_ready),
                {ATTR_STORAGE_ACTION: ACTION_ENTER_MIXED_TRANSITION},
            ),
            otel_metrics.Observation(int(snapshot.finalize_ready), {ATTR_STORAGE_ACTION: ACTION_FINALIZE}),
        ]

    def _observe_canonical_live_backlog(self, options: object) -> Iterable[otel_metrics.Observation]:
        snapshot = self.info_snapshot()
        if snapshot is None:
            return []
        return [otel_metrics.Observation(snapshot.canonical_live_backlog)]

    def _observe_live_runtime_capability(self, options: object) -> Iterable[otel_metrics.Observation]:
        snapshot = self.info_snapshot()
        if snapshot is None:
            return []
        return [
            otel_metrics.Observation(count, {ATTR_STORAGE_CAPABILITY: capability})
            for capability, count in snapshot.live_runtime_capability.items()
        ]

    def record_branch_overrun(self, branch: str) -> None:
        self.branch_overrun.add(1, {ATTR_BRANCH: branch})

    def record_promotion_batch(self, state: str, batch_size: int, seconds: float) -> None:
        attributes = {ATTR_JOB_STATE: state}
        self.promote_batches.add(1, attributes)
        self.promote_batch_size.record(batch_size, attributes)
        self.promote_duration.record(seconds, attributes)

    def record_promotion_lateness(self, state: str, seconds: Iterable[float]) -> None:
        attributes = {ATTR_JOB_STATE: state}
        for value in seconds:
            self.promote_lateness.record(value, attributes)

    def record_rescues(self, kind: str, count: int) -> None:
        if count:
            self.rescues.add(count, {ATTR_RESCUE_KIND: kind})

    def record_queue_depth(self, queue: str, depth: dict[str, int]) -> None:
        self._queues_with_depth.add(queue)
        for state, count in depth.items():
            self.queue_depth.set(count, {ATTR_JOB_QUEUE: queue, ATTR_JOB_STATE: state})

    def record_queue_info(
        self,
        queue: str,
        display_name: str | None,
        description: str | None,
        owner: str | None,
        docs_url: str | None,
        tags: list[str],
    ) -> None:
        """Awa's attribute set: only the fields a descriptor declares."""
        attributes = {ATTR_JOB_QUEUE: queue}
        for key, value in (
            ("awa.queue.display_name", display_name),
            ("awa.queue.description", description),
            ("awa.queue.owner", owner),
            ("awa.queue.docs_url", docs_url),
        ):
            if value:
                attributes[key] = value
        if tags:
            attributes["awa.queue.tags"] = ",".join(tags)
        self.queue_info.set(1, attributes)

    def record_queue_lag(self, queue: str, seconds: float | None) -> None:
        """``None``: nothing available. As in Awa, a queue that never had
        a lag reports none; one that had reports 0 once it drains."""
        if seconds is None:
            if queue in self._queues_with_lag:
                self.queue_lag.set(0.0, {ATTR_JOB_QUEUE: queue})
            return
        self._queues_with_lag.add(queue)
        self.queue_lag.set(seconds, {ATTR_JOB_QUEUE: queue})

    def zero_vanished_queues(self, current: set[str], states: tuple[str, ...]) -> set[str]:
        """Set depth and lag of queues published before but absent from
        ``current`` to zero, once; returns those queues."""
        vanished = (self._queues_with_depth | self._queues_with_lag) - current
        for queue in vanished:
            if queue in self._queues_with_depth:
                self.record_queue_depth(queue, dict.fromkeys(states, 0))
            self.record_queue_lag(queue, None)
        self._queues_with_depth -= vanished
        self._queues_with_lag -= vanished
        return vanished

    # -- queue storage -------------------------------------------------------

    def record_rotate_rotated(self, ring: str, slot: int, generation: int) -> None:
        self.rotate_attempts.add(
            1, {ATTR_RING: ring, ATTR_RING_OUTCOME: "rotated", ATTR_RING_BLOCKER: "none"}
        )
        self.ring_current_slot.set(slot, {ATTR_RING: ring})
        self.ring_generation.set(generation, {ATTR_RING: ring})

    def record_rotate_skipped_busy(self, ring: str, blockers: dict[str, int]) -> None:
        """One attempt per non-zero blocker (``queue.ready_rows``, ``lease.rows``,
        ...), as Awa records them, so a sum by blocker works; ``lost_cas`` when none."""
        emitted = False
        for blocker, count in blockers.items():
            if count > 0:
                emitted = True
                attributes = {ATTR_RING: ring, ATTR_RING_OUTCOME: "skipped_busy", ATTR_RING_BLOCKER: blocker}
                self.rotate_attempts.add(1, attributes)
                self.rotate_skipped_rows.record(count, attributes)
        if not emitted:
            self.rotate_attempts.add(
                1, {ATTR_RING: ring, ATTR_RING_OUTCOME: "skipped_busy", ATTR_RING_BLOCKER: "lost_cas"}
            )

    def record_prune(
        self,
        ring: str,
        outcome: str,
        reason: str | None = None,
        count: int | None = None,
        phase_seconds: Mapping[str, float] | None = None,
    ) -> None:
        """``outcome``: noop, pruned, blocked or skipped_active (with reason and
        count). ``phase_seconds`` (lock, truncate, commit) of a pruned one go
        to awa.maintenance.prune.duration, as Awa main records them."""
        attributes = {ATTR_RING: ring, ATTR_RING_OUTCOME: outcome, ATTR_RING_REASON: reason or "none"}
        self.prune_attempts.add(1, attributes)
        if count is not None:
            self.prune_skipped_rows.record(count, attributes)
        if outcome == "pruned" and phase_seconds:
            for phase in PRUNE_PHASES:
                if phase in phase_seconds:
                    self.prune_duration.record(
                        phase_seconds[phase], {ATTR_RING: ring, ATTR_MAINTENANCE_PHASE: phase}
                    )

    def record_dlq_moved(self, kind: str, queue: str, reason: str, count: int = 1) -> None:
        if count:
            self.dlq_moved.add(count, {ATTR_JOB_KIND: kind, ATTR_JOB_QUEUE: queue, ATTR_DLQ_REASON: reason})

    def record_dlq_purged(self, queue: str | None, count: int) -> None:
        if count:
            self.dlq_purged.add(count, {ATTR_JOB_QUEUE: queue} if queue else {})

    def record_dlq_depth(self, queue: str, count: int) -> None:
        self.dlq_depth.set(count, {ATTR_JOB_QUEUE: queue})
