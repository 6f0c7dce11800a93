"""Rescue of running attempts past their hard deadline."""

from __future__ import annotations

from ..context import MaintenanceContext

NAME = "rescue_expired_deadlines"


async def run_once(ctx: MaintenanceContext) -> object:
    raise NotImplementedError(f"{NAME} on queue storage is not written yet")
