"""The schema contract: which Awa schema versions and storage engines
awa_trio can maintain, and the ``migrate`` command (delegated to awa-pg)."""

from __future__ import annotations

import dataclasses
import json
import logging
import re
from typing import Any

import trio

from .db import Database, QueryError, open_database
from .engines import states
from .engines.states import ENTER_MIXED_BLOCKERS as ENTER_MIXED_BLOCKERS
from .engines.states import FINALIZE_BLOCKERS as FINALIZE_BLOCKERS
from .engines.states import INITIAL_ENGINE as INITIAL_ENGINE
from .engines.states import STATE_ACTIVE as STATE_ACTIVE
from .engines.states import STATE_CANONICAL as STATE_CANONICAL
from .engines.states import STATE_MIXED_TRANSITION as STATE_MIXED_TRANSITION
from .engines.states import STATE_PREPARED as STATE_PREPARED
from .engines.states import STORAGE_REPORT_LITERALS as STORAGE_REPORT_LITERALS
from .engines.states import SUPPORTED_ENGINES as SUPPORTED_ENGINES
from .engines.states import accepts_transition as accepts_transition
from .errors import AwaTrioError, UnsupportedSchema
from .sql import Statement

log = logging.getLogger(__name__)

#: Awa 0.6.0-0.6.1 = 39, Awa 0.6.2-0.6.9 = 40 (v40 only changes storage-transition finalisation).
SUPPORTED_SCHEMA_VERSIONS = (39, 40)
#: Engine names and transition states live with the state-to-engine map
#: (:mod:`awa_trio.engines.states`); kept importable from here for callers.
CANONICAL = states.CANONICAL
QUEUE_STORAGE = states.QUEUE_STORAGE
AWA_PG_REQUIREMENT = "awa-pg==0.6.1"
DEFAULT_QUEUE_STORAGE_SCHEMA = "awa"

_SCHEMA_PRESENT_SQL = Statement("SELECT to_regclass('awa.schema_version') IS NOT NULL")
_SCHEMA_VERSION_SQL = Statement("SELECT max(version) FROM awa.schema_version")
_STORAGE_STATUS_SQL = Statement("""
    SELECT active_engine, current_engine, prepared_engine, state, details::text AS details
    FROM awa.storage_status()
""")
# The three reads above in one round trip, for a database that has the awa
# schema (the storage watch reads it every second); where a part is missing
# it fails, and the reads above say what is there.
_SCHEMA_AND_STORAGE_SQL = Statement("""
    SELECT (SELECT max(version) FROM awa.schema_version) AS version,
           status.active_engine, status.state, status.details::text AS details
    FROM (SELECT 1) AS always_one_row
    LEFT JOIN awa.storage_status() AS status ON true
""")
#: SQLSTATEs of a missing table, function or schema.
_UNDEFINED_OBJECT_SQLSTATES = ("42P01", "42883", "3F000")
#: A schema name awa_trio can put into SQL text unquoted.
PLAIN_IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


@dataclasses.dataclass(frozen=True)
class SchemaInfo:
    version: int
    #: ``awa.active_storage_engine()``: where new work goes.
    engine: str
    #: Transition state (canonical, prepared, mixed_transition, active).
    state: str = STATE_CANONICAL
    #: Schema holding the queue-storage tables (from storage_status details).
    queue_storage_schema: str = DEFAULT_QUEUE_STORAGE_SCHEMA

    # What these mean per engine is decided by the state-to-engine map.
    @property
    def runs_queue_storage(self) -> bool:
        """Queue-storage branches run (routing has flipped or finished)."""
        return states.runs_queue_storage(self)

    @property
    def in_mixed_transition(self) -> bool:
        """Canonical rows may still be draining beside queue storage."""
        return states.in_mixed_transition(self)

    @property
    def branch_set(self) -> tuple[str, str]:
        """What decides the branch set: a change of it ends the leader term."""
        return states.branch_set(self)


def unsupported_version_message(version: int | None) -> str:
    supported = ", ".join(str(v) for v in SUPPORTED_SCHEMA_VERSIONS)
    if version is None:
        return (
            "no awa schema in this database (supported versions: "
            f"{supported}); install it with `python -m awa_trio migrate`"
        )
    return (
        f"awa schema version {version} is not supported (supported: {supported}); "
        f"upgrade awa_trio or pin awa-pg"
    )


def _queue_storage_schema(details: str | None) -> str:
    try:
        name = (json.loads(details) if details else {}).get("schema")
    except (ValueError, AttributeError):
        name = None
    if not name:
        return DEFAULT_QUEUE_STORAGE_SCHEMA
    if not PLAIN_IDENTIFIER.match(name):
        raise UnsupportedSchema(
            f"queue-storage schema name {name!r} in awa.storage_status() is not a plain "
            "identifier awa_trio can address"
        )
    return str(name)


async def read_schema(db: Database) -> SchemaInfo | None:
    """The installed schema version and storage state, or None without an awa schema."""
    try:
        row = await db.fetchrow(*_SCHEMA_AND_STORAGE_SQL.bind())
    except QueryError as exc:
        if exc.sqlstate not in _UNDEFINED_OBJECT_SQLSTATES:
            raise
        return await _read_schema_step_by_step(db)
    if row is None or row["version"] is None:
        return None
    return _schema_info(row["version"], row["active_engine"], row["state"], row["details"])


async def _read_schema_step_by_step(db: Database) -> SchemaInfo | None:
    """read_schema for a database that may lack any part of the awa schema."""
    if not await db.fetchval(*_SCHEMA_PRESENT_SQL.bind()):
        return None
    version = await db.fetchval(*_SCHEMA_VERSION_SQL.bind())
    if version is None:
        return None
    row = await db.fetchrow(*_STORAGE_STATUS_SQL.bind())
    if row is None:  # no transition row: a canonical install
        return SchemaInfo(version=int(version), engine=INITIAL_ENGINE)
    return _schema_info(version, row["active_engine"], row["state"], row["details"])


def _schema_info(version: int, engine: str | None, state: str | None, details: str | None) -> SchemaInfo:
    return SchemaInfo(
        version=int(version),
        engine=str(engine or INITIAL_ENGINE),
        state=str(state or STATE_CANONICAL),
        queue_storage_schema=_queue_storage_schema(details),
    )


async def check_schema(db: Database) -> SchemaInfo:
    """Refuse, with one clear line, any database awa_trio cannot maintain."""
    info = await read_schema(db)
    if info is None:
        raise UnsupportedSchema(unsupported_version_message(None))
    if info.version not in SUPPORTED_SCHEMA_VERSIONS:
        raise UnsupportedSchema(unsupported_version_message(info.version))
    if info.engine not in SUPPORTED_ENGINES:
        raise UnsupportedSchema(unsupported_engine_message(info.engine))
    return info


def unsupported_engine_message(engine: str) -> str:
    return (
        f"awa storage engine {engine!r} is not maintained by this awa_trio release "
        f"(supported: {', '.join(SUPPORTED_ENGINES)}); let an Awa runtime lead this database"
    )


#: Whether a canonical install holds any job (on a fresh one, none).
#: Asked first by migrate: fails at once with the real cause.
_SERVER_ANSWERS_SQL = Statement("SELECT 1")
_HAS_JOBS_SQL = Statement("SELECT EXISTS (SELECT 1 FROM awa.jobs)")


def _awa_pg() -> Any:
    try:
        import awa
    except ImportError:
        raise UnsupportedSchema(
            f"awa-pg is not installed; install it with: pip install '{AWA_PG_REQUIREMENT}'"
        ) from None
    return awa


async def migrate(database_url: str, engine: str | None = None) -> SchemaInfo:
    """Install or upgrade the Awa schema with awa-pg's own migrator.

    The server is asked first, with awa_trio's own driver: it fails in a
    moment with the real cause, where awa-pg's pool waits 30 s and reports
    only that it timed out. With ``engine="queue_storage"`` a fresh install
    is switched to queue storage by awa-pg's installer, the switch the first
    awa-pg runtime would make; an install that already holds jobs is
    refused, since moving them is the staged transition's work.
    """
    awa = _awa_pg()
    async with open_database(database_url, pool_size=1) as db:
        await db.fetchval(*_SERVER_ANSWERS_SQL.bind())
        await trio.to_thread.run_sync(awa.Client(database_url).migrate)
        info = await check_schema(db)
        if not states.switched_at_install(engine, info):
            return info
        if info.state != STATE_CANONICAL or await db.fetchval(*_HAS_JOBS_SQL.bind()):
            raise AwaTrioError(
                f"this database holds jobs on the canonical engine (state {info.state}): switch it to "
                "queue storage with Awa's staged transition (prepare, enter, finalize), not at install"
            )
        await trio.to_thread.run_sync(install_queue_storage, database_url)
        return await check_schema(db)


def install_queue_storage(database_url: str) -> None:
    """awa-pg's installer, in the schema an awa-pg runtime would finalise
    into: blocking (it runs its own asyncio loop), for a worker thread."""
    import asyncio

    awa = _awa_pg()
    asyncio.run(awa.AsyncClient(database_url).install_queue_storage(schema=DEFAULT_QUEUE_STORAGE_SCHEMA))
