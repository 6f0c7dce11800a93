"""Queue ring: rotate the cursor, then prune the oldest sealed slot."""

from __future__ import annotations

from ..context import MaintenanceContext

NAME = "rotate_queue"


async def run_once(ctx: MaintenanceContext) -> object:
    raise NotImplementedError(f"{NAME} on queue storage is not written yet")
