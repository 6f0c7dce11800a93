"""What a branch body hands back: its result, carrying the failures it went
on past.

A body that meets a failure it can carry on past (one promotable state
failing while the other goes on, a rescue row skipped, one plane of a
transition failing) logs it at ERROR for the operator and records the same
line in its result's :attr:`BodyResult.errors`. The branch actor reads the
pass's health from there (:func:`errors_of`): a pass with any error counts
as failed, so a branch that fails every tick never looks healthy, whatever
the logging configuration lets through.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any


@dataclasses.dataclass(kw_only=True)
class BodyResult:
    """Base of every branch body's result."""

    #: One line per failure the pass went on past, in the order they came
    #: (each also logged at ERROR); any makes the pass count as failed. Not
    #: part of equality: two passes that did the same work are equal.
    errors: list[str] = dataclasses.field(default_factory=list, compare=False)

    def log_error(self, logger: logging.Logger, message: str, *args: object, exc_info: bool = False) -> None:
        """Log ``message % args`` at ERROR and record it as one of this pass's errors."""
        logger.error(message, *args, exc_info=exc_info)
        self.errors.append(message % args if args else message)


def errors_of(result: Any) -> list[str]:
    """The failures a body's result carries (none for a result of any other
    type: an application's own branch may return what it likes)."""
    return result.errors if isinstance(result, BodyResult) else []
