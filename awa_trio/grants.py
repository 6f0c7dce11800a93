"""Least privilege: the grants a non-superuser maintenance role needs, and the
check a leader makes when a term starts.

What awa_trio needs was read off the SQL it runs, together with what Awa's
own functions and triggers do on its behalf: none of them is SECURITY
DEFINER, so each runs with the leader's privileges (the unique-claim and
admin-cache triggers of the job tables, ``awa.insert_job_compat`` behind cron
fires and follow-up jobs, the lane functions behind promotion). Advisory
locks and LISTEN/NOTIFY need no grant.

Objects are listed one by one from the live catalog (ring children per slot,
lane sequences per lane, functions with their signatures), so the statements
are exact for the database they were generated on. Run ``python -m awa_trio
grants`` again after a migration adds tables, after a storage transition,
and after a ring is resized. Lane sequences appear with every new queue,
priority or shard; the default privileges in the output cover those
(``ALTER DEFAULT PRIVILEGES`` for the roles that own the queue-storage
objects), and :func:`missing_privileges` names any that are still missing.

Three grants are wider than one table, because the database leaves no
narrower one: ``CREATE`` on the queue-storage schema (promotion reserves lane
positions through Awa's ``ensure_lane_sequences``, which runs ``CREATE
SEQUENCE IF NOT EXISTS`` for every batch, and PostgreSQL checks ``CREATE`` even
when the sequence exists); ``pg_read_all_stats`` (the terminal-count rollup
may only TRUNCATE while no other session of the database holds a snapshot,
and without it the ``pg_stat_activity`` columns that say so are hidden for
other roles' sessions, so the check would always pass); and ``UPDATE`` on
tables awa_trio only locks rows of (``SELECT ... FOR UPDATE`` requires it).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Sequence

from .db import Database, DatabaseError, open_database
from .errors import UnsupportedSchema
from .schema import QUEUE_STORAGE, STATE_CANONICAL, SchemaInfo, check_schema

log = logging.getLogger(__name__)

DEFAULT_ROLE = "awa_maintenance"
AWA_SCHEMA = "awa"
#: The predefined role that shows other roles' sessions in pg_stat_activity.
READ_ALL_STATS = "pg_read_all_stats"

SELECT, INSERT, UPDATE, DELETE, TRUNCATE = "SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE"
USAGE, CREATE, EXECUTE, CONNECT = "USAGE", "CREATE", "EXECUTE", "CONNECT"
#: At most this many missing privileges are named in the term-start line.
MISSING_SHOWN = 10


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

# --- the canonical plane (awa schema) ----------------------------------------------------

_JOB_TABLE_WHY = "promotion, rescues, cleanup, priority aging, batch operations, cron; status"
_ADMIN_CACHE_WHY = "admin cache, kept by the job-table triggers and the admin metadata branches"
_DIRTY_KEYS_WHY = (
    "dirty admin-cache keys: marked by the job-table triggers, drained by the admin metadata branches"
)

CANONICAL_TABLES = (
    TableNeed("jobs_hot", (SELECT, INSERT, UPDATE, DELETE), _JOB_TABLE_WHY),
    TableNeed("scheduled_jobs", (SELECT, INSERT, UPDATE, DELETE), _JOB_TABLE_WHY),
    # Awa 0.6.1: recompute locks the keys (FOR UPDATE), refresh truncates them.
    TableNeed(
        "admin_dirty_queues",
        (SELECT, INSERT, UPDATE, DELETE, TRUNCATE),
        _DIRTY_KEYS_WHY + " (row locks; refresh truncates)",
        via_awa_functions=True,
    ),
    TableNeed(
        "admin_dirty_kinds",
        (SELECT, INSERT, UPDATE, DELETE, TRUNCATE),
        _DIRTY_KEYS_WHY + " (row locks; refresh truncates)",
        via_awa_functions=True,
    ),
    # Later 0.6 releases mark keys in these instead (plain inserts and deletes).
    TableNeed("admin_dirty_queue_marks", (SELECT, INSERT, DELETE), _DIRTY_KEYS_WHY, via_awa_functions=True),
    TableNeed("admin_dirty_kind_marks", (SELECT, INSERT, DELETE), _DIRTY_KEYS_WHY, via_awa_functions=True),
    TableNeed("queue_state_counts", (SELECT, INSERT, UPDATE, DELETE), _ADMIN_CACHE_WHY + "; queue_stats"),
    TableNeed("job_queue_catalog", (SELECT, INSERT, UPDATE, DELETE), _ADMIN_CACHE_WHY),
    TableNeed("job_kind_catalog", (SELECT, INSERT, UPDATE, DELETE), _ADMIN_CACHE_WHY),
)

CANONICAL_SEQUENCES = (
    SequenceNeed("jobs_id_seq", (USAGE,), "ids of jobs insert_job_compat inserts (cron, follow-ups)"),
)

CANONICAL_FUNCTIONS = (
    FunctionNeed("recompute_dirty_admin_metadata", "recompute_dirty_admin_metadata branch"),
    FunctionNeed("refresh_admin_metadata", "refresh_admin_metadata branch"),
)

# --- the queue-storage plane --------------------------------------------------------------

#: In the awa schema: what queue storage adds there.
QUEUE_STORAGE_AWA_TABLES = (
    TableNeed(
        "job_unique_claims",
        (UPDATE,),
        "a rescue takes a unique claim back (INSERT ... ON CONFLICT DO UPDATE)",
    ),
    TableNeed("jobs", (SELECT,), "status: the rescue backlog reads the awa.jobs view"),
)

QUEUE_STORAGE_AWA_FUNCTIONS = (
    FunctionNeed("jobs_compat", "behind the awa.jobs view (status)"),
    FunctionNeed("queue_storage_payload_tags", "batch operations' tag filter; awa.jobs"),
    FunctionNeed("queue_storage_payload_errors", "awa.jobs"),
)

_RING_CHILD = (SELECT, TRUNCATE)
_QUEUE_RING_WHY = "queue ring: rotation checks it, prune reads and truncates each slot's child"
_CLAIM_RING_WHY = "claim ring: rotation and prune"
_ROW_LOCK_WHY = "UPDATE only for the row locks (SELECT ... FOR UPDATE)"

#: In the queue-storage schema (``awa`` unless the installation chose another).
QUEUE_STORAGE_TABLES = (
    TableNeed("queue_ring_state", (SELECT, UPDATE), "queue ring cursor (rotation, prune, rollup, promotion)"),
    TableNeed("queue_ring_slots", (SELECT, UPDATE), "queue ring slot generations"),
    TableNeed("lease_ring_state", (SELECT, UPDATE), "lease ring cursor"),
    TableNeed("lease_ring_slots", (SELECT, UPDATE), "lease ring slot generations"),
    TableNeed("claim_ring_state", (SELECT, UPDATE), "claim ring cursor"),
    TableNeed("claim_ring_slots", (SELECT, UPDATE), "claim ring slots and their rescue cursors"),
    TableNeed(
        "ready_entries",
        (SELECT, INSERT, UPDATE),
        "promotion and batch operations file entries (UPDATE for row locks); " + _QUEUE_RING_WHY,
        _RING_CHILD,
    ),
    TableNeed(
        "ready_segments", (SELECT, INSERT), "promotion and batch operations; " + _QUEUE_RING_WHY, _RING_CHILD
    ),
    TableNeed("ready_tombstones", (SELECT, INSERT), "batch operations; " + _QUEUE_RING_WHY, _RING_CHILD),
    TableNeed("ready_claim_attempt_batches", (SELECT,), _QUEUE_RING_WHY, _RING_CHILD),
    TableNeed(
        "done_entries",
        (SELECT, INSERT),
        "rescues; prune carries failed rows; " + _QUEUE_RING_WHY,
        _RING_CHILD,
    ),
    TableNeed("receipt_completion_batches", (SELECT,), _QUEUE_RING_WHY, _RING_CHILD),
    TableNeed("receipt_completion_tombstones", (SELECT,), _QUEUE_RING_WHY, _RING_CHILD),
    TableNeed(
        "queue_terminal_count_deltas",
        (SELECT, INSERT),
        "rescues and prune add deltas; the rollup folds, deletes and truncates each slot's child",
        (SELECT, DELETE, TRUNCATE),
    ),
    TableNeed("queue_terminal_live_counts", (SELECT, INSERT, UPDATE, DELETE), "terminal_count_rollup; prune"),
    TableNeed(
        "queue_terminal_rollups", (SELECT, INSERT, UPDATE), "prune folds pruned slots' terminal counts"
    ),
    TableNeed(
        "deferred_jobs",
        (SELECT, INSERT, UPDATE, DELETE),
        "promotion, rescues (retryable rows), batch operations; status",
    ),
    TableNeed(
        "dlq_entries",
        (SELECT, INSERT, UPDATE, DELETE),
        "callback rescues dead-letter, cleanup purges; " + _ROW_LOCK_WHY,
    ),
    TableNeed(
        "leases",
        (SELECT, UPDATE, DELETE),
        "rescues take leases; lease ring rotation and prune; " + _ROW_LOCK_WHY,
        _RING_CHILD,
    ),
    TableNeed(
        "lease_claims", (SELECT, UPDATE), "rescues close receipt claims; " + _CLAIM_RING_WHY, _RING_CHILD
    ),
    TableNeed(
        "lease_claim_batches",
        (SELECT, UPDATE),
        "rescues; " + _CLAIM_RING_WHY + "; " + _ROW_LOCK_WHY,
        _RING_CHILD,
    ),
    TableNeed(
        "lease_claim_closures", (SELECT, INSERT), "rescues write closures; " + _CLAIM_RING_WHY, _RING_CHILD
    ),
    TableNeed(
        "lease_claim_closure_batches",
        (SELECT, INSERT),
        "rescues write closures; " + _CLAIM_RING_WHY,
        _RING_CHILD,
    ),
    TableNeed("attempt_state", (SELECT, DELETE), "heartbeats read and dropped by rescues"),
    TableNeed(
        "queue_lanes",
        (SELECT, INSERT),
        "promotion and batch operations create lanes (ON CONFLICT (...) reads)",
    ),
    TableNeed(
        "queue_enqueue_heads", (SELECT, INSERT, UPDATE), "lane creation and position reservation; queue_stats"
    ),
    TableNeed(
        "queue_claim_heads",
        (SELECT, INSERT, UPDATE),
        "lane creation; claim cursors read by prune, rollup, queue_stats; row locks",
    ),
    TableNeed("terminal_jobs", (SELECT,), "read by awa.jobs_compat() (status)"),
)

QUEUE_STORAGE_SEQUENCES = (
    SequenceNeed("job_id_seq", (USAGE,), "ids of jobs insert_job_compat inserts (cron, follow-ups)"),
    SequenceNeed("lease_claim_closure_batch_id_seq", (USAGE,), "rescues closing compact claims"),
)

#: Lane sequences (one enqueue and one claim sequence per queue, priority and
#: shard): read for every claim cursor, moved when positions are reserved.
LANE_SEQUENCE_PREFIXES = ("queue_enqueue_seq_", "queue_claim_seq_")
LANE_SEQUENCE_PRIVILEGES = (SELECT, UPDATE)

QUEUE_STORAGE_FUNCTIONS = (
    FunctionNeed("sequence_next_value", "claim cursors (prune, rollup, queue_stats, batch operations)"),
    FunctionNeed("reserve_enqueue_seq", "promotion and batch operations reserve lane positions"),
    FunctionNeed("ensure_lane_sequences", "lane creation"),
    FunctionNeed("set_sequence_next", "called by the lane-head triggers"),
    FunctionNeed("queue_lane_sequence_name", "called by the lane functions and triggers"),
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


def planes(info: SchemaInfo) -> tuple[bool, bool]:
    """(canonical, queue storage): whose grants the database needs now. A
    staged transition needs both (the canonical plane drains, and once routing
    flips the queue-storage branches run); finalised queue storage leaves the
    canonical job tables alone (even awa.jobs reads queue storage then)."""
    queue_storage = info.engine == QUEUE_STORAGE or info.state != STATE_CANONICAL
    canonical = not info.runs_queue_storage or info.in_mixed_transition
    return canonical, queue_storage


_NAMESPACE_SQL = "SELECT oid, quote_ident(nspname) AS sql_name FROM pg_namespace WHERE nspname = $1"
_RELATIONS_SQL = """
    SELECT relname AS name, oid, oid::regclass::text AS sql_name
    FROM pg_class
    WHERE relnamespace = $1 AND relname = ANY($2::text[]) AND relkind IN ('r', 'p', 'v')
"""
# Ring children in slot order (their names end in the slot number).
_PARTITIONS_SQL = """
    SELECT parent.relname AS parent, child.oid, child.oid::regclass::text AS sql_name
    FROM pg_inherits AS inheritance
    JOIN pg_class AS parent ON parent.oid = inheritance.inhparent
    JOIN pg_class AS child ON child.oid = inheritance.inhrelid
    WHERE parent.relnamespace = $1 AND parent.relname = ANY($2::text[])
    ORDER BY parent.relname, length(child.relname), child.relname
"""
_SEQUENCES_SQL = """
    SELECT relname AS name, oid, oid::regclass::text AS sql_name
    FROM pg_class
    WHERE relnamespace = $1 AND relkind = 'S'
      AND (relname = ANY($2::text[])
           OR EXISTS (SELECT 1 FROM unnest($3::text[]) AS prefix WHERE starts_with(relname::text, prefix)))
    ORDER BY relname
"""
# Which of these tables the source of some function in the schema names.
_NAMED_BY_FUNCTIONS_SQL = """
    SELECT name
    FROM unnest($2::text[]) AS name
    WHERE EXISTS (SELECT 1 FROM pg_proc WHERE pronamespace = $1 AND prosrc ~ ('\\m' || name || '\\M'))
"""
_FUNCTIONS_SQL = """
    SELECT proname AS name, oid, oid::regprocedure::text AS sql_name
    FROM pg_proc
    WHERE pronamespace = $1 AND proname = ANY($2::text[])
    ORDER BY proname, oid
"""
# Roles that own queue-storage objects: whoever creates lane sequences later
# (producers, workers) is most likely one of them.
_OWNERS_SQL = """
    SELECT quote_ident(owner.rolname) AS sql_name, owner.rolsuper AS superuser
    FROM pg_roles AS owner
    WHERE owner.oid IN (
        SELECT nspowner FROM pg_namespace WHERE oid = $1
        UNION
        SELECT relowner FROM pg_class WHERE relnamespace = $1 AND relkind IN ('r', 'p', 'S')
    )
      AND owner.rolname <> $2
    ORDER BY owner.rolname
"""
_DATABASE_SQL = """
    SELECT oid, quote_ident(datname) AS sql_name FROM pg_database WHERE datname = current_database()
"""
_ROLE_SQL = "SELECT oid, quote_ident(rolname) AS sql_name FROM pg_roles WHERE rolname = $1"


async def _one_object(db: Database, sql: str, *args: object) -> DatabaseObject | None:
    row = await db.fetchrow(sql, *args)
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
        named = {row["name"] for row in await db.fetch(_NAMED_BY_FUNCTIONS_SQL, namespace, indirect)}
        by_name = {
            name: need for name, need in by_name.items() if name in named or not need.via_awa_functions
        }
    found = {row["name"]: row for row in await db.fetch(_RELATIONS_SQL, namespace, list(by_name))}
    children: dict[str, list[DatabaseObject]] = {}
    partitioned = [need.name for need in by_name.values() if need.partition_privileges]
    for row in await db.fetch(_PARTITIONS_SQL, namespace, partitioned):
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
    db: Database, namespace: int, needs: Sequence[SequenceNeed], lanes: bool
) -> list[Grant]:
    by_name = {need.name: need for need in needs}
    prefixes = list(LANE_SEQUENCE_PREFIXES) if lanes else []
    rows = await db.fetch(_SEQUENCES_SQL, namespace, list(by_name), prefixes)
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
    if lane_sequences:
        grants.append(
            Grant(
                "sequence",
                LANE_SEQUENCE_PRIVILEGES,
                lane_sequences,
                "lane sequences: claim cursors are read, reservations move them",
            )
        )
    return grants


async def _function_grants(db: Database, namespace: int, needs: Sequence[FunctionNeed]) -> list[Grant]:
    why = {need.name: need.why for need in needs}
    return [
        Grant("function", (EXECUTE,), (DatabaseObject(int(row["oid"]), row["sql_name"]),), why[row["name"]])
        for row in await db.fetch(_FUNCTIONS_SQL, namespace, list(why))
    ]


async def _default_privileges(
    db: Database, namespace: DatabaseObject, role_name: str, role: str
) -> list[Grant]:
    """Lane sequences made after these grants: readable by the maintenance
    role when an owner role makes them, and usable by the owner roles (if not
    superusers) when the maintenance role makes them (promoting a job of a
    queue that never had a ready row)."""
    grants = []
    for owner in await db.fetch(_OWNERS_SQL, namespace.oid, role_name):
        grants.append(
            Grant(
                "default",
                LANE_SEQUENCE_PRIVILEGES,
                (),
                f"lane sequences {owner['sql_name']} creates from now on",
                statement=(
                    f"ALTER DEFAULT PRIVILEGES FOR ROLE {owner['sql_name']} IN SCHEMA {namespace.sql_name} "
                    f"GRANT {', '.join(LANE_SEQUENCE_PRIVILEGES)} ON SEQUENCES TO {role}"
                ),
            )
        )
        if not owner["superuser"]:
            grants.append(
                Grant(
                    "default",
                    (SELECT, USAGE, UPDATE),
                    (),
                    f"lane sequences the maintenance role creates, for {owner['sql_name']}",
                    statement=(
                        f"ALTER DEFAULT PRIVILEGES FOR ROLE {role} IN SCHEMA {namespace.sql_name} "
                        f"GRANT SELECT, USAGE, UPDATE ON SEQUENCES TO {owner['sql_name']}"
                    ),
                )
            )
    return grants


async def required_grants(db: Database, info: SchemaInfo, role_name: str = DEFAULT_ROLE) -> list[Grant]:
    """Every grant ``role_name`` needs to maintain this database as it is now."""
    role = str(await db.fetchval("SELECT quote_ident($1)", role_name))
    canonical, queue_storage = planes(info)
    grants: list[Grant] = []
    database = await _one_object(db, _DATABASE_SQL)
    if database is not None:
        grants.append(Grant("database", (CONNECT,), (database,), "connecting"))

    awa = await _one_object(db, _NAMESPACE_SQL, AWA_SCHEMA)
    if awa is None:
        return grants
    qs = await _one_object(db, _NAMESPACE_SQL, info.queue_storage_schema) if queue_storage else None
    grants.append(Grant("schema", (USAGE,), (awa,), "awa's own tables and functions"))
    if qs is not None:
        schema_privileges = (USAGE, CREATE)
        why = "CREATE: promotion reserves lane positions through ensure_lane_sequences (CREATE SEQUENCE IF NOT EXISTS)"
        if qs.oid == awa.oid:
            grants[-1] = Grant("schema", schema_privileges, (awa,), why)
        else:
            grants.append(Grant("schema", schema_privileges, (qs,), why))

    awa_tables = list(AWA_TABLES)
    awa_functions = list(AWA_FUNCTIONS)
    awa_sequences: list[SequenceNeed] = []
    if canonical:
        awa_tables += CANONICAL_TABLES
        awa_functions += CANONICAL_FUNCTIONS
        awa_sequences += CANONICAL_SEQUENCES
    qs_tables: list[TableNeed] = []
    qs_functions: list[FunctionNeed] = []
    qs_sequences: list[SequenceNeed] = []
    if qs is not None:
        awa_tables += QUEUE_STORAGE_AWA_TABLES
        awa_functions += QUEUE_STORAGE_AWA_FUNCTIONS
        qs_tables, qs_functions, qs_sequences = (
            list(QUEUE_STORAGE_TABLES),
            list(QUEUE_STORAGE_FUNCTIONS),
            list(QUEUE_STORAGE_SEQUENCES),
        )
        if qs.oid == awa.oid:
            awa_tables += qs_tables
            awa_functions += qs_functions
            awa_sequences += qs_sequences
            qs_tables, qs_functions, qs_sequences = [], [], []

    grants += await _table_grants(db, awa.oid, awa_tables)
    grants += await _sequence_grants(db, awa.oid, awa_sequences, lanes=qs is not None and qs.oid == awa.oid)
    grants += await _function_grants(db, awa.oid, awa_functions)
    if qs is not None and qs.oid != awa.oid:
        grants += await _table_grants(db, qs.oid, qs_tables)
        grants += await _sequence_grants(db, qs.oid, qs_sequences, lanes=True)
        grants += await _function_grants(db, qs.oid, qs_functions)
    if qs is not None:
        stats = await _one_object(db, _ROLE_SQL, READ_ALL_STATS)
        if stats is not None:
            grants.append(
                Grant(
                    "role",
                    (),
                    (stats,),
                    "terminal_count_rollup must see other roles' snapshots before it truncates",
                )
            )
        grants += await _default_privileges(db, qs, role_name, role)
    return grants


def grants_script(grants: Sequence[Grant], role: str, info: SchemaInfo, database: str) -> str:
    """The statements, one per line, under a short header."""
    engine = f"{info.engine} ({info.state})"
    if planes(info)[1]:
        engine += f", queue-storage schema {info.queue_storage_schema}"
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
    role = str(await db.fetchval("SELECT quote_ident($1)", role_name))
    database = str(await db.fetchval("SELECT quote_ident(current_database())"))
    return grants_script(grants, role, info, database)


async def print_grants(database_url: str, role_name: str = DEFAULT_ROLE) -> int:
    """``python -m awa_trio grants``: the SQL on stdout."""
    async with open_database(database_url, pool_size=1) as db:
        script = await build_grants_script(db, role_name)
    print(script)
    return 0


# --- the term-start check ----------------------------------------------------------------

_MISSING_SQL = """
    SELECT need.label
    FROM unnest($1::text[], $2::oid[], $3::text[], $4::text[]) WITH ORDINALITY
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
"""


async def missing_privileges(db: Database, info: SchemaInfo | None = None) -> list[str]:
    """What the connected role lacks of :func:`required_grants`, as short
    strings (``"TRUNCATE on awa.ready_entries_3"``); empty when nothing is
    missing (always, for a superuser). ``info``: the schema as the caller
    read it (read here otherwise)."""
    role = await db.fetchrow(
        "SELECT current_user AS name, current_setting('is_superuser') = 'on' AS superuser"
    )
    if role is None or role["superuser"]:
        return []
    info = info or await check_schema(db)
    role_name = str(role["name"])
    checks = [check for grant in await required_grants(db, info, role_name) for check in grant.checks()]
    if not checks:
        return []
    kinds, oids, privileges, labels = (list(column) for column in zip(*checks, strict=True))
    rows = await db.fetch(_MISSING_SQL, kinds, oids, privileges, labels)
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
            role_name = str(await db.fetchval("SELECT current_user"))
            log.error("%s", missing_privileges_message(role_name, missing))
    except (DatabaseError, UnsupportedSchema) as exc:
        log.debug("privilege check failed: %s", exc)
        return []
    return missing
