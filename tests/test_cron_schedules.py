"""Periodic job definitions and their configuration: every mistake is caught
at registration, with a message naming the schedule."""

from __future__ import annotations

import tomllib
from datetime import UTC, datetime

import pytest

from awa_trio.cron import (
    MissedFirePolicy,
    PeriodicJob,
    PeriodicJobError,
    merge_periodic_jobs,
    parse_periodic_job_flag,
    periodic_jobs_from_document,
    periodic_jobs_from_flags,
    split_periodic_job_lines,
    validate_periodic_jobs,
)
from awa_trio.errors import ConfigError


def test_defaults_match_upstream():
    job = PeriodicJob("nightly", "0 2 * * *", kind="report")
    assert (job.timezone, job.queue, job.args, job.priority, job.max_attempts, job.tags,
            job.metadata, job.missed_fire_policy) == (
        "UTC", "default", {}, 2, 25, (), {}, MissedFirePolicy.COALESCE)


def test_values_are_normalised_and_copied():
    args = {"format": "pdf", "pages": (1, 2)}
    job = PeriodicJob("nightly", "0 2 * * *", kind="report", args=args, tags=["a", "b"],
                      missed_fire_policy="catch_up")
    args["format"] = "changed"
    assert job.args == {"format": "pdf", "pages": [1, 2]}
    assert job.tags == ("a", "b")
    assert job.missed_fire_policy is MissedFirePolicy.CATCH_UP


def test_next_fire_uses_the_zone():
    job = PeriodicJob("nightly", "30 2 * * *", kind="report", timezone="Europe/London")
    assert job.next_fire_after(datetime(2026, 7, 1, tzinfo=UTC)) == datetime(2026, 7, 1, 1, 30, tzinfo=UTC)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"cron_expr": "61 * * * *"}, "invalid cron expression '61 * * * *': '61' is out of range"),
        ({"cron_expr": "0 0 * * * 2026"}, "invalid cron expression"),
        ({"cron_expr": "0 0 30 2 *"}, "can never fire"),
        ({"timezone": "Mars/Olympus"}, "unknown timezone 'Mars/Olympus'"),
        ({"timezone": "europe/london"}, "unknown timezone"),  # IANA names are case-sensitive
        ({"timezone": "localtime"}, "unknown timezone"),  # means "this machine"
        ({"missed_fire_policy": "Coalesce"}, "invalid missed fire policy 'Coalesce'"),
        ({"missed_fire_policy": "skip"}, "use 'coalesce' or 'catch_up'"),
        ({"priority": 0}, "priority must be between 1 and 4, got 0"),
        ({"priority": True}, "priority must be an integer"),
        ({"max_attempts": 1001}, "max_attempts must be between 1 and 1000, got 1001"),
        ({"kind": ""}, "kind must be a non-empty string"),
        ({"kind": "k" * 201}, "kind must be at most 200 characters"),
        ({"queue": "q" * 201}, "queue must be at most 200 characters"),
        ({"args": [1, 2]}, "args must be a JSON object"),
        ({"args": {"when": datetime(2026, 1, 1)}}, "args is not JSON-serialisable"),
        ({"args": {"x": float("nan")}}, "args is not JSON-serialisable"),
        ({"metadata": {"x": "a\x00b"}}, "NUL character"),
        ({"tags": "nightly"}, "tags must be a list of strings"),
        ({"tags": ["t"] * 21}, "at most 20 tags"),
        ({"tags": [1]}, "tags must be strings"),
    ],
)
def test_invalid_definitions_name_the_schedule(overrides, message):
    values = {"kind": "report", **overrides}
    cron_expr = values.pop("cron_expr", "0 2 * * *")
    with pytest.raises(PeriodicJobError) as caught:
        PeriodicJob("nightly_report", cron_expr, **values)
    assert str(caught.value).startswith("periodic job 'nightly_report': ")
    assert message in str(caught.value)
    assert isinstance(caught.value, ConfigError)  # the CLI reports it as a configuration error


def test_a_name_is_required():
    with pytest.raises(PeriodicJobError, match="non-empty name"):
        PeriodicJob("  ", "* * * * *", kind="report")


def test_names_must_be_unique():
    jobs = [PeriodicJob("a", "* * * * *", kind="k"), PeriodicJob("a", "0 * * * *", kind="k")]
    with pytest.raises(PeriodicJobError, match="'a' is registered twice"):
        validate_periodic_jobs(jobs)
    with pytest.raises(PeriodicJobError, match="must be PeriodicJob objects"):
        validate_periodic_jobs([{"name": "a"}])


TOML = """
[[periodic_jobs]]
name = "nightly_report"
cron_expr = "30 2 * * *"
timezone = "Europe/London"
kind = "nightly_report"
queue = "reports"
args = { format = "pdf" }
priority = 3
max_attempts = 5
tags = ["reports"]
metadata = { team = "finance" }
missed_fire_policy = "catch_up"

[[periodic_jobs]]
name = "heartbeat"
cron_expr = "*/10 * * * * *"
kind = "heartbeat"
"""


def test_toml_document():
    nightly, heartbeat = periodic_jobs_from_document(tomllib.loads(TOML), source="awa.toml")
    assert nightly == PeriodicJob(
        "nightly_report", "30 2 * * *", kind="nightly_report", timezone="Europe/London",
        queue="reports", args={"format": "pdf"}, priority=3, max_attempts=5, tags=["reports"],
        metadata={"team": "finance"}, missed_fire_policy="catch_up",
    )
    assert heartbeat.cron_expr == "*/10 * * * * *" and heartbeat.kind == "heartbeat"
    assert periodic_jobs_from_document({}) == ()


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ('periodic_jobs = "x"', "awa.toml: periodic_jobs must be an array of tables"),
        ('[[periodic_jobs]]\nname = "a"\ncron = "* * * * *"\nkind = "k"',
         "awa.toml: [[periodic_jobs]] #1 (a): unknown key 'cron'"),
        ('[[periodic_jobs]]\nname = "a"\ncron_expr = "* * * * *"', "#1 (a): missing kind"),
        ('[[periodic_jobs]]\nname = "a"\ncron_expr = "* * * * *"\nkind = "k"\n'
         '[[periodic_jobs]]\nname = "b"\ncron_expr = "* * * *"\nkind = "k"',
         "periodic job 'b': invalid cron expression"),
        ('[[periodic_jobs]]\nname = "a"\ncron_expr = "* * * * *"\nkind = "k"\n'
         '[[periodic_jobs]]\nname = "a"\ncron_expr = "0 * * * *"\nkind = "k"',
         "'a' is registered twice"),
    ],
)
def test_toml_mistakes(document, message):
    with pytest.raises(PeriodicJobError) as caught:
        periodic_jobs_from_document(tomllib.loads(document), source="awa.toml")
    assert message in str(caught.value)


def test_flag_syntax():
    job = parse_periodic_job_flag(
        'nightly_report=30 2 * * *;kind=nightly_report;timezone=Europe/London;'
        'args={"format": "pdf", "note": "a;b=c"};tags=reports, nightly;priority=3;'
        'max_attempts=5;metadata={"team": "finance"};missed_fire_policy=catch_up;'
    )
    assert job == PeriodicJob(
        "nightly_report", "30 2 * * *", kind="nightly_report", timezone="Europe/London",
        args={"format": "pdf", "note": "a;b=c"}, tags=["reports", "nightly"], priority=3,
        max_attempts=5, metadata={"team": "finance"}, missed_fire_policy="catch_up",
    )
    seconds = parse_periodic_job_flag("heartbeat = */10 * * * * * ; kind = heartbeat")
    assert (seconds.name, seconds.cron_expr, seconds.kind) == ("heartbeat", "*/10 * * * * *", "heartbeat")


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("heartbeat", "must look like NAME=EXPRESSION;kind=KIND"),
        ("=* * * * *;kind=k", "must look like"),
        ("a=* * * * *", "missing kind"),
        ("a=* * * * *;kind=k;cron=x", "unknown key 'cron'"),
        ("a=* * * * *;kind=k;name=b", "unknown key 'name'"),
        ("a=* * * * *;kind=k;kind=j", "kind is given twice"),
        ("a=* * * * *;kind=k;args={oops}", "args is not valid JSON"),
        ('a=* * * * *;kind=k;args={"x": 1} trailing', "unexpected text after the args JSON"),
        ("a=* * * * *;kind=k;priority=high", "priority must be an integer, not 'high'"),
        ("a=* * * * *;kind=k;loose", "'loose' is not key=value"),
        ("a=* * * * *;kind=k;args=[1]", "periodic job 'a': args must be a JSON object"),
        ("a=* * * *;kind=k", "periodic job 'a': invalid cron expression"),
    ],
)
def test_flag_mistakes(flag, message):
    with pytest.raises(PeriodicJobError) as caught:
        parse_periodic_job_flag(flag)
    assert message in str(caught.value)


def test_flags_replace_file_entries_of_the_same_name():
    from_file = periodic_jobs_from_document(tomllib.loads(TOML))
    from_flags = periodic_jobs_from_flags([
        "heartbeat=*/30 * * * * *;kind=heartbeat",
        "cleanup=@daily;kind=cleanup",
    ])
    merged = merge_periodic_jobs(from_file, from_flags)
    assert [(job.name, job.cron_expr) for job in merged] == [
        ("nightly_report", "30 2 * * *"), ("heartbeat", "*/30 * * * * *"), ("cleanup", "@daily"),
    ]
    with pytest.raises(PeriodicJobError, match="registered twice"):
        periodic_jobs_from_flags(["a=@daily;kind=k", "a=@hourly;kind=k"])


def test_environment_lines():
    text = "# schedules\nheartbeat=*/10 * * * * *;kind=heartbeat\n\n  cleanup=@daily;kind=cleanup  \n"
    assert split_periodic_job_lines(text) == [
        "heartbeat=*/10 * * * * *;kind=heartbeat", "cleanup=@daily;kind=cleanup",
    ]
