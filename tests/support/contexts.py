"""Build a MaintenanceContext on a test database, to call a branch's
run_once directly (no leadership, no timers)."""

from __future__ import annotations

import dataclasses
from typing import Any

from awa_trio.config import MaintenanceConfig
from awa_trio.context import MaintenanceContext
from awa_trio.metrics import MaintenanceMetrics
from awa_trio.schema import check_schema


async def make_context(
    db,
    config: MaintenanceConfig | None = None,
    *,
    meter_provider=None,
    engine: str | None = None,
    hooks=None,
    **settings: Any,
) -> MaintenanceContext:
    """``settings`` change single config fields; ``engine`` pretends the
    database runs another storage engine."""
    config = config or MaintenanceConfig()
    if settings:
        config = config.replace(**settings)
    schema = await check_schema(db)
    if engine is not None:
        schema = dataclasses.replace(schema, engine=engine)
    return MaintenanceContext.standalone(
        db=db,
        config=config,
        metrics=MaintenanceMetrics(meter_provider),
        schema=schema,
        hooks=hooks,
    )
