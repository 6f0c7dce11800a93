"""Named SQL statements with one templating step.

Each engine writes its statements as plain SQL strings (no f-strings, so a
JSON literal is written ``'{}'``), wrapped in :class:`Statement`:

* ``:name`` is a parameter. The text is compiled once, at import, to
  asyncpg's ``$1, $2, ...`` in order of first appearance, and
  :meth:`Statement.bind` orders the values by name, so no caller counts
  positions. ``::type`` casts, string literals, quoted identifiers and
  comments are left alone.
* ``{name}`` outside string literals is an identifier slot: the
  queue-storage schema (``{schema}``, a validated plain identifier from
  ``awa.storage_status()``) or, for the ring statements, the partitions of
  one slot. Slots are filled by :meth:`Statement.bind`, and the text for one
  set of identifiers is kept, so a term renders each statement once. This
  is the one templating step: the text that reaches PostgreSQL is the
  statement's text with its identifiers filled in
  (``python -m awa_trio sql --schema NAME`` prints every one).
* Text is composed at import, in one pass per template: a piece of SQL
  shared by several statements (a safety gate, a lock key) is a
  :class:`Fragment`, written once, whose call fills its slots with the
  columns of one use; ``Statement(text, **parts)`` fills the statement's
  own slots with its pieces. A value placed in a slot is final SQL: it may
  hold identifier slots, left for the bind, never a slot that a later pass
  fills. Such a nesting (a fragment's slot filled with text that has more
  slots, which the statement then fills) hides the text PostgreSQL gets;
  :attr:`Statement.nested` names the slots a statement filled that way, and
  a test keeps the list from growing.

``Statement.bind(schema, **values)`` returns the positional arguments of
:meth:`awa_trio.db.Connection.fetch` and friends::

    rows = await conn.fetch(*TAKE_STALE.bind(schema, limit=100, job_ids=None))
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import Any

# Parts of SQL text that are not code: string literals (E'' included, with
# '' escapes), quoted identifiers and line comments.
_NOT_CODE = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|--[^\n]*")
_SLOT = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
# ':name' but not the second colon of '::type', nor 'a[1:n]'.
_PARAMETER = re.compile(r"(?<![:\w]):([A-Za-z_][A-Za-z0-9_]*)")
_POSITIONAL = re.compile(r"\$[0-9]")


def _code_parts(text: str) -> Iterator[tuple[bool, str]]:
    """(is_code, part) pieces of ``text``, in order."""
    position = 0
    for literal in _NOT_CODE.finditer(text):
        yield True, text[position : literal.start()]
        yield False, literal.group()
        position = literal.end()
    yield True, text[position:]


def _fill_slots(text: str, values: dict[str, str]) -> str:
    """``text`` with the ``{slot}`` names of ``values`` replaced (outside
    string literals and comments); other slots stay."""

    def fill(match: re.Match[str]) -> str:
        return values.get(match.group(1), match.group())

    return "".join(_SLOT.sub(fill, part) if code else part for code, part in _code_parts(text))


def slots_of(text: str) -> frozenset[str]:
    """The ``{slot}`` names in the code of ``text``."""
    return frozenset(name for code, part in _code_parts(text) if code for name in _SLOT.findall(part))


def parameters_of(text: str) -> tuple[str, ...]:
    """The ``:name`` parameters in the code of ``text``, in order of first use."""
    names: list[str] = []
    for code, part in _code_parts(text):
        if code:
            names.extend(name for name in _PARAMETER.findall(part) if name not in names)
    return tuple(names)


class Fragment:
    """A piece of SQL shared by several statements, with ``{column}`` slots
    that each use fills with its own expressions. The slots named in
    ``identifiers`` (``{schema}`` always) are left for the statement's bind:
    a call may fill them, but need not."""

    def __init__(self, text: str, *, identifiers: Iterable[str] = ()) -> None:
        self.text = text
        self.slots = slots_of(text)
        #: Slots a call leaves to the statement.
        self.identifiers = frozenset({"schema", *identifiers})
        unknown = self.identifiers - self.slots - {"schema"}
        if unknown:
            raise ValueError(f"fragment has no slot {sorted(unknown)}")

    def __call__(self, **columns: str) -> str:
        unknown = set(columns) - self.slots
        if unknown:
            raise ValueError(f"fragment has no slot {sorted(unknown)}")
        missing = self.slots - set(columns) - self.identifiers
        if missing:
            raise ValueError(f"fragment slots not given: {sorted(missing)}")
        # (Promotion's FILE is placed per batch, with long array literals:
        # only a value with a brace is read.)
        carried = frozenset(slot for value in columns.values() if "{" in value for slot in slots_of(value))
        text = _fill_slots(self.text, columns)
        # A plain str unless it carries slots: text filled per call goes to
        # the driver as it is, and asyncpg takes only an exact str.
        return PlacedText(text, carried) if carried else text


class PlacedText(str):
    """A fragment's text for one use, remembering the slots its values
    brought in (:attr:`Statement.nested` is a later pass filling them)."""

    carried: frozenset[str]

    def __new__(cls, text: str, carried: frozenset[str]) -> PlacedText:
        placed = super().__new__(cls, text)
        placed.carried = carried
        return placed


class Statement:
    """One SQL statement: ``:name`` parameters, ``{identifier}`` slots."""

    def __init__(self, text: str, **parts: str) -> None:
        #: The slots this statement filled with its pieces at construction.
        self.placed: tuple[str, ...] = tuple(sorted(parts))
        #: Those of them that a value placed in a fragment brought in: the
        #: text was composed in two passes, the second filling the first's.
        self.nested: tuple[str, ...] = tuple(sorted(set(parts) & getattr(text, "carried", frozenset())))
        if parts:
            absent = set(parts) - slots_of(text)
            if absent:
                raise ValueError(f"statement has no slot {sorted(absent)}")
            text = _fill_slots(text, parts)
        names: list[str] = []
        compiled: list[str] = []
        for code, part in _code_parts(text):
            if code:
                if _POSITIONAL.search(part):
                    raise ValueError("write parameters as :name, not $n")
                part = _PARAMETER.sub(lambda match: self._number(names, match.group(1)), part)
            compiled.append(part)
        self.text = "".join(compiled)
        #: Parameter names in ``$n`` order.
        self.parameters: tuple[str, ...] = tuple(names)
        #: Identifier slots filled at bind time.
        self.slots = slots_of(self.text)
        if self.slots & set(self.parameters):
            raise ValueError(
                f"a name is both a slot and a parameter: {sorted(self.slots & set(self.parameters))}"
            )
        self._rendered: dict[tuple[str, ...], str] = {}

    @staticmethod
    def _number(names: list[str], name: str) -> str:
        if name not in names:
            names.append(name)
        return f"${names.index(name) + 1}"

    def render(self, schema: str | None = None, **identifiers: str) -> str:
        """The text with its identifier slots filled (kept per identifiers)."""
        if schema is not None:
            identifiers["schema"] = schema
        if set(identifiers) != self.slots:
            raise ValueError(
                f"statement slots {sorted(self.slots)} need identifiers, got {sorted(identifiers)}"
            )
        key = tuple(identifiers[slot] for slot in sorted(self.slots))
        text = self._rendered.get(key)
        if text is None:
            text = _fill_slots(self.text, identifiers) if identifiers else self.text
            if len(self._rendered) < 1024:
                self._rendered[key] = text
        return text

    def arguments(self, values: dict[str, Any]) -> list[Any]:
        """``values`` in ``$n`` order."""
        if set(values) != set(self.parameters):
            missing = sorted(set(self.parameters) - set(values))
            extra = sorted(set(values) - set(self.parameters))
            raise ValueError(f"statement parameters: missing {missing}, unknown {extra}")
        return [values[name] for name in self.parameters]

    def bind(self, schema: str | None = None, **values: Any) -> tuple[Any, ...]:
        """``(text, *arguments)`` for ``Connection.fetch`` and friends; keys of
        ``values`` that name a slot are identifiers, the rest parameters."""
        identifiers = {name: values.pop(name) for name in list(values) if name in self.slots}
        return (self.render(schema, **identifiers), *self.arguments(values))

    def __repr__(self) -> str:
        return f"Statement(parameters={self.parameters}, slots={sorted(self.slots)})"
