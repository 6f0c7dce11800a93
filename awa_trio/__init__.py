"""awa_trio: a Trio-native maintenance leader for the Awa job queue."""

#: The one place the version lives (pyproject.toml reads it from here).
__version__ = "0.2.0"

from .branch import BranchSpec
from .config import DlqPolicy, MaintenanceConfig, RetentionPolicy, parse_duration
from .context import MaintenanceContext
from .cron import MissedFirePolicy, PeriodicJob, PeriodicJobError
from .db import ConnectionLost, DatabaseError, QueryError, UniqueViolation
from .errors import AwaTrioError, ConfigError, LeadershipAbandoned, UnsupportedSchema
from .hooks import FollowUpJob, Hooks, JobCancelled, JobRescued, RescueReason
from .jobs import JobRow
from .service import MaintenanceService

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
