"""DLQ purge past retention, plus the engine-independent cleanup steps."""

from __future__ import annotations

from ..context import MaintenanceContext

NAME = "cleanup"


async def run_once(ctx: MaintenanceContext) -> object:
    raise NotImplementedError(f"{NAME} on queue storage is not written yet")
