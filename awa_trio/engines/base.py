"""What a storage engine is to the rest of awa_trio: one :class:`Engine`
instance per engine package (``ENGINE`` in its ``engine.py``).

Code outside :mod:`awa_trio.engines` asks the engine object for what
differs between engines (its branches, the grants they need, the backlog
reads of ``status`` and ``doctor``, its part in a staged transition, how
messages describe it and name its rescues, example identifiers for ``awa_trio
sql``) and never compares engine names; :mod:`awa_trio.engines` alone maps a storage
state to an engine. The instance module stays light: the branch
modules are imported inside the functions that build the specs, so asking
an engine for its name, grants or reads loads none of them.

:data:`ENGINE_PIECES` is the checklist a new engine fills in (the same list
as docs/architecture.md); :func:`check_engine` names the piece an object
lacks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from ..errors import AwaTrioError
from ..sql import Statement
from .states import StorageState

if TYPE_CHECKING:
    from ..branch import BranchSpec
    from ..config import MaintenanceConfig
    from ..context import MaintenanceContext

    RunOnce = Callable[[MaintenanceContext], Awaitable[Any]]

SELECT, INSERT, UPDATE, DELETE, TRUNCATE = "SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE"
USAGE, CREATE, EXECUTE, CONNECT = "USAGE", "CREATE", "EXECUTE", "CONNECT"


# --- grants: what an engine's statements need ------------------------------------------


@dataclasses.dataclass(frozen=True)
class TableNeed:
    """Privileges on one table or view (by name in its schema)."""

    name: str
    privileges: tuple[str, ...]
    why: str
    #: Privileges needed on each partition as well: ring prunes and the
    #: rollup read, lock and truncate a slot's child tables directly.
    partition_privileges: tuple[str, ...] = ()
    #: Only Awa's own functions touch it: needed only where one of them
    #: names it (Awa releases differ in which admin-cache tables they use).
    via_awa_functions: bool = False


@dataclasses.dataclass(frozen=True)
class SequenceNeed:
    name: str
    privileges: tuple[str, ...]
    why: str


@dataclasses.dataclass(frozen=True)
class FunctionNeed:
    """EXECUTE on every overload of a function (by name in its schema)."""

    name: str
    why: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class StorageSchemaNeeds:
    """An engine that keeps its tables in a schema of their own (named by
    ``awa.storage_status()``; ``awa`` unless the installation chose another)."""

    #: How the grants script's header names the schema.
    schema_label: str
    #: Privileges on the schema itself, and why.
    schema_privileges: tuple[str, ...]
    schema_why: str
    tables: tuple[TableNeed, ...]
    sequences: tuple[SequenceNeed, ...]
    functions: tuple[FunctionNeed, ...]
    #: Sequences made at run time, one per name with these prefixes; their
    #: privileges, why, and what the default privileges call them.
    sequence_prefixes: tuple[str, ...]
    prefix_privileges: tuple[str, ...]
    prefix_why: str
    prefix_label: str
    #: Predefined roles the maintenance role must be a member of, and why.
    member_of: tuple[tuple[str, str], ...]


@dataclasses.dataclass(frozen=True, kw_only=True)
class GrantNeeds:
    """What an engine's branches (and the Awa functions and triggers they
    call, none SECURITY DEFINER) need of the role that leads."""

    #: In the awa schema.
    awa_tables: tuple[TableNeed, ...]
    awa_sequences: tuple[SequenceNeed, ...]
    awa_functions: tuple[FunctionNeed, ...]
    #: In the engine's own schema; None: it has none.
    storage_schema: StorageSchemaNeeds | None


# --- reads: status and doctor ------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class BacklogReads:
    """The reads ``status`` and ``doctor`` make of an engine's backlog;
    ``{schema}`` (if a statement has it) is the storage schema."""

    #: Due jobs not yet promoted: rows of (state, jobs, oldest_seconds).
    due_counts: Statement
    #: One row: stale_heartbeats, past_deadline, callbacks_timed_out
    #: (parameter ``:staleness``, seconds).
    rescue_backlog: Statement

    def due_counts_query(self, storage_schema: str) -> tuple[Any, ...]:
        """:attr:`due_counts`, bound for ``Database.fetch``."""
        return _bind(self.due_counts, storage_schema)

    def rescue_backlog_query(self, storage_schema: str, staleness: float) -> tuple[Any, ...]:
        """:attr:`rescue_backlog`, bound for ``Database.fetchrow``."""
        return _bind(self.rescue_backlog, storage_schema, staleness=staleness)


def _bind(statement: Statement, storage_schema: str, **values: Any) -> tuple[Any, ...]:
    """``statement`` bound, with the storage schema where it has the slot."""
    return statement.bind(storage_schema if "schema" in statement.slots else None, **values)


# --- staged transitions --------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class DrainPasses:
    """What the leader owes an engine's rows while a staged transition
    drains them into the next engine: one pass per branch of the next
    engine it is folded into, and a report branch of its own."""

    promote: RunOnce
    rescue_heartbeats: RunOnce
    rescue_deadlines: RunOnce
    rescue_callbacks: RunOnce
    cleanup: RunOnce
    report: Callable[[MaintenanceConfig], BranchSpec]


# --- messages --------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class Wording:
    """How messages speak of a database this engine leads: templates whose
    ``{engine}`` and ``{state}`` are ``awa.storage_status()``'s."""

    #: After ``migrate``: where the database is and what happens next.
    migrated: str
    #: The demo's line on the storage it runs on.
    demo: str

    def describe_migrated(self, info: StorageState) -> str:
        return self.migrated.format(engine=info.engine, state=info.state)

    def describe_demo(self, info: StorageState) -> str:
        return self.demo.format(engine=info.engine, state=info.state)


# --- the engine ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class Engine:
    """One storage engine. Every field is required (``None`` where an
    optional capability is absent), so a new engine decides each one."""

    #: ``awa.storage_status()``'s name for it.
    name: str
    #: How log lines and messages name it.
    title: str
    #: Every branch name it may run, in any variant: declared here so that
    #: checking a configured name loads no branch module.
    branch_names: frozenset[str]
    #: Its branch set, for a database it alone serves.
    branches: Callable[[MaintenanceConfig], list[BranchSpec]]
    #: Its set while a staged transition drains the previous engine's rows
    #: (given that engine's passes); None: no transition leads into it.
    transition_branches: Callable[[MaintenanceConfig, DrainPasses], list[BranchSpec]] | None
    #: The passes over its rows while a transition drains them; None: no
    #: transition leads out of it.
    drain_passes: Callable[[], DrainPasses] | None
    #: The grants its branches need.
    grants: GrantNeeds
    #: Its backlog reads (status, doctor).
    backlog: BacklogReads
    #: Its tables live in the schema ``awa.storage_status()`` names (a change
    #: of that schema ends a term).
    uses_storage_schema: bool
    #: How ``migrate --engine`` switches a fresh install to it (blocking, for
    #: a worker thread; given the database URL); None: the migration leaves
    #: a fresh install on it.
    install: Callable[[str], None] | None
    #: The ``storage_transition_role`` an awa-pg runtime takes to keep a
    #: database on this engine (the demo's workers).
    worker_role: str
    #: How messages speak of a database it leads (``migrate``, the demo).
    wording: Wording
    #: ``() -> {error text: kind}``: the error entry each of its rescues
    #: writes into a job's errors, and which rescue it is (``heartbeat``,
    #: ``deadline``, ``callback``), for the demo's narration (loads the
    #: rescue modules).
    rescue_reasons: Callable[[], Mapping[str, str]]
    #: ``(schema, slot) -> {module or "": {slot name: identifier}}``: the
    #: identifiers ``python -m awa_trio sql`` shows for its statements whose
    #: slots name the partitions of one ring slot; None: it has none.
    sql_examples: Callable[[str, int], dict[str, dict[str, str]]] | None
    #: One row, column ``ready``: whether its schema (parameter
    #: ``storage_schema``, the one ``awa.storage_status()`` names), prepared
    #: for a staged transition into it, is complete enough for routing to
    #: flip (the storage report's ``transition_ready``); None: no transition
    #: leads into it.
    prepared_schema_ready: Statement | None

    def __post_init__(self) -> None:
        check_engine(self)

    def __repr__(self) -> str:
        return f"<Engine {self.name}>"


#: (piece, what it is): the checklist a new engine fills in.
ENGINE_PIECES: tuple[tuple[str, str], ...] = (
    ("name", "awa.storage_status()'s name for the engine"),
    ("title", "how messages name it"),
    ("branch_names", "every branch name it may run, declared without importing the branches"),
    ("branches", "its branch specs (config -> list[BranchSpec])"),
    ("transition_branches", "its set while a staged transition drains the previous engine, or None"),
    ("drain_passes", "the passes over its rows while a transition drains them, or None"),
    ("grants", "the privileges its branches need (GrantNeeds)"),
    ("backlog", "the due-count and rescue-backlog statements of status and doctor (BacklogReads)"),
    ("uses_storage_schema", "whether its tables live in the schema storage_status() names"),
    ("install", "how migrate --engine switches a fresh install to it, or None"),
    ("worker_role", "the storage_transition_role an awa-pg runtime takes to stay on it"),
    ("wording", "how migrate and the demo describe a database it leads (Wording)"),
    ("rescue_reasons", "() -> {error text: rescue kind} of its rescues, for the demo's narration"),
    ("sql_examples", "the ring identifiers `awa_trio sql` shows for its slot statements, or None"),
    ("prepared_schema_ready", "the statement saying its prepared schema can enter a transition, or None"),
)

#: The type each piece must have (None allowed where the checklist says so).
_OPTIONAL = {"transition_branches", "drain_passes", "install", "sql_examples", "prepared_schema_ready"}
_KINDS: dict[str, tuple[type, ...] | str] = {
    "name": (str,),
    "title": (str,),
    "branch_names": (frozenset,),
    "branches": "callable",
    "transition_branches": "callable",
    "drain_passes": "callable",
    "grants": (GrantNeeds,),
    "backlog": (BacklogReads,),
    "uses_storage_schema": (bool,),
    "install": "callable",
    "worker_role": (str,),
    "wording": (Wording,),
    "rescue_reasons": "callable",
    "sql_examples": "callable",
    "prepared_schema_ready": (Statement,),
}


class IncompleteEngine(AwaTrioError):
    """An engine object lacks a piece of :data:`ENGINE_PIECES`."""


def check_engine(engine: object) -> None:
    """Raise IncompleteEngine naming every piece ``engine`` lacks or has of
    the wrong kind (any object: a third engine need not subclass Engine)."""
    problems = []
    for piece, what in ENGINE_PIECES:
        missing = object()
        value = getattr(engine, piece, missing)
        if value is missing:
            problems.append(f"{piece} (missing: {what})")
            continue
        if value is None and piece in _OPTIONAL:
            continue
        kind = _KINDS[piece]
        wrong = not callable(value) if isinstance(kind, str) else not isinstance(value, kind)
        if wrong or (piece in ("name", "title", "worker_role", "branch_names") and not value):
            problems.append(f"{piece} (got {value!r}: {what})")
    if problems:
        label = getattr(engine, "name", None) or type(engine).__name__
        raise IncompleteEngine(f"engine {label!r} lacks: " + "; ".join(problems))
