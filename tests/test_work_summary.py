"""The leader's minute line: what maintenance did, and nothing when it did
nothing."""

from __future__ import annotations

import datetime as dt
import logging

import trio

from awa_trio.cron.branches import CronEvalResult
from awa_trio.engines.canonical.priority_aging import PriorityAgingResult
from awa_trio.engines.queue_storage.rings import PruneResult, RingTickResult, RotateResult
from awa_trio.engines.queue_storage.terminal_count_rollup import RollupResult
from awa_trio.maintenance.cleanup import CleanupResult
from awa_trio.maintenance.promotion import PromoteResult
from awa_trio.maintenance.rescue import RescueResult
from awa_trio.tracker import PruneOutcome
from awa_trio.work_summary import WorkSummary, describe, work_done


def test_each_branch_result_says_what_it_did():
    assert work_done(PromoteResult(promoted={"scheduled": 3, "retryable": 2})) == {"promoted": 5}
    assert work_done(RescueResult(rescued=[object(), object()], duplicates_cancelled=[object()])) == {
        "rescued": 2, "cancelled": 1}
    assert work_done(CleanupResult(jobs_deleted=7, dlq_purged=3)) == {"cleaned": 10}
    now = dt.datetime.now(dt.UTC)
    assert work_done(CronEvalResult(enqueued=[("a", 1, now)])) == {"fired": 1}
    tick = RingTickResult(rotate=RotateResult(rotated=True, slot=1), prune=PruneResult(outcome=PruneOutcome.PRUNED))
    assert work_done(tick) == {"rotated": 1, "pruned": 1}
    idle = RingTickResult(rotate=RotateResult(rotated=False, slot=1), prune=PruneResult(outcome=PruneOutcome.NOOP))
    assert work_done(idle) == {}
    assert work_done(PriorityAgingResult(aged=4)) == {"aged": 4}
    assert work_done(RollupResult(rolled_slots=2)) == {"rolled up": 2}
    assert work_done(PromoteResult()) == work_done(None) == {}
    assert describe({"cleaned": 1200, "promoted": 1204, "rescued": 3}) == "promoted 1,204, rescued 3, cleaned 1,200"


async def test_one_line_a_minute_with_work_and_none_without(caplog, autojump_clock):
    caplog.set_level(logging.INFO, logger="awa_trio.summary")
    summary = WorkSummary()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(summary.log_every)
        await trio.sleep(30)
        summary.record(RingTickResult(rotate=RotateResult(rotated=True, slot=1)))  # rings only: silence
        await trio.sleep(31)
        summary.record(PromoteResult(promoted={"scheduled": 2}))
        summary.record(RescueResult(rescued=[object()]))
        summary.record(PromoteResult(promoted={"retryable": 1}))
        summary.record(RingTickResult(rotate=RotateResult(rotated=True, slot=2)))
        await trio.sleep(60)
        await trio.sleep(120)  # two more idle minutes
        nursery.cancel_scope.cancel()
    assert [r.getMessage() for r in caplog.records] == ["in the last minute: promoted 3, rescued 1, rotated 1"]


async def test_a_leader_says_what_it_promoted(database_url, awa_client, caplog, monkeypatch):
    """A real leader over real jobs: the line counts the jobs that came due."""
    from conftest import in_thread

    from awa_trio import MaintenanceConfig, MaintenanceService, work_summary

    monkeypatch.setattr(work_summary, "SUMMARY_INTERVAL", 1.0)
    caplog.set_level(logging.INFO, logger="awa_trio.summary")
    soon = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=0.3)
    for n in range(5):
        await in_thread(awa_client.insert, {"n": n}, kind="summary_job", run_at=soon)
    service = MaintenanceService(database_url, MaintenanceConfig(promote_interval=0.1))
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        with trio.fail_after(15):
            while not any("promoted" in r.getMessage() for r in caplog.records):
                await trio.sleep(0.1)
        nursery.cancel_scope.cancel()
    lines = [r.getMessage() for r in caplog.records if r.name == "awa_trio.summary"]
    assert lines[0].startswith("in the last 1s: promoted 5"), lines


def test_a_transition_pass_counts_the_work_of_both_planes():
    """During a staged transition promotion and the rescues serve both
    planes in one body: the minute line counts what each plane did."""
    from awa_trio.engines.queue_storage.planes import PlaneResults

    both = PlaneResults(
        queue_storage=PromoteResult(promoted={"scheduled": 3}),
        canonical=PromoteResult(promoted={"retryable": 2}),
    )
    assert work_done(both) == {"promoted": 5}
    one_failed = PlaneResults(queue_storage=None, canonical=RescueResult(rescued=[object()]))
    assert work_done(one_failed) == {"rescued": 1}
