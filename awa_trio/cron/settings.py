"""Periodic jobs from configuration: a TOML file and a repeatable CLI flag.

In the TOML file, one ``[[periodic_jobs]]`` table per schedule; the keys are
the :class:`~awa_trio.cron.schedules.PeriodicJob` fields::

    [[periodic_jobs]]
    name = "nightly_report"
    cron_expr = "30 2 * * *"
    timezone = "Europe/London"
    kind = "nightly_report"
    queue = "reports"
    args = { format = "pdf" }
    tags = ["reports"]
    missed_fire_policy = "catch_up"

    [[periodic_jobs]]
    name = "heartbeat"
    cron_expr = "*/10 * * * * *"      # 6 fields: the second comes first
    kind = "heartbeat"

On the command line, one ``--periodic-job`` per schedule: ``NAME=EXPRESSION``
and then ``;key=value`` pairs with the same keys. ``args`` and ``metadata``
take a JSON object (a ``;`` inside a JSON string is fine), ``tags`` a
comma-separated list::

    --periodic-job 'nightly_report=30 2 * * *;kind=nightly_report;timezone=Europe/London'
    --periodic-job 'export=0 */6 * * *;kind=export;args={"format": "csv"};tags=ops,export'
    --periodic-job 'heartbeat=*/10 * * * * *;kind=heartbeat;missed_fire_policy=catch_up'

A flag replaces a file entry of the same name; a name used twice in one
source is an error.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .schedules import PeriodicJob, PeriodicJobError, validate_periodic_jobs

#: The TOML array of tables holding the schedules.
TOML_KEY = "periodic_jobs"
FIELD_NAMES = tuple(field.name for field in dataclasses.fields(PeriodicJob))
REQUIRED_FIELDS = ("name", "cron_expr", "kind")
_JSON_FIELDS = ("args", "metadata")
_INTEGER_FIELDS = ("priority", "max_attempts")
FLAG_SYNTAX = "NAME=EXPRESSION;kind=KIND[;queue=Q][;timezone=TZ][;args={JSON}][;key=value...]"


def _build(values: Mapping[str, Any], where: str) -> PeriodicJob:
    unknown = [key for key in values if key not in FIELD_NAMES]
    if unknown:
        raise PeriodicJobError(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(FIELD_NAMES)})")
    missing = [key for key in REQUIRED_FIELDS if key not in values]
    if missing:
        raise PeriodicJobError(f"{where}: missing {', '.join(missing)}")
    return PeriodicJob(**values)


def periodic_jobs_from_document(
    document: Mapping[str, Any], *, source: str = "config file"
) -> tuple[PeriodicJob, ...]:
    """The ``[[periodic_jobs]]`` tables of a parsed TOML document."""
    tables = document.get(TOML_KEY, [])
    if not isinstance(tables, list):
        raise PeriodicJobError(f"{source}: {TOML_KEY} must be an array of tables ([[{TOML_KEY}]])")
    jobs = []
    for position, table in enumerate(tables, start=1):
        where = f"{source}: [[{TOML_KEY}]] #{position}"
        if not isinstance(table, Mapping):
            raise PeriodicJobError(f"{where} must be a table")
        if isinstance(table.get("name"), str):
            where += f" ({table['name']})"
        jobs.append(_build(table, where))
    return validate_periodic_jobs(jobs)


def _split_value(text: str, start: int, key: str, flag: str) -> tuple[Any, int]:
    """Read one value starting at ``start``; returns it and the index after
    its terminating ``;`` (or the end)."""
    if key in _JSON_FIELDS:
        position = start
        while position < len(text) and text[position].isspace():
            position += 1
        try:
            value, position = json.JSONDecoder().raw_decode(text, position)
        except json.JSONDecodeError as exc:
            raise PeriodicJobError(f"--periodic-job {flag!r}: {key} is not valid JSON: {exc}") from None
        rest_end = text.find(";", position)
        rest_end = len(text) if rest_end < 0 else rest_end
        if text[position:rest_end].strip():
            raise PeriodicJobError(
                f"--periodic-job {flag!r}: unexpected text after the {key} JSON: "
                f"{text[position:rest_end].strip()!r}"
            )
        return value, rest_end + 1
    end = text.find(";", start)
    end = len(text) if end < 0 else end
    raw = text[start:end].strip()
    if key == "tags":
        return [tag.strip() for tag in raw.split(",") if tag.strip()], end + 1
    if key in _INTEGER_FIELDS:
        try:
            return int(raw), end + 1
        except ValueError:
            raise PeriodicJobError(
                f"--periodic-job {flag!r}: {key} must be an integer, not {raw!r}"
            ) from None
    return raw, end + 1


def parse_periodic_job_flag(flag: str) -> PeriodicJob:
    """One ``--periodic-job`` value (see the module docstring for the syntax)."""
    name, equals, rest = flag.partition("=")
    if not equals or not name.strip():
        raise PeriodicJobError(f"--periodic-job {flag!r} must look like {FLAG_SYNTAX}")
    expression_end = rest.find(";")
    expression_end = len(rest) if expression_end < 0 else expression_end
    values: dict[str, Any] = {"name": name.strip(), "cron_expr": rest[:expression_end].strip()}
    position = expression_end + 1
    while position < len(rest):
        key_end = rest.find("=", position)
        separator = rest.find(";", position)
        if separator >= 0 and (key_end < 0 or separator < key_end):
            loose = rest[position:separator].strip()
            if loose:
                raise PeriodicJobError(f"--periodic-job {flag!r}: {loose!r} is not key=value")
            position = separator + 1  # an empty segment (";;" or a trailing ";")
            continue
        if key_end < 0:
            if rest[position:].strip():
                raise PeriodicJobError(
                    f"--periodic-job {flag!r}: {rest[position:].strip()!r} is not key=value"
                )
            break
        key = rest[position:key_end].strip()
        if key not in FIELD_NAMES or key in ("name", "cron_expr"):
            raise PeriodicJobError(
                f"--periodic-job {flag!r}: unknown key {key!r} (known: "
                f"{', '.join(k for k in FIELD_NAMES if k not in ('name', 'cron_expr'))})"
            )
        if key in values:
            raise PeriodicJobError(f"--periodic-job {flag!r}: {key} is given twice")
        values[key], position = _split_value(rest, key_end + 1, key, flag)
    return _build(values, f"--periodic-job {flag!r}")


def periodic_jobs_from_flags(flags: Iterable[str]) -> tuple[PeriodicJob, ...]:
    return validate_periodic_jobs(parse_periodic_job_flag(flag) for flag in flags)


def split_periodic_job_lines(text: str) -> list[str]:
    """Flag values from an environment variable: one per line; blank lines
    and lines starting with ``#`` are ignored."""
    lines = (line.strip() for line in text.splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def merge_periodic_jobs(
    from_file: Sequence[PeriodicJob], from_flags: Sequence[PeriodicJob]
) -> tuple[PeriodicJob, ...]:
    """File schedules, with flag schedules replacing same-named ones (flags
    win over the file, as for every other setting). A replaced schedule keeps
    its place; new flag schedules follow the file's."""
    by_name = {job.name: job for job in from_file}
    for job in from_flags:
        by_name[job.name] = job
    return tuple(by_name.values())
