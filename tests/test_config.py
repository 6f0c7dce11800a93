"""MaintenanceConfig: seed defaults, normalised durations, errors naming the field."""

import dataclasses
from datetime import timedelta

import pytest

from awa_trio.config import (
    DlqPolicy,
    MaintenanceConfig,
    RetentionPolicy,
    format_duration,
    parse_duration,
)
from awa_trio.errors import ConfigError


def test_defaults_are_the_seeds():
    config = MaintenanceConfig()
    assert (config.leader_election_interval, config.leader_check_interval) == (10, 30)
    assert config.promote_interval == 0.25
    assert (config.heartbeat_rescue_interval, config.deadline_rescue_interval,
            config.callback_rescue_interval, config.heartbeat_staleness) == (30, 30, 30, 90)
    assert (config.cleanup_interval, config.completed_retention, config.failed_retention) == (
        60, 24 * 3600, 72 * 3600)
    assert (config.cleanup_batch_size, config.dlq_cleanup_batch_size) == (5000, 1000)
    assert config.dlq_retention == 30 * 86400 and config.descriptor_retention == 30 * 86400
    assert (config.queue_stats_interval, config.dirty_key_recompute_interval,
            config.metadata_reconciliation_interval, config.priority_aging_interval,
            config.batch_operations_interval, config.terminal_count_rollup_interval) == (30, 2, 60, 60, 1, 30)
    assert (config.cron_sync_interval, config.cron_eval_interval) == (60, 1)
    assert (config.queue_rotate_interval, config.lease_rotate_interval,
            config.effective_claim_rotate_interval) == (1, 0.25, 1)
    assert config.claim_rotate_interval == 0  # follows the queue cadence
    assert config.queue_retention_overrides == {} and config.dlq_policy == DlqPolicy()


@pytest.mark.parametrize(
    "text, seconds",
    [("250ms", 0.25), ("30s", 30), ("5m", 300), ("24h", 86400), ("30d", 2592000), ("1.5", 1.5),
     (7, 7), (timedelta(minutes=2), 120)],
)
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


def test_format_duration_reads_like_an_operator_writes():
    assert [format_duration(s) for s in (0.25, 30, 300, 86400, 259200, 2592000, 1.5)] == [
        "250ms", "30s", "5m", "24h", "72h", "30d", "1.5s"]


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"promote_interval": 0}, "promote_interval must be > 0"),
        ({"heartbeat_staleness": "-1s"}, "heartbeat_staleness must not be negative"),
        ({"heartbeat_staleness": "soon"}, "heartbeat_staleness: cannot read"),
        ({"failed_retention": -1}, "failed_retention must be >= 0"),
        ({"cleanup_batch_size": 0}, "cleanup_batch_size must be > 0"),
        ({"pool_size": 2.5}, "pool_size must be an integer"),
        ({"leader_check_interval": float("nan")}, "leader_check_interval must be finite"),
        ({"queue_retention_overrides": {"q": {"completed": "soon"}}},
         r"^queue_retention_overrides\['q'\]\.completed: cannot read 'soon' as a duration"),
        ({"queue_retention_overrides": {"q": {"failed": -1}}},
         r"^queue_retention_overrides\['q'\]\.failed must be >= 0$"),
        ({"queue_retention_overrides": {"q": {"kept": "1h"}}},
         r"^queue_retention_overrides\['q'\]: unknown retention setting 'kept'"),
        ({"dlq_policy": {"enabled": True}}, "dlq_policy"),
        ({"dlq_policy": {"enabled_default": "no"}},
         r"^dlq_policy\.enabled_default must be true or false, got 'no'$"),
        ({"dlq_policy": {"overrides": {"q": "maybe"}}},
         r"^dlq_policy\.overrides\['q'\] must be true or false, got 'maybe'$"),
    ],
)
def test_invalid_values_fail_at_construction_naming_the_field(changes, message):
    with pytest.raises(ConfigError, match=message):
        MaintenanceConfig(**changes)


def test_config_is_frozen_and_replace_validates():
    config = MaintenanceConfig(queue_retention_overrides={"emails": RetentionPolicy(completed="1h")})
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.promote_interval = 1
    with pytest.raises(TypeError):
        config.queue_retention_overrides["other"] = RetentionPolicy()
    assert config.replace(promote_interval="1s").promote_interval == 1
    with pytest.raises(ConfigError, match="promote_interval must be > 0"):
        config.replace(promote_interval=0)


def test_zero_descriptor_retention_means_disabled_and_is_valid():
    assert MaintenanceConfig(descriptor_retention=0).descriptor_retention == 0


def test_dlq_policy_overrides():
    policy = DlqPolicy(enabled_default=False, overrides={"emails": True})
    assert policy.enabled_for("emails") and not policy.enabled_for("other")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"enabled_default": "no"}, r"^dlq_policy\.enabled_default must be true or false, got 'no'$"),
        ({"enabled_default": 1}, r"^dlq_policy\.enabled_default must be true or false, got 1$"),
        ({"enabled_default": None}, r"^dlq_policy\.enabled_default must be true or false, got None$"),
        ({"overrides": {"emails": "maybe"}},
         r"^dlq_policy\.overrides\['emails'\] must be true or false, got 'maybe'$"),
        ({"overrides": {"emails": 0}}, r"^dlq_policy\.overrides\['emails'\] must be true or false, got 0$"),
        ({"overrides": {"": True}}, r"^dlq_policy\.overrides keys must be queue names$"),
        ({"overrides": ["emails"]}, r"^dlq_policy\.overrides must map queue names"),
    ],
)
def test_dlq_policy_accepts_only_booleans(kwargs, message):
    # "no" is a truthy string: accepted, it would have switched the DLQ on.
    with pytest.raises(ConfigError, match=message):
        DlqPolicy(**kwargs)


def test_dlq_policy_booleans_are_kept():
    policy = MaintenanceConfig(
        dlq_policy={"enabled_default": True, "overrides": {"emails": False}}).dlq_policy
    assert policy == DlqPolicy(enabled_default=True, overrides={"emails": False})
    assert policy.enabled_for("other") and not policy.enabled_for("emails")
    with pytest.raises(TypeError):
        policy.overrides["other"] = True
