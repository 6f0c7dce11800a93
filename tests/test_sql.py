"""The one templating step of awa_trio.sql: named parameters, identifier
slots and fragments, against the database where the outcome is SQL."""

from __future__ import annotations

import pytest

from awa_trio.sql import Fragment, Statement, parameters_of


def test_named_parameters_compile_to_positions_in_first_use_order() -> None:
    statement = Statement("SELECT :b::int + :a::int, :b::int, '{}'::jsonb, '{metadata}'::text[]")
    assert statement.text == "SELECT $1::int + $2::int, $1::int, '{}'::jsonb, '{metadata}'::text[]"
    assert statement.parameters == ("b", "a")
    assert statement.bind(a=1, b=2) == (statement.text, 2, 1)


def test_literals_comments_and_casts_are_not_parameters_or_slots() -> None:
    statement = Statement(
        "SELECT format('awa:%s:{x}', :job_id), \"col:umn\", arr[1:2], x::text -- :not_a_parameter {nor_a_slot}\n"
    )
    assert statement.parameters == ("job_id",)
    assert statement.slots == frozenset()
    assert "'awa:%s:{x}'" in statement.text and "-- :not_a_parameter {nor_a_slot}" in statement.text


def test_missing_or_unknown_parameters_are_refused() -> None:
    statement = Statement("SELECT :limit")
    with pytest.raises(ValueError, match=r"missing \['limit'\]"):
        statement.bind()
    with pytest.raises(ValueError, match=r"unknown \['limits'\]"):
        statement.bind(limit=1, limits=2)


def test_positional_parameters_are_refused() -> None:
    with pytest.raises(ValueError, match="not \\$n"):
        Statement("SELECT $1")


def test_schema_and_identifier_slots_are_filled_once_per_identifiers() -> None:
    statement = Statement("LOCK TABLE {children}; SELECT 1 FROM {schema}.leases WHERE job_id = :job_id")
    assert statement.slots == {"schema", "children"}
    text, job_id = statement.bind("awa_exp", children="a, b", job_id=7)
    assert text == "LOCK TABLE a, b; SELECT 1 FROM awa_exp.leases WHERE job_id = $1" and job_id == 7
    assert statement.render("awa_exp", children="a, b") is text
    with pytest.raises(ValueError, match="need identifiers"):
        statement.render("awa_exp")


def test_fragment_is_placed_with_its_columns_and_leaves_the_schema() -> None:
    gate = Fragment("NOT EXISTS (SELECT 1 FROM {schema}.done_entries AS done WHERE done.job_id = {job_id})")
    statement = Statement(
        "SELECT * FROM claims WHERE {gate} AND claims.slot = :slot", gate=gate(job_id="claims.job_id")
    )
    assert statement.render("s") == (
        "SELECT * FROM claims WHERE NOT EXISTS (SELECT 1 FROM s.done_entries AS done"
        " WHERE done.job_id = claims.job_id) AND claims.slot = $1"
    )
    with pytest.raises(ValueError, match="not given"):
        gate()
    with pytest.raises(ValueError, match="no slot"):
        gate(job_id="x", run_lease="y")
    with pytest.raises(ValueError, match="no slot"):
        Statement("SELECT 1", gate="x")


async def test_bound_statement_runs_on_postgres(db) -> None:
    statement = Statement("SELECT :b::int * 10 + :a::int AS value, '{\"k\": 1}'::jsonb ->> 'k' AS k")
    row = await db.fetchrow(*statement.bind(a=3, b=4))
    assert row["value"] == 43 and row["k"] == "1"


def _select_items(select_list: str) -> list[str]:
    """Items of a SELECT list, split at commas outside parentheses and quotes."""
    items, depth, quoted, start = [], 0, False, 0
    for index, char in enumerate(select_list):
        if char == "'":
            quoted = not quoted
        elif not quoted and char == "(":
            depth += 1
        elif not quoted and char == ")":
            depth -= 1
        elif not quoted and depth == 0 and char == ",":
            items.append(select_list[start:index])
            start = index + 1
    return [*items, select_list[start:]]


def _output_name(item: str) -> str:
    """The column an item names: its alias, or a bare column."""
    words = item.split()
    return words[-1] if len(words) >= 3 and words[-2] == "AS" else item.strip()


def _job_row_inserts() -> list[tuple[str, list[str]]]:
    import re

    from awa_trio.engines.canonical import (
        canonical_drain,
        promote,
        rescue_callbacks,
        rescue_deadlines,
        rescue_heartbeats,
    )
    from awa_trio.jobs import JOB_COLUMNS

    columns = ", ".join(JOB_COLUMNS)
    pattern = re.compile(
        r"INSERT INTO awa\.\w+ \(" + re.escape(columns) + r"\)\s+SELECT(.*?)\n\s*FROM ", re.S
    )
    found = []
    for module in (canonical_drain, promote, rescue_callbacks, rescue_deadlines, rescue_heartbeats):
        for name, value in vars(module).items():
            statements = value.values() if isinstance(value, dict) else [value]
            for statement in statements:
                if isinstance(statement, Statement):
                    for select_list in pattern.findall(statement.text):
                        found.append(
                            (
                                f"{module.__name__}.{name}",
                                [_output_name(i) for i in _select_items(select_list)],
                            )
                        )
    return found


def test_every_job_row_insert_names_its_values_in_column_order() -> None:
    """An INSERT ... SELECT of a whole job row gives each value the name of
    the column it fills, so a misplaced NULL is caught here."""
    from awa_trio.jobs import JOB_COLUMNS

    inserts = _job_row_inserts()
    assert len(inserts) >= 11  # promotion (batch, one, cancel) and the three rescues (batch, one)
    for name, outputs in inserts:
        assert outputs == list(JOB_COLUMNS), name


def test_a_fragment_leaves_the_identifiers_it_names_to_the_statement() -> None:
    pages = Fragment(
        "(SELECT sum(relpages) FROM pg_class WHERE relnamespace = {schema_literal}::regnamespace"
        " AND relname = {child_name})",
        identifiers=("schema_literal",),
    )
    placed = pages(child_name="'leases_' || :slot")
    statement = Statement("SELECT " + placed + " = 0")
    assert statement.slots == {"schema_literal"} and statement.placed == ()
    assert statement.bind(schema_literal="'awa'", slot="3") == (
        "SELECT (SELECT sum(relpages) FROM pg_class WHERE relnamespace = 'awa'::regnamespace"
        " AND relname = 'leases_' || $1) = 0",
        "3",
    )
    with pytest.raises(ValueError, match="not given"):
        pages()
    with pytest.raises(ValueError, match="no slot"):
        Fragment("SELECT 1", identifiers=("slot",))


def test_a_statement_records_the_slots_it_filled_at_construction() -> None:
    assert Statement("SELECT {x} FROM {schema}.t", x="1").placed == ("x",)
    assert Statement("SELECT 1 FROM {schema}.t").placed == ()


def test_parameters_of_reads_code_only() -> None:
    assert parameters_of("SELECT :b, ':c', x::int, :a, :b -- :d\n") == ("b", "a")


def test_a_statement_names_the_slots_it_filled_in_a_second_pass() -> None:
    take = Fragment("DELETE FROM {schema}.leases WHERE {predicate}")
    nested = Statement(take(predicate="heartbeat_at < {cutoff}"), cutoff="now() - :staleness::interval")
    assert nested.nested == ("cutoff",) and nested.placed == ("cutoff",)
    flat = Statement(take(predicate="heartbeat_at < now() - :staleness::interval"))
    assert flat.nested == () and flat.text == nested.text
    # An identifier a placed value carries is left for the bind: not nested.
    assert Statement(take(predicate="lease_slot = {slot}")).slots == {"schema", "slot"}


def test_a_fragment_filled_with_finished_text_is_an_exact_str_for_the_driver():
    """asyncpg refuses a str subclass as query text ("Expected str"):
    promotion's FILE is a fragment filled per batch and sent as it is."""
    from awa_trio.engines.queue_storage.promote import file_sql

    text = file_sql("awa", [{"job_ids": [1, 2], "first_seq": 7, "enqueue_shard": 0}])
    assert type(text) is str
    assert "ARRAY[1,2]" in text
