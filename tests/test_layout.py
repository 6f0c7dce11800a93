"""The source layout's rules (issue 17), checked on the import graph of
awa_trio, type-only imports included: no module imports the other engine,
the shared core imports no engine, and there are no import cycles."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "awa_trio"
ENGINES = ("awa_trio.engines.canonical", "awa_trio.engines.queue_storage")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def import_graph() -> dict[str, set[str]]:
    modules = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                for alias in node.names:
                    candidate = f"{target}.{alias.name}"
                    targets.add(candidate if candidate in modules else target)
            elif isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
        graph[name] = {target for target in targets if target in modules and target != name}
    return graph


def test_no_engine_imports_the_other_and_the_core_imports_none():
    graph = import_graph()
    offenders = []
    for module, targets in graph.items():
        for target in targets:
            for engine in ENGINES:
                other = [e for e in ENGINES if e != engine]
                if module.startswith(engine) and any(target.startswith(o) for o in other):
                    offenders.append(f"{module} -> {target}")
            if module.startswith("awa_trio.maintenance") and target.startswith("awa_trio.engines"):
                offenders.append(f"{module} -> {target}")
    assert offenders == []


def test_there_are_no_import_cycles():
    graph = import_graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    assert cycles == []


def test_the_checks_see_a_cycle_and_a_cross_engine_import(tmp_path, monkeypatch):
    """The graph reader itself works: a planted cycle and a planted engine
    import are found (so the two tests above can fail)."""
    fake = tmp_path / "awa_trio"
    (fake / "engines" / "canonical").mkdir(parents=True)
    (fake / "engines" / "queue_storage").mkdir(parents=True)
    for init in (fake, fake / "engines", fake / "engines" / "canonical", fake / "engines" / "queue_storage"):
        (init / "__init__.py").write_text("")
    (fake / "a.py").write_text("from . import b\n")
    (fake / "b.py").write_text("from .a import thing\n")
    (fake / "engines" / "queue_storage" / "x.py").write_text("from ..canonical import y\n")
    (fake / "engines" / "canonical" / "y.py").write_text("")
    monkeypatch.setattr(__import__(__name__), "PACKAGE", fake)
    graph = import_graph()
    assert "awa_trio.b" in graph["awa_trio.a"] and "awa_trio.a" in graph["awa_trio.b"]
    assert "awa_trio.engines.canonical.y" in graph["awa_trio.engines.queue_storage.x"]
