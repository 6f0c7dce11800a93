"""Queue depth, lag and DLQ depth gauges from the bounded head-signal query."""

from __future__ import annotations

from ..context import MaintenanceContext

NAME = "queue_stats"


async def run_once(ctx: MaintenanceContext) -> object:
    raise NotImplementedError(f"{NAME} on queue storage is not written yet")
