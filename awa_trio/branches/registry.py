"""Which branches run on which storage engine, at which interval."""

from __future__ import annotations

from ..branch import BranchSpec
from ..config import MaintenanceConfig
from ..schema import CANONICAL, SchemaInfo
from . import promote


def canonical_branches(config: MaintenanceConfig) -> list[BranchSpec]:
    return [
        BranchSpec(promote.NAME, config.promote_interval, promote.run_once),
    ]


def default_branches(config: MaintenanceConfig, schema: SchemaInfo) -> list[BranchSpec]:
    if schema.engine == CANONICAL:
        return canonical_branches(config)
    raise ValueError(f"no branches for storage engine {schema.engine!r}")
