"""Maintenance settings: every default of awa-worker's maintenance leader, validated once.

All durations are float seconds. Values may be given as numbers, as
``datetime.timedelta`` or as strings such as ``"250ms"``, ``"30s"``, ``"5m"``,
``"24h"``, ``"30d"``; they are normalised to seconds when the config is built.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from datetime import timedelta
from types import MappingProxyType
from typing import Any

from .errors import ConfigError

SECOND = 1.0
MINUTE = 60.0
HOUR = 3600.0
DAY = 86400.0

# Defaults of awa-worker v0.6.1 (maintenance.rs, MaintenanceService::new).
DEFAULT_LEADER_ELECTION_INTERVAL = 10 * SECOND
DEFAULT_LEADER_CHECK_INTERVAL = 30 * SECOND
DEFAULT_PROMOTE_INTERVAL = 0.25
#: Up to 100 early promotion passes a second: jobs due within 10 ms of each
#: other share a pass (bench/README.md, jobs on time).
DEFAULT_PROMOTE_MIN_GAP = 0.010
DEFAULT_HEARTBEAT_RESCUE_INTERVAL = 30 * SECOND
DEFAULT_DEADLINE_RESCUE_INTERVAL = 30 * SECOND
DEFAULT_CALLBACK_RESCUE_INTERVAL = 30 * SECOND
DEFAULT_HEARTBEAT_STALENESS = 90 * SECOND
DEFAULT_CLEANUP_INTERVAL = 60 * SECOND
DEFAULT_COMPLETED_RETENTION = 24 * HOUR
DEFAULT_FAILED_RETENTION = 72 * HOUR
DEFAULT_CLEANUP_BATCH_SIZE = 5000
DEFAULT_QUEUE_STATS_INTERVAL = 30 * SECOND
DEFAULT_DLQ_RETENTION = 30 * DAY
DEFAULT_DLQ_CLEANUP_BATCH_SIZE = 1000
DEFAULT_DIRTY_KEY_RECOMPUTE_INTERVAL = 2 * SECOND
DEFAULT_METADATA_RECONCILIATION_INTERVAL = 60 * SECOND
DEFAULT_PRIORITY_AGING_INTERVAL = 60 * SECOND
DEFAULT_BATCH_OPERATIONS_INTERVAL = 1 * SECOND
DEFAULT_TERMINAL_COUNT_ROLLUP_INTERVAL = 30 * SECOND
DEFAULT_DESCRIPTOR_RETENTION = 30 * DAY
DEFAULT_RUNTIME_SNAPSHOT_RETENTION = 24 * HOUR
#: awa-worker v0.6.1 ClientBuilder: how often a runtime refreshes its awa.runtime_instances row.
DEFAULT_RUNTIME_SNAPSHOT_INTERVAL = 10 * SECOND
DEFAULT_CRON_SYNC_INTERVAL = 60 * SECOND
DEFAULT_CRON_EVAL_INTERVAL = 1 * SECOND
DEFAULT_QUEUE_ROTATE_INTERVAL = 1 * SECOND
DEFAULT_LEASE_ROTATE_INTERVAL = 0.25
#: 0 = follow queue_rotate_interval, as awa-worker's claim rotation follows the queue cadence.
DEFAULT_CLAIM_ROTATE_INTERVAL = 0.0

# awa_trio's own settings (awa-worker has none of these).
DEFAULT_BRANCH_RESTART_LIMIT = 5
DEFAULT_BRANCH_RESTART_WINDOW = 60 * SECOND
DEFAULT_BRANCH_TIMEOUT = 300 * SECOND
DEFAULT_LOCK_TIMEOUT = 30 * SECOND
DEFAULT_STATEMENT_LOCK_TIMEOUT = 0.1
#: statement_lock_timeout must stay well below PostgreSQL's deadlock_timeout
#: (1 s by default), or the deadlock detector may pick the operator's DDL.
MAX_STATEMENT_LOCK_TIMEOUT = 0.5
DEFAULT_POOL_SIZE = 8
DEFAULT_LOCK_KEEPALIVE = 30 * SECOND
DEFAULT_HOOK_TIMEOUT = 30 * SECOND
DEFAULT_HOOK_CONCURRENCY = 16
DEFAULT_HOOK_QUEUE_SIZE = 1000
DEFAULT_RESCUE_BATCH_SIZE = 500
DEFAULT_PRIORITY_AGING_BATCH_SIZE = 1000
#: 30 s: a 1M-row cleanup backlog drains in one 60 s tick here (23.5 s); rescues (30 s
#: ticks) get 15 s.
DEFAULT_DRAIN_TIME_BUDGET = 30 * SECOND
DEFAULT_TAKEOVER_POLL_INTERVAL = 0.25

_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": MINUTE, "h": HOUR, "d": DAY, None: 1.0}


def parse_duration(value: Any, *, field: str = "duration") -> float:
    """Turn ``"250ms"``, ``"30s"``, ``"5m"``, ``"24h"``, ``"30d"``, a number of
    seconds or a ``timedelta`` into float seconds."""
    if isinstance(value, bool):
        raise ConfigError(f"{field} must be a duration, not {value!r}")
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str):
        match = _DURATION_RE.match(value)
        if not match and _DURATION_RE.match(value.strip().removeprefix("-")):
            raise ConfigError(f"{field} must not be negative, not {value!r}")
        if not match:
            raise ConfigError(
                f"{field}: cannot read {value!r} as a duration "
                "(use e.g. 250ms, 30s, 5m, 24h, 30d or plain seconds)"
            )
        seconds = float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    else:
        raise ConfigError(f"{field} must be a duration, not {type(value).__name__}")
    if not math.isfinite(seconds):
        raise ConfigError(f"{field} must be finite")
    return seconds


def format_duration(seconds: float) -> str:
    """Exact, readable spelling of a duration for ``--help`` and logs
    (days only from a week up, so 24h and 72h read as operators say them)."""
    if seconds >= 7 * DAY and seconds % DAY == 0:
        return f"{int(seconds // DAY)}d"
    for unit, size in (("h", HOUR), ("m", MINUTE), ("s", SECOND)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    if seconds < 1 and round(seconds * 1000, 6) == round(seconds * 1000):
        return f"{round(seconds * 1000)}ms"
    return f"{seconds:g}s"


def _require_positive(field: str, value: float) -> None:
    if not value > 0:
        raise ConfigError(f"{field} must be > 0")


def _require_non_negative(field: str, value: float) -> None:
    if not value >= 0:
        raise ConfigError(f"{field} must be >= 0")


def _require_count(field: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        try:
            if isinstance(value, str) and value.strip().lstrip("-").isdigit():
                value = int(value)
            else:
                raise ValueError
        except ValueError:
            raise ConfigError(f"{field} must be an integer, not {value!r}") from None
    if value <= 0:
        raise ConfigError(f"{field} must be > 0")
    count: int = value
    return count


_RETENTION_FIELDS = ("completed", "failed", "dlq")


def _retention_seconds(field: str, value: Any) -> float:
    seconds = parse_duration(value, field=field)
    _require_non_negative(field, seconds)
    return seconds


@dataclasses.dataclass(frozen=True, kw_only=True)
class RetentionPolicy:
    """Retention for one queue; overrides the global retention for that queue."""

    #: How long completed jobs are kept.
    completed: float = DEFAULT_COMPLETED_RETENTION
    #: How long failed and cancelled jobs are kept.
    failed: float = DEFAULT_FAILED_RETENTION
    #: How long dead-lettered jobs are kept (queue storage); None uses the global value.
    dlq: float | None = None

    def __post_init__(self) -> None:
        for name in _RETENTION_FIELDS:
            value = getattr(self, name)
            if name == "dlq" and value is None:
                continue
            object.__setattr__(self, name, _retention_seconds(f"retention.{name}", value))


def retention_policy_from(values: Mapping[str, Any], *, field: str) -> RetentionPolicy:
    """A RetentionPolicy from a mapping (TOML table, dict, flag), with errors
    prefixed by ``field`` so they say which queue is wrong."""
    for name in values:
        if name not in _RETENTION_FIELDS:
            raise ConfigError(f"{field}: unknown retention setting {name!r} (use completed, failed, dlq)")
    settings: dict[str, Any] = {
        name: None if name == "dlq" and value is None else _retention_seconds(f"{field}.{name}", value)
        for name, value in values.items()
    }
    return RetentionPolicy(**settings)


def _require_switch(field: str, value: Any) -> bool:
    # A string such as "no" is truthy: accepting it would silently mean "on".
    if not isinstance(value, bool):
        raise ConfigError(f"{field} must be true or false, got {value!r}")
    return value


@dataclasses.dataclass(frozen=True, kw_only=True)
class DlqPolicy:
    """Whether jobs that fail terminally go to the dead-letter queue (queue storage)."""

    #: Applies to queues without an override.
    enabled_default: bool = False
    #: Per-queue on/off overrides.
    overrides: Mapping[str, bool] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        _require_switch("dlq_policy.enabled_default", self.enabled_default)
        if not isinstance(self.overrides, Mapping):
            raise ConfigError("dlq_policy.overrides must map queue names to true or false")
        for queue, enabled in self.overrides.items():
            if not isinstance(queue, str) or not queue:
                raise ConfigError("dlq_policy.overrides keys must be queue names")
            _require_switch(f"dlq_policy.overrides[{queue!r}]", enabled)
        object.__setattr__(self, "overrides", MappingProxyType(dict(self.overrides)))

    def enabled_for(self, queue: str) -> bool:
        return self.overrides.get(queue, self.enabled_default)


INTERVAL = "interval"  # a duration that must be > 0
RETENTION = "retention"  # a duration that may be 0
COUNT = "count"  # a positive integer


def setting(default: Any, kind: str, help: str, *, factory: Any = None) -> Any:
    """A config field; its help text and kind drive validation, --help and env vars."""
    metadata = {"kind": kind, "help": help}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


@dataclasses.dataclass(frozen=True, kw_only=True)
class MaintenanceConfig:
    """Every knob of the maintenance leader. Field names follow awa-worker's
    ``MaintenanceService`` so flags and docs map one to one."""

    # Leadership.
    leader_election_interval: float = setting(
        DEFAULT_LEADER_ELECTION_INTERVAL,
        INTERVAL,
        "Ceiling of the wait after a failed election attempt or leadership term (errors retry "
        "after 100 ms, doubling up to 1 s or this, whichever is shorter; healthy followers poll "
        "every takeover_poll_interval); a node that gave up leadership stays out twice this.",
    )
    leader_check_interval: float = setting(
        DEFAULT_LEADER_CHECK_INTERVAL, INTERVAL, "How often the leader verifies it still holds the lock."
    )
    resign_hold_off: float = setting(
        30.0,
        INTERVAL,
        "After resign() hands the lock over, how long this node stays a follower before it "
        "competes for the lock again (deploys: the new leader is elsewhere).",
    )

    # Rescue and promotion.
    promote_interval: float = setting(
        DEFAULT_PROMOTE_INTERVAL, INTERVAL, "Promotion of due scheduled and retryable jobs."
    )
    promote_min_gap: float = setting(
        DEFAULT_PROMOTE_MIN_GAP,
        INTERVAL,
        "Shortest time between the starts of two promotion passes when one wakes early for a known "
        "run_at: jobs due closer together than this are promoted in one pass (a promote_interval or "
        "more: poll only).",
    )
    heartbeat_rescue_interval: float = setting(
        DEFAULT_HEARTBEAT_RESCUE_INTERVAL, INTERVAL, "Sweep for running jobs with a stale heartbeat."
    )
    deadline_rescue_interval: float = setting(
        DEFAULT_DEADLINE_RESCUE_INTERVAL, INTERVAL, "Sweep for running jobs past their hard deadline."
    )
    callback_rescue_interval: float = setting(
        DEFAULT_CALLBACK_RESCUE_INTERVAL,
        INTERVAL,
        "Sweep for waiting_external jobs past their callback timeout.",
    )
    heartbeat_staleness: float = setting(
        DEFAULT_HEARTBEAT_STALENESS,
        INTERVAL,
        "A running job whose heartbeat is older than this is presumed dead.",
    )

    # Cleanup and retention.
    cleanup_interval: float = setting(
        DEFAULT_CLEANUP_INTERVAL,
        INTERVAL,
        "Deletion of finished jobs, stale snapshots, descriptors and batch operations.",
    )
    completed_retention: float = setting(
        DEFAULT_COMPLETED_RETENTION, RETENTION, "Completed jobs older than this are deleted."
    )
    failed_retention: float = setting(
        DEFAULT_FAILED_RETENTION, RETENTION, "Failed and cancelled jobs older than this are deleted."
    )
    cleanup_batch_size: int = setting(
        DEFAULT_CLEANUP_BATCH_SIZE, COUNT, "Rows per cleanup DELETE; a pass repeats batches."
    )
    queue_retention_overrides: Mapping[str, RetentionPolicy] = setting(
        None, "overrides", "Per-queue retention replacing the global values for that queue.", factory=dict
    )
    dlq_retention: float = setting(
        DEFAULT_DLQ_RETENTION, RETENTION, "Dead-lettered rows older than this are deleted (queue storage)."
    )
    dlq_cleanup_batch_size: int = setting(
        DEFAULT_DLQ_CLEANUP_BATCH_SIZE, COUNT, "Most dead-letter rows deleted per pass (queue storage)."
    )
    dlq_policy: DlqPolicy = setting(
        None, "dlq_policy", "Which queues dead-letter terminal failures (queue storage).", factory=DlqPolicy
    )
    descriptor_retention: float = setting(
        DEFAULT_DESCRIPTOR_RETENTION,
        RETENTION,
        "Queue and kind descriptors unseen for this long are deleted; 0 disables.",
    )
    runtime_snapshot_retention: float = setting(
        DEFAULT_RUNTIME_SNAPSHOT_RETENTION,
        RETENTION,
        "Runtime snapshots unseen for this long are deleted (fixed 24h upstream).",
    )
    runtime_snapshot_interval: float = setting(
        DEFAULT_RUNTIME_SNAPSHOT_INTERVAL,
        INTERVAL,
        "How often this node refreshes its own row in awa.runtime_instances (Awa's admin views "
        "read it); a leadership change is written at once.",
    )

    # Metrics and admin caches.
    queue_stats_interval: float = setting(
        DEFAULT_QUEUE_STATS_INTERVAL, INTERVAL, "Publication of awa.queue.depth and awa.queue.lag."
    )
    dirty_key_recompute_interval: float = setting(
        DEFAULT_DIRTY_KEY_RECOMPUTE_INTERVAL,
        INTERVAL,
        "Recompute of admin counters for recently touched queues and kinds.",
    )
    metadata_reconciliation_interval: float = setting(
        DEFAULT_METADATA_RECONCILIATION_INTERVAL, INTERVAL, "Full reconciliation of admin counters."
    )

    # Other branches.
    priority_aging_interval: float = setting(
        DEFAULT_PRIORITY_AGING_INTERVAL,
        INTERVAL,
        "Available jobs waiting longer than this gain one priority level per pass.",
    )
    batch_operations_interval: float = setting(
        DEFAULT_BATCH_OPERATIONS_INTERVAL,
        INTERVAL,
        "Processing of one chunk of a pending admin batch operation.",
    )
    terminal_count_rollup_interval: float = setting(
        DEFAULT_TERMINAL_COUNT_ROLLUP_INTERVAL, INTERVAL, "Fold of terminal-count deltas (queue storage)."
    )
    cron_sync_interval: float = setting(
        DEFAULT_CRON_SYNC_INTERVAL, INTERVAL, "Upsert of registered periodic jobs into awa.cron_jobs."
    )
    cron_eval_interval: float = setting(DEFAULT_CRON_EVAL_INTERVAL, INTERVAL, "Evaluation of cron schedules.")
    queue_rotate_interval: float = setting(
        DEFAULT_QUEUE_ROTATE_INTERVAL, INTERVAL, "Queue ring rotation (queue storage)."
    )
    lease_rotate_interval: float = setting(
        DEFAULT_LEASE_ROTATE_INTERVAL, INTERVAL, "Lease ring rotation (queue storage)."
    )
    claim_rotate_interval: float = setting(
        DEFAULT_CLAIM_ROTATE_INTERVAL,
        RETENTION,
        "Claim ring rotation (queue storage); 0 follows queue_rotate_interval.",
    )

    # awa_trio's own supervision and connection settings.
    branch_restart_limit: int = setting(
        DEFAULT_BRANCH_RESTART_LIMIT,
        COUNT,
        "Crashes of one branch tolerated within branch_restart_window before this node "
        "gives up leadership so a healthy node can take over.",
    )
    branch_restart_window: float = setting(
        DEFAULT_BRANCH_RESTART_WINDOW, INTERVAL, "Window over which branch crashes are counted."
    )
    branch_timeout: float = setting(
        DEFAULT_BRANCH_TIMEOUT, INTERVAL, "A branch body running longer than this is cancelled and logged."
    )
    lock_timeout: float = setting(
        DEFAULT_LOCK_TIMEOUT,
        INTERVAL,
        "Server-side lock_timeout of awa_trio's other sessions (the leader lock's); "
        "maintenance statements use statement_lock_timeout.",
    )
    statement_lock_timeout: float = setting(
        DEFAULT_STATEMENT_LOCK_TIMEOUT,
        INTERVAL,
        "Longest a maintenance statement waits for a lock before it gives up and its branch "
        "yields until the next tick (an operator's DDL always wins); below 0.5 s, well under "
        "PostgreSQL's deadlock_timeout.",
    )
    pool_size: int = setting(
        DEFAULT_POOL_SIZE, COUNT, "Connections in the shared pool (the lock has its own)."
    )
    lock_keepalive: float = setting(
        DEFAULT_LOCK_KEEPALIVE,
        RETENTION,
        "How long the server keeps the lock of a leader whose network went silent before it "
        "drops the session and frees the lock for another node (server-side TCP keepalive "
        "and user timeout of the lock connection); 0 leaves the OS defaults (hours).",
    )
    rescue_batch_size: int = setting(
        DEFAULT_RESCUE_BATCH_SIZE, COUNT, "Rows per rescue statement; a sweep repeats batches."
    )
    priority_aging_batch_size: int = setting(
        DEFAULT_PRIORITY_AGING_BATCH_SIZE, COUNT, "Rows per priority-aging statement; a pass repeats batches."
    )
    drain_time_budget: float = setting(
        DEFAULT_DRAIN_TIME_BUDGET,
        INTERVAL,
        "Longest one tick of a draining branch (cleanup, rescues, priority aging) keeps "
        "taking batches; the budget used is the smaller of this and half the branch's interval.",
    )
    takeover_poll_interval: float = setting(
        DEFAULT_TAKEOVER_POLL_INTERVAL,
        INTERVAL,
        "How often a follower tries the leader lock (pg_try_advisory_lock, which never waits "
        "and holds no snapshot between tries): the bound on takeover after a leader dies. A "
        "leader's graceful release wakes followers at once.",
    )
    hook_timeout: float = setting(
        DEFAULT_HOOK_TIMEOUT, INTERVAL, "Longest a lifecycle hook handler may run before it is cancelled."
    )
    hook_concurrency: int = setting(
        DEFAULT_HOOK_CONCURRENCY, COUNT, "Lifecycle hook handlers running at once."
    )
    hook_queue_size: int = setting(
        DEFAULT_HOOK_QUEUE_SIZE,
        COUNT,
        "Hook events waiting for a handler; beyond this, events are dropped and logged.",
    )

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            kind = field.metadata["kind"]
            value = getattr(self, field.name)
            if kind == INTERVAL:
                value = parse_duration(value, field=field.name)
                _require_positive(field.name, value)
            elif kind == RETENTION:
                value = parse_duration(value, field=field.name)
                _require_non_negative(field.name, value)
            elif kind == COUNT:
                value = _require_count(field.name, value)
            else:
                continue
            object.__setattr__(self, field.name, value)

        if self.statement_lock_timeout >= MAX_STATEMENT_LOCK_TIMEOUT:
            raise ConfigError(
                f"statement_lock_timeout must be below {MAX_STATEMENT_LOCK_TIMEOUT:g}s (well under "
                f"PostgreSQL's deadlock_timeout), not {self.statement_lock_timeout:g}s"
            )

        overrides = {}
        for queue, policy in dict(self.queue_retention_overrides).items():
            if not isinstance(queue, str) or not queue:
                raise ConfigError("queue_retention_overrides keys must be queue names")
            if isinstance(policy, Mapping):
                policy = retention_policy_from(policy, field=f"queue_retention_overrides[{queue!r}]")
            if not isinstance(policy, RetentionPolicy):
                raise ConfigError(f"queue_retention_overrides[{queue!r}] must be a RetentionPolicy")
            overrides[queue] = policy
        object.__setattr__(self, "queue_retention_overrides", MappingProxyType(overrides))

        if isinstance(self.dlq_policy, Mapping):
            try:
                object.__setattr__(self, "dlq_policy", DlqPolicy(**self.dlq_policy))
            except TypeError as exc:
                raise ConfigError(f"dlq_policy: {exc}") from None
        if not isinstance(self.dlq_policy, DlqPolicy):
            raise ConfigError("dlq_policy must be a DlqPolicy")

    @property
    def effective_claim_rotate_interval(self) -> float:
        return self.claim_rotate_interval or self.queue_rotate_interval

    def replace(self, **changes: Any) -> MaintenanceConfig:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)
