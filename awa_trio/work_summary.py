"""One INFO line a minute saying what maintenance did to jobs, none when it
did nothing: a leader that only logs trouble looks dead to the person reading
its log while it promotes thousands of jobs.

Each branch actor hands its body's result to the term's :class:`WorkSummary`;
:func:`work_done` reads the counts from the result types the branches return
(by their fields, so the core imports no engine), and the term's summary
task logs the minute's totals.
"""

from __future__ import annotations

import collections
import logging
from typing import Any

import trio

from .maintenance.planes import Planes
from .tracker import PruneOutcome

log = logging.getLogger("awa_trio.summary")

#: How often the summary line comes (when there was work).
SUMMARY_INTERVAL = 60.0
#: The words of the line, in this order.
WORK = ("promoted", "rescued", "cancelled", "cleaned", "fired", "aged", "rotated", "pruned", "rolled up")
#: Work on jobs: a minute with any of it gets a line. The ring work after it
#: goes in that line but makes none alone: on queue storage the rings turn
#: over every second even when no job moves, and that minute stays silent.
JOB_WORK = WORK[:6]


def work_done(result: Any) -> dict[str, int]:
    """The work one body's result records, by the words of :data:`WORK`."""
    if isinstance(result, Planes):  # a transition's body: each plane's work
        total: collections.Counter[str] = collections.Counter()
        for part in result.results():
            total.update(work_done(part))
        return dict(total)
    counts: dict[str, int] = {}
    promoted = getattr(result, "promoted", None)
    if isinstance(promoted, dict):  # PromoteResult: by state
        counts["promoted"] = sum(promoted.values())
    rescued = getattr(result, "rescued", None)
    if isinstance(rescued, list):  # RescueResult
        counts["rescued"] = len(rescued)
    cancelled = getattr(result, "duplicates_cancelled", None)
    if isinstance(cancelled, list):  # rescues and promotion: superseded unique duplicates
        counts["cancelled"] = len(cancelled)
    if hasattr(result, "jobs_deleted"):  # CleanupResult
        counts["cleaned"] = result.jobs_deleted + getattr(result, "dlq_purged", 0)
    enqueued = getattr(result, "enqueued", None)
    if isinstance(enqueued, list):  # CronEvalResult
        counts["fired"] = len(enqueued)
    if hasattr(result, "prune_backed_off"):  # RingTickResult
        counts["rotated"] = int(bool(result.rotate and result.rotate.rotated))
        counts["pruned"] = int(bool(result.prune and result.prune.outcome is PruneOutcome.PRUNED))
    if isinstance(getattr(result, "aged", None), int):  # PriorityAgingResult
        counts["aged"] = result.aged
    if isinstance(getattr(result, "rolled_slots", None), int):  # RollupResult
        counts["rolled up"] = result.rolled_slots
    return {word: count for word, count in counts.items() if count}


class WorkSummary:
    """The work of one leadership term's branches since the last line."""

    def __init__(self) -> None:
        self._counts: collections.Counter[str] = collections.Counter()

    def record(self, result: Any) -> None:
        self._counts.update(work_done(result))

    def take(self) -> dict[str, int]:
        """The counts so far, and start again from nothing."""
        counts, self._counts = dict(self._counts), collections.Counter()
        return counts

    async def log_every(self, interval: float | None = None) -> None:
        """Log the totals every ``interval`` (SUMMARY_INTERVAL) seconds in
        which there was work."""
        interval = interval or SUMMARY_INTERVAL
        while True:
            await trio.sleep(interval)
            counts = self.take()
            if any(counts.get(word) for word in JOB_WORK):
                log.info("in the last %s: %s", _period(interval), describe(counts))


def describe(counts: dict[str, int]) -> str:
    """``promoted 1,204, rescued 3, cleaned 900`` in :data:`WORK`'s order."""
    return ", ".join(f"{word} {counts[word]:,}" for word in WORK if counts.get(word))


def _period(seconds: float) -> str:
    return "minute" if seconds == 60 else f"{seconds:g}s"
