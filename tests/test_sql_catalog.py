"""The rendered SQL is a reviewed file: tests/sql/rendered_awa.sql is what
``python -m awa_trio sql --schema awa`` prints, every statement as
PostgreSQL receives it, so a change to any statement shows as a diff of it."""

from __future__ import annotations

import difflib
import re
import subprocess
import sys
from pathlib import Path

import pytest

from awa_trio.sql import parameters_of, slots_of
from awa_trio.sql_catalog import render_catalog, statements

RENDERED = Path(__file__).resolve().parent / "sql" / "rendered_awa.sql"
REGENERATE = "python -m awa_trio sql --schema awa > tests/sql/rendered_awa.sql"
#: Statements composed in two passes, the second filling slots that a value
#: placed in a fragment brought in (:attr:`awa_trio.sql.Statement.nested`).
#: Remove each as it is flattened; add none.
NESTED: dict[str, tuple[str, ...]] = {}


def _run_sql_command(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "awa_trio", "sql", *args], capture_output=True, text=True, timeout=60, check=False
    )


def test_the_checked_in_rendering_is_the_codes() -> None:
    expected = render_catalog("awa")
    actual = RENDERED.read_text() if RENDERED.exists() else ""
    if actual != expected:
        diff = "".join(
            list(difflib.unified_diff(actual.splitlines(True), expected.splitlines(True), str(RENDERED), "code"))[:80]
        )
        pytest.fail(f"the SQL of the code differs from {RENDERED.name}; if the change is meant, run\n"
                    f"    {REGENERATE}\nand review the diff:\n{diff}")


def test_the_rendering_leaves_no_slot_and_no_named_parameter() -> None:
    text = render_catalog("awa")
    assert slots_of(text) == frozenset()
    assert parameters_of(text) == ()
    # Each statement's parameters are numbered from $1 without a gap.
    for entry in statements():
        numbers = {int(n) for n in re.findall(r"\$(\d+)", entry.statement.text)}
        assert numbers == set(range(1, len(entry.statement.parameters) + 1)), entry.name


def test_every_statement_of_the_package_is_in_the_catalog() -> None:
    """The catalog finds statements by walking module globals; one held
    anywhere else (a closure, a list built at import) would be missed. In a
    fresh interpreter, so that only the package's statements are alive."""
    script = (
        "import gc\n"
        "from awa_trio.sql import Statement\n"
        "from awa_trio.sql_catalog import statements\n"
        "named = {id(entry.statement) for entry in statements()}\n"
        "alive = [obj for obj in gc.get_objects() if isinstance(obj, Statement)]\n"
        "print(len(named), [obj for obj in alive if id(obj) not in named])\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    count, missed = result.stdout.split(" ", 1)
    # Well over a hundred: the walk found the package, not a stray module.
    assert int(count) >= 120 and missed.strip() == "[]", result.stdout


def test_each_statement_is_named_where_it_is_defined() -> None:
    names = [entry.name for entry in statements()]
    assert names == sorted(names) and len(names) == len(set(names))
    by_name = {entry.name: entry for entry in statements()}
    # A module constant that a dataclass also holds keeps its own name.
    assert "awa_trio.engines.queue_storage.rotate_lease.LEASE_LIVE_SQL" in by_name
    assert not any(name.endswith("LEASE_RING_TABLES.live_sql") for name in by_name)
    # An imported statement is named in the module it comes from only.
    assert "awa_trio.maintenance.rescue.CANCEL_NOTICES_SQL" in by_name
    assert not any(name.endswith(".CANCEL_NOTICES_SQL") and "maintenance" not in name for name in by_name)
    assert "awa_trio.engines.canonical.promote.DUE_IDS_SQL['scheduled']" in by_name


def test_no_statement_is_composed_in_nested_passes_but_those_listed() -> None:
    nested = {entry.name: entry.statement.nested for entry in statements() if entry.statement.nested}
    assert nested == NESTED, (
        "a statement fills a slot that a value placed in a fragment brought in: write that value "
        "out where the fragment is called (or, if a listed one was flattened, remove it from NESTED)"
    )


def test_the_sql_command_prints_the_rendering_for_the_schema_given() -> None:
    result = _run_sql_command("--schema", "awa")
    assert result.returncode == 0, result.stderr
    assert result.stdout == render_catalog("awa") and result.stderr == ""
    other = _run_sql_command("--schema", "queues_2")
    assert other.returncode == 0, other.stderr
    assert "FROM queues_2.leases" in other.stdout and "awa.leases" not in other.stdout
    assert "relnamespace = 'queues_2'::regnamespace" in other.stdout


@pytest.mark.parametrize("name", ["Awa", "awa-exp", "1awa", "awa;drop", "a" * 64, ""])
def test_a_schema_that_is_not_a_plain_identifier_is_one_line_and_exit_2(name: str) -> None:
    result = _run_sql_command("--schema", name)
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in lines[0], result.stderr
    assert lines[0].startswith(f"awa_trio: invalid configuration: --schema {name!r} must be a plain identifier")


def test_the_sql_command_has_its_own_help() -> None:
    result = _run_sql_command("--help")
    assert result.returncode == 0
    assert result.stdout.startswith("usage: python -m awa_trio sql ")
    assert "--schema NAME" in result.stdout and "--database-url" not in result.stdout
