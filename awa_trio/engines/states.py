"""The storage states and engine names, and what each state means for a
leader: the part of the state-to-engine map that needs no engine object
(:mod:`awa_trio.engines` turns these names into engines). A leaf module, so
the schema contract and the job types can use it without importing any
engine."""

from __future__ import annotations

from typing import Protocol

#: ``awa.storage_status()``'s engine names.
CANONICAL = "canonical"
QUEUE_STORAGE = "queue_storage"
#: Engines with a full set of branches in this release, in the order their
#: grants are listed.
SUPPORTED_ENGINES = (CANONICAL, QUEUE_STORAGE)
#: Transition states (``awa.storage_transition_state.state``).
STATE_CANONICAL = "canonical"
STATE_PREPARED = "prepared"
STATE_MIXED_TRANSITION = "mixed_transition"
STATE_ACTIVE = "active"

#: Where a database without a transition row is.
INITIAL_ENGINE = CANONICAL
#: Where a fresh Awa 0.6 install ends up (its first awa-pg runtime finalises
#: it there): the demo's default and the CLI's first choice.
DEFAULT_ENGINE = QUEUE_STORAGE
ENGINE_CHOICES = (DEFAULT_ENGINE, *(name for name in SUPPORTED_ENGINES if name != DEFAULT_ENGINE))
#: Engines a staged transition leads into (each has a transition variant of
#: its branch set; the tests hold the two lists together).
TRANSITION_TARGETS = (QUEUE_STORAGE,)

# --- Awa's runtime vocabulary (awa.runtime_instances) ---------------------------------------
# Each runtime row says which storage it can serve (storage_capability) and
# its part in a staged transition (transition_role); the transition gates
# count live rows by these values, so they name engines too.

#: ``storage_capability`` values.
CAPABILITY_CANONICAL = "canonical"
CAPABILITY_CANONICAL_DRAIN_ONLY = "canonical_drain_only"
CAPABILITY_QUEUE_STORAGE = "queue_storage"
#: Capabilities awa.storage.live_runtime_capability always reports (0 when none).
STORAGE_CAPABILITIES = (CAPABILITY_CANONICAL, CAPABILITY_CANONICAL_DRAIN_ONLY, CAPABILITY_QUEUE_STORAGE)
#: The capability awa_trio's own runtime row reports: a leader that follows
#: every state, so no transition gate waits for it.
LEADER_CAPABILITY = CAPABILITY_QUEUE_STORAGE
#: The ``transition_role`` and capability of a runtime ready to serve the
#: transition target: entering mixed transition needs one live.
TARGET_ROLE = "queue_storage_target"
TARGET_CAPABILITY = CAPABILITY_QUEUE_STORAGE
#: Capabilities whose live runtimes keep the prepared state from entering
#: mixed transition (they would keep writing to the engine being left).
ENTER_MIXED_BLOCKERS = (CAPABILITY_CANONICAL,)
#: Runtime capabilities whose live snapshots keep awa.storage_finalize()
#: waiting, by schema version: schema 40 (Awa 0.6.2+) lets drained drain-only
#: runtimes stay up through finalize.
FINALIZE_BLOCKERS = {
    39: (CAPABILITY_CANONICAL, CAPABILITY_CANONICAL_DRAIN_ONLY),
    40: (CAPABILITY_CANONICAL,),
}
#: The storage report's SQL literals for the values above (slots of
#: :data:`awa_trio.engines.queue_info.INFO_SQL`): the engine a staged
#: transition leads into, and the role and capability of its runtimes. The
#: report compares with one target: a second one fails here, at import.
(_TARGET_ENGINE,) = TRANSITION_TARGETS
STORAGE_REPORT_LITERALS = {
    "target_engine": f"'{_TARGET_ENGINE}'",
    "target_role": f"'{TARGET_ROLE}'",
    "target_capability": f"'{TARGET_CAPABILITY}'",
}


class StorageState(Protocol):
    """What ``awa.storage_status()`` says (a :class:`~awa_trio.schema.SchemaInfo`)."""

    @property
    def engine(self) -> str: ...

    @property
    def state(self) -> str: ...


def runs_queue_storage(info: StorageState) -> bool:
    """Queue-storage branches run, as in an awa-pg runtime with the auto
    role, once routing has flipped (mixed_transition) or finished (active)."""
    return info.engine == QUEUE_STORAGE and info.state in (STATE_MIXED_TRANSITION, STATE_ACTIVE)


def in_mixed_transition(info: StorageState) -> bool:
    """Canonical rows may still be draining beside queue storage."""
    return runs_queue_storage(info) and info.state == STATE_MIXED_TRANSITION


def leading_engine(info: StorageState) -> str:
    """The engine whose branches lead a database in this state."""
    return QUEUE_STORAGE if runs_queue_storage(info) else CANONICAL


def draining_engine(info: StorageState) -> str | None:
    """The engine whose rows still drain beside the leading one (a staged
    transition after routing flipped), or None."""
    return CANONICAL if in_mixed_transition(info) else None


def engines_in_use(info: StorageState) -> tuple[str, ...]:
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
    return tuple(names)


def branch_set(info: StorageState) -> tuple[str, str]:
    """What decides the branch set: a change of it ends the leader term."""
    if not runs_queue_storage(info):
        return (CANONICAL, "")
    return (QUEUE_STORAGE, info.state)


def switched_at_install(asked: str | None, info: StorageState) -> bool:
    """Whether ``migrate --engine asked`` must still switch this install (Awa's
    installer does it for queue storage; the canonical engine needs none)."""
    return asked == QUEUE_STORAGE and not runs_queue_storage(info)


def accepts_transition(name: str | None) -> bool:
    """Whether a staged transition can lead into the engine ``name`` (the
    prepared engine of ``awa.storage_status()``)."""
    return name in TRANSITION_TARGETS


def job_label(engine: str, job_id: int) -> str:
    """A job for log lines: a bare id on the initial engine (whose ids
    everyone knows), ``engine:id`` on another (ids overlap between engines)."""
    return str(job_id) if engine == INITIAL_ENGINE else f"{engine}:{job_id}"
