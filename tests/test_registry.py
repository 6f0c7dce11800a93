"""The branch registry: which branches lead a canonical database, and that
each one ticks at its own configured interval (a swapped field would make,
say, promotion run every minute and cleanup four times a second)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from awa_trio.config import INTERVAL, MaintenanceConfig
from awa_trio.cron import evaluate_cron_schedules, sync_periodic_jobs
from awa_trio.db import QueryError
from awa_trio.engines.canonical import (
    admin_metadata,
    batch_operations,
    cleanup,
    priority_aging,
    promote,
    queue_stats,
    rescue_callbacks,
    rescue_deadlines,
    rescue_heartbeats,
)
from awa_trio.engines.canonical.registry import canonical_branches
from awa_trio.engines.queue_storage.planes import PlaneResults, both_planes
from awa_trio.engines.queue_storage.registry import DRAIN_FOLDED_INTO as CANONICAL_DRAIN
from awa_trio.engines.queue_storage.registry import queue_storage_branches
from awa_trio.registry import default_branches
from awa_trio.schema import CANONICAL, QUEUE_STORAGE, SchemaInfo

# Branch name -> (config field of its interval, its body).
EXPECTED = {
    "rescue_stale_heartbeats": ("heartbeat_rescue_interval", rescue_heartbeats.run_once),
    "rescue_expired_deadlines": ("deadline_rescue_interval", rescue_deadlines.run_once),
    "rescue_expired_callbacks": ("callback_rescue_interval", rescue_callbacks.run_once),
    "promote_scheduled": ("promote_interval", promote.run_once),
    "cleanup": ("cleanup_interval", cleanup.run_once),
    "priority_aging": ("priority_aging_interval", priority_aging.run_once),
    "recompute_dirty_admin_metadata": (
        "dirty_key_recompute_interval", admin_metadata.run_recompute_dirty),
    "refresh_admin_metadata": ("metadata_reconciliation_interval", admin_metadata.run_refresh),
    "queue_stats": ("queue_stats_interval", queue_stats.run_once),
    "batch_operations": ("batch_operations_interval", batch_operations.run_once),
    "cron_sync": ("cron_sync_interval", sync_periodic_jobs),
    "cron_eval": ("cron_eval_interval", evaluate_cron_schedules),
}


def distinct_intervals() -> MaintenanceConfig:
    """Every interval field a different value, so each spec can only match its own."""
    fields = [f.name for f in dataclasses.fields(MaintenanceConfig)
              if f.metadata["kind"] == INTERVAL]
    values = {name: 1000 + 7 * n for n, name in enumerate(fields)}
    values["statement_lock_timeout"] = 0.1  # bounded below deadlock_timeout; no branch ticks on it
    return MaintenanceConfig(**values)


def test_canonical_branches_are_exactly_the_upstream_set():
    names = [spec.name for spec in canonical_branches(MaintenanceConfig())]
    assert len(names) == len(set(names))
    assert sorted(names) == sorted(EXPECTED)


def test_each_branch_ticks_at_its_own_config_interval():
    config = distinct_intervals()
    intervals = {getattr(config, field) for field, _ in EXPECTED.values()}
    assert len(intervals) == len(EXPECTED)

    specs = {spec.name: spec for spec in canonical_branches(config)}

    assert {name: spec.interval for name, spec in specs.items()} == {
        name: getattr(config, field) for name, (field, _) in EXPECTED.items()
    }
    assert {name: spec.run_once for name, spec in specs.items()} == {
        name: body for name, (_, body) in EXPECTED.items()
    }


def test_only_cron_branches_change_the_tick_policy():
    """A new term runs cron_sync, cron_eval and promotion at once (a takeover
    then loses no tick of them); cron_eval is never skipped by overrun
    cooldown; every other branch waits one interval and has a cooldown."""
    specs = {spec.name: spec for spec in canonical_branches(MaintenanceConfig())}
    assert {name for name, spec in specs.items() if spec.run_immediately} == {
        "cron_sync", "cron_eval", "promote_scheduled"}
    assert {name for name, spec in specs.items() if not spec.cooldown} == {"cron_eval"}


CANONICAL_ONLY = {"priority_aging", "recompute_dirty_admin_metadata", "refresh_admin_metadata"}
RING_AND_ROLLUP = {"rotate_queue", "rotate_lease", "rotate_claim", "terminal_count_rollup"}


def test_default_branches_follow_the_storage_state():
    config = distinct_intervals()
    canonical = SchemaInfo(version=39, engine=CANONICAL)
    assert default_branches(config, canonical) == canonical_branches(config)
    # Prepared (routing not flipped yet): still the canonical set.
    prepared = SchemaInfo(version=39, engine=CANONICAL, state="prepared")
    assert default_branches(config, prepared) == canonical_branches(config)

    active = SchemaInfo(version=39, engine=QUEUE_STORAGE, state="active")
    names = [spec.name for spec in default_branches(config, active)]
    assert len(names) == len(set(names))
    assert not CANONICAL_ONLY & set(names)
    assert set(names) >= RING_AND_ROLLUP
    assert {spec.name for spec in canonical_branches(config)} - CANONICAL_ONLY <= set(names)


def test_ring_branches_use_their_own_intervals_and_rollup_is_never_skipped():
    config = distinct_intervals().replace(claim_rotate_interval=4321)
    specs = {spec.name: spec for spec in queue_storage_branches(config)}
    assert specs["rotate_queue"].interval == config.queue_rotate_interval
    assert specs["rotate_lease"].interval == config.lease_rotate_interval
    assert specs["rotate_claim"].interval == config.claim_rotate_interval
    follows_queue = queue_storage_branches(config.replace(claim_rotate_interval=0))
    assert {spec.name: spec.interval for spec in follows_queue}["rotate_claim"] == (
        config.queue_rotate_interval)
    assert specs["terminal_count_rollup"].interval == config.terminal_count_rollup_interval
    from awa_trio.engines.queue_storage import batch_operations as qs_batch_operations

    assert specs["batch_operations"].run_once is qs_batch_operations.run_once
    assert {name for name, spec in specs.items() if not spec.cooldown} == {
        "terminal_count_rollup", "cron_eval"}


def test_mixed_transition_serves_both_planes_in_promotion_rescues_and_cleanup():
    config = distinct_intervals()
    mixed = SchemaInfo(version=39, engine=QUEUE_STORAGE, state="mixed_transition")
    active = SchemaInfo(version=39, engine=QUEUE_STORAGE, state="active")
    mixed_specs = {spec.name: spec for spec in default_branches(config, mixed)}
    active_specs = {spec.name: spec for spec in default_branches(config, active)}
    assert mixed_specs.keys() - active_specs.keys() == {"canonical_drain"}
    assert active_specs.keys() <= mixed_specs.keys()
    both = {name for name in active_specs
            if mixed_specs[name].run_once is not active_specs[name].run_once}
    assert both == {"promote_scheduled", "rescue_stale_heartbeats", "rescue_expired_deadlines",
                    "rescue_expired_callbacks", "cleanup"}
    # Same cadence and tick policy as on queue storage alone.
    for name in active_specs:
        assert dataclasses.replace(mixed_specs[name], run_once=None) == dataclasses.replace(
            active_specs[name], run_once=None)
    assert mixed_specs["canonical_drain"].interval == config.queue_stats_interval
    # Only queue storage's own bodies and the canonical drain serve the transition.
    assert set(CANONICAL_DRAIN) == both


def query_error(message: str) -> QueryError:
    return QueryError(message, sqlstate="57014")


def recorder(calls: list[str], plane: str, outcome):
    async def run_once(ctx):
        calls.append(plane)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    return run_once


async def test_both_planes_runs_each_plane_once_and_returns_both_results():
    calls: list[str] = []
    body = both_planes("promote_scheduled", recorder(calls, "qs", "q"), recorder(calls, "c", "c"))
    assert await body(None) == PlaneResults(queue_storage="q", canonical="c")
    assert calls == ["qs", "c"]


async def test_a_database_error_on_one_plane_leaves_the_other_served(caplog):
    calls: list[str] = []
    body = both_planes(
        "rescue_stale_heartbeats",
        recorder(calls, "qs", query_error("canceling statement due to lock timeout")),
        recorder(calls, "c", "rescued"),
    )
    assert await body(None) == PlaneResults(queue_storage=None, canonical="rescued")
    assert calls == ["qs", "c"]
    assert ("rescue_stale_heartbeats: queue_storage plane failed: [57014] canceling statement"
            in caplog.text)

    both_fail = both_planes(
        "cleanup", recorder(calls, "qs", query_error("one")),
        recorder(calls, "c", query_error("two")))
    with pytest.raises(QueryError, match="one"):
        await both_fail(None)


async def test_a_bug_on_the_queue_storage_plane_still_lets_the_canonical_drain_run():
    """The supervisor still sees the bug (and restarts the branch), but the
    canonical rows are promoted or rescued in that same pass first."""
    calls: list[str] = []
    body = both_planes("promote_scheduled", recorder(calls, "qs", KeyError("bug")),
                       recorder(calls, "c", "promoted"))
    with pytest.raises(KeyError):
        await body(None)
    assert calls == ["qs", "c"]


def test_a_canonical_leader_never_loads_the_queue_storage_modules_or_croniter():
    """Start-up CPU is part of the idle cost: the canonical set, the CLI and
    a cron-less leader must not import what only queue storage or a
    schedule needs."""
    script = (
        "import sys\n"
        "from awa_trio import cli\n"
        "from awa_trio.registry import default_branches\n"
        "from awa_trio.config import MaintenanceConfig\n"
        "from awa_trio.schema import CANONICAL, SchemaInfo\n"
        "default_branches(MaintenanceConfig(), SchemaInfo(version=39, engine=CANONICAL))\n"
        "print(sorted(m for m in sys.modules if m.startswith(('awa_trio.engines.queue_storage', 'croniter'))))\n"
    )
    loaded = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == "[]"
    # The queue-storage set does load them, through the same registry call.
    active = SchemaInfo(version=39, engine=QUEUE_STORAGE, state="active")
    assert "rotate_queue" in {spec.name for spec in default_branches(MaintenanceConfig(), active)}
