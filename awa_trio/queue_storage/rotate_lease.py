"""Lease ring: rotate (compare-and-set on slot and generation), then prune."""

from __future__ import annotations

from ..context import MaintenanceContext

NAME = "rotate_lease"


async def run_once(ctx: MaintenanceContext) -> object:
    raise NotImplementedError(f"{NAME} on queue storage is not written yet")
