"""benchmarks/ imports: no circle among its modules, and none of them imports the tests."""
from __future__ import annotations

import ast
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
TESTS = Path(__file__).resolve().parent


def _imports(path: Path) -> set[str]:
    """The top-level module names ``path`` imports, at any depth of its code."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of ``graph``, or None."""
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> list[str] | None:
        if module in path:
            return path[path.index(module):] + [module]
        if module in done:
            return None
        for target in sorted(graph[module]):
            found = visit(target, path + [module])
            if found:
                return found
        done.add(module)
        return None

    for module in sorted(graph):
        found = visit(module, [])
        if found:
            return found
    return None


def test_benchmarks_import_no_circle_and_no_test() -> None:
    modules = {p.stem: p for p in BENCH.glob("*.py")}
    graph = {name: _imports(path) & set(modules) for name, path in modules.items()}
    assert {"surfaces", "catalog", "planner"} <= set(graph) and graph["planner"]  # the graph is read
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])
    tests = {p.stem for p in TESTS.glob("*.py")} - set(modules)
    assert {name: sorted(_imports(path) & tests) for name, path in modules.items() if _imports(path) & tests} == {}


def test_a_circle_is_found() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
