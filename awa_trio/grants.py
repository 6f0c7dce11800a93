"""Least privilege: the grants a non-superuser maintenance role needs, and the
check a leader makes when a term starts.

Each engine declares what its branches need (``grants`` on its
:class:`~awa_trio.engines.base.Engine`: read off the SQL it runs, together
with what Awa's own functions and triggers do on its behalf, none of them
SECURITY DEFINER); this module adds what every engine needs in the awa
schema, asks the engines in use for the rest, and resolves the needs
against the live catalog. Advisory locks and LISTEN/NOTIFY need no grant.

Objects are listed one by one from the catalog (ring children per slot,
sequences made at run time per prefix, functions with their signatures),
so the statements are exact for the database they were generated on. Run
``python -m awa_trio grants`` again after a migration adds tables, after a
storage transition, and after a ring is resized. Sequences an engine makes
at run time (queue storage's lane sequences, with every new queue, priority
or shard) are covered by the default privileges in the output (``ALTER
DEFAULT PRIVILEGES`` for the roles that own the engine's schema objects),
and :func:`missing_privileges` names any that are still missing. ``UPDATE``
is granted on tables awa_trio only locks rows of (``SELECT ... FOR UPDATE``
requires it).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Sequence
from typing import Any

from .db import Database, DatabaseError, open_database
from .engines import engines_in_use
from .engines.base import (
    CONNECT,
    CREATE,
    DELETE,
    EXECUTE,
    INSERT,
    SELECT,
    TRUNCATE,
    UPDATE,
    USAGE,
    FunctionNeed,
    SequenceNeed,
    StorageSchemaNeeds,
    TableNeed,
)
from .errors import UnsupportedSchema
from .schema import SchemaInfo, check_schema
from .sql import Statement

log = logging.getLogger(__name__)

DEFAULT_ROLE = "awa_maintenance"
AWA_SCHEMA = "awa"
#: At most this many missing privileges are named in the term-start line.
MISSING_SHOWN = 10


# --- the awa schema, whatever the engine ----------------------------------------------

AWA_TABLES = (
    TableNeed("schema_version", (SELECT,), "schema check (start, terms, /readyz)"),
    TableNeed(
        "storage_transition_state",
        (SELECT,),
        "awa.storage_status(), awa.active_storage_engine(): which engine and branch set",
    ),
    TableNeed(
        "runtime_storage_backends", (SELECT,), "awa.active_queue_storage_schema() in awa.insert_job_compat"
    ),
    TableNeed(
        "runtime_instances",
        (SELECT, INSERT, UPDATE, DELETE),
        "this node's own row (Awa's admin views); cleanup of stale runtime snapshots; status; queue_stats",
    ),
    TableNeed("queue_descriptors", (SELECT, DELETE), "cleanup of stale descriptors; queue_stats"),
    TableNeed("job_kind_descriptors", (SELECT, DELETE), "cleanup of stale descriptors"),
    TableNeed("queue_meta", (SELECT,), "queue_stats; paused queues and enqueue shards"),
    TableNeed(
        "batch_operations",
        (SELECT, UPDATE, DELETE),
        "batch_operations runner; cleanup of expired operations",
    ),
    TableNeed("batch_operation_items", (SELECT, INSERT, UPDATE), "batch_operations runner"),
    TableNeed("cron_jobs", (SELECT, INSERT, UPDATE), "cron_sync, cron_eval; status"),
    TableNeed(
        "job_unique_claims",
        (SELECT, INSERT, DELETE),
        "unique claims moved by promotion, rescues and the job-table triggers",
    ),
)

AWA_FUNCTIONS = (
    FunctionNeed("storage_status", "schema check, status, /readyz"),
    FunctionNeed("active_storage_engine", "storage_status(); batch operations' engine guard"),
    FunctionNeed("active_queue_storage_schema", "called by insert_job_compat"),
    FunctionNeed("insert_job_compat", "cron fires and follow-up jobs"),
    FunctionNeed("job_state_in_bitmask", "unique-claim trigger, insert_job_compat"),
    FunctionNeed("backoff_duration", "rescues: when a rescued job runs again"),
    FunctionNeed(
        "canonical_live_backlog",
        "queue_stats' storage gauges (EXECUTE is checked even where it is not called); "
        "canonical_drain report during a staged transition",
    ),
)

# --- resolving the needs against the catalog -----------------------------------------------


@dataclasses.dataclass(frozen=True)
class DatabaseObject:
    """One object found in the catalog: its OID and its name as SQL."""

    oid: int
    sql_name: str


@dataclasses.dataclass(frozen=True)
class Grant:
    """One statement of the output, and the checks behind it."""

    #: ``database``, ``schema``, ``table``, ``sequence``, ``function``,
    #: ``role`` (membership) or ``default`` (default privileges: no check).
    kind: str
    privileges: tuple[str, ...]
    objects: tuple[DatabaseObject, ...]
    why: str
    #: The statement for ``kind == "default"`` (its shape is its own).
    statement: str | None = None

    def sql(self, role: str) -> str:
        if self.statement is not None:
            return f"{self.statement};  -- {self.why}"
        names = ", ".join(obj.sql_name for obj in self.objects)
        if self.kind == "role":
            return f"GRANT {names} TO {role};  -- {self.why}"
        target = {"table": "", "sequence": "SEQUENCE ", "function": "FUNCTION "}.get(
            self.kind, self.kind.upper() + " "
        )
        return f"GRANT {', '.join(self.privileges)} ON {target}{names} TO {role};  -- {self.why}"

    def checks(self) -> Iterable[tuple[str, int, str, str]]:
        """(kind, oid, privilege, what a missing one is called) per privilege."""
        if self.kind == "default":
            return
        for obj in self.objects:
            if self.kind == "role":
                yield self.kind, obj.oid, "USAGE", f"membership in {obj.sql_name}"
                continue
            what = "" if self.kind == "table" else self.kind + " "
            for privilege in self.privileges:
                yield self.kind, obj.oid, privilege, f"{privilege} on {what}{obj.sql_name}"


NAMESPACE_SQL = Statement(
    "SELECT oid, quote_ident(nspname) AS sql_name FROM pg_namespace WHERE nspname = :schema_name"
)
RELATIONS_SQL = Statement("""
    SELECT relname AS name, oid, oid::regclass::text AS sql_name
    FROM pg_class
    WHERE relnamespace = :namespace AND relname = ANY(:names::text[]) AND relkind IN ('r', 'p', 'v')
""")
# Ring children in slot order (their names end in the slot number).
PARTITIONS_SQL = Statement("""
    SELECT parent.relname AS parent, child.oid, child.oid::regclass::text AS sql_name
    FROM pg_inherits AS inheritance
    JOIN pg_class AS parent ON parent.oid = inheritance.inhparent
    JOIN pg_class AS child ON child.oid = inheritance.inhrelid
    WHERE parent.relnamespace = :namespace AND parent.relname = ANY(:names::text[])
    ORDER BY parent.relname, length(child.relname), child.relname
""")
SEQUENCES_SQL = Statement("""
    SELECT relname AS name, oid, oid::regclass::text AS sql_name
    FROM pg_class
    WHERE relnamespace = :namespace AND relkind = 'S'
      AND (relname = ANY(:names::text[])
           OR EXISTS (SELECT 1 FROM unnest(:prefixes::text[]) AS prefix WHERE starts_with(relname::text, prefix)))
    ORDER BY relname
""")
# Which of these tables the source of some function in the schema names.
NAMED_BY_FUNCTIONS_SQL = Statement("""
    SELECT name
    FROM unnest(:names::text[]) AS name
    WHERE EXISTS (SELECT 1 FROM pg_proc WHERE pronamespace = :namespace AND prosrc ~ ('\\m' || name || '\\M'))
""")
FUNCTIONS_SQL = Statement("""
    SELECT proname AS name, oid, oid::regprocedure::text AS sql_name
    FROM pg_proc
    WHERE pronamespace = :namespace AND proname = ANY(:names::text[])
    ORDER BY proname, oid
""")
# Roles that own the storage schema's objects: whoever creates sequences
# there later (producers, workers) is most likely one of them.
OWNERS_SQL = Statement("""
    SELECT quote_ident(owner.rolname) AS sql_name, owner.rolsuper AS superuser
    FROM pg_roles AS owner
    WHERE owner.oid IN (
        SELECT nspowner FROM pg_namespace WHERE oid = :namespace
        UNION
        SELECT relowner FROM pg_class WHERE relnamespace = :namespace AND relkind IN ('r', 'p', 'S')
    )
      AND owner.rolname <> :role_name
    ORDER BY owner.rolname
""")
DATABASE_SQL = Statement("""
    SELECT oid, quote_ident(datname) AS sql_name FROM pg_database WHERE datname = current_database()
""")
ROLE_SQL = Statement("SELECT oid, quote_ident(rolname) AS sql_name FROM pg_roles WHERE rolname = :role_name")
QUOTE_ROLE_SQL = Statement("SELECT quote_ident(:role_name)")
QUOTE_DATABASE_SQL = Statement("SELECT quote_ident(current_database())")
CURRENT_USER_SQL = Statement("SELECT current_user")
CURRENT_ROLE_SQL = Statement(
    "SELECT current_user AS name, current_setting('is_superuser') = 'on' AS superuser"
)


async def _one_object(db: Database, statement: tuple[Any, ...]) -> DatabaseObject | None:
    """The object a bound catalog statement finds, if any."""
    row = await db.fetchrow(*statement)
    return None if row is None else DatabaseObject(int(row["oid"]), str(row["sql_name"]))


def _merge(needs: Iterable[TableNeed]) -> dict[str, TableNeed]:
    """One need per table: privileges of every plane that uses it, in order."""
    merged: dict[str, TableNeed] = {}
    for need in needs:
        known = merged.get(need.name)
        if known is None:
            merged[need.name] = need
            continue
        merged[need.name] = TableNeed(
            need.name,
            _union(known.privileges, need.privileges),
            f"{known.why}; {need.why}",
            _union(known.partition_privileges, need.partition_privileges),
            known.via_awa_functions and need.via_awa_functions,
        )
    return merged


PRIVILEGE_ORDER = (SELECT, INSERT, UPDATE, DELETE, TRUNCATE, USAGE, CREATE, EXECUTE, CONNECT)


def _union(first: Sequence[str], second: Sequence[str]) -> tuple[str, ...]:
    return tuple(p for p in PRIVILEGE_ORDER if p in first or p in second)


async def _table_grants(db: Database, namespace: int, needs: Sequence[TableNeed]) -> list[Grant]:
    by_name = _merge(needs)
    indirect = [need.name for need in by_name.values() if need.via_awa_functions]
    if indirect:
        named = {
            row["name"]
            for row in await db.fetch(*NAMED_BY_FUNCTIONS_SQL.bind(namespace=namespace, names=indirect))
        }
        by_name = {
            name: need for name, need in by_name.items() if name in named or not need.via_awa_functions
        }
    found = {
        row["name"]: row
        for row in await db.fetch(*RELATIONS_SQL.bind(namespace=namespace, names=list(by_name)))
    }
    children: dict[str, list[DatabaseObject]] = {}
    partitioned = [need.name for need in by_name.values() if need.partition_privileges]
    for row in await db.fetch(*PARTITIONS_SQL.bind(namespace=namespace, names=partitioned)):
        children.setdefault(row["parent"], []).append(DatabaseObject(int(row["oid"]), row["sql_name"]))
    grants = []
    # A table missing from this schema version is needed by no statement here.
    for need in by_name.values():
        row = found.get(need.name)
        if row is None:
            continue
        grants.append(
            Grant("table", need.privileges, (DatabaseObject(int(row["oid"]), row["sql_name"]),), need.why)
        )
        if children.get(need.name):
            grants.append(
                Grant(
                    "table",
                    need.partition_privileges,
                    tuple(children[need.name]),
                    f"each slot's child of {row['sql_name']}",
                )
            )
    return grants


async def _sequence_grants(
    db: Database, namespace: int, needs: Sequence[SequenceNeed], made_later: StorageSchemaNeeds | None
) -> list[Grant]:
    """``made_later``: the storage schema whose prefixed sequences (made at
    run time) live in this namespace, if one does."""
    by_name = {need.name: need for need in needs}
    prefixes = list(made_later.sequence_prefixes) if made_later is not None else []
    rows = await db.fetch(*SEQUENCES_SQL.bind(namespace=namespace, names=list(by_name), prefixes=prefixes))
    grants = [
        Grant(
            "sequence",
            by_name[row["name"]].privileges,
            (DatabaseObject(int(row["oid"]), row["sql_name"]),),
            by_name[row["name"]].why,
        )
        for row in rows
        if row["name"] in by_name
    ]
    lane_sequences = tuple(
        DatabaseObject(int(row["oid"]), row["sql_name"]) for row in rows if row["name"] not in by_name
    )
    if lane_sequences and made_later is not None:
        grants.append(Grant("sequence", made_later.prefix_privileges, lane_sequences, made_later.prefix_why))
    return grants


async def _function_grants(db: Database, namespace: int, needs: Sequence[FunctionNeed]) -> list[Grant]:
    why = {need.name: need.why for need in needs}
    return [
        Grant("function", (EXECUTE,), (DatabaseObject(int(row["oid"]), row["sql_name"]),), why[row["name"]])
        for row in await db.fetch(*FUNCTIONS_SQL.bind(namespace=namespace, names=list(why)))
    ]


async def _default_privileges(
    db: Database, namespace: DatabaseObject, needs: StorageSchemaNeeds, role_name: str, role: str
) -> list[Grant]:
    """Sequences made after these grants (lane sequences, on queue storage):
    readable by the maintenance role when an owner role makes them, and
    usable by the owner roles (if not superusers) when the maintenance role
    makes them (promoting a job of a queue that never had a ready row)."""
    grants = []
    label = needs.prefix_label
    for owner in await db.fetch(*OWNERS_SQL.bind(namespace=namespace.oid, role_name=role_name)):
        grants.append(
            Grant(
                "default",
                needs.prefix_privileges,
                (),
                f"{label} {owner['sql_name']} creates from now on",
                statement=(
                    f"ALTER DEFAULT PRIVILEGES FOR ROLE {owner['sql_name']} IN SCHEMA {namespace.sql_name} "
                    f"GRANT {', '.join(needs.prefix_privileges)} ON SEQUENCES TO {role}"
                ),
            )
        )
        if not owner["superuser"]:
            grants.append(
                Grant(
                    "default",
                    (SELECT, USAGE, UPDATE),
                    (),
                    f"{label} the maintenance role creates, for {owner['sql_name']}",
                    statement=(
                        f"ALTER DEFAULT PRIVILEGES FOR ROLE {role} IN SCHEMA {namespace.sql_name} "
                        f"GRANT SELECT, USAGE, UPDATE ON SEQUENCES TO {owner['sql_name']}"
                    ),
                )
            )
    return grants


async def required_grants(db: Database, info: SchemaInfo, role_name: str = DEFAULT_ROLE) -> list[Grant]:
    """Every grant ``role_name`` needs to maintain this database as it is
    now: the engine-independent needs, and those of each engine in use."""
    role = str(await db.fetchval(*QUOTE_ROLE_SQL.bind(role_name=role_name)))
    grants: list[Grant] = []
    database = await _one_object(db, DATABASE_SQL.bind())
    if database is not None:
        grants.append(Grant("database", (CONNECT,), (database,), "connecting"))

    awa = await _one_object(db, NAMESPACE_SQL.bind(schema_name=AWA_SCHEMA))
    if awa is None:
        return grants
    grants.append(Grant("schema", (USAGE,), (awa,), "awa's own tables and functions"))
    awa_schema_grant = len(grants) - 1
    awa_tables = list(AWA_TABLES)
    awa_functions = list(AWA_FUNCTIONS)
    awa_sequences: list[SequenceNeed] = []
    # The engines' own schemas present in the database: (namespace, needs).
    storage_schemas: list[tuple[DatabaseObject, StorageSchemaNeeds]] = []
    for engine in engines_in_use(info):
        needs = engine.grants
        storage = needs.storage_schema
        if storage is not None:
            namespace = await _one_object(db, NAMESPACE_SQL.bind(schema_name=info.queue_storage_schema))
            if namespace is None:  # not installed (yet): nothing of this engine to grant
                continue
            schema_grant = Grant("schema", storage.schema_privileges, (namespace,), storage.schema_why)
            if namespace.oid == awa.oid:
                grants[awa_schema_grant] = schema_grant
            else:
                grants.append(schema_grant)
            storage_schemas.append((namespace, storage))
        awa_tables += needs.awa_tables
        awa_functions += needs.awa_functions
        awa_sequences += needs.awa_sequences
    in_awa = [storage for namespace, storage in storage_schemas if namespace.oid == awa.oid]
    for storage in in_awa:
        awa_tables += storage.tables
        awa_functions += storage.functions
        awa_sequences += storage.sequences

    grants += await _table_grants(db, awa.oid, awa_tables)
    grants += await _sequence_grants(db, awa.oid, awa_sequences, in_awa[0] if in_awa else None)
    grants += await _function_grants(db, awa.oid, awa_functions)
    for namespace, storage in storage_schemas:
        if namespace.oid != awa.oid:
            grants += await _table_grants(db, namespace.oid, storage.tables)
            grants += await _sequence_grants(db, namespace.oid, storage.sequences, storage)
            grants += await _function_grants(db, namespace.oid, storage.functions)
    for namespace, storage in storage_schemas:
        for member_of, why in storage.member_of:
            membership = await _one_object(db, ROLE_SQL.bind(role_name=member_of))
            if membership is not None:
                grants.append(Grant("role", (), (membership,), why))
        grants += await _default_privileges(db, namespace, storage, role_name, role)
    return grants


def grants_script(grants: Sequence[Grant], role: str, info: SchemaInfo, database: str) -> str:
    """The statements, one per line, under a short header."""
    engine = f"{info.engine} ({info.state})"
    for storage in (e.grants.storage_schema for e in engines_in_use(info)):
        if storage is not None:
            engine += f", {storage.schema_label} {info.queue_storage_schema}"
    header = [
        f"-- awa_trio maintenance role {role} on database {database}: {engine}, schema version {info.version}.",
        "-- Made from this database's catalog: make it again after a migration, a storage transition",
        "-- or a ring resize. Run it as a superuser (pg_read_all_stats and default privileges for",
        "-- other roles need one) or as the owner of the awa schema. Create the role first, once",
        f"-- per cluster: CREATE ROLE {role} LOGIN PASSWORD '...';",
        "-- EXECUTE on functions is granted to PUBLIC by default: those lines matter only where",
        "-- it was revoked.",
    ]
    return "\n".join(header + [grant.sql(role) for grant in grants])


async def build_grants_script(db: Database, role_name: str = DEFAULT_ROLE) -> str:
    info = await check_schema(db)
    grants = await required_grants(db, info, role_name)
    role = str(await db.fetchval(*QUOTE_ROLE_SQL.bind(role_name=role_name)))
    database = str(await db.fetchval(*QUOTE_DATABASE_SQL.bind()))
    return grants_script(grants, role, info, database)


async def print_grants(database_url: str, role_name: str = DEFAULT_ROLE) -> int:
    """``python -m awa_trio grants``: the SQL on stdout."""
    async with open_database(database_url, pool_size=1) as db:
        script = await build_grants_script(db, role_name)
    print(script)
    return 0


# --- the term-start check ----------------------------------------------------------------

MISSING_SQL = Statement("""
    SELECT need.label
    FROM unnest(:kinds::text[], :objects::oid[], :privileges::text[], :labels::text[]) WITH ORDINALITY
        AS need(kind, object, privilege, label, position)
    WHERE NOT COALESCE(
        CASE need.kind
            WHEN 'table' THEN has_table_privilege(need.object, need.privilege)
            WHEN 'sequence' THEN has_sequence_privilege(need.object, need.privilege)
            WHEN 'function' THEN has_function_privilege(need.object, need.privilege)
            WHEN 'schema' THEN has_schema_privilege(need.object, need.privilege)
            WHEN 'database' THEN has_database_privilege(need.object, need.privilege)
            WHEN 'role' THEN pg_has_role(need.object, need.privilege)
        END,
        true)
    ORDER BY need.position
""")


async def missing_privileges(db: Database, info: SchemaInfo | None = None) -> list[str]:
    """What the connected role lacks of :func:`required_grants`, as short
    strings (``"TRUNCATE on awa.ready_entries_3"``); empty when nothing is
    missing (always, for a superuser). ``info``: the schema as the caller
    read it (read here otherwise)."""
    role = await db.fetchrow(*CURRENT_ROLE_SQL.bind())
    if role is None or role["superuser"]:
        return []
    info = info or await check_schema(db)
    role_name = str(role["name"])
    checks = [check for grant in await required_grants(db, info, role_name) for check in grant.checks()]
    if not checks:
        return []
    kinds, oids, privileges, labels = (list(column) for column in zip(*checks, strict=True))
    rows = await db.fetch(*MISSING_SQL.bind(kinds=kinds, objects=oids, privileges=privileges, labels=labels))
    return [str(row["label"]) for row in rows]


def missing_privileges_message(role_name: str, missing: Sequence[str]) -> str:
    """The one line a leader logs when its role lacks privileges."""
    shown = ", ".join(missing[:MISSING_SHOWN])
    more = f" (+{len(missing) - MISSING_SHOWN} more)" if len(missing) > MISSING_SHOWN else ""
    privileges = "privilege" if len(missing) == 1 else "privileges"
    return (
        f"role {role_name} lacks {len(missing)} {privileges} awa_trio needs on this database: "
        f"{shown}{more}; apply the output of `python -m awa_trio grants --role {role_name}` "
        "as the schema owner"
    )


async def warn_about_missing_privileges(db: Database, info: SchemaInfo | None = None) -> list[str]:
    """Log :func:`missing_privileges_message` (one ERROR line) if anything is
    missing; a failing check is logged at DEBUG and never raises (the
    branches report their own errors)."""
    try:
        missing = await missing_privileges(db, info)
        if missing:
            role_name = str(await db.fetchval(*CURRENT_USER_SQL.bind()))
            log.error("%s", missing_privileges_message(role_name, missing))
    except (DatabaseError, UnsupportedSchema) as exc:
        log.debug("privilege check failed: %s", exc)
        return []
    return missing
