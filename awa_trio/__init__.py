"""awa_trio: a Trio-native maintenance leader for the Awa job queue."""

from .branch import BranchSpec
from .config import DlqPolicy, MaintenanceConfig, RetentionPolicy, parse_duration
from .context import MaintenanceContext
from .db import ConnectionLost, DatabaseError, QueryError, UniqueViolation
from .errors import AwaTrioError, ConfigError, LeadershipAbandoned, UnsupportedSchema
from .service import MaintenanceService

__all__ = [
    "AwaTrioError",
    "BranchSpec",
    "ConfigError",
    "ConnectionLost",
    "DatabaseError",
    "DlqPolicy",
    "LeadershipAbandoned",
    "MaintenanceConfig",
    "MaintenanceContext",
    "MaintenanceService",
    "QueryError",
    "RetentionPolicy",
    "UniqueViolation",
    "UnsupportedSchema",
    "parse_duration",
]
