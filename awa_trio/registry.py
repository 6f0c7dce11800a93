"""The branch factory a service uses unless told otherwise: the branches
the storage state calls for, as :mod:`awa_trio.engines` decides them (the
one place that maps a storage state to an engine)."""

from __future__ import annotations

from .branch import BranchSpec
from .config import MaintenanceConfig
from .engines import branches_for
from .engines import every_branch_name as _every_branch_name
from .schema import SchemaInfo


def default_branches(config: MaintenanceConfig, schema: SchemaInfo) -> list[BranchSpec]:
    """The leading engine's set, or its staged-transition variant."""
    return branches_for(config, schema)


def every_branch_name(config: MaintenanceConfig) -> frozenset[str]:
    """Every branch name on any engine and transition state: what
    ``disabled_branches`` and pause accept (the set a leader runs changes
    with the storage state while it runs). The engines declare the names,
    so no branch module is imported to check one."""
    del config  # the names do not depend on it
    return _every_branch_name()
