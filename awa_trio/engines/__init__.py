"""The storage engines, one package each, and the one place that maps a
storage state to an engine.

Each engine package holds its branch modules and one
:class:`~awa_trio.engines.base.Engine` instance (``ENGINE`` in its
``engine.py``): its branch specs, the grants they need, its backlog reads,
its part in a staged transition. An engine imports only the shared core
(:mod:`awa_trio.maintenance`) and the driver, never another engine.

This package alone knows the engines by name: :mod:`awa_trio.engines.states`
says which engine leads a database in a given ``awa.storage_status()``
state, which one still drains beside it and whose objects the database
uses; this module turns those names into engine objects. Everything else
asks the engine object it is given. Engine modules are imported on first
use, so a canonical leader never loads the queue-storage package to run its
branches (start-up CPU is part of the idle cost).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from . import states
from .base import Engine
from .states import (
    CANONICAL,
    DEFAULT_ENGINE,
    ENGINE_CHOICES,
    INITIAL_ENGINE,
    QUEUE_STORAGE,
    STATE_ACTIVE,
    STATE_CANONICAL,
    STATE_MIXED_TRANSITION,
    STATE_PREPARED,
    SUPPORTED_ENGINES,
    StorageState,
)

if TYPE_CHECKING:
    from ..branch import BranchSpec
    from ..config import MaintenanceConfig

__all__ = [
    "CANONICAL",
    "DEFAULT_ENGINE",
    "ENGINE_CHOICES",
    "INITIAL_ENGINE",
    "QUEUE_STORAGE",
    "STATE_ACTIVE",
    "STATE_CANONICAL",
    "STATE_MIXED_TRANSITION",
    "STATE_PREPARED",
    "SUPPORTED_ENGINES",
    "Engine",
    "branches_for",
    "draining_engine",
    "engine_for",
    "engine_named",
    "engines_in_use",
    "every_branch_name",
    "known_engines",
    "planes",
]

#: Known engines, by name: the module holding each one's ``ENGINE``.
_ENGINE_MODULES = {
    CANONICAL: "awa_trio.engines.canonical.engine",
    QUEUE_STORAGE: "awa_trio.engines.queue_storage.engine",
}


def engine_named(name: str) -> Engine:
    """The engine ``awa.storage_status()`` calls ``name`` (ValueError if unknown)."""
    module = _ENGINE_MODULES.get(name)
    if module is None:
        raise ValueError(f"unknown storage engine {name!r} (known: {', '.join(SUPPORTED_ENGINES)})")
    engine: Engine = importlib.import_module(module).ENGINE
    return engine


def known_engines() -> tuple[Engine, ...]:
    """Every engine of this release (imports each one's light engine module)."""
    return tuple(engine_named(name) for name in SUPPORTED_ENGINES)


def engine_for(info: StorageState) -> Engine:
    """The engine whose branches lead a database in this state."""
    return engine_named(states.leading_engine(info))


def draining_engine(info: StorageState) -> Engine | None:
    """The engine whose rows still drain beside the leading one, or None."""
    name = states.draining_engine(info)
    return None if name is None else engine_named(name)


def engines_in_use(info: StorageState) -> tuple[Engine, ...]:
    """Engines whose objects the database uses now (whose grants it needs)."""
    return tuple(engine_named(name) for name in states.engines_in_use(info))


def planes(info: StorageState) -> tuple[bool, ...]:
    """Per engine of :data:`SUPPORTED_ENGINES`, in that order: whether the
    database uses it now (:func:`engines_in_use`)."""
    in_use = states.engines_in_use(info)
    return tuple(name in in_use for name in SUPPORTED_ENGINES)


def branches_for(config: MaintenanceConfig, info: StorageState) -> list[BranchSpec]:
    """The branches a term runs in this state: the leading engine's set, or
    its transition variant while another engine's rows drain."""
    engine = engine_for(info)
    drained = draining_engine(info)
    if drained is None:
        return engine.branches(config)
    if engine.transition_branches is None or drained.drain_passes is None:
        raise RuntimeError(f"no staged transition leads from {drained.name} to {engine.name}")
    return engine.transition_branches(config, drained.drain_passes())


def every_branch_name() -> frozenset[str]:
    """Every branch name on any engine and transition state, as the engines
    declare them (no branch module is imported)."""
    return frozenset(name for engine in known_engines() for name in engine.branch_names)
