"""A job as maintenance sees it: one row of ``awa.jobs``.

Branches that move jobs (rescues) get their rows back with ``RETURNING``;
:class:`JobRow` is what they hand to lifecycle hooks, follow-up factories
and in-flight cancellation, so embedding code never sees driver records.

Every row names its storage ``engine``. The canonical engine numbers jobs
from ``awa.jobs_id_seq`` and queue storage from ``awa.job_id_seq``: during a
storage transition both planes hold jobs, and the same id can name two
different jobs, so anything keyed by job (in-flight registrations, logs)
keys by ``(engine, id)``.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Mapping
from datetime import datetime
from typing import Any

# The engine names stay importable from here for callers outside the package.
from .engines.states import CANONICAL as CANONICAL
from .engines.states import INITIAL_ENGINE, SUPPORTED_ENGINES, job_label
from .engines.states import QUEUE_STORAGE as QUEUE_STORAGE

ENGINES = SUPPORTED_ENGINES

# ``JobRow.engine`` names the engine holding the row, as ``awa.storage_status()``
# does (:data:`CANONICAL` for ``awa.jobs_hot`` / ``awa.scheduled_jobs``,
# :data:`QUEUE_STORAGE` for the queue-storage tables).

#: Columns of ``awa.jobs`` (and of ``awa.jobs_hot`` / ``awa.scheduled_jobs``), in table order.
JOB_COLUMNS = (
    "id", "kind", "queue", "args", "state", "priority", "attempt", "max_attempts",
    "run_at", "heartbeat_at", "deadline_at", "attempted_at", "finalized_at",
    "created_at", "errors", "metadata", "tags", "unique_key", "unique_states",
    "callback_id", "callback_timeout_at", "callback_filter",
    "callback_on_complete", "callback_on_fail", "callback_transform",
    "run_lease", "progress",
)  # fmt: skip


@dataclasses.dataclass(frozen=True, slots=True)
class JobRow:
    """One job, as committed by the statement that returned it."""

    id: int
    kind: str
    queue: str
    #: The job's arguments (decoded jsonb).
    args: Any
    #: ``awa.job_state`` value: available, running, retryable, cancelled, ...
    state: str
    priority: int
    attempt: int
    max_attempts: int
    run_at: datetime
    heartbeat_at: datetime | None
    deadline_at: datetime | None
    attempted_at: datetime | None
    finalized_at: datetime | None
    created_at: datetime
    #: One dict per recorded failure: ``{"error": str, "attempt": int, "at": str, ...}``.
    errors: list[dict[str, Any]]
    metadata: dict[str, Any]
    tags: list[str]
    unique_key: bytes | None
    #: ``bit(8)`` mask of the states that hold the unique claim (driver bit string).
    unique_states: Any
    callback_id: uuid.UUID | None
    callback_timeout_at: datetime | None
    callback_filter: str | None
    callback_on_complete: str | None
    callback_on_fail: str | None
    callback_transform: str | None
    #: Bumped at every claim; with ``id`` it names one attempt (in-flight cancellation key).
    run_lease: int
    progress: Any
    #: Storage engine holding the job: :data:`CANONICAL` or :data:`QUEUE_STORAGE`.
    #: Ids are only unique within one engine.
    #: Without one, the engine every database starts on.
    engine: str = INITIAL_ENGINE

    @classmethod
    def from_record(cls, record: Mapping[str, Any], *, engine: str = INITIAL_ENGINE) -> JobRow:
        """Build from a ``RETURNING *`` (or ``SELECT *``) record of a job table
        (or a record with the same columns)."""
        if engine not in ENGINES:
            raise ValueError(f"unknown storage engine {engine!r}")
        values = {name: record[name] for name in JOB_COLUMNS}
        # A buggy writer can store any JSON here (null, a list, a number); the
        # row in the database keeps it, hooks see an empty list or mapping.
        errors, metadata = values["errors"], values["metadata"]
        values["errors"] = list(errors) if isinstance(errors, list) else []
        values["metadata"] = dict(metadata) if isinstance(metadata, Mapping) else {}
        values["tags"] = list(values["tags"] or [])
        return cls(**values, engine=engine)

    @property
    def key(self) -> tuple[str, int]:
        """``(engine, id)``: what names one job across both storage engines."""
        return (self.engine, self.id)

    @property
    def label(self) -> str:
        """For log lines: ``1234`` on canonical, ``queue_storage:1234`` otherwise."""
        return job_label(self.engine, self.id)

    @property
    def last_error(self) -> str | None:
        """Text of the most recent ``errors`` entry, if it has one."""
        if not self.errors:
            return None
        last = self.errors[-1]
        text = last.get("error") if isinstance(last, Mapping) else None
        return text if isinstance(text, str) else None
