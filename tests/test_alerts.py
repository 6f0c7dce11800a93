"""The alert pack in deploy/prometheus and the dashboard in deploy/grafana:
promtool accepts the rules and every dashboard query, every rule fires on
the series its unit test gives and stays quiet on the others, and every
metric a rule or panel queries is one a running leader really exports."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import trio
from conftest import in_thread
from test_http_endpoints import FAST, get, scraped_series

from awa_trio import BranchSpec, MaintenanceService
from awa_trio.db import QueryError
from awa_trio.http_api import prometheus_meter_provider

RULES = Path(__file__).parent.parent / "deploy" / "prometheus" / "awa_trio-alerts.yml"
RULE_TESTS = RULES.with_name("awa_trio-alerts.test.yml")
DASHBOARD = RULES.parent.parent / "grafana" / "awa_trio-dashboard.json"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool is not installed (apt-get install prometheus)"
)
#: Series the rules read that only upstream's runtimes export, not awa_trio
#: leading alone: none (the storage-transition gauges come from queue_stats).
EMITTED_BY_AWA_PG_RUNTIMES: set[str] = set()
#: A metric name in a PromQL expression (awa_trio's and Awa's series only).
METRIC_NAME_RE = re.compile(r"\b(awa_[a-z0-9_]+)\b")


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=60)


@needs_promtool
def test_promtool_accepts_the_rules_and_every_rule_has_a_summary_and_runbook():
    checked = promtool("check", "rules", str(RULES))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 14 rules found" in checked.stdout
    text = RULES.read_text()
    assert text.count("summary:") == text.count("- alert:") == text.count("runbook:") == 14


@needs_promtool
def test_every_rule_fires_on_its_series_and_stays_quiet_otherwise():
    tested = promtool("test", "rules", str(RULE_TESTS))
    assert tested.returncode == 0, tested.stdout + tested.stderr
    alerts = set(re.findall(r"- alert: (\w+)", RULES.read_text()))
    cases = RULE_TESTS.read_text()
    for alert in alerts:
        assert f"name: {alert} fires" in cases and f"name: {alert} stays quiet" in cases, alert


@needs_promtool
def test_the_rule_tests_can_fail(tmp_path):
    """A rule made blind (a threshold no series reaches) fails its test."""
    (tmp_path / RULES.name).write_text(
        RULES.read_text().replace("(awa_queue_lag_seconds) > 300", "(awa_queue_lag_seconds) > 5000"))
    (tmp_path / RULE_TESTS.name).write_text(RULE_TESTS.read_text())
    tested = promtool("test", "rules", str(tmp_path / RULE_TESTS.name))
    assert tested.returncode != 0
    assert "AwaTrioQueueLagOverSlo" in tested.stdout + tested.stderr


def metric_names(expressions: list[str]) -> set[str]:
    """Series names in PromQL expressions: label matchers and grouping
    clauses are cut first, since label names share the ``awa_`` prefix."""
    names = set()
    for expression in expressions:
        expression = re.sub(r"\{[^}]*\}", "", expression)
        expression = re.sub(r"\b(?:by|on|without|ignoring)\s*\([^)]*\)", "", expression)
        names.update(METRIC_NAME_RE.findall(expression))
    return names


def rule_expressions() -> list[str]:
    return re.findall(r"expr: (\|\n(?:\s{10}.*\n)+|.*)", RULES.read_text())


def dashboard_expressions() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]


def metric_names_in_rules() -> set[str]:
    return metric_names(rule_expressions())


def test_every_dashboard_panel_has_a_query_promtool_accepts(tmp_path):
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] == "awa-trio-maintenance"
    assert all(panel["targets"] and panel["title"] for panel in dashboard["panels"])
    if PROMTOOL is None:
        pytest.skip("promtool is not installed (apt-get install prometheus)")
    # promtool parses PromQL in rule files: one recording rule per panel query.
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query_{n}", "expr": expr} for n, expr in enumerate(dashboard_expressions())]}]}
    (tmp_path / "dashboard.yml").write_text(json.dumps(rules))
    checked = promtool("check", "rules", str(tmp_path / "dashboard.yml"))
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_rules_query_the_series_they_should():
    assert metric_names_in_rules() == {
        "awa_trio_leader", "awa_trio_term_started_seconds", "awa_trio_branch_errors_total",
        "awa_maintenance_branch_overrun_total", "awa_ring_generation",
        "awa_maintenance_rotate_attempts_total", "awa_maintenance_prune_attempts_total",
        "awa_queue_depth", "awa_maintenance_promote_batches_total", "awa_maintenance_rescues_total",
        "awa_job_dlq_depth", "awa_queue_lag_seconds", "awa_storage_state", "awa_storage_transition_ready",
        "awa_trio_branch_paused",
    }


async def test_every_metric_the_rules_and_dashboard_query_is_in_a_real_scrape(qs_database_url, qs_db, qs_awa_client):
    """A queue-storage leader with a failing branch (errors), a branch slower
    than its interval (overruns), a job whose worker was killed (rescue) and
    due jobs (promotion): its /metrics holds
    every series name the alert pack and the dashboard use."""
    import datetime as dt

    from support.awa_pg import awa_pg_worker

    async def broken(ctx):
        raise QueryError("relation does not exist", sqlstate="42P01")

    async def slow(ctx):
        await trio.sleep(0.15)

    provider = prometheus_meter_provider()
    service = MaintenanceService(
        qs_database_url, FAST, http_address="127.0.0.1:0", meter_provider=provider,
        extra_branches=[BranchSpec("broken_probe", 0.05, broken), BranchSpec("slow_probe", 0.05, slow)])
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        with trio.fail_after(20):
            await service.wait_until_leader()
        [url] = service.http_urls
        # A job hangs in a worker we then kill: its lease goes stale and is rescued.
        async with awa_pg_worker(qs_database_url, "alerts_hang:alerts", behaviour="hang",
                                 extra_args=["--role", "auto"]) as worker:
            await in_thread(qs_awa_client.insert, {}, kind="alerts_hang", queue="alerts")
            await worker.wait_for_line("START", timeout=30)
            worker.kill()
        soon = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=1)
        for _ in range(3):
            await in_thread(qs_awa_client.insert, {}, kind="alerts_later", queue="alerts", run_at=soon)
        wanted = (metric_names_in_rules() | metric_names(dashboard_expressions())) - EMITTED_BY_AWA_PG_RUNTIMES
        assert {"awa_storage_state", "awa_storage_transition_ready"} <= wanted
        missing: set[str] = wanted
        with trio.move_on_after(45):
            while missing:
                series = scraped_series((await get(f"{url}/metrics"))[1].decode())
                missing = wanted - set(series)
                await trio.sleep(0.5)
        assert missing == set(), sorted(missing)
        nursery.cancel_scope.cancel()
    provider.shutdown()
