"""awa_trio's own row in ``awa.runtime_instances``, so that Awa's admin views
(``awa serve``: the leader count and each instance's maintenance badge) show
who maintains the fleet. Awa's design for such a process is a
maintenance-only instance (hardbyte/awa #282): it runs no queues, claims no
jobs, heartbeats none.

Every awa_trio node registers, followers too, and refreshes its row every
``runtime_snapshot_interval`` (Awa's runtimes: 10 s) and at once when it
gains or loses the lock. A clean stop marks the row ``shutting_down`` and then
deletes it. A database error is logged and the next interval tries again.

The row must change nothing the fleet does. Every storage gate counts live
rows of this table: ``storage_auto_finalize_if_fresh`` refuses while any row
was seen in the last 90 s; entering the mixed transition refuses while a live
row says ``canonical`` and needs a live ``queue_storage_target``; finalize
refuses while one says ``canonical`` (schema 39: or ``canonical_drain_only``);
abort, in mixed transition, refuses while one says ``queue_storage``; Awa 0.7
refuses to migrate past v43 while a live row's ``version`` is below 0.6.2 or
not semver, and to flip ring authority while a live row has no
``binary_version`` (a v43 column). So awa_trio's row says ``queue_storage``
(it maintains queue storage; Awa's auto runtimes say the same before the
flip) with the ``auto`` role (it follows ``awa.storage_status()``), which no
gate counts in the canonical, prepared and active states; its ``version``
is semver above every floor; and the row exists only while it changes no
gate (:func:`may_register`): not during the mixed transition (every
capability is counted there by finalize or by abort), not on a database that
``storage_auto_finalize_if_fresh`` could still finalise (canonical, nothing
prepared, no canonical job), not on a schema awa_trio does not maintain.
Each refresh reads the gate again after its write, so a migration holding
the table, which the write waited for, is seen at once.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import re
import socket
import uuid
from collections.abc import Callable
from typing import Any

import trio

from .db import Connection, Database, DatabaseError, QueryError, describe_error
from .engines.states import LEADER_CAPABILITY, STATE_CANONICAL, STATE_MIXED_TRANSITION
from .leadership import LeadershipState
from .sql import Statement
from .version import __version__

log = logging.getLogger(__name__)

#: The newest Awa release whose schema and maintenance contract awa_trio
#: keeps (schema 40 = Awa 0.6.2-0.6.9): the semver part of the ``version``
#: column. Awa 0.7 reads that column as a runtime's release and refuses to
#: migrate past v43 while a live one is below 0.6.2 or not semver; awa_trio's
#: own version (0.x) would read as an old Awa runtime there.
AWA_CONTRACT_VERSION = "0.6.9"
#: What marks awa_trio's rows: the semver build metadata of ``version``.
BUILD_TAG = "awa-trio"
#: The capability and transition role awa_trio's row reports (see the module docstring).
STORAGE_CAPABILITY = LEADER_CAPABILITY
TRANSITION_ROLE = "auto"
#: A missing table, function or schema: no awa schema to register in.
MISSING_OBJECT_SQLSTATES = ("42P01", "42883", "3F000")
#: Longest the clean-stop writes may take.
STOP_TIMEOUT = 2.0


def runtime_version() -> str:
    """``0.6.9+awa-trio.<awa_trio version>``: semver whose precedence is
    the Awa contract kept (build metadata never counts in a comparison)."""
    own_version = __version__
    build = re.sub(r"[^0-9A-Za-z-]+", ".", own_version).strip(".")
    return f"{AWA_CONTRACT_VERSION}+{BUILD_TAG}.{build}"


def is_awa_trio_version(version: str | None) -> bool:
    """True for a ``version`` written by awa_trio (status, doctor, tests)."""
    return bool(version) and f"+{BUILD_TAG}." in str(version)


# Whether a live row of ours leaves every gate as it would be without it.
# The canonical job tables are read only on a canonical database with
# nothing prepared (:data:`FRESH_CANONICAL_SQL`): a role granted queue
# storage alone cannot read them, and there they decide nothing.
STORAGE_GATE_SQL = Statement("""
    SELECT (SELECT max(version) FROM awa.schema_version) = ANY(:versions::int[]) AS supported,
           sts.state,
           sts.prepared_engine IS NULL AS nothing_prepared
    FROM awa.storage_transition_state AS sts
    WHERE sts.singleton
""")
# storage_auto_finalize_if_fresh counts awa.jobs, which on a canonical
# database is these two tables (a function materialising every row: not
# something to run every 10 s). Jobs elsewhere make the gate refuse anyway,
# so missing them here only withdraws the row where it would be harmless.
CANONICAL_JOBS_EXIST_SQL = Statement("""
    SELECT EXISTS (SELECT 1 FROM awa.jobs_hot) OR EXISTS (SELECT 1 FROM awa.scheduled_jobs)
""")

UPSERT_SQL = Statement("""
    INSERT INTO awa.runtime_instances AS runtime (
        instance_id, hostname, pid, version, storage_capability, transition_role,
        started_at, last_seen_at, snapshot_interval_ms, healthy, postgres_connected,
        poll_loop_alive, heartbeat_alive, maintenance_alive, shutting_down, leader,
        global_max_workers, queues, queue_descriptor_hashes, job_kind_descriptor_hashes
    )
    VALUES (
        :instance_id, :hostname, :pid, :version, :storage_capability, :transition_role,
        :started_at, now(), :snapshot_interval_ms, :healthy, true,
        false, false, :maintenance_alive, :shutting_down, :leader,
        NULL, '[]'::jsonb, '{}'::jsonb, '{}'::jsonb
    )
    ON CONFLICT (instance_id) DO UPDATE SET
        hostname = EXCLUDED.hostname,
        pid = EXCLUDED.pid,
        version = EXCLUDED.version,
        storage_capability = EXCLUDED.storage_capability,
        transition_role = EXCLUDED.transition_role,
        started_at = EXCLUDED.started_at,
        last_seen_at = now(),
        snapshot_interval_ms = EXCLUDED.snapshot_interval_ms,
        healthy = EXCLUDED.healthy,
        postgres_connected = EXCLUDED.postgres_connected,
        poll_loop_alive = EXCLUDED.poll_loop_alive,
        heartbeat_alive = EXCLUDED.heartbeat_alive,
        maintenance_alive = EXCLUDED.maintenance_alive,
        shutting_down = EXCLUDED.shutting_down,
        leader = EXCLUDED.leader,
        global_max_workers = EXCLUDED.global_max_workers,
        queues = EXCLUDED.queues,
        queue_descriptor_hashes = EXCLUDED.queue_descriptor_hashes,
        job_kind_descriptor_hashes = EXCLUDED.job_kind_descriptor_hashes
""")
MARK_SHUTTING_DOWN_SQL = Statement("""
    UPDATE awa.runtime_instances
    SET shutting_down = true, leader = false, maintenance_alive = false, healthy = false,
        last_seen_at = now()
    WHERE instance_id = :instance_id
""")
DELETE_SQL = Statement("DELETE FROM awa.runtime_instances WHERE instance_id = :instance_id")


async def may_register(conn: Connection, supported_versions: tuple[int, ...]) -> bool:
    """True while a live row of ours changes no gate that reads the table."""
    row = await conn.fetchrow(*STORAGE_GATE_SQL.bind(versions=list(supported_versions)))
    if row is None or not row["supported"] or row["state"] == STATE_MIXED_TRANSITION:
        return False
    if row["state"] == STATE_CANONICAL and row["nothing_prepared"]:
        return bool(await conn.fetchval(*CANONICAL_JOBS_EXIST_SQL.bind()))
    return True


class RuntimeRegistration:
    """One service's row: what it says and when it is written."""

    def __init__(
        self,
        db: Database,
        state: LeadershipState,
        interval: Callable[[], float],
        supported_versions: tuple[int, ...],
        *,
        healthy: Callable[[], bool] = lambda: True,
        instance_id: uuid.UUID | None = None,
    ) -> None:
        self.db = db
        self.state = state
        #: The snapshot interval in force (read at every refresh: a reload applies).
        self.interval = interval
        self.supported_versions = supported_versions
        self.healthy = healthy
        self.instance_id = instance_id or uuid.uuid4()
        self.hostname = socket.gethostname()
        self.pid = os.getpid()
        self.version = runtime_version()
        self.started_at = dt.datetime.now(dt.UTC)
        #: Whether the last refresh left a row (None before the first one).
        self.registered: bool | None = None
        #: The error of the last refresh, while refreshes keep failing.
        self._last_error: str | None = None

    def snapshot(self) -> dict[str, Any]:
        """The row's values now (a clean stop marks it with MARK_SHUTTING_DOWN_SQL)."""
        leading = self.state.is_leader
        return {
            "instance_id": self.instance_id,
            "hostname": self.hostname,
            "pid": self.pid,
            "version": self.version,
            "storage_capability": STORAGE_CAPABILITY,
            "transition_role": TRANSITION_ROLE,
            "started_at": self.started_at,
            "snapshot_interval_ms": round(self.interval() * 1000),
            "healthy": self.healthy(),
            "maintenance_alive": leading,
            "shutting_down": False,
            "leader": leading,
        }

    async def refresh(self) -> bool:
        """Write the row, or delete it where it would change a gate; True if
        a row is left. The gate is read again after the write: a migration
        holding the table made the write wait, and is seen then. Each
        statement commits on its own, so no lock is held from one to the
        next (a transaction holding the gate's tables while it waits for this
        one deadlocks with DDL that takes them all, such as DROP SCHEMA)."""
        async with self.db.acquire() as conn:
            if await may_register(conn, self.supported_versions):
                await conn.execute(*UPSERT_SQL.bind(**self.snapshot()))
                if await may_register(conn, self.supported_versions):
                    return True
            await conn.execute(*DELETE_SQL.bind(instance_id=self.instance_id))
            return False

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Refresh every interval and on every leadership change until
        cancelled; then mark the row shutting down and delete it."""
        task_status.started()
        try:
            while True:
                leading = self.state.is_leader
                await self._refresh_logged()
                if self.state.is_leader != leading:
                    continue  # changed while writing: write the change now
                with trio.move_on_after(self.interval()):
                    await self.state.wait_for_change()
        finally:
            with trio.move_on_after(STOP_TIMEOUT, shield=True):
                await self._withdraw()

    async def _refresh_logged(self) -> None:
        try:
            registered = await self.refresh()
        except QueryError as exc:
            if exc.sqlstate in MISSING_OBJECT_SQLSTATES:
                # No awa schema (dropped, not migrated yet): nothing to be
                # counted in; the elector says what is wrong with the schema.
                self._note_registered(False)
                return
            self._note_failure(exc)
            return
        except DatabaseError as exc:
            self._note_failure(exc)
            return
        finally:
            if not self.state.is_leader:
                # A follower keeps no connection but its election one.
                self.db.drop_idle_connections()
        self._note_registered(registered)

    def _note_failure(self, exc: DatabaseError) -> None:
        """The first of a run of identical failures is a warning, repeats debug lines."""
        error = describe_error(exc)
        level = logging.DEBUG if error == self._last_error else logging.WARNING
        self._last_error = error
        log.log(
            level,
            "runtime instance %s: refresh failed, next try in %s s: %s",
            self.instance_id,
            f"{self.interval():g}",
            error,
        )

    def _note_registered(self, registered: bool) -> None:
        if self._last_error is not None:
            log.info("runtime instance %s: refreshed again", self.instance_id)
            self._last_error = None
        if registered != self.registered:
            if registered:
                log.info(
                    "registered in awa.runtime_instances as instance %s, version %s",
                    self.instance_id,
                    self.version,
                )
            else:
                log.info(
                    "not registered in awa.runtime_instances: a row would change what a storage gate "
                    "decides (a canonical database auto-finalize could still move, a mixed transition, "
                    "or a schema awa_trio does not maintain)"
                )
        self.registered = registered

    async def _withdraw(self) -> None:
        """Mark the row shutting down, then delete it (tried even if the last
        refresh was cut short: its commit may have landed)."""
        try:
            await self.db.execute(*MARK_SHUTTING_DOWN_SQL.bind(instance_id=self.instance_id))
            await self.db.execute(*DELETE_SQL.bind(instance_id=self.instance_id))
            self.registered = False
        except DatabaseError as exc:
            log.log(
                logging.WARNING if self.registered else logging.DEBUG,
                "runtime instance %s: could not remove its row (it expires unrefreshed): %s",
                self.instance_id,
                describe_error(exc),
            )
