"""Periodic job definitions, validated when they are registered.

Every field is checked up front, and each error names the schedule, so a
typo stops the process at startup: ``awa.insert_job_compat`` checks kind,
queue and tags only at fire time, where a bad value would make the
evaluator fail (and log) every second forever.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from ..errors import ConfigError
from .expressions import CronExpressionError, parse_cron_expression
from .fire_times import (
    CronSchedule,
    InvalidPolicyError,
    MissedFirePolicy,
    UnknownTimezoneError,
    load_zone,
    parse_policy,
)

DEFAULT_TIMEZONE = "UTC"
DEFAULT_QUEUE = "default"
DEFAULT_PRIORITY = 2
DEFAULT_MAX_ATTEMPTS = 25
DEFAULT_MISSED_FIRE_POLICY = MissedFirePolicy.COALESCE
# Limits enforced by awa.insert_job_compat when the job is inserted.
MAX_KIND_LENGTH = 200
MAX_QUEUE_LENGTH = 200
MAX_TAGS = 20
PRIORITY_RANGE = (1, 4)
MAX_ATTEMPTS_RANGE = (1, 1000)


class PeriodicJobError(ConfigError):
    """A periodic job definition is invalid; the message names the schedule."""


@dataclasses.dataclass(frozen=True)
class PeriodicJob:
    """A schedule that enqueues one job of ``kind`` at every fire.

    ``PeriodicJob("nightly_report", "0 2 * * *", kind="nightly_report",
    timezone="Europe/London")``. The expression has 5 fields, or 6 with the
    second first; see :mod:`awa_trio.cron.expressions` for the syntax.
    """

    #: Unique name; the primary key of ``awa.cron_jobs``.
    name: str
    cron_expr: str
    _: dataclasses.KW_ONLY
    #: Kind of the enqueued job (what an Awa worker registered a handler for).
    kind: str
    #: IANA zone the expression is read in.
    timezone: str = DEFAULT_TIMEZONE
    queue: str = DEFAULT_QUEUE
    #: The job's arguments: a JSON object.
    args: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    priority: int = DEFAULT_PRIORITY
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    tags: Sequence[str] = ()
    #: Merged into each job's metadata, with ``cron_name`` and ``cron_fire_time``.
    metadata: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    #: ``coalesce``: after an outage, fire once (the latest); ``catch_up``: fire every missed one.
    missed_fire_policy: MissedFirePolicy | str = DEFAULT_MISSED_FIRE_POLICY

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise PeriodicJobError(f"a periodic job needs a non-empty name, got {self.name!r}")
        # Typed str, but filled from TOML, flags and embedders' code: checked.
        given: tuple[object, object] = (self.cron_expr, self.timezone)
        if not isinstance(given[0], str):
            self._fail(f"the cron expression must be a string, got {self.cron_expr!r}")
        try:
            parse_cron_expression(self.cron_expr)
        except CronExpressionError as exc:
            self._fail(f"invalid cron expression {self.cron_expr!r}: {exc}")
        if not isinstance(given[1], str):
            self._fail(f"timezone must be a string, got {self.timezone!r}")
        try:
            load_zone(self.timezone)
        except UnknownTimezoneError as exc:
            self._fail(str(exc))
        try:
            self._set("missed_fire_policy", parse_policy(self.missed_fire_policy))
        except InvalidPolicyError as exc:
            self._fail(str(exc))
        self._check_text("kind", self.kind, MAX_KIND_LENGTH)
        self._check_text("queue", self.queue, MAX_QUEUE_LENGTH)
        self._check_int("priority", self.priority, PRIORITY_RANGE)
        self._check_int("max_attempts", self.max_attempts, MAX_ATTEMPTS_RANGE)
        self._set("args", self._json_object("args", self.args))
        self._set("metadata", self._json_object("metadata", self.metadata))
        self._set("tags", self._tags(self.tags))

    # -- validation helpers ----------------------------------------------------

    def _fail(self, message: str) -> None:
        raise PeriodicJobError(f"periodic job {self.name!r}: {message}") from None

    def _set(self, field: str, value: Any) -> None:
        object.__setattr__(self, field, value)

    def _check_text(self, field: str, value: Any, max_length: int) -> None:
        if not isinstance(value, str) or not value:
            self._fail(f"{field} must be a non-empty string, got {value!r}")
        if len(value) > max_length:
            self._fail(f"{field} must be at most {max_length} characters, got {len(value)}")

    def _check_int(self, field: str, value: Any, bounds: tuple[int, int]) -> None:
        low, high = bounds
        if isinstance(value, bool) or not isinstance(value, int):
            self._fail(f"{field} must be an integer, got {value!r}")
        if not low <= value <= high:
            self._fail(f"{field} must be between {low} and {high}, got {value}")

    def _json_object(self, field: str, value: Any) -> dict[str, Any]:
        if not isinstance(value, Mapping):
            self._fail(f"{field} must be a JSON object (a mapping), got {type(value).__name__}")
        try:
            text = json.dumps(dict(value), allow_nan=False)
        except (TypeError, ValueError) as exc:
            self._fail(f"{field} is not JSON-serialisable: {exc}")
        if "\\u0000" in text:
            self._fail(f"{field} contains a NUL character, which PostgreSQL's jsonb rejects")
        copied: dict[str, Any] = json.loads(
            text
        )  # a private copy: later changes to the caller's dict do not leak in
        return copied

    def _tags(self, value: Any) -> tuple[str, ...]:
        if isinstance(value, str) or not isinstance(value, Iterable):
            self._fail(f"tags must be a list of strings, got {value!r}")
        tags = tuple(value)
        if not all(isinstance(tag, str) for tag in tags):
            self._fail(f"tags must be strings, got {list(tags)!r}")
        if len(tags) > MAX_TAGS:
            self._fail(f"at most {MAX_TAGS} tags are allowed, got {len(tags)}")
        return tags

    # -- use -----------------------------------------------------------------------

    @property
    def schedule(self) -> CronSchedule:
        return CronSchedule.parse(self.cron_expr, self.timezone)

    def next_fire_after(self, instant: datetime) -> datetime | None:
        """The first fire strictly after ``instant`` (for display and tests)."""
        return self.schedule.next_fire_after(instant)


def validate_periodic_jobs(jobs: Iterable[PeriodicJob]) -> tuple[PeriodicJob, ...]:
    """The jobs as a tuple; rejects anything else and names used twice
    (a second registration would silently replace the first)."""
    result: list[PeriodicJob] = []
    seen: set[str] = set()
    for job in jobs:
        if not isinstance(job, PeriodicJob):
            raise PeriodicJobError(f"periodic jobs must be PeriodicJob objects, got {job!r}")
        if job.name in seen:
            raise PeriodicJobError(f"periodic job {job.name!r} is registered twice")
        seen.add(job.name)
        result.append(job)
    return tuple(result)
