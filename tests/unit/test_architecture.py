"""The package's shape stays as issue 15 left it: short functions, and no import cycles.

- Every function and method in ``syncscope/`` (nested ones included) spans at most
  ``MAX_FUNCTION_LINES`` lines, counted as ``end_lineno - lineno + 1`` on the ast (from the
  ``def`` line, decorators not counted, docstring and comments counted).
- No import cycles among syncscope's modules. An edge is every ``import``/``from ... import``
  of a syncscope module, at module level *and* inside functions (a deferred import only
  postpones a cycle), relative ones resolved. ``from a.b import c`` names the module
  ``a.b.c`` when that is one, else ``a.b``. Packages that Python initialises on the way to a
  submodule are not edges (a package whose ``__init__`` imports its own submodules would
  otherwise form a cycle with each of them). Imports under ``if TYPE_CHECKING:`` are not
  edges: they never run. A cycle is a strongly connected component of more than one module.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "syncscope"
MAX_FUNCTION_LINES = 80


def _modules() -> dict[str, Path]:
    """Dotted name -> file, for every module of the package (packages by their __init__)."""
    out: dict[str, Path] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import under ``node`` that can run (``if TYPE_CHECKING:`` bodies skipped)."""
    if isinstance(node, ast.Import | ast.ImportFrom):
        yield node
        return
    if isinstance(node, ast.If) and _is_type_checking(node.test):
        for child in node.orelse:
            yield from _import_nodes(child)
        return
    for child in ast.iter_child_nodes(node):
        yield from _import_nodes(child)


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> Iterator[str]:
    """The dotted names an import statement loads (resolving relative imports)."""
    if isinstance(node, ast.Import):
        for alias in node.names:
            yield alias.name
        return
    base = node.module or ""
    if node.level:
        package = module.split(".") if is_package else module.split(".")[:-1]
        package = package[: len(package) - (node.level - 1)]
        base = ".".join([*package, base] if base else package)
    for alias in node.names:
        yield f"{base}.{alias.name}"
        yield base


def _import_graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in _import_nodes(tree):
            found = list(_targets(node, name, path.name == "__init__.py"))
            if isinstance(node, ast.ImportFrom):
                # ``from a.b import c``: the module a.b.c if it is one, else a.b itself
                pairs = zip(found[0::2], found[1::2], strict=True)
                found = [sub if sub in modules else base for sub, base in pairs]
            graph[name].update(t for t in found if t in modules and t != name)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component: list[str] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def test_no_function_is_longer_than_80_lines() -> None:
    long: list[str] = []
    for name, path in _modules().items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{name}.{node.name} (line {node.lineno}): {lines} lines")
    assert not long, "functions over 80 lines:\n" + "\n".join(long)


def test_no_import_cycles() -> None:
    cycles = _cycles(_import_graph())
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_the_checks_see_what_they_check() -> None:
    # the graph holds known edges (module level, function level, relative, from-package)...
    graph = _import_graph()
    assert "syncscope.model" in graph["syncscope.analysis.build"]
    assert "syncscope.trace.load" in graph["syncscope.analysis.inputs"]  # inside a function
    assert "syncscope.fixes.codemod" in graph["syncscope.fixes"]  # a package's __init__
    assert "syncscope.testing.track" not in graph["syncscope"]  # only under TYPE_CHECKING there
    # ...and a cycle, of any length, is found as one component
    ring = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _cycles(ring) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_relative_imports_resolve() -> None:
    (node,) = ast.parse("from .units import human_ns").body
    assert isinstance(node, ast.ImportFrom)
    found = list(_targets(node, "syncscope.render.summary", is_package=False))
    assert found == ["syncscope.render.units.human_ns", "syncscope.render.units"]
    (node,) = ast.parse("from .. import model").body
    assert isinstance(node, ast.ImportFrom)
    found = list(_targets(node, "syncscope.trace", is_package=True))
    assert found == ["syncscope.model", "syncscope"]
