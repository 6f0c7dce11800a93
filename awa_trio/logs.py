"""Logging for people and for machines: text or JSON lines, the branch and
term of every record, no secrets, and one line per failure episode.

* ``configure_logging(level, fmt, secrets)`` sets up the root handler (the
  CLI calls it; an embedding application keeps its own logging and may add
  :class:`ContextFilter`/:class:`SecretFilter` to its handlers).
* The branch and leadership term of a record come from context variables,
  which Trio copies into every task a branch or term spawns.
* :class:`ConnectionEpisodeFilter` turns a run of connection failures (a
  server restarting: every tick of every branch fails the same way) into one
  warning when it starts and, from :func:`connection_recovered`, one line
  when it ends.
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
import time
from collections.abc import Iterable
from urllib.parse import unquote, unquote_plus, urlsplit

#: Name of the maintenance branch whose task logged the record.
CURRENT_BRANCH: contextvars.ContextVar[str | None] = contextvars.ContextVar("awa_trio_branch", default=None)
#: Number of the leadership term (1, 2, ...) of this process, while leading.
CURRENT_TERM: contextvars.ContextVar[int | None] = contextvars.ContextVar("awa_trio_term", default=None)

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
    """One JSON object per line: time, level, logger, message, branch, the
    term while leading (and the traceback, if any)."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "branch": getattr(record, "branch", None),
        }
        term = getattr(record, "term", None)
        if term is not None:  # outside a term there is none to name (not "term": null)
            entry["term"] = term
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            entry["exception"] = record.exc_text
        return json.dumps(entry, default=str)


#: Query parameters of a PostgreSQL URL whose values are secret: the client
#: key's passphrase, and where the client key is (asyncpg reads both).
SECRET_URL_PARAMETERS = ("sslpassword", "sslkey")
#: Environment variables asyncpg (like libpq) reads secrets from.
SECRET_ENVIRONMENT_VARIABLES = ("PGPASSWORD", "PGSSLKEY")
_PASSWORD_IN_URL = re.compile(r"(://[^:/@]+):([^@]*)@")
_SECRET_PARAMETER_IN_URL = re.compile(rf"([?&](?:{'|'.join(SECRET_URL_PARAMETERS)})=)([^&#]*)")


def url_password(url: str) -> str | None:
    """The password in a PostgreSQL URL (user:password@host), if any."""
    try:
        password = urlsplit(url).password
    except ValueError:
        match = _PASSWORD_IN_URL.search(url)
        password = match.group(2) if match else None
    return unquote(password) if password else None


def secrets_of(database_url: str, environ: dict[str, str] | os._Environ[str] = os.environ) -> list[str]:
    """Everything that must never be printed: the URL's password, its
    sslpassword and sslkey values (each as written and as decoded), and
    PGPASSWORD and PGSSLKEY."""
    found = []
    password = url_password(database_url)
    if password:
        found.append(password)
        raw = _PASSWORD_IN_URL.search(database_url)
        if raw:
            found.append(raw.group(2))
    for match in _SECRET_PARAMETER_IN_URL.finditer(database_url):
        if match.group(2):
            # asyncpg decodes the query string as a form does (%XX and +).
            found += [match.group(2), unquote_plus(match.group(2))]
    found += [environ[name] for name in SECRET_ENVIRONMENT_VARIABLES if environ.get(name)]
    return found


def redact_url(url: str) -> str:
    """The URL for messages: its password and the values of its secret query
    parameters become ``***``; host, database and certificate paths stay,
    since they are what a person needs to see to fix a connection."""
    url = _PASSWORD_IN_URL.sub(rf"\1:{REDACTED}@", url)
    return _SECRET_PARAMETER_IN_URL.sub(rf"\1{REDACTED}", url)


def configure_logging(level: str, fmt: str = "text", secrets: Iterable[str] = ()) -> None:
    """Root handler on stderr with the context, secret and noise filters."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    handler.addFilter(ContextFilter())
    handler.addFilter(AsyncpgPoolNoiseFilter())
    handler.addFilter(ConnectionEpisodeFilter())
    handler.addFilter(SecretFilter(secrets))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)


#: What a lost or refused connection looks like in a log line, whichever
#: branch or step wrote it (SQLSTATE class 08, admin shutdown, start-up).
_CONNECTION_TROUBLE = re.compile(
    r"\[08\w{3}\]|\[57P0[123]\]|connection (was|is) closed|connection refused|"
    r"terminating connection|the database system is (starting up|shutting down)|"
    r"ConnectionResetError|ConnectionRefusedError|connection lost|unexpected connection_lost|cannot switch to state|"
    r"another operation .* is in progress|connect call failed|could not connect|name or service not known|"
    r"no route to host|network is unreachable|timed out|TimeoutError",
    re.IGNORECASE,
)


class ConnectionEpisodeFilter(logging.Filter):
    """While a branch's connection is failing, only its first connection
    error is a warning; the rest are debug until :func:`connection_recovered`
    is called for it (the branch's next successful body), which logs one line.
    Keyed by branch (from the context), else by logger."""

    def __init__(self) -> None:
        super().__init__()

    def filter(self, record: logging.LogRecord) -> bool:
        # A record reaching several handlers is judged once.
        verdict = getattr(record, "_awa_trio_episode_verdict", None)
        if verdict is None:
            verdict = self._judge(record)
            record._awa_trio_episode_verdict = verdict
        return verdict

    def _judge(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING or record.levelno >= logging.CRITICAL:
            return True
        if getattr(record, "outage_log", False):
            return True  # an OutageLog's own line: already counted there
        message = record.getMessage()
        if not _CONNECTION_TROUBLE.search(message):
            return True
        key = getattr(record, "branch", None) or CURRENT_BRANCH.get() or record.name
        episode = _OPEN_EPISODES.get(key)
        if episode is None:
            _OPEN_EPISODES[key] = _Episode(started=_now(), last_error=message, last_failure=_now())
            record.msg = f"{message} (connection trouble; repeats are logged at debug until it recovers)"
            record.args = None
            record.exc_info, record.exc_text = None, None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            return True
        episode.failures += 1
        episode.last_error = message
        episode.last_failure = _now()
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        record.exc_info, record.exc_text = None, None
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


_OPEN_EPISODES: dict[str, _Episode] = {}


def connection_recovered(key: str, logger: logging.Logger, *, since: float | None = None) -> None:
    """Close ``key``'s connection-trouble episode, if one is open and had no
    failure after ``since`` (when the work that just succeeded began)."""
    episode = _OPEN_EPISODES.get(key)
    if episode is None or (since is not None and episode.last_failure >= since):
        return
    del _OPEN_EPISODES[key]
    logger.info(
        "%sdatabase connection works again after %d failure%s in %.1fs",
        "" if key == logger.name else f"{key}: ",  # the format shows the logger's name already
        episode.failures,
        "" if episode.failures == 1 else "s",
        _now() - episode.started,
    )


@dataclasses.dataclass
class _Episode:
    started: float
    failures: int = 1
    last_error: str = ""
    last_failure: float = 0.0


def _now() -> float:
    return time.monotonic()


#: An outage's first reminder comes this long after it began; each later
#: one twice as long after the one before, up to OUTAGE_REMINDER_CEILING.
OUTAGE_FIRST_REMINDER = 10.0
OUTAGE_REMINDER_CEILING = 900.0


class OutageLog:
    """A repeated failure told as a person wants to read it: one WARNING when
    it starts, a reminder at a slowly growing interval (10 s, 20 s, 40 s ...
    up to every 15 minutes) while it lasts, one INFO when it ends; every
    failure in between at DEBUG. Times are Trio's clock."""

    def __init__(self, logger: logging.Logger, what: str):
        self._log = logger
        self._what = what
        self._started: float | None = None
        self._failures = 0
        self._next_reminder = 0.0
        self._gap = OUTAGE_FIRST_REMINDER

    @property
    def ongoing(self) -> bool:
        return self._started is not None

    def failed(self, error: object) -> None:
        import trio

        now = trio.current_time()
        self._failures += 1
        extra = {"outage_log": True}
        if self._started is None:
            self._started, self._gap = now, OUTAGE_FIRST_REMINDER
            self._next_reminder = now + self._gap
            self._log.warning(
                "%s failed: %s (retrying; reminders at growing intervals until it works again)",
                self._what,
                error,
                extra=extra,
            )
        elif now >= self._next_reminder:
            self._gap = min(OUTAGE_REMINDER_CEILING, self._gap * 2)
            self._next_reminder = now + self._gap
            self._log.warning(
                "%s still failing after %.0fs (%d attempts): %s",
                self._what,
                now - self._started,
                self._failures,
                error,
                extra=extra,
            )
        else:
            self._log.debug("%s failed: %s", self._what, error, extra=extra)

    def recovered(self) -> None:
        import trio

        if self._started is None:
            return
        self._log.info(
            "%s works again after %.1fs (%d failed attempt%s)",
            self._what,
            trio.current_time() - self._started,
            self._failures,
            "" if self._failures == 1 else "s",
            extra={"outage_log": True},
        )
        self._started, self._failures = None, 0
