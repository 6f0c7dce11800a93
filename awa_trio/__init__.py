"""awa_trio: a Trio-native maintenance leader for the Awa job queue.

The public names load on first use (PEP 562), so that ``python -m awa_trio``
reaches its own start-up code, and its signal handling, in milliseconds
instead of after every dependency has been imported.
"""

import importlib
from typing import TYPE_CHECKING, Any

from .version import __version__ as __version__

if TYPE_CHECKING:
    from .branch import BranchSpec
    from .config import DlqPolicy, MaintenanceConfig, RetentionPolicy, parse_duration
    from .context import MaintenanceContext
    from .cron import MissedFirePolicy, PeriodicJob, PeriodicJobError
    from .db import ConnectionLost, DatabaseError, QueryError, UniqueViolation
    from .errors import AwaTrioError, ConfigError, LeadershipAbandoned, UnsupportedSchema
    from .hooks import FollowUpJob, Hooks, JobCancelled, JobRescued, RescueReason
    from .jobs import JobRow
    from .service import MaintenanceService

#: Each public name and the module it lives in.
_EXPORTS = {
    "AwaTrioError": ".errors",
    "BranchSpec": ".branch",
    "ConfigError": ".errors",
    "ConnectionLost": ".db",
    "DatabaseError": ".db",
    "DlqPolicy": ".config",
    "FollowUpJob": ".hooks",
    "Hooks": ".hooks",
    "JobCancelled": ".hooks",
    "JobRescued": ".hooks",
    "JobRow": ".jobs",
    "LeadershipAbandoned": ".errors",
    "MaintenanceConfig": ".config",
    "MaintenanceContext": ".context",
    "MaintenanceService": ".service",
    "MissedFirePolicy": ".cron",
    "PeriodicJob": ".cron",
    "PeriodicJobError": ".cron",
    "QueryError": ".db",
    "RescueReason": ".hooks",
    "RetentionPolicy": ".config",
    "UniqueViolation": ".db",
    "UnsupportedSchema": ".errors",
    "parse_duration": ".config",
}

__all__ = [
    "AwaTrioError",
    "BranchSpec",
    "ConfigError",
    "ConnectionLost",
    "DatabaseError",
    "DlqPolicy",
    "FollowUpJob",
    "Hooks",
    "JobCancelled",
    "JobRescued",
    "JobRow",
    "LeadershipAbandoned",
    "MaintenanceConfig",
    "MaintenanceContext",
    "MaintenanceService",
    "MissedFirePolicy",
    "PeriodicJob",
    "PeriodicJobError",
    "QueryError",
    "RescueReason",
    "RetentionPolicy",
    "UniqueViolation",
    "UnsupportedSchema",
    "parse_duration",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value
