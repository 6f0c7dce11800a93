"""Rescue of attempts waiting for a callback past its timeout."""

from __future__ import annotations

from ..context import MaintenanceContext

NAME = "rescue_expired_callbacks"


async def run_once(ctx: MaintenanceContext) -> object:
    raise NotImplementedError(f"{NAME} on queue storage is not written yet")
