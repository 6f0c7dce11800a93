"""Logging for people and for machines: text or JSON lines, the branch and
term of every record, no secrets, and one line per failure episode.

* ``configure_logging(level, fmt, secrets)`` sets up the root handler (the
  CLI calls it; an embedding application keeps its own logging and may add
  :class:`ContextFilter`/:class:`SecretFilter` to its handlers).
* The branch and leadership term of a record come from context variables,
  which Trio copies into every task a branch or term spawns.
* :class:`FailureEpisodes` turns a run of identical failures (a server
  restarting: every tick of every branch fails the same way) into one
  warning when it starts and one line when it ends.
"""

from __future__ import annotations

import contextvars
import dataclasses
import datetime as dt
import json
import logging
import os
import re
import sys
from collections.abc import Iterable
from urllib.parse import unquote, urlsplit

import trio

#: Name of the maintenance branch whose task logged the record.
CURRENT_BRANCH: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "awa_trio_branch", default=None
)
#: Number of the leadership term (1, 2, ...) of this process, while leading.
CURRENT_TERM: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "awa_trio_term", default=None
)

LOG_FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
REDACTED = "***"
#: asyncpg's pool logs a whole traceback each time it fails to reconnect.
_ASYNCPG_POOL_NOISE = "Failed to restore the pool connection floor"


class ContextFilter(logging.Filter):
    """Adds ``branch`` and ``term`` to every record (None outside them)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "branch"):
            record.branch = CURRENT_BRANCH.get()
        if not hasattr(record, "term"):
            record.term = CURRENT_TERM.get()
        return True


class SecretFilter(logging.Filter):
    """Replaces each known secret (a password) in the rendered message and
    traceback with ``***``."""

    def __init__(self, secrets: Iterable[str]):
        super().__init__()
        self.secrets = sorted({s for s in secrets if s}, key=len, reverse=True)

    def scrub(self, text: str) -> str:
        for secret in self.secrets:
            text = text.replace(secret, REDACTED)
        return text

    def filter(self, record: logging.LogRecord) -> bool:
        if not self.secrets:
            return True
        message = record.getMessage()
        scrubbed = self.scrub(message)
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = self.scrub(record.exc_text)
        if scrubbed != message:
            record.msg, record.args = scrubbed, None
        return True


class AsyncpgPoolNoiseFilter(logging.Filter):
    """asyncpg's pool logs a full traceback per failed reconnection while the
    server is down; the failure episode is already reported by awa_trio, so
    that becomes one debug line without the traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name.startswith("asyncpg") and _ASYNCPG_POOL_NOISE in str(record.msg):
            error = record.exc_info[1] if record.exc_info else None
            record.msg = f"{_ASYNCPG_POOL_NOISE}: {error}" if error else _ASYNCPG_POOL_NOISE
            record.args = None
            record.exc_info = None
            record.exc_text = None
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, branch, term
    (and the traceback, if any)."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": dt.datetime.fromtimestamp(record.created, dt.timezone.utc).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "branch": getattr(record, "branch", None),
            "term": getattr(record, "term", None),
        }
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            entry["exception"] = record.exc_text
        return json.dumps(entry, default=str)


def url_password(url: str) -> str | None:
    """The password in a PostgreSQL URL (user:password@host), if any."""
    try:
        password = urlsplit(url).password
    except ValueError:
        match = re.search(r"://[^:/@]+:([^@]*)@", url)
        password = match.group(1) if match else None
    return unquote(password) if password else None


def secrets_of(database_url: str, environ: dict[str, str] | os._Environ[str] = os.environ) -> list[str]:
    """Everything that must never be printed: the URL's password (raw and
    decoded) and PGPASSWORD."""
    found = []
    password = url_password(database_url)
    if password:
        found.append(password)
        raw = re.search(r"://[^:/@]+:([^@]*)@", database_url)
        if raw:
            found.append(raw.group(1))
    if environ.get("PGPASSWORD"):
        found.append(environ["PGPASSWORD"])
    return found


def configure_logging(level: str, fmt: str = "text", secrets: Iterable[str] = ()) -> None:
    """Root handler on stderr with the context, secret and noise filters."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    handler.addFilter(ContextFilter())
    handler.addFilter(AsyncpgPoolNoiseFilter())
    handler.addFilter(SecretFilter(secrets))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)


@dataclasses.dataclass
class _Episode:
    started: float
    failures: int = 1
    last_error: str = ""


class FailureEpisodes:
    """One warning when a kind of failure starts, one info line when it ends.

    ``failed(key, error)`` returns True for the first failure of an episode
    (the caller logs it, or lets this class do it with ``log``); repeats are
    counted and logged at debug. ``recovered(key)`` closes the episode.
    """

    def __init__(self, logger: logging.Logger):
        self._log = logger
        self._episodes: dict[str, _Episode] = {}

    def failed(self, key: str, error: str, *, message: str | None = None) -> bool:
        episode = self._episodes.get(key)
        if episode is None:
            self._episodes[key] = _Episode(started=_now(), last_error=error)
            self._log.warning("%s", message or f"{key}: {error}")
            return True
        episode.failures += 1
        episode.last_error = error
        self._log.debug("%s (failure %d of this episode): %s", key, episode.failures, error)
        return False

    def recovered(self, key: str) -> None:
        episode = self._episodes.pop(key, None)
        if episode is not None:
            self._log.info("%s: recovered after %d failure%s in %.1fs (last: %s)",
                           key, episode.failures, "" if episode.failures == 1 else "s",
                           _now() - episode.started, episode.last_error)

    def is_failing(self, key: str) -> bool:
        return key in self._episodes


def _now() -> float:
    try:
        return trio.current_time()
    except RuntimeError:  # outside Trio (tests of the formatter)
        import time

        return time.monotonic()
