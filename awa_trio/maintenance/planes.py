"""One branch body serving every plane of a staged transition (the engine
it leads into and the rows still draining from the one it leaves).

The planes are an engine's business: an engine that runs a transition
declares its result as a :class:`Planes` subclass whose fields (after the
errors) are its planes, in the order their passes run, each named as its
log lines name the plane."""

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
class Planes(BodyResult):
    """What one pass over every plane did on each (None: that plane
    failed). Its errors are every plane's, in the order they came: a
    plane's failure, or the errors its pass went on past."""

    @classmethod
    def plane_names(cls) -> tuple[str, ...]:
        """The planes, in the order their passes run."""
        base = {field.name for field in dataclasses.fields(BodyResult)}
        return tuple(field.name for field in dataclasses.fields(cls) if field.name not in base)

    def results(self) -> tuple[Any, ...]:
        """Each plane's result, in :meth:`plane_names` order."""
        return tuple(getattr(self, name) for name in self.plane_names())


def serve_planes(name: str, result_type: type[Planes], *passes: RunOnce) -> RunOnce:
    """One body that serves every plane of ``result_type``, one pass each
    (in its order). Each plane gets its pass whatever the others did: a
    database error is logged with the plane and the branch goes on (raised
    only when every plane failed); any other exception (a bug) is raised
    after the other planes have run, for the supervisor."""
    planes = result_type.plane_names()
    if len(planes) != len(passes):
        raise TypeError(f"{result_type.__name__} has planes {planes}: give one pass each")

    async def run_once(ctx: MaintenanceContext) -> Planes:
        result = result_type(*(None for _ in planes))
        database_errors: list[DatabaseError] = []
        bug: Exception | None = None
        for plane, body in zip(planes, passes, strict=True):
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
        if len(database_errors) == len(planes):
            raise database_errors[0]
        return result

    run_once.__name__ = f"{name}_both_planes"
    run_once.__qualname__ = run_once.__name__
    return run_once
