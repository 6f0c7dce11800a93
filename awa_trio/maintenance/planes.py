"""One branch body serving both planes of a staged transition (queue
storage and the canonical rows still draining)."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from ..body import BodyResult, errors_of
from ..context import MaintenanceContext
from ..db import DatabaseError, describe_error

log = logging.getLogger(__name__)

RunOnce = Callable[[MaintenanceContext], Awaitable[Any]]


@dataclasses.dataclass
class PlaneResults(BodyResult):
    """What one both-planes pass did on each plane (None: that plane
    failed). Its errors are both planes', in the order they came: a plane's
    failure, or the errors its pass went on past."""

    queue_storage: Any
    canonical: Any


def both_planes(name: str, queue_storage_pass: RunOnce, canonical_pass: RunOnce) -> RunOnce:
    """One body that serves both planes. Each plane gets its pass whatever
    the other one did: a database error is logged with the plane and the
    branch goes on (raised only when both planes failed); any other exception
    (a bug) is raised after the other plane has run, for the supervisor."""

    async def run_once(ctx: MaintenanceContext) -> PlaneResults:
        result = PlaneResults(queue_storage=None, canonical=None)
        database_errors: list[DatabaseError] = []
        bug: Exception | None = None
        for plane, body in (("queue_storage", queue_storage_pass), ("canonical", canonical_pass)):
            try:
                outcome = await body(ctx)
            except DatabaseError as exc:
                result.log_error(log, "%s: %s plane failed: %s", name, plane, describe_error(exc))
                database_errors.append(exc)
            except Exception as exc:
                bug = bug or exc
            else:
                setattr(result, plane, outcome)
                result.errors += errors_of(outcome)
        if bug is not None:
            raise bug
        if len(database_errors) == 2:
            raise database_errors[0]
        return result

    run_once.__name__ = f"{name}_both_planes"
    run_once.__qualname__ = run_once.__name__
    return run_once
