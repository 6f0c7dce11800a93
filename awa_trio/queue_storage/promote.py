"""Promotion of due deferred rows into ready entries, server-side."""

from __future__ import annotations

from ..context import MaintenanceContext

NAME = "promote_scheduled"


async def run_once(ctx: MaintenanceContext) -> object:
    raise NotImplementedError(f"{NAME} on queue storage is not written yet")
