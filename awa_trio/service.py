"""MaintenanceService: the public entry point, for the CLI and for embedding.

Embedding in a Trio application::

    service = MaintenanceService(database_url, MaintenanceConfig(...))
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)   # returns once the schema is checked
        ...
        await service.wait_until_leader()  # optional
        service.stop()                     # graceful: releases the lock

``run`` opens the database, refuses an unsupported schema with one
:class:`~awa_trio.errors.UnsupportedSchema` line, then takes part in leader
election until stopped or cancelled. A schema that goes away later (dropped
and re-created, migrated past what awa_trio supports) makes the leader step
down and wait, not stop: it leads again once a supported schema is back.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import socket
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import trio
from opentelemetry.metrics import MeterProvider

from .branch import BranchSpec
from .config import MaintenanceConfig
from .context import MaintenanceContext, Services
from .cron import (
    PeriodicJob,
    declared_periodic_jobs,
    merge_declared_periodic_jobs,
    validate_periodic_jobs,
)
from .cron.declared import DeclarationSource
from .db import Database, DatabaseError, open_database, sole_exception
from .engines import INITIAL_ENGINE
from .errors import AwaTrioError, ConfigError, UnsupportedSchema
from .hooks import Hooks
from .leadership import LeaderElector, LeadershipState
from .live import LiveSettings, ReloadRequest, ReloadResult
from .logs import CURRENT_TERM
from .metrics import MaintenanceMetrics
from .registry import default_branches, every_branch_name
from .runtime_instance import RuntimeRegistration
from .schema import (
    SUPPORTED_SCHEMA_VERSIONS,
    SchemaInfo,
    check_schema,
)
from .sql import Statement
from .term import LeaderTerm, run_leader_term
from .term_outcome import term_outcome

#: Session defaults a transaction-mode pooler would leave awa_trio unable to override.
DEFAULT_ISOLATION_SQL = Statement("SHOW default_transaction_isolation")
JIT_SQL = Statement("SHOW jit")

log = logging.getLogger(__name__)

BranchFactory = Callable[[MaintenanceConfig, SchemaInfo], Sequence[BranchSpec]]


class MaintenanceService:
    """A maintenance leader candidate for one Awa database."""

    def __init__(
        self,
        database_url: str,
        config: MaintenanceConfig | None = None,
        *,
        meter_provider: MeterProvider | None = None,
        hooks: Hooks | None = None,
        periodic_jobs: Sequence[PeriodicJob] = (),
        periodic_from: DeclarationSource | Sequence[DeclarationSource] = (),
        extra_branches: Sequence[BranchSpec] = (),
        disabled_branches: Sequence[str] = (),
        branch_factory: BranchFactory = default_branches,
        http_address: str | None = None,
        lock_database_url: str | None = None,
        admin_address: str | None = None,
        instance_id: uuid.UUID | None = None,
    ):
        self.database_url = database_url
        #: This process's id in awa.runtime_instances, and the
        #: ``service.instance.id`` of its metrics (``target_info``).
        self.instance_id = instance_id or uuid.uuid4()
        #: A URL that reaches the server directly, for the leader lock (and
        #: the batch runner's lock) when database_url goes through a
        #: transaction-mode pooler; None: database_url for everything.
        self.lock_database_url = lock_database_url
        self.metrics = MaintenanceMetrics(meter_provider)
        #: Rescue side effects (awa_trio.hooks.Hooks); its dispatcher actor runs
        #: in the service's nursery so handlers outlive leadership changes.
        self.hooks = hooks
        self._extra_branches = tuple(extra_branches)
        self._branch_factory = branch_factory
        #: The reloadable settings (config, disabled branches, periodic jobs)
        #: and the paused branches; periodic jobs are validated here, so a bad
        #: schedule fails at construction, naming it.
        #: Schedules the application declares in code (``periodic_from``: a
        #: ``"module:function"`` or the function, called once here with a
        #: recorder); kept across reconfigure(), which replaces only the others.
        sources = (
            [periodic_from] if isinstance(periodic_from, str) or callable(periodic_from) else periodic_from
        )
        self.declared_periodic_jobs = declared_periodic_jobs(list(sources), search_working_directory=False)
        self.live = LiveSettings(
            config or MaintenanceConfig(),
            disabled_branches,
            merge_declared_periodic_jobs(validate_periodic_jobs(periodic_jobs), self.declared_periodic_jobs),
        )
        #: Where reload() reads new settings from (the CLI sets it to re-read
        #: the config file and environment); None: reload() has no source.
        self.reload_source: Callable[[], ReloadRequest] | None = None
        self._state = LeadershipState()
        self._scope: trio.CancelScope | None = None
        self._elector: LeaderElector | None = None
        #: Filled in by run() once the schema has been checked, then kept current
        #: by the leader (term starts and storage state changes).
        self._checked_schema: SchemaInfo | None = None
        self._first_branches: tuple[BranchSpec, ...] = ()
        #: The latest leadership term's view (schema, branches, tracker).
        self._leader_term: LeaderTerm | None = None
        #: ``HOST:PORT`` of the metrics/health/status server (None: no server).
        self.http_address = http_address
        #: Where that server listens once started (port 0 resolved).
        self.http_urls: list[str] = []
        #: ``HOST:PORT`` (or ``PORT``, loopback) of the admin listener: reload,
        #: resign, pause and resume over HTTP (None: no listener).
        self.admin_address = admin_address
        self.admin_urls: list[str] = []
        self._db: Database | None = None
        #: This node's row in awa.runtime_instances (set once running).
        self.registration: RuntimeRegistration | None = None
        self._term = 0
        self._term_started_at: float | None = None
        self.metrics.observe_leadership(lambda: (self.is_leader, self._term_started_at))
        self.metrics.observe_live_settings(self._live_settings_reading)

    # -- state the embedding application can read --------------------------

    @property
    def schema(self) -> SchemaInfo | None:
        """The schema as last seen: checked at start, then kept current by
        the leader (term starts and storage state changes)."""
        return self._leader_term.schema if self._leader_term is not None else self._checked_schema

    @property
    def branches(self) -> tuple[BranchSpec, ...]:
        """The branches the latest term runs (before one: those the checked
        schema selects)."""
        return self._leader_term.branches if self._leader_term is not None else self._first_branches

    @property
    def config(self) -> MaintenanceConfig:
        """The settings in force (the latest generation a reload applied)."""
        return self.live.config

    @property
    def periodic_jobs(self) -> tuple[PeriodicJob, ...]:
        return self.live.periodic_jobs

    @property
    def config_generation(self) -> int:
        return self.live.generation

    @property
    def paused_branches(self) -> frozenset[str]:
        return frozenset(self.live.paused)

    def _live_settings_reading(self) -> tuple[int, dict[str, bool]] | None:
        """(generation, paused per running branch) for the gauges while leading."""
        if not self.is_leader:
            return None
        return self.live.generation, {spec.name: spec.name in self.live.paused for spec in self.branches}

    @property
    def is_leader(self) -> bool:
        return self._state.is_leader

    @property
    def is_alive(self) -> bool:
        return self._state.is_alive

    @property
    def leadership_history(self) -> list[tuple[float, bool]]:
        """Recent leadership changes as (trio.current_time(), is_leader)."""
        return list(self._state.history)

    @property
    def not_leading_reason(self) -> str | None:
        """Why this node cannot lead now (its server is a standby or
        read-only, or does not answer), or None: /readyz and /status say it."""
        return self._state.not_leading_reason or self._state.unreachable_reason

    @property
    def lock_backend_pid(self) -> int | None:
        """pid of the backend holding the leader lock while leading."""
        return self._state.lock_backend_pid

    async def wait_for_leadership_change(self) -> bool:
        """Wait for the next change; returns True if now leading."""
        return await self._state.wait_for_change()

    async def wait_until_leader(self) -> None:
        await self._state.wait_until(True)

    async def wait_until_follower(self) -> None:
        await self._state.wait_until(False)

    async def check_database(self) -> SchemaInfo:
        """The schema now, if the database answers and awa_trio maintains it
        (raises DatabaseError or UnsupportedSchema otherwise): /readyz."""
        if self._db is None:
            raise UnsupportedSchema("the service has not connected to its database yet")
        return await check_schema(self._db)

    async def status(self) -> dict[str, Any]:
        """What /status shows: leadership, storage, branches, hooks."""
        schema = self.schema
        branches: dict[str, Any] = {}
        tracker = self._leader_term.tracker if self.is_leader and self._leader_term else None
        if tracker is not None:
            with trio.move_on_after(1.0):
                try:
                    branches = await tracker.snapshot()
                except (trio.BrokenResourceError, trio.ClosedResourceError, trio.EndOfChannel):
                    pass  # the term ended while asked (a handover): no branch figures
        for spec in self.branches if self.is_leader else ():
            branch = branches.setdefault(spec.name, {})
            branch["interval"] = spec.interval
            branch["paused"] = spec.name in self.live.paused
        return {
            "role": "leader" if self.is_leader else "follower",
            "alive": self.is_alive,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "term": self._term if self.is_leader else None,
            "term_started_at": self._term_started_at if self.is_leader else None,
            "lock_backend_pid": self.lock_backend_pid,
            "not_leading_reason": self.not_leading_reason,
            "schema_version": schema.version if schema else None,
            "engine": schema.engine if schema else None,
            "transition_state": schema.state if schema else None,
            "config_generation": self.live.generation,
            "paused_branches": sorted(self.live.paused),
            "branches": branches,
            "hook_queue_depth": self.hooks.queue_depth() if self.hooks is not None else None,
        }

    def resign(self) -> bool:
        """Hand leadership over to a follower at once (for deploys) and stay a
        follower for config.resign_hold_off; False if not leading."""
        return self._elector is not None and self._elector.resign()

    def reconfigure(
        self,
        config: MaintenanceConfig,
        *,
        disabled_branches: Sequence[str] | None = None,
        periodic_jobs: Sequence[PeriodicJob] | None = None,
        restart_only: Sequence[str] = (),
    ) -> ReloadResult:
        """Apply new settings without a restart: the leader's branches take
        them at their next tick, keeping the lock and tracker state.
        Disabled branches and periodic jobs stay as they are unless given.
        Raises ConfigError (and keeps the old settings) if they are invalid;
        ``restart_only`` names further settings the caller could not apply."""
        live = self.live
        disabled = frozenset(live.disabled_branches if disabled_branches is None else disabled_branches)
        jobs = live.periodic_jobs
        if periodic_jobs is not None:
            jobs = merge_declared_periodic_jobs(
                validate_periodic_jobs(periodic_jobs), self.declared_periodic_jobs
            )
        self._check_disabled_branches(disabled, config)
        changed, kept = live.replace(config, disabled, jobs)
        kept = tuple(kept) + tuple(restart_only)
        if self._elector is not None:
            self._elector.reconfigure(live.config)
        if changed:
            log.info("config generation %d applied: %s changed", live.generation, ", ".join(changed))
        if kept:
            log.warning(
                "config reload: %s changed but take effect only at a restart (the running values stay)",
                ", ".join(kept),
            )
        if not changed and not kept:
            log.info("config reload: nothing changed (generation %d)", live.generation)
        return ReloadResult(applied=True, generation=live.generation, changed=changed, restart_only=kept)

    def reload(self) -> ReloadResult:
        """Re-read the settings from ``reload_source`` (SIGHUP, the admin
        endpoint) and apply them; an invalid source keeps the old settings and
        logs one line saying why."""
        try:
            if self.reload_source is None:
                raise ConfigError(
                    "this service has no config source to reload from (embedded: call reconfigure)"
                )
            request = self.reload_source()
            return self.reconfigure(
                request.config,
                disabled_branches=request.disabled_branches,
                periodic_jobs=request.periodic_jobs,
                restart_only=request.restart_only,
            )
        except ConfigError as exc:
            log.error("config reload refused, keeping generation %d: %s", self.live.generation, exc)
            return ReloadResult(applied=False, generation=self.live.generation, error=str(exc))

    def known_branch_names(self, config: MaintenanceConfig | None = None) -> frozenset[str]:
        """Every branch name on any engine and transition state (what pause
        and disabled_branches accept): the registry lists them; a custom
        branch_factory stands for the registry, with the names it runs on the
        schema seen (the newest supported one, on the initial engine, before connecting)."""
        config = config or self.config
        if self._branch_factory is default_branches:
            names = set(every_branch_name(config))
        else:
            schema = self.schema or SchemaInfo(SUPPORTED_SCHEMA_VERSIONS[-1], INITIAL_ENGINE)
            names = {spec.name for spec in self._branch_factory(config, schema)}
        return frozenset(names | {spec.name for spec in self._extra_branches})

    def pause(self, branch: str) -> bool:
        """Stop running one branch's bodies from its next tick, until
        resume(); this node only, kept across terms. False if already paused."""
        self._check_branch_name(branch)
        if branch in self.live.paused:
            return False
        self.live.paused.add(branch)
        self.live.notify()
        log.warning("%s: paused (resume to run it again)", branch)
        return True

    def resume(self, branch: str) -> bool:
        """Run a paused branch again from its next tick; False if not paused."""
        self._check_branch_name(branch)
        if branch not in self.live.paused:
            return False
        self.live.paused.discard(branch)
        self.live.notify()
        log.info("%s: resumed", branch)
        return True

    def _check_branch_name(self, branch: str) -> None:
        known = self.known_branch_names()
        if branch not in known:
            raise ConfigError(f"no branch named {branch!r} (known: {', '.join(sorted(known))})")

    def stop(self) -> None:
        """Ask run() to return: branches are cancelled, the lock released."""
        if self._scope is not None:
            self._scope.cancel(reason="maintenance service stopped")

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[MaintenanceService]:
        """Run the service for the length of an ``async with`` block, in a
        nursery of its own, and stop it gracefully on the way out. Whatever
        ends the block alone (a start-up error, a crash, the block's own
        exception) comes out as itself, not wrapped in an ExceptionGroup, so
        ``except UnsupportedSchema`` around the block works."""
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(self.run)
                try:
                    yield self
                finally:
                    self.stop()
        except BaseExceptionGroup as group:
            error = sole_exception(group)
            if error is None:
                raise
            raise error from error.__cause__

    # -- the service ---------------------------------------------------------

    def _select_branches(self, schema: SchemaInfo) -> tuple[BranchSpec, ...]:
        live = self.live
        branches = list(self._branch_factory(live.config, schema)) + list(self._extra_branches)
        return tuple(spec for spec in branches if spec.name not in live.disabled_branches)

    def _check_disabled_branches(
        self, disabled: frozenset[str] | None = None, config: MaintenanceConfig | None = None
    ) -> None:
        """Names must exist on some engine: the set can change while running."""
        disabled = self.live.disabled_branches if disabled is None else disabled
        known = self.known_branch_names(config)
        unknown = sorted(disabled - known)
        if unknown:
            raise ConfigError(
                f"disabled_branches names unknown branches: {', '.join(unknown)} "
                f"(known: {', '.join(sorted(known))})"
            )

    def validate_disabled_branches(self) -> None:
        """What the run checks at start, without a database (``--print-config``
        says what the run would refuse)."""
        self._check_disabled_branches()

    async def _adapt_to_pooler(self, db: Database) -> None:
        """Through a transaction-mode pooler (PgBouncer's pool_mode =
        transaction) a session-level advisory lock would stay on whichever
        server session the pooler lent, not with this process: the lock must
        go through lock_database_url, a direct URL, or nowhere. The pool
        then runs without session state (no statement cache, no SETs)."""
        if self.lock_database_url is not None and await db.shares_server_sessions(self.lock_database_url):
            raise ConfigError(
                "lock_database_url leads to a transaction-mode pooler (two sessions shared one server "
                "backend): it must reach the server directly, or through a session-mode pooler"
            )
        if not db.transaction_pooled:
            return
        if self.lock_database_url is None:
            raise ConfigError(
                "the database URL leads to a transaction-mode pooler (two sessions shared one server "
                "backend), where the leader lock would not stay with this process: set lock_database_url "
                "(--lock-database-url, AWA_LOCK_DATABASE_URL) to a URL that reaches the server directly"
            )
        db.use_session_dsn(self.lock_database_url)
        isolation = await db.fetchval(*DEFAULT_ISOLATION_SQL.bind())
        if isolation != "read committed":
            raise ConfigError(
                f"default_transaction_isolation is {isolation!r} behind a transaction-mode pooler, where "
                "awa_trio cannot set it per session: set it to 'read committed' for the maintenance role "
                "(ALTER ROLE ... SET default_transaction_isolation = 'read committed')"
            )
        if await db.fetchval(*JIT_SQL.bind()) == "on":
            log.warning(
                "jit is on behind a transaction-mode pooler, where awa_trio cannot turn it off per "
                "session; a queue-storage pass over every ring partition can take seconds to compile: "
                "ALTER ROLE ... SET jit = off for the maintenance role"
            )
        log.info(
            "the database URL leads to a transaction-mode pooler: pooled connections keep no session "
            "state; the leader lock and the batch runner's lock use lock_database_url"
        )

    def _registration(self, db: Database) -> RuntimeRegistration:
        """This node's row in awa.runtime_instances (awa_trio.runtime_instance)."""
        return RuntimeRegistration(
            db,
            self._state,
            lambda: self.live.config.runtime_snapshot_interval,
            SUPPORTED_SCHEMA_VERSIONS,
            healthy=lambda: self.not_leading_reason is None,
            instance_id=self.instance_id,
        )

    async def run(
        self, *, task_status: trio.TaskStatus[MaintenanceService] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Serve until stop() or cancellation. Startup errors (bad URL,
        unreachable server, unsupported schema) are raised before
        ``task_status.started()``; a storage change while leading restarts
        the term with the matching branches, and a schema awa_trio cannot
        maintain (any more) makes the leader step down until one it can is
        back (``not_leading_reason`` says why meanwhile). A lone
        awa_trio/database error is raised as itself, not in a group."""
        try:
            await self._run(task_status)
        except BaseExceptionGroup as group:
            error = sole_exception(group)
            if isinstance(error, (AwaTrioError, DatabaseError)):
                raise error from error.__cause__
            raise

    async def _run(self, task_status: trio.TaskStatus[MaintenanceService]) -> None:
        with trio.CancelScope() as scope:
            self._scope = scope
            async with open_database(
                self.database_url,
                pool_size=self.config.pool_size,
                lock_timeout=self.config.lock_timeout,
                statement_lock_timeout=self.config.statement_lock_timeout,
            ) as db:
                self._db = db
                schema = self._checked_schema = await check_schema(db)
                self._leader_term = None
                await self._adapt_to_pooler(db)
                self._check_disabled_branches()
                self._first_branches = self._select_branches(schema)
                log.info(
                    "awa schema version %d, storage engine %s (%s)",
                    schema.version,
                    schema.engine,
                    schema.state,
                )
                ctx = MaintenanceContext(
                    Services(db, self.metrics, self.hooks), self.config, schema, self.periodic_jobs
                )

                async def lead(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
                    self._term += 1
                    CURRENT_TERM.set(self._term)
                    self._term_started_at = time.time()
                    try:
                        async with trio.open_nursery() as term_nursery:
                            self._leader_term = await term_nursery.start(
                                functools.partial(run_leader_term, ctx, self._select_branches, live=self.live)
                            )
                            task_status.started()
                    finally:
                        # Following from here: keep only the election connection.
                        db.drop_idle_connections()

                db.drop_idle_connections()  # the start-up checks' connection
                elector = self._elector = LeaderElector(
                    db,
                    self.config,
                    self._state,
                    lead,
                    outcome_of=lambda group: term_outcome(group, ctx, self.config),
                    lock_dsn=self.lock_database_url,
                )
                try:
                    async with trio.open_nursery() as nursery:
                        if self.hooks is not None:
                            await nursery.start(self.hooks.run, self.config)
                        if self.http_address is not None:
                            from .http_api import serve_http

                            self.http_urls = await nursery.start(serve_http, self, self.http_address)
                        if self.admin_address is not None:
                            from .http_api import serve_admin

                            self.admin_urls = await nursery.start(serve_admin, self, self.admin_address)
                        await nursery.start(elector.run)
                        # Followers register too: Awa's admin views list every node.
                        self.registration = self._registration(db)
                        await nursery.start(self.registration.run)
                        self._state.is_alive = True
                        task_status.started(self)
                finally:
                    self._state.is_alive = False
                    self._state.set_leader(False)
        self._scope = None
