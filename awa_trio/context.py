"""What every branch body receives: the database and the leader's settings."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from .config import MaintenanceConfig
from .db import Database
from .metrics import MaintenanceMetrics
from .schema import SchemaInfo
from .tracker_actor import NO_PRUNE_BACKOFF, PruneGate

if TYPE_CHECKING:
    from .cron.schedules import PeriodicJob
    from .hooks import Hooks


@dataclasses.dataclass(frozen=True)
class Services:
    """What a service owns for as long as it runs, across every term: the
    database, the metrics and the hooks."""

    db: Database
    metrics: MaintenanceMetrics
    #: Lifecycle hooks, follow-up jobs and in-flight cancellation (rescue side effects).
    hooks: Hooks | None = None


@dataclasses.dataclass(frozen=True)
class MaintenanceContext:
    """Shared, read-only inputs of branch bodies (``run_once(ctx)``): the
    process-wide services, the settings of the current generation (config,
    periodic jobs) and the term's own state (schema, tracker).

    Tests build one with :meth:`standalone` over a test database and call a
    branch's ``run_once`` directly, without leadership or timers.
    """

    services: Services
    #: The settings in force (a reload hands the next tick a new context).
    config: MaintenanceConfig
    #: The storage state this term runs.
    schema: SchemaInfo
    #: Periodic jobs this process registers (cron).
    periodic_jobs: tuple[PeriodicJob, ...] = ()
    #: The tracker actor of the current leadership term; outside one, a gate
    #: that never backs off (never None, so bodies need no check).
    tracker: PruneGate = NO_PRUNE_BACKOFF
    #: The interval of the branch whose body runs (its spec's, set by the
    #: branch actor); None for a body called on its own.
    interval: float | None = None

    @classmethod
    def standalone(
        cls,
        *,
        db: Database,
        config: MaintenanceConfig,
        metrics: MaintenanceMetrics,
        schema: SchemaInfo,
        hooks: Hooks | None = None,
        periodic_jobs: tuple[PeriodicJob, ...] = (),
    ) -> MaintenanceContext:
        """A context outside any service (tests, benches, one-off calls)."""
        return cls(Services(db, metrics, hooks), config, schema, periodic_jobs)

    @property
    def db(self) -> Database:
        return self.services.db

    @property
    def metrics(self) -> MaintenanceMetrics:
        return self.services.metrics

    @property
    def hooks(self) -> Hooks | None:
        return self.services.hooks
