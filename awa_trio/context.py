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
class MaintenanceContext:
    """Shared, read-only inputs of branch bodies (``run_once(ctx)``).

    Tests build one over a test database and call a branch's ``run_once``
    directly, without leadership or timers.
    """

    db: Database
    config: MaintenanceConfig
    metrics: MaintenanceMetrics
    schema: SchemaInfo
    #: Lifecycle hooks, follow-up jobs and in-flight cancellation (rescue side effects).
    hooks: Hooks | None = None
    #: Periodic jobs this process registers (cron).
    periodic_jobs: tuple[PeriodicJob, ...] = ()
    #: The tracker actor of the current leadership term; outside one, a gate
    #: that never backs off (never None, so bodies need no check).
    tracker: PruneGate = NO_PRUNE_BACKOFF
