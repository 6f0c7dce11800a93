"""Sustained queue-storage load: real awa-pg workers completing and failing
jobs while a leader (awa_trio or upstream's) rotates and prunes the rings.
Shared by tests/test_qs_sustained.py and bench/bench_qs_sustained.py."""

from __future__ import annotations

import dataclasses
import itertools
import statistics
from pathlib import Path

LOAD_WORKER_SCRIPT = Path(__file__).with_name("awa_pg_load_worker.py")
RINGS = ("queue", "lease", "claim")

RING_SAMPLE_SQL = """
    SELECT
        (SELECT generation FROM awa.queue_ring_state WHERE singleton) AS queue,
        (SELECT generation FROM awa.lease_ring_state WHERE singleton) AS lease,
        (SELECT generation FROM awa.claim_ring_state WHERE singleton) AS claim,
        (SELECT count(*) FROM awa.done_entries) AS done_rows,
        (SELECT count(*) FROM awa.dlq_entries) AS dlq_rows
"""

#: What the jobs became, read from the queue-storage view awa-pg's own API uses.
JOB_STATES_SQL = """
    SELECT state::text AS state, count(*) AS n
    FROM awa.jobs
    WHERE queue = $1
    GROUP BY 1
"""

#: Terminal jobs of a queue as upstream's exact count reads them: rollups of
#: pruned slots + folded live counters + pending deltas + receipt completions
#: not tombstoned. (awa-pg's ``completed_last_hour`` misses pruned completions.)
EXACT_TERMINAL_SQL = """
    SELECT COALESCE((SELECT sum(pruned_completed_count + pruned_failed_count)
                     FROM awa.queue_terminal_rollups WHERE queue = $1), 0)
         + COALESCE((SELECT sum(live_terminal_count)
                     FROM awa.queue_terminal_live_counts WHERE queue = $1), 0)
         + COALESCE((SELECT sum(terminal_delta)
                     FROM awa.queue_terminal_count_deltas WHERE queue = $1), 0)
         + COALESCE((SELECT sum(completed_count)
                     FROM awa.receipt_completion_batches WHERE queue = $1), 0)
         - (SELECT count(*) FROM awa.receipt_completion_tombstones WHERE queue = $1)
"""


@dataclasses.dataclass
class RingSamples:
    """Generation of each ring over time, to find the longest stall."""

    times: list[float] = dataclasses.field(default_factory=list)
    generations: dict[str, list[int]] = dataclasses.field(
        default_factory=lambda: {ring: [] for ring in RINGS}
    )
    done_rows: list[int] = dataclasses.field(default_factory=list)

    def add(self, at: float, row) -> None:
        self.times.append(at)
        for ring in RINGS:
            self.generations[ring].append(int(row[ring]))
        self.done_rows.append(int(row["done_rows"]))

    def stalls(self, ring: str) -> list[float]:
        """Gaps between consecutive generation changes of one ring."""
        changes = [
            self.times[i]
            for i in range(1, len(self.times))
            if self.generations[ring][i] != self.generations[ring][i - 1]
        ]
        if not self.times:
            return []
        edges = [self.times[0], *changes, self.times[-1]]
        return [b - a for a, b in itertools.pairwise(edges)]

    def longest_stall(self, ring: str) -> float:
        return max(self.stalls(ring), default=0.0)

    def median_stall(self, ring: str) -> float:
        gaps = self.stalls(ring)
        return statistics.median(gaps) if gaps else 0.0

    def rotations(self, ring: str) -> int:
        values = self.generations[ring]
        return values[-1] - values[0] if values else 0
