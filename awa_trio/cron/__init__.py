"""Periodic (cron) jobs: definitions, croner-compatible fire times, and the
cron_sync / cron_eval leader branches.

Embedding::

    from awa_trio.cron import PeriodicJob

    jobs = [PeriodicJob("nightly_report", "30 2 * * *", kind="nightly_report",
                        timezone="Europe/London", args={"format": "pdf"})]
    service = MaintenanceService(url, periodic_jobs=jobs)

or the application's own declarations (see :mod:`awa_trio.cron.declared`)::

    service = MaintenanceService(url, periodic_from="app.schedules:declare")
"""

from .branches import (
    CRON_EVAL,
    CRON_SYNC,
    CronEvalResult,
    CronSyncResult,
    cron_branches,
    evaluate_cron_schedules,
    evaluate_schedules,
    sync_periodic_jobs,
)
from .declared import (
    PeriodicRecorder,
    declared_periodic_jobs,
    derive_kind,
    merge_declared_periodic_jobs,
)
from .expressions import CronExpression, CronExpressionError, parse_cron_expression
from .fire_times import (
    CATCH_UP_LIMIT,
    CronSchedule,
    MissedFirePolicy,
    UnknownTimezoneError,
    compute_fire_times,
    format_fire_time,
)
from .schedules import PeriodicJob, PeriodicJobError, validate_periodic_jobs
from .settings import (
    merge_periodic_jobs,
    parse_periodic_job_flag,
    periodic_jobs_from_document,
    periodic_jobs_from_flags,
    split_periodic_job_lines,
)

__all__ = [
    "CATCH_UP_LIMIT",
    "CRON_EVAL",
    "CRON_SYNC",
    "CronEvalResult",
    "CronExpression",
    "CronExpressionError",
    "CronSchedule",
    "CronSyncResult",
    "MissedFirePolicy",
    "PeriodicJob",
    "PeriodicJobError",
    "PeriodicRecorder",
    "UnknownTimezoneError",
    "compute_fire_times",
    "cron_branches",
    "declared_periodic_jobs",
    "derive_kind",
    "evaluate_cron_schedules",
    "evaluate_schedules",
    "format_fire_time",
    "merge_declared_periodic_jobs",
    "merge_periodic_jobs",
    "parse_cron_expression",
    "parse_periodic_job_flag",
    "periodic_jobs_from_document",
    "periodic_jobs_from_flags",
    "split_periodic_job_lines",
    "sync_periodic_jobs",
    "validate_periodic_jobs",
]
