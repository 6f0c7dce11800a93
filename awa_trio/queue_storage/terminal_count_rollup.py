"""Fold sealed slots' terminal-count deltas into the live counts."""

from __future__ import annotations

from ..context import MaintenanceContext

NAME = "terminal_count_rollup"


async def run_once(ctx: MaintenanceContext) -> object:
    raise NotImplementedError(f"{NAME} on queue storage is not written yet")
