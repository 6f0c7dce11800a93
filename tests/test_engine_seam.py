"""The engine seam: each storage engine is one Engine object, and outside
``awa_trio/engines/`` code asks that object instead of comparing engine names.

What counts as an engine-name comparison (the scan below, over every module
of ``awa_trio`` outside ``awa_trio/engines/``; ``awa_trio/engines/__init__.py``
is the one place that maps a storage state to an engine, so the whole
package is allowed):

* a comparison (``==``, ``!=``, ``in``, ``not in``, ``is``, ``is not``, in an
  ``if``, a conditional expression, anywhere) with an operand that is, or is
  a tuple/list/set literal holding, a string literal naming a known engine
  (``"canonical"``, ``"queue_storage"``: taken from
  ``awa_trio.engines.SUPPORTED_ENGINES``, so a third engine's name is covered
  too), or a name or attribute spelled like one of the engine-name constants
  of :mod:`awa_trio.engines` (``CANONICAL``, ``QUEUE_STORAGE``,
  ``INITIAL_ENGINE``, ``DEFAULT_ENGINE``);
* a ``match`` case on such a literal or constant.

Not counted: the ``STATE_*`` transition-state constants (the state
``canonical`` shares its spelling with the engine: compare states through
those constants, never a bare literal), and membership in the whole list of
engines (``SUPPORTED_ENGINES``: "is it known" names no engine).

Three more scans name an engine however it is used, outside
``awa_trio/engines/``:

* a string literal in code (docstrings and comments are prose, and SQL
  text is one literal, not equal to a name) equal to an engine name or a
  value of Awa's runtime vocabulary (the ``storage_capability`` values and
  the transition target's ``transition_role``, kept in
  :mod:`awa_trio.engines.states`): ``"canonical"``, ``"queue_storage"``,
  ``"canonical_drain_only"``, ``"queue_storage_target"``. SQL that compares
  with one takes it from ``states.STORAGE_REPORT_LITERALS``;
* an import of one engine's package or modules (``awa_trio.engines.canonical``,
  ``awa_trio.engines.queue_storage``, any engine package): ask
  :mod:`awa_trio.engines` for the engine object instead. ``sql_catalog``
  imports every module by walking the package, with no import statement;
* an identifier spelled after an engine: the constants ``CANONICAL`` and
  ``QUEUE_STORAGE``, the ``SchemaInfo`` properties ``runs_queue_storage``
  and ``in_mixed_transition``, an attribute or field named ``canonical`` or
  ``queue_storage``. Allowed, in :data:`COMPATIBILITY_NAMES`, are only the
  re-exports that keep these names importable for tests and embedding code
  (``awa_trio.schema.CANONICAL``, ``awa_trio.jobs.QUEUE_STORAGE``,
  ``SchemaInfo.runs_queue_storage`` ...): a re-export defines the name once
  and no module of the package uses it.
"""

from __future__ import annotations

import ast
import dataclasses
import pathlib
import subprocess
import sys
import types

import pytest

import awa_trio
from awa_trio import engines
from awa_trio.config import MaintenanceConfig
from awa_trio.engines import base, states
from awa_trio.engines.base import ENGINE_PIECES, Engine, IncompleteEngine, check_engine
from awa_trio.engines.canonical.registry import canonical_branches
from awa_trio.engines.queue_storage.registry import queue_storage_branches
from awa_trio.registry import default_branches, every_branch_name
from awa_trio.schema import SchemaInfo
from awa_trio.sql import Statement

PACKAGE = pathlib.Path(awa_trio.__file__).parent
ROOT = PACKAGE.parent
ENGINE_NAMES = frozenset(engines.SUPPORTED_ENGINES)
ENGINE_NAME_CONSTANTS = frozenset(
    name
    for module in (engines, states)
    for name, value in vars(module).items()
    if name.isupper() and not name.startswith("STATE_") and isinstance(value, str) and value in ENGINE_NAMES
)
#: Engine names and Awa's runtime vocabulary: no string literal outside the engines equals one.
ENGINE_VOCABULARY = ENGINE_NAMES | frozenset(states.STORAGE_CAPABILITIES) | {states.TARGET_ROLE}
#: The engine packages (each directory of awa_trio/engines holding a package).
ENGINE_PACKAGES = frozenset(
    f"awa_trio.engines.{path.parent.name}" for path in (PACKAGE / "engines").glob("*/__init__.py")
)
#: Identifiers spelled after an engine.
ENGINE_SPELLED = (
    frozenset({"CANONICAL", "QUEUE_STORAGE", "runs_queue_storage", "in_mixed_transition"}) | ENGINE_NAMES
)
#: (file, identifier): the re-exports kept for callers outside the package,
#: and why; there the name may only be defined (imported, assigned, a
#: ``def``), not used.
COMPATIBILITY_NAMES = {
    # Engine names, importable where tests and applications found them.
    ("awa_trio/schema.py", "CANONICAL"),
    ("awa_trio/schema.py", "QUEUE_STORAGE"),
    ("awa_trio/jobs.py", "CANONICAL"),
    ("awa_trio/jobs.py", "QUEUE_STORAGE"),
    # SchemaInfo's properties, defined by asking engines/states.py.
    ("awa_trio/schema.py", "runs_queue_storage"),
    ("awa_trio/schema.py", "in_mixed_transition"),
}
COMPARISONS = (ast.Eq, ast.NotEq, ast.In, ast.NotIn, ast.Is, ast.IsNot)


def _names_an_engine(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return node.value in ENGINE_NAMES
    if isinstance(node, ast.Name):
        return node.id in ENGINE_NAME_CONSTANTS
    if isinstance(node, ast.Attribute):
        return node.attr in ENGINE_NAME_CONSTANTS
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_names_an_engine(element) for element in node.elts)
    return False


def engine_name_comparisons(source: str, filename: str = "<snippet>") -> list[str]:
    """``file:line: code`` of each engine-name comparison in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Compare) and any(isinstance(op, COMPARISONS) for op in node.ops):
            operands = [node.left, *node.comparators]
        elif isinstance(node, ast.MatchValue):
            operands = [node.value]
        else:
            continue
        if any(_names_an_engine(operand) for operand in operands):
            found.append(f"{filename}:{node.lineno}: {ast.unparse(node)}")
    return found


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the string statements (docstrings, attribute docs) in ``tree``."""
    return {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
    }


def engine_name_literals(source: str, filename: str = "<snippet>") -> list[str]:
    """``file:line: literal`` of each string literal in code that equals an
    engine name or runtime-vocabulary value."""
    tree = ast.parse(source, filename)
    prose = _docstrings(tree)
    return [
        f"{filename}:{node.lineno}: {node.value!r}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and node.value in ENGINE_VOCABULARY and id(node) not in prose
    ]


def _imported_modules(node: ast.AST, package: str) -> list[str]:
    """The modules an import statement names (relative ones resolved
    against ``package``), each ``from`` name taken as a possible module."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    if node.level:
        parts = package.split(".")
        base = ".".join(parts[: len(parts) - (node.level - 1)])
        target = f"{base}.{node.module}" if node.module else base
    else:
        target = node.module or ""
    return [target, *(f"{target}.{alias.name}" for alias in node.names)]


def engine_imports(source: str, filename: str = "<snippet>", package: str = "awa_trio") -> list[str]:
    """``file:line: statement`` of each import of an engine package's modules."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        modules = _imported_modules(node, package)
        if any(
            module == pkg or module.startswith(pkg + ".") for module in modules for pkg in ENGINE_PACKAGES
        ):
            found.append(f"{filename}:{node.lineno}: {ast.unparse(node)}")
    return found


def engine_spelled_names(source: str, filename: str = "<snippet>") -> list[tuple[str, str, bool]]:
    """(``file:line: name``, identifier, re-exports) of each identifier
    spelled after an engine; re-exports: the occurrence only defines the
    name from the state-to-engine map (an import, an assignment target, a
    ``def``, a read of ``states.<name>``), never uses it."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Name):
            names, defines = [node.id], isinstance(node.ctx, ast.Store)
        elif isinstance(node, ast.Attribute):
            from_map = isinstance(node.value, ast.Name) and node.value.id == "states"
            names, defines = [node.attr], from_map
        elif isinstance(node, ast.alias):
            names, defines = [node.asname or node.name.rpartition(".")[2], node.name.rpartition(".")[2]], True
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names, defines = [node.name], True
        elif isinstance(node, ast.keyword) and node.arg:
            names, defines = [node.arg], False
        else:
            continue
        for name in sorted(set(names) & ENGINE_SPELLED):
            line = getattr(node, "lineno", "?")
            found.append((f"{filename}:{line}: {name}", name, defines))
    return found


def _package_outside_the_engines() -> list[pathlib.Path]:
    scanned = [
        path for path in sorted(PACKAGE.rglob("*.py")) if "engines" not in path.relative_to(PACKAGE).parts
    ]
    assert len(scanned) > 40  # the scan reaches the package, not an empty directory
    return scanned


def _package_of(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts if parts[-1] == "__init__" else parts[:-1]).removesuffix(".__init__")


def test_the_scan_flags_engine_name_comparisons_and_nothing_else():
    offending = """
if info.engine == "canonical":
    pass
label = "bare" if engine != CANONICAL else "tagged"
wanted = name in (QUEUE_STORAGE, "x")
flipped = schema.QUEUE_STORAGE is other
match engine:
    case "queue_storage":
        pass
"""
    assert len(engine_name_comparisons(offending)) == 5
    fine = """
ready = state == STATE_CANONICAL and known in SUPPORTED_ENGINES
CAPABILITIES = ("canonical", "queue_storage")
def register(engine=CANONICAL): ...
counts = live["canonical"] == 0
text = "SELECT 1 WHERE active_engine = 'queue_storage'"
leader = engine_for(info) is engine_named(name)
"""
    assert engine_name_comparisons(fine) == []
    assert {"CANONICAL", "QUEUE_STORAGE"} <= ENGINE_NAME_CONSTANTS
    assert not any(name.startswith("STATE_") for name in ENGINE_NAME_CONSTANTS)


def test_no_module_outside_the_engines_compares_engine_names():
    scanned = _package_outside_the_engines()
    found = [
        hit
        for path in scanned
        for hit in engine_name_comparisons(path.read_text(), str(path.relative_to(ROOT)))
    ]
    assert found == [], "ask the engine object (awa_trio.engines) instead:\n" + "\n".join(found)


def test_the_scans_flag_engine_literals_imports_and_spelled_names():
    literals = """
\"\"\"A docstring may say "canonical" and 'queue_storage'.\"\"\"
STORAGE_CAPABILITY = "queue_storage"
CAPABILITIES = ("canonical", "canonical_drain_only")
live["canonical"] == 0
role = f"{x}" + "queue_storage_target"
def f():
    "queue_storage"
    return "queue_storage"
"""
    assert len(engine_name_literals(literals)) == 6
    assert (
        engine_name_literals("""
text = "SELECT 1 WHERE active_engine = {target_engine}"
state = STATE_CANONICAL
label = "queue storage"
""")
        == []
    )
    imports = """
from .engines.canonical import rescue_heartbeats
from .engines import queue_storage
from awa_trio.engines.queue_storage.rotate_lease import LEASE_RING_TABLES
import awa_trio.engines.canonical.engine
from ..engines.queue_storage.layout import schema_literal
"""
    assert len(engine_imports(imports, package="awa_trio")) == 4
    assert len(engine_imports(imports, package="awa_trio.maintenance")) == 3  # the last three
    assert (
        engine_imports("""
from .engines import engine_for, states
from .engines.states import INITIAL_ENGINE
from .engines.base import Engine
""")
        == []
    )
    spelled = """
from .schema import CANONICAL
from .engines.states import QUEUE_STORAGE as QS
if info.runs_queue_storage or schema.in_mixed_transition:
    result.canonical = None
PlaneResults(queue_storage=None)
"""
    assert sorted(name for _, name, _ in engine_spelled_names(spelled)) == [
        "CANONICAL", "QUEUE_STORAGE", "canonical", "in_mixed_transition", "queue_storage", "runs_queue_storage",
    ]  # fmt: skip
    assert engine_spelled_names("engine = INITIAL_ENGINE\nschema = info.queue_storage_schema\n") == []
    # A listed re-export may define the name, never use it.
    re_export = "CANONICAL = states.CANONICAL\ndef f(engine=CANONICAL): ...\n"
    assert [defines for _, _, defines in engine_spelled_names(re_export)] == [True, True, False]
    assert "canonical" in ENGINE_VOCABULARY and "canonical_drain_only" in ENGINE_VOCABULARY
    assert {"awa_trio.engines.canonical", "awa_trio.engines.queue_storage"} == ENGINE_PACKAGES


def test_no_module_outside_the_engines_spells_an_engine_literal():
    found = [
        hit
        for path in _package_outside_the_engines()
        for hit in engine_name_literals(path.read_text(), str(path.relative_to(ROOT)))
    ]
    assert found == [], "take the value from the engine object or awa_trio.engines.states:\n" + "\n".join(
        found
    )


def test_no_module_outside_the_engines_imports_an_engine_package():
    found = [
        hit
        for path in _package_outside_the_engines()
        for hit in engine_imports(path.read_text(), str(path.relative_to(ROOT)), _package_of(path))
    ]
    assert found == [], "ask awa_trio.engines for the engine object instead:\n" + "\n".join(found)


def test_no_module_outside_the_engines_names_an_engine_but_the_listed_re_exports():
    found = [
        hit
        for path in _package_outside_the_engines()
        for hit, name, defines in engine_spelled_names(path.read_text(), str(path.relative_to(ROOT)))
        if not (defines and (path.relative_to(ROOT).as_posix(), name) in COMPATIBILITY_NAMES)
    ]
    assert found == [], "ask the engine object (awa_trio.engines) instead:\n" + "\n".join(found)


# --- every engine provides every piece ------------------------------------------------------


def test_the_checklist_is_the_interface_and_the_docs_list_it():
    assert [piece for piece, _ in ENGINE_PIECES] == [field.name for field in dataclasses.fields(Engine)]
    checklist = (ROOT / "docs" / "architecture.md").read_text()
    missing = [piece for piece, _ in ENGINE_PIECES if f"`{piece}`" not in checklist]
    assert missing == [], f"docs/architecture.md's third-engine checklist lacks {missing}"


@pytest.mark.parametrize("engine", engines.known_engines(), ids=lambda engine: engine.name)
def test_every_engine_provides_every_piece(engine):
    check_engine(engine)
    assert engines.engine_named(engine.name) is engine


def _pieces(engine: Engine) -> dict[str, object]:
    return {field.name: getattr(engine, field.name) for field in dataclasses.fields(Engine)}


@pytest.mark.parametrize("piece", [piece for piece, _ in ENGINE_PIECES])
def test_a_missing_piece_is_named(piece):
    pieces = _pieces(engines.engine_named(engines.QUEUE_STORAGE))
    del pieces[piece]
    # Any object may be an engine: the check names what it lacks.
    with pytest.raises(IncompleteEngine, match=rf"lacks: {piece} \(missing"):
        check_engine(types.SimpleNamespace(**pieces))
    # Building the dataclass without it fails naming it too.
    with pytest.raises(TypeError, match=piece):
        Engine(**pieces)


def test_a_piece_of_the_wrong_kind_is_named():
    pieces = _pieces(engines.engine_named(engines.CANONICAL))
    with pytest.raises(IncompleteEngine, match=r"'ledger' lacks: grants \(got None"):
        Engine(**{**pieces, "name": "ledger", "grants": None})
    with pytest.raises(IncompleteEngine, match=r"lacks: branches \(got 'promote'.*; backlog"):
        Engine(**{**pieces, "branches": "promote", "backlog": ()})
    # The optional capabilities may be None.
    Engine(**{**pieces, "transition_branches": None, "drain_passes": None, "install": None})


def test_backlog_reads_are_named_statements():
    for engine in engines.known_engines():
        for statement in (engine.backlog.due_counts, engine.backlog.rescue_backlog):
            assert isinstance(statement, Statement)
        assert engine.backlog.rescue_backlog.parameters == ("staleness",)
        text, staleness = engine.backlog.rescue_backlog_query("qs_schema", 30.0)
        assert staleness == 30.0 and "{" not in text
        (due_text,) = engine.backlog.due_counts_query("qs_schema")
        assert ("qs_schema." in due_text) is engine.uses_storage_schema


# --- the state-to-engine map gives the sets it gave before ----------------------------------

CANONICAL_STATE = SchemaInfo(version=40, engine="canonical")
PREPARED = SchemaInfo(version=40, engine="canonical", state="prepared")
MIXED = SchemaInfo(version=40, engine="queue_storage", state="mixed_transition")
ACTIVE = SchemaInfo(version=40, engine="queue_storage", state="active")
ALL_STATES = [
    SchemaInfo(version=40, engine=engine, state=state)
    for engine in ("canonical", "queue_storage")
    for state in ("canonical", "prepared", "mixed_transition", "active")
]

CANONICAL_SET = [
    "rescue_stale_heartbeats", "rescue_expired_deadlines", "rescue_expired_callbacks",
    "promote_scheduled", "cleanup", "priority_aging", "recompute_dirty_admin_metadata",
    "refresh_admin_metadata", "queue_stats", "batch_operations", "cron_sync", "cron_eval",
]  # fmt: skip
QUEUE_STORAGE_SET = [
    "rescue_stale_heartbeats", "rescue_expired_deadlines", "rescue_expired_callbacks",
    "promote_scheduled", "cleanup", "queue_stats", "batch_operations", "terminal_count_rollup",
    "rotate_queue", "rotate_lease", "rotate_claim", "cron_sync", "cron_eval",
]  # fmt: skip
FOLDED = {"promote_scheduled", "rescue_stale_heartbeats", "rescue_expired_deadlines",
          "rescue_expired_callbacks", "cleanup"}  # fmt: skip


def _without_bodies(specs):
    return [dataclasses.replace(spec, run_once=None) for spec in specs]


def test_canonical_and_prepared_run_the_canonical_set():
    config = MaintenanceConfig()
    for info in (CANONICAL_STATE, PREPARED):
        specs = default_branches(config, info)
        assert [spec.name for spec in specs] == CANONICAL_SET
        assert specs == canonical_branches(config)
        assert engines.engine_for(info).name == "canonical"
        assert engines.draining_engine(info) is None


def test_active_runs_the_queue_storage_set():
    config = MaintenanceConfig()
    specs = default_branches(config, ACTIVE)
    assert [spec.name for spec in specs] == QUEUE_STORAGE_SET
    assert specs == queue_storage_branches(config)


def test_mixed_transition_runs_the_queue_storage_set_with_the_canonical_drain_folded_in():
    config = MaintenanceConfig()
    mixed = default_branches(config, MIXED)
    active = queue_storage_branches(config)
    assert [spec.name for spec in mixed] == [*QUEUE_STORAGE_SET, "canonical_drain"]
    assert _without_bodies(mixed[:-1]) == _without_bodies(active)
    changed = {new.name for new, old in zip(mixed, active, strict=False) if new.run_once is not old.run_once}
    assert changed == FOLDED
    # The canonical engine's own drain passes, the same ones every term.
    drain = engines.engine_named("canonical").drain_passes()
    assert drain is engines.engine_named("canonical").drain_passes()
    report = mixed[-1]
    assert (report.interval, report.run_immediately) == (config.queue_stats_interval, True)


def test_the_declared_branch_names_are_the_names_the_specs_use():
    config = MaintenanceConfig()
    for engine in engines.known_engines():
        assert {spec.name for spec in engine.branches(config)} <= engine.branch_names
    produced = {spec.name for info in ALL_STATES for spec in default_branches(config, info)}
    assert produced == every_branch_name(config) == engines.every_branch_name()


def _old_planes(info: SchemaInfo) -> tuple[bool, bool]:
    """grants.planes() before the seam, as a model."""
    runs_qs = info.engine == "queue_storage" and info.state in ("mixed_transition", "active")
    in_mixed = runs_qs and info.state == "mixed_transition"
    return (not runs_qs or in_mixed, info.engine == "queue_storage" or info.state != "canonical")


def _old_branch_set(info: SchemaInfo) -> tuple[str, str]:
    runs_qs = info.engine == "queue_storage" and info.state in ("mixed_transition", "active")
    return ("queue_storage", info.state) if runs_qs else ("canonical", "")


@pytest.mark.parametrize("info", ALL_STATES, ids=lambda info: f"{info.engine}-{info.state}")
def test_whose_grants_and_which_branch_set_follow_the_state_as_before(info):
    assert engines.planes(info) == _old_planes(info)
    assert info.branch_set == _old_branch_set(info)
    in_use = [engine.name for engine in engines.engines_in_use(info)]
    assert in_use == [
        name for name, used in zip(engines.SUPPORTED_ENGINES, _old_planes(info), strict=True) if used
    ]


def test_naming_branches_on_a_canonical_leader_loads_no_queue_storage_branch_module():
    """The engines declare their branch names: checking disabled_branches on
    a canonical leader imports the queue-storage engine object, never a
    branch body."""
    script = (
        "import sys\n"
        "from awa_trio.config import MaintenanceConfig\n"
        "from awa_trio.registry import default_branches, every_branch_name\n"
        "from awa_trio.schema import SchemaInfo\n"
        "every_branch_name(MaintenanceConfig())\n"
        "default_branches(MaintenanceConfig(), SchemaInfo(version=40, engine='canonical'))\n"
        "print(sorted(m for m in sys.modules if m.startswith('awa_trio.engines.queue_storage')))\n"
    )
    loaded = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == str(
        sorted(
            [
                "awa_trio.engines.queue_storage",
                "awa_trio.engines.queue_storage.engine",
                "awa_trio.engines.queue_storage.grant_needs",
            ]
        )
    )


def test_the_engine_interface_module_imports_no_branch():
    assert not any(
        isinstance(node, ast.ImportFrom) and node.module and "registry" in node.module
        for node in ast.walk(ast.parse(pathlib.Path(base.__file__).read_text()))
    )


def test_the_transition_targets_are_the_engines_with_a_transition_variant():
    assert {engine.name for engine in engines.known_engines() if engine.transition_branches} == set(
        states.TRANSITION_TARGETS
    )
    assert {engine.name for engine in engines.known_engines() if engine.drain_passes} == {
        states.draining_engine(MIXED)
    }


def test_the_transition_targets_are_the_engines_with_a_readiness_check():
    assert {engine.name for engine in engines.known_engines() if engine.prepared_schema_ready} == set(
        states.TRANSITION_TARGETS
    )


def test_the_storage_report_names_none_of_the_target_engines_tables():
    from awa_trio.engines import queue_info

    (target_name,) = states.TRANSITION_TARGETS
    target = engines.engine_named(target_name)
    assert target.prepared_schema_ready is not None
    assert target.prepared_schema_ready.parameters == ("storage_schema",)
    source = (ROOT / "awa_trio" / "engines" / "queue_info.py").read_text()
    assert "claim_ready_runtime" not in source and "deferred_jobs" not in source
    assert "claim_ready_runtime" not in queue_info.INFO_SQL.render()


def test_the_words_rescue_reasons_and_ring_examples_come_from_the_engines():
    canonical, queue_storage = engines.engine_named("canonical"), engines.engine_named("queue_storage")
    assert canonical.wording.describe_migrated(CANONICAL_STATE).startswith(
        "it is on the canonical engine (state canonical). The first awa-pg runtime"
    )
    assert queue_storage.wording.describe_migrated(ACTIVE) == (
        "queue storage is live (awa.storage_status(): engine queue_storage, state active)"
    )
    assert queue_storage.wording.describe_demo(MIXED).endswith(
        "(awa.storage_status(): engine queue_storage, state mixed_transition); "
        "awa_trio leads it with its queue-storage branches"
    )
    from awa_trio.demo import RESCUE_ERRORS
    from awa_trio.engines.canonical import rescue_callbacks, rescue_deadlines, rescue_heartbeats
    from awa_trio.engines.queue_storage import rescue_heartbeats as qs_rescue_heartbeats

    assert RESCUE_ERRORS == {
        rescue_heartbeats.RESCUE_ERROR: "heartbeat",
        qs_rescue_heartbeats.RECEIPT_ERROR: "heartbeat",
        rescue_deadlines.RESCUE_ERROR: "deadline",
        rescue_callbacks.RESCUE_ERROR: "callback",
    }
    for engine in engines.known_engines():
        assert set(engine.rescue_reasons().values()) == {"heartbeat", "deadline", "callback"}
    # Only queue storage has ring statements; the catalog shows its slot 0.
    assert canonical.sql_examples is None
    from awa_trio.sql_catalog import EXAMPLE_SLOT, example_identifiers

    assert example_identifiers("awa") == queue_storage.sql_examples("awa", EXAMPLE_SLOT)


def test_the_runtime_vocabulary_is_the_maps():
    from awa_trio import metrics, runtime_instance
    from awa_trio.engines import queue_info

    assert metrics.STORAGE_CAPABILITIES == ("canonical", "canonical_drain_only", "queue_storage")
    assert runtime_instance.STORAGE_CAPABILITY == "queue_storage"
    assert queue_info.FINALIZE_BLOCKERS == {39: ("canonical", "canonical_drain_only"), 40: ("canonical",)}
    text = queue_info.INFO_SQL.render()
    assert "WHEN status.active_engine = 'queue_storage'" in text
    assert "transition_role = 'queue_storage_target' AND storage_capability = 'queue_storage'" in text
