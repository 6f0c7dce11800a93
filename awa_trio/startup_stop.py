"""A stop (SIGINT or SIGTERM) that arrives while ``python -m awa_trio`` starts.

During start-up the two signals are recorded, never raised as
KeyboardInterrupt: CPython 3.11 remembers a KeyboardInterrupt that passed
through code run by ``exec`` (dataclasses build their methods that way at
import) and then ends the process by SIGINT, exit -2, even after the
exception was caught and the program returned 0. Each command honours a
recorded stop once its own handling is in place: ``run`` and ``demo`` after
their signal receivers open, the others before they begin.
"""

from __future__ import annotations

import signal
from types import FrameType
from typing import Any

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)

_received: signal.Signals | None = None
_previous: dict[signal.Signals, Any] = {}


def _record(signum: int, frame: FrameType | None) -> None:
    global _received
    if _received is None:
        _received = signal.Signals(signum)


def defer() -> None:
    """Record SIGINT and SIGTERM from now on instead of acting on them. A
    signal the process was started with ignored stays ignored."""
    for signum in STOP_SIGNALS:
        handler = signal.getsignal(signum)
        if handler is signal.SIG_IGN:
            continue
        _previous[signum] = handler
        signal.signal(signum, _record)


def restore() -> None:
    """Give the signals back their handlers from before :func:`defer`."""
    while _previous:
        signum, handler = _previous.popitem()
        signal.signal(signum, handler)


def received() -> signal.Signals | None:
    """The first stop signal recorded since :func:`defer`, if any."""
    return _received
