"""The storage engines, one package each, and the one place that maps a
storage state to an engine.

Each engine package holds its branch modules and one
:class:`~awa_trio.engines.base.Engine` instance (``ENGINE`` in its
``engine.py``): its branch specs, the grants they need, its backlog reads,
its part in a staged transition. An engine imports only the shared core
(:mod:`awa_trio.maintenance`) and the driver, never another engine.

This module alone knows the engines by name: which engine leads a database
in a given ``awa.storage_status()`` state, which one still drains beside it,
and whose objects the database uses. Everything else asks the engine object
it is given. Engine modules are imported on first use, so a canonical
leader never loads the queue-storage package to run its branches (start-up
CPU is part of the idle cost).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from .base import Engine

if TYPE_CHECKING:
    from ..branch import BranchSpec
    from ..config import MaintenanceConfig
    from ..schema import SchemaInfo

#: ``awa.storage_status()``'s engine names.
CANONICAL = "canonical"
QUEUE_STORAGE = "queue_storage"
#: Transition states (``awa.storage_transition_state.state``).
STATE_CANONICAL = "canonical"
STATE_PREPARED = "prepared"
STATE_MIXED_TRANSITION = "mixed_transition"
STATE_ACTIVE = "active"

#: Known engines, by name: the module holding each one's ``ENGINE``.
_ENGINE_MODULES = {
    CANONICAL: "awa_trio.engines.canonical.engine",
    QUEUE_STORAGE: "awa_trio.engines.queue_storage.engine",
}
#: Engines with a full set of branches in this release.
SUPPORTED_ENGINES = tuple(_ENGINE_MODULES)
#: Where a database without a transition row is.
INITIAL_ENGINE = CANONICAL
#: Where a fresh Awa 0.6 install ends up (its first awa-pg runtime finalises
#: it there): the demo's default and the CLI's first choice.
DEFAULT_ENGINE = QUEUE_STORAGE
ENGINE_CHOICES = (DEFAULT_ENGINE, *(name for name in SUPPORTED_ENGINES if name != DEFAULT_ENGINE))


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


def job_label(engine: str, job_id: int) -> str:
    """A job for log lines: a bare id on the initial engine (whose ids
    everyone knows), ``engine:id`` on another (ids overlap between engines)."""
    return str(job_id) if engine == INITIAL_ENGINE else f"{engine}:{job_id}"


def runs_queue_storage(info: SchemaInfo) -> bool:
    """Queue-storage branches run, as upstream's auto runtime does, once
    routing has flipped (mixed_transition) or finished (active)."""
    return info.engine == QUEUE_STORAGE and info.state in (STATE_MIXED_TRANSITION, STATE_ACTIVE)


def in_mixed_transition(info: SchemaInfo) -> bool:
    """Canonical rows may still be draining beside queue storage."""
    return runs_queue_storage(info) and info.state == STATE_MIXED_TRANSITION


def engine_for(info: SchemaInfo) -> Engine:
    """The engine whose branches lead a database in this state."""
    return engine_named(QUEUE_STORAGE if runs_queue_storage(info) else CANONICAL)


def draining_engine(info: SchemaInfo) -> Engine | None:
    """The engine whose rows still drain beside the leading one (a staged
    transition after routing flipped), or None."""
    return engine_named(CANONICAL) if in_mixed_transition(info) else None


def engines_in_use(info: SchemaInfo) -> tuple[Engine, ...]:
    """Engines whose objects the database uses now, so whose grants a leader
    needs. A staged transition needs both (the canonical plane drains, and
    once routing flips the queue-storage branches run; while prepared the
    queue-storage schema is already there); finalised queue storage leaves
    the canonical job tables alone (even awa.jobs reads queue storage then)."""
    names = []
    if not runs_queue_storage(info) or in_mixed_transition(info):
        names.append(CANONICAL)
    if info.engine == QUEUE_STORAGE or info.state != STATE_CANONICAL:
        names.append(QUEUE_STORAGE)
    return tuple(engine_named(name) for name in names)


def planes(info: SchemaInfo) -> tuple[bool, ...]:
    """Per engine of :data:`SUPPORTED_ENGINES`, in that order: whether the
    database uses it now (:func:`engines_in_use`)."""
    in_use = {engine.name for engine in engines_in_use(info)}
    return tuple(name in in_use for name in SUPPORTED_ENGINES)


def branch_set(info: SchemaInfo) -> tuple[str, str]:
    """What decides the branch set: a change of it ends the leader term."""
    if not runs_queue_storage(info):
        return (CANONICAL, "")
    return (QUEUE_STORAGE, info.state)


def branches_for(config: MaintenanceConfig, info: SchemaInfo) -> list[BranchSpec]:
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


def accepts_transition(name: str | None) -> bool:
    """Whether a staged transition can lead into the engine ``name`` (the
    prepared engine of ``awa.storage_status()``)."""
    return name in _ENGINE_MODULES and engine_named(name).transition_branches is not None
