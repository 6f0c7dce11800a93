"""Every SQL statement of awa_trio, rendered as PostgreSQL receives it.

``python -m awa_trio sql --schema NAME`` prints it; tests/sql/rendered_awa.sql
is its output for ``awa``, so a change to any statement shows in review as
a diff of that file.

The statements are found, not listed: every module of the package is
imported (both engines) and every :class:`~awa_trio.sql.Statement` reachable
from a module's globals (directly, or inside a dict, tuple, dataclass
instance or class) is named by the shortest path to it from the module that
defines it, e.g. ``awa_trio.cron.store.ATOMIC_ENQUEUE_SQL`` or
``awa_trio.engines.canonical.promote.DUE_IDS_SQL['scheduled']``.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import pkgutil
import textwrap
from collections.abc import Iterator
from types import ModuleType
from typing import Any

from .errors import ConfigError
from .schema import PLAIN_IDENTIFIER
from .sql import Statement

#: Modules that run something when imported.
NOT_IMPORTED = ("awa_trio.__main__",)
#: The ring slot shown for statements whose slots name one slot's partitions.
EXAMPLE_SLOT = 0
#: How deep the search goes inside containers (module.DICT[key].field is 2).
_MAX_DEPTH = 4


def check_schema_name(name: str) -> str:
    """``name`` if it is a schema name awa_trio can address (the rule
    :mod:`awa_trio.schema` applies to ``awa.storage_status()``)."""
    if not PLAIN_IDENTIFIER.match(name):
        raise ConfigError(
            f"--schema {name!r} must be a plain identifier: lower-case letters, digits and _, "
            "not starting with a digit, at most 63 characters"
        )
    return name


def package_modules() -> list[ModuleType]:
    """Every awa_trio module, imported, by name."""
    import awa_trio

    names = [info.name for info in pkgutil.walk_packages(awa_trio.__path__, "awa_trio.")]
    return [
        importlib.import_module(name) for name in sorted({"awa_trio", *names}) if name not in NOT_IMPORTED
    ]


def _imported_names(module: ModuleType) -> set[str]:
    """Globals of ``module`` bound by an import statement (their objects live elsewhere)."""
    try:
        tree = ast.parse(inspect.getsource(module))
    except (OSError, TypeError):
        return set()
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            names.update((alias.asname or alias.name).partition(".")[0] for alias in node.names)
    return names


def _reachable(value: Any, path: str, depth: int, seen: set[int]) -> Iterator[tuple[str, Statement]]:
    if isinstance(value, Statement):
        yield path, value
        return
    if depth >= _MAX_DEPTH or id(value) in seen:
        return
    seen = seen | {id(value)}
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _reachable(item, f"{path}[{key!r}]", depth + 1, seen)
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            yield from _reachable(item, f"{path}[{index}]", depth + 1, seen)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for field in dataclasses.fields(value):
            yield from _reachable(getattr(value, field.name), f"{path}.{field.name}", depth + 1, seen)
    elif isinstance(value, type) and value.__module__.startswith("awa_trio"):
        for name, item in vars(value).items():
            yield from _reachable(item, f"{path}.{name}", depth + 1, seen)


@dataclasses.dataclass(frozen=True)
class Entry:
    """One statement of the catalog."""

    #: Qualified name: module, global, then any key or field.
    name: str
    #: The module it is named in.
    module: str
    statement: Statement


def statements() -> list[Entry]:
    """Every Statement of the package, in name order.

    A statement reachable under several names (an import, a dataclass field
    holding a module constant) is listed once, under the shortest name in a
    module that does not import it."""
    names: dict[int, list[tuple[bool, int, str, str]]] = {}
    found: dict[int, Statement] = {}
    for module in package_modules():
        imported = _imported_names(module)
        for name, value in vars(module).items():
            if name.startswith("__"):
                continue
            for path, statement in _reachable(value, f"{module.__name__}.{name}", 0, set()):
                found[id(statement)] = statement
                rank = (name in imported, path.count(".") + path.count("["), path, module.__name__)
                names.setdefault(id(statement), []).append(rank)
    entries = []
    for key, candidates in names.items():
        _, _, name, module_name = min(candidates)
        entries.append(Entry(name=name, module=module_name, statement=found[key]))
    return sorted(entries, key=lambda entry: entry.name)


def example_identifiers(schema: str) -> dict[str, dict[str, str]]:
    """The identifiers shown for statements whose slots name partitions of a
    ring slot, by module (``""``: any module): each engine's own, for
    :data:`EXAMPLE_SLOT` (``Engine.sql_examples``)."""
    from .engines import known_engines

    examples: dict[str, dict[str, str]] = {"": {}}
    for engine in known_engines():
        if engine.sql_examples is None:
            continue
        for module, identifiers in engine.sql_examples(schema, EXAMPLE_SLOT).items():
            examples.setdefault(module, {}).update(identifiers)
    return examples


def _layout(text: str) -> str:
    """``text`` without its surrounding blank lines and common indentation
    (the first line is often the opening quote's, unindented)."""
    lines = [line.rstrip() for line in text.strip("\n").splitlines()]
    if lines and not lines[0][:1].isspace():
        return "\n".join([lines[0], *textwrap.dedent("\n".join(lines[1:])).splitlines()]).rstrip()
    return textwrap.dedent("\n".join(lines)).strip("\n")


def render_entry(entry: Entry, schema: str, examples: dict[str, dict[str, str]]) -> str:
    """One statement with its header: name, identifiers other than the
    schema, parameters in ``$n`` order."""
    statement = entry.statement
    own = examples.get(entry.module, {})
    identifiers = {slot: own.get(slot) or examples[""][slot] for slot in sorted(statement.slots - {"schema"})}
    header = [f"-- {entry.name}"]
    if identifiers:
        header.append(
            "-- identifiers: " + ", ".join(f"{slot}={value}" for slot, value in identifiers.items())
        )
    if statement.parameters:
        numbered = (f"${number} :{parameter}" for number, parameter in enumerate(statement.parameters, 1))
        header.append("-- parameters: " + ", ".join(numbered))
    text = statement.render(schema if "schema" in statement.slots else None, **identifiers)
    return "\n".join(header) + "\n" + _layout(text) + ";\n"


def render_catalog(schema: str) -> str:
    """Every statement rendered for ``schema``, as ``python -m awa_trio sql`` prints it."""
    check_schema_name(schema)
    examples = example_identifiers(schema)
    found = statements()
    head = (
        f"-- Every SQL statement of awa_trio ({len(found)} awa_trio.sql.Statement objects), rendered for the\n"
        f"-- queue-storage schema {schema}: `python -m awa_trio sql --schema {schema}`.\n"
        "-- Parameters are shown as PostgreSQL receives them ($1, $2, ...), each header naming\n"
        "-- them in that order. Statements whose slots name the partitions of one ring slot are\n"
        f"-- shown for slot {EXAMPLE_SLOT} (of the lease ring where a statement serves both lease and\n"
        "-- claim rings); their header lists those identifiers. Indentation is trimmed and the\n"
        "-- closing ';' is added here; the text is otherwise what the code sends.\n"
    )
    return head + "".join("\n" + render_entry(entry, schema, examples) for entry in found)
