"""What an operator may change under a running service without a restart.

The service owns one :class:`LiveSettings`. A reload (SIGHUP, the admin
endpoint, or :meth:`MaintenanceService.reconfigure` when embedded) replaces
the config, the disabled branches and the periodic jobs together and bumps
the generation; a pause or resume changes the paused set. Each change sets
:attr:`LiveSettings.changed` (and replaces it), and the leader's running
term applies it: branches added or removed, every other branch given its
new spec and context for its next tick, the lock and tracker state kept.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import TYPE_CHECKING

import trio

from .config import MaintenanceConfig

if TYPE_CHECKING:
    from .cron.schedules import PeriodicJob

#: Settings read once, when the service starts: a reload that changes them
#: keeps the running value and says a restart is needed.
RESTART_ONLY_FIELDS = (
    "pool_size",
    "lock_timeout",
    "statement_lock_timeout",
    "hook_timeout",
    "hook_concurrency",
    "hook_queue_size",
)


@dataclasses.dataclass(frozen=True)
class ReloadRequest:
    """New settings read from where the service was configured (the CLI:
    flags, environment and config file, read again)."""

    config: MaintenanceConfig
    disabled_branches: tuple[str, ...]
    periodic_jobs: tuple[PeriodicJob, ...]
    #: Settings outside MaintenanceConfig that changed but need a restart
    #: (database URLs, listen addresses, logging).
    restart_only: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class ReloadResult:
    """What one reload did (also the admin endpoint's answer)."""

    #: False: the new settings were refused and the old ones kept (see error).
    applied: bool
    generation: int
    #: Names of the settings that changed and took effect.
    changed: tuple[str, ...] = ()
    #: Settings that changed but keep their running value until a restart.
    restart_only: tuple[str, ...] = ()
    error: str | None = None

    def as_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)


class LiveSettings:
    """The current generation of reloadable settings, and the paused branches."""

    def __init__(
        self,
        config: MaintenanceConfig,
        disabled_branches: Iterable[str] = (),
        periodic_jobs: tuple[PeriodicJob, ...] = (),
    ):
        self.config = config
        self.disabled_branches = frozenset(disabled_branches)
        self.periodic_jobs = periodic_jobs
        #: 1 at start; +1 for every reload that changed something.
        self.generation = 1
        self.paused: set[str] = set()
        #: Set, then replaced, on every change.
        self.changed = trio.Event()

    def notify(self) -> None:
        self.changed.set()
        self.changed = trio.Event()

    def replace(
        self,
        config: MaintenanceConfig,
        disabled_branches: Iterable[str],
        periodic_jobs: tuple[PeriodicJob, ...],
    ) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """Take the new settings (restart-only fields keep their running
        values); returns (changed, restart_only) names, both empty if
        nothing changed (the generation then stays)."""
        restart_only = tuple(
            name for name in RESTART_ONLY_FIELDS if getattr(config, name) != getattr(self.config, name)
        )
        if restart_only:
            config = config.replace(**{name: getattr(self.config, name) for name in restart_only})
        changed = [
            field.name
            for field in dataclasses.fields(MaintenanceConfig)
            if getattr(config, field.name) != getattr(self.config, field.name)
        ]
        disabled = frozenset(disabled_branches)
        if disabled != self.disabled_branches:
            changed.append("disabled_branches")
        if periodic_jobs != self.periodic_jobs:
            changed.append("periodic_jobs")
        if changed:
            self.config, self.disabled_branches, self.periodic_jobs = config, disabled, periodic_jobs
            self.generation += 1
            self.notify()
        return tuple(changed), restart_only
