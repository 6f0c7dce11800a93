"""Schedules the application declares in code, read the way awa-pg reads them.

In Awa 0.6 an application declares its periodic jobs on its awa-pg client::

    def declare(client):
        client.periodic("nightly_report", "30 2 * * *", NightlyReport,
                        NightlyReport(format="pdf"), timezone="Europe/London")

and only the runtime holding the maintenance lock writes them into
``awa.cron_jobs``. While awa_trio leads, no runtime does, so awa_trio calls
the same function (``--periodic-from app.schedules:declare``) with a
:class:`PeriodicRecorder`: a stand-in client whose ``periodic`` has
awa-pg 0.6.1's signature and turns each call into a :class:`PeriodicJob`
holding exactly the values awa-pg's leader would write: the kind derived
from ``args_type.__name__`` (:func:`derive_kind`), the args serialised as
awa-pg serialises them (:func:`args_to_json`), ``tags=None`` as ``[]`` and
``metadata=None`` as ``{}``.

Where awa-pg accepts a declaration that could never fire (metadata that is
not a JSON object, a cron expression awa_trio's parser refuses), this is an
error at startup that names the schedule.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import math
import operator
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from .schedules import PeriodicJob, PeriodicJobError

#: A ``"package.module:function"`` string, or the function itself.
DeclarationSource = str | Callable[[Any], object]
#: awa-pg's limit on nested lists and dicts in args and metadata.
MAX_JSON_DEPTH = 64
_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1
SOURCE_SYNTAX = "package.module:function"


def derive_kind(class_name: str) -> str:
    """awa-pg's kind for an args class: CamelCase to snake_case
    (``SendEmail`` -> ``send_email``, ``SMTPEmail`` -> ``smtp_email``,
    ``ProcessV2Import`` -> ``process_v2_import``); anything else is kept."""
    out: list[str] = []
    for i, char in enumerate(class_name):
        if not char.isupper():
            out.append(char)
            continue
        before = class_name[i - 1] if i else ""
        after = class_name[i + 1] if i + 1 < len(class_name) else ""
        if i and (
            before.islower()
            or before in "0123456789"
            or (before.isupper() and after != "" and after.islower())
        ):
            out.append("_")
        out.append(char.lower()[0])
    return "".join(out)


def args_to_json(args: object) -> Any:
    """Job args as awa-pg serialises them: anything with ``model_dump``
    (pydantic) through ``model_dump(mode="json")``, a dataclass through
    ``dataclasses.asdict``, or a dict; then :func:`value_to_json`."""
    try:
        dump = args.model_dump  # type: ignore[attr-defined]
    except Exception:
        dump = None
    if dump is not None:
        return value_to_json(dump(mode="json"))
    if hasattr(args, "__dataclass_fields__"):
        return value_to_json(dataclasses.asdict(args))  # type: ignore[call-overload]
    if isinstance(args, dict):
        return value_to_json(args)
    raise PeriodicJobError("Job args must be a dataclass, pydantic BaseModel, or dict")


def value_to_json(value: object, depth: int = 0) -> Any:
    """One Python value as awa-pg converts it to JSON: bool, then anything
    with ``__index__`` that fits in 64 bits, then anything with ``__float__``
    (``Decimal`` becomes a float; NaN and infinities become null), str,
    list, dict with str keys, and otherwise the object's ``__dict__``. A
    tuple or a datetime is refused, as awa-pg refuses it."""
    if depth > MAX_JSON_DEPTH:
        raise PeriodicJobError(f"JSON nesting too deep (max {MAX_JSON_DEPTH} levels)")
    if value is None or isinstance(value, bool):
        return value
    whole = _as_index(value)
    if whole is not None and _I64_MIN <= whole <= _I64_MAX:
        return whole
    number = _as_float(value)
    if number is not None:
        return number if math.isfinite(number) else None
    if isinstance(value, str) and _is_utf8(value):
        return str(value)
    if isinstance(value, list):
        return [value_to_json(item, depth + 1) for item in value]
    if isinstance(value, dict):
        result = {}
        for key, item in value.items():
            if not isinstance(key, str) or not _is_utf8(key):
                raise PeriodicJobError(f"a JSON object key must be a string, got {key!r}")
            result[str(key)] = value_to_json(item, depth + 1)
        return result
    try:
        attributes = value.__dict__
    except AttributeError:
        raise PeriodicJobError(f"Cannot convert {type(value).__qualname__} to JSON") from None
    return value_to_json(attributes, depth + 1)


def _as_index(value: object) -> int | None:
    if isinstance(value, (str, bytes, bytearray)) or not hasattr(type(value), "__index__"):
        return None
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except Exception:
        return None


def _as_float(value: object) -> float | None:
    if isinstance(value, (str, bytes, bytearray)):
        return None
    kind = type(value)
    if not (isinstance(value, float) or hasattr(kind, "__float__") or hasattr(kind, "__index__")):
        return None
    try:
        return float(value)  # type: ignore[arg-type]
    except Exception:
        return None


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class PeriodicRecorder:
    """What awa_trio passes to the application's declaration function in
    place of its awa-pg client: ``periodic`` only."""

    def __init__(self) -> None:
        self.jobs: list[PeriodicJob] = []

    def periodic(
        self,
        name: str,
        cron_expr: str,
        args_type: type[Any],
        args: Any,
        *,
        timezone: str = "UTC",
        queue: str = "default",
        priority: int = 2,
        max_attempts: int = 25,
        tags: Sequence[str] | None = None,
        metadata: dict[str, Any] | None = None,
        missed_fire_policy: str = "coalesce",
    ) -> None:
        """awa-pg 0.6.1's ``AsyncClient.periodic``: record one schedule."""
        class_name = getattr(args_type, "__name__", None)
        if not isinstance(class_name, str):
            raise PeriodicJobError(f"periodic job {name!r}: args_type must be a class, got {args_type!r}")
        if isinstance(tags, str):
            raise PeriodicJobError(f"periodic job {name!r}: tags must be a list of strings, got {tags!r}")
        try:
            args_json = args_to_json(args)
            metadata_json = {} if metadata is None else value_to_json(metadata)
        except PeriodicJobError as exc:
            raise PeriodicJobError(f"periodic job {name!r}: {exc}") from None
        self.jobs.append(
            PeriodicJob(
                name,
                cron_expr,
                kind=derive_kind(class_name),
                timezone=timezone,
                queue=queue,
                args=args_json,
                priority=priority,
                max_attempts=max_attempts,
                tags=[] if tags is None else list(tags),
                metadata=metadata_json,
                missed_fire_policy=missed_fire_policy,
            )
        )

    def __getattr__(self, attribute: str) -> Any:
        raise AttributeError(
            f"awa_trio's recorder has only periodic(), not {attribute}(); keep the other "
            "client calls (task, start, ...) outside the declaration function"
        )


def source_label(source: DeclarationSource) -> str:
    """How errors and logs name a declaration source."""
    if isinstance(source, str):
        return source
    module = getattr(source, "__module__", None) or "?"
    return f"{module}:{getattr(source, '__qualname__', repr(source))}"


def import_declaration(target: str, *, search_working_directory: bool = True) -> Callable[[Any], object]:
    """The function ``package.module:function`` names, imported from the
    working directory (first, as ``python -m`` does) and ``PYTHONPATH``."""
    module_name, colon, attribute = (part.strip() for part in target.partition(":"))
    if not colon or not module_name or not attribute:
        raise PeriodicJobError(f"periodic_from {target!r} must look like {SOURCE_SYNTAX}")
    if search_working_directory and not ({"", os.getcwd()} & set(sys.path)):
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise PeriodicJobError(
                f"periodic_from {target!r}: no module named {exc.name!r} "
                "(searched the working directory and PYTHONPATH)"
            ) from None
        raise PeriodicJobError(f"periodic_from {target!r}: importing {module_name} failed: {exc}") from None
    except Exception as exc:
        raise PeriodicJobError(
            f"periodic_from {target!r}: importing {module_name} failed: {type(exc).__name__}: {exc}"
        ) from None
    found: Any = module
    for part in attribute.split("."):
        try:
            found = getattr(found, part)
        except AttributeError:
            raise PeriodicJobError(f"periodic_from {target!r}: {module_name} has no {attribute!r}") from None
    if not callable(found):
        raise PeriodicJobError(f"periodic_from {target!r}: {attribute} is not a function")
    return found  # type: ignore[no-any-return]


def declared_periodic_jobs(
    sources: Sequence[DeclarationSource], *, search_working_directory: bool = True
) -> tuple[PeriodicJob, ...]:
    """Call each declaration function on a recorder; its schedules, in
    declaration order. A name declared twice is an error (awa-pg would let
    the last one win)."""
    jobs: list[PeriodicJob] = []
    declared_by: dict[str, str] = {}
    for source in sources:
        label = source_label(source)
        function = (
            import_declaration(source, search_working_directory=search_working_directory)
            if isinstance(source, str)
            else source
        )
        if not callable(function):
            raise PeriodicJobError(f"periodic_from {source!r} must be {SOURCE_SYNTAX!r} or a function")
        recorder = PeriodicRecorder()
        try:
            returned = function(recorder)
        except PeriodicJobError as exc:
            raise PeriodicJobError(f"periodic_from {label}: {_one_line(exc)}") from None
        except Exception as exc:
            raise PeriodicJobError(
                f"periodic_from {label}: the declaration raised {type(exc).__name__}: {_one_line(exc)}"
            ) from None
        if inspect.isawaitable(returned):
            if inspect.iscoroutine(returned):
                returned.close()
            raise PeriodicJobError(
                f"periodic_from {label}: must be a plain function (awa-pg's periodic() is not async)"
            )
        for job in recorder.jobs:
            if job.name in declared_by:
                raise PeriodicJobError(
                    f"periodic job {job.name!r} is declared twice (by {declared_by[job.name]} and {label})"
                )
            declared_by[job.name] = label
            jobs.append(job)
    return tuple(jobs)


def merge_declared_periodic_jobs(
    configured: Sequence[PeriodicJob], declared: Sequence[PeriodicJob]
) -> tuple[PeriodicJob, ...]:
    """The configured schedules ([periodic_jobs], --periodic-job) followed by
    the declared ones; a name in both is an error, since neither source can
    tell which one is meant."""
    configured_names = {job.name for job in configured}
    for job in declared:
        if job.name in configured_names:
            raise PeriodicJobError(
                f"periodic job {job.name!r} is both declared in code (periodic_from) and configured "
                "([periodic_jobs] or --periodic-job); keep one"
            )
    return tuple(configured) + tuple(declared)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__
