"""The package's shape: short functions, no import cycles, layers, a map of each stage.

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
- Layers, on the same edges plus the imports made only for the type checker: ``model`` and
  the foundation (``errors``, ``_version``, ``text``, ``atomic``, ``fields``) import nothing
  above them, ``analysis`` only the model and ``text`` (``FOUNDATION``); the run-directory
  format (``rundir``) never imports capture; render never imports analysis or load; capture
  never imports analysis, render or load; load never diagnoses, renders, captures or
  launches (``FORBIDDEN``).
- The package root holds at most ``MAX_ROOT_MODULES`` modules (its entry points, the
  run-directory format and the foundation); every other module is in the folder of its
  stage, docs/concepts.md lists each folder (``test_every_folder_is_on_the_map``) and each
  folder's ``__init__`` says in its docstring which of its modules do what.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

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


def _import_nodes(node: ast.AST, typing: bool = False) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import under ``node`` that can run (``if TYPE_CHECKING:`` bodies skipped), or
    with ``typing`` every import, those for the type checker included."""
    if isinstance(node, ast.Import | ast.ImportFrom):
        yield node
        return
    if not typing and isinstance(node, ast.If) and _is_type_checking(node.test):
        for child in node.orelse:
            yield from _import_nodes(child)
        return
    for child in ast.iter_child_nodes(node):
        yield from _import_nodes(child, typing)


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


def _import_graph(typing: bool = False) -> dict[str, set[str]]:
    """Module -> the syncscope modules it imports; with ``typing`` also the imports made only
    for the type checker (a layer rule holds for types too)."""
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in _import_nodes(tree, typing):
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
    assert "syncscope.model" in graph["syncscope.load.captured"]
    assert "syncscope.load.traces" in graph["syncscope.load.inputs"]  # inside a function
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
    found = list(_targets(node, "syncscope.load", is_package=True))
    assert found == ["syncscope.model", "syncscope"]


# The layers: what each part of the package may import. A module belongs to the
# part named by its first name under syncscope/ (syncscope.model.figures: "model").
FOUNDATION: dict[str, set[str]] = {  # these import nothing above them: only what is listed
    "errors": set(),
    "_version": set(),
    "text": set(),  # text helpers: safe terminal text, bytes and durations
    "atomic": {"errors"},  # files written whole or not at all
    "fields": {"errors"},  # typed, range-checked readers of the values a file holds
    "model": {"errors", "model"},
    # the rules: pure functions from the model to findings, whatever read the run
    "analysis": {"model", "text"},
}
FORBIDDEN: dict[str, set[str]] = {  # part -> the parts it never imports
    "rundir": {"capture"},  # the on-disk format is read by everything, written by capture
    "render": {"analysis", "load"},  # renderers show the model and its findings
    "capture": {"analysis", "render", "load"},  # the ranks' hot path records, never reports
    # loading reads what a run left into the model: it neither diagnoses nor renders
    "load": {"analysis", "render", "capture", "launch", "commands", "fixes", "testing"},
}
# the entry points (__init__, __main__, cli), the on-disk format (rundir) and the foundation
MAX_ROOT_MODULES = 9


def _part(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""  # "" is the package itself


def _layer_violations(graph: dict[str, set[str]]) -> list[str]:
    bad: list[str] = []
    for module, targets in sorted(graph.items()):
        part = _part(module)
        for target in sorted(targets):
            other = _part(target)
            if part in FOUNDATION and other not in FOUNDATION[part] | {part}:
                bad.append(f"{module} imports {target} ({part} imports nothing above it)")
            if other in FORBIDDEN.get(part, set()):
                bad.append(f"{module} imports {target} ({part} never imports {other})")
            if target == "syncscope":  # the root is the public API, above everything
                bad.append(f"{module} imports the package root (nothing reaches up to it)")
    return bad


def test_the_layers_hold_at_run_time_and_for_the_type_checker() -> None:
    bad = _layer_violations(_import_graph(typing=True))
    assert not bad, "imports across the layers:\n" + "\n".join(bad)


def test_the_layer_check_sees_a_violation() -> None:
    graph = {
        "syncscope.model.figures": {"syncscope.model", "syncscope.text"},
        "syncscope.render.summary": {"syncscope.model.figures", "syncscope.analysis.advice"},
        "syncscope.rundir": {"syncscope.atomic", "syncscope.capture.recorder.records"},
        "syncscope.capture.session": {"syncscope.rundir", "syncscope.load.trace.read"},
        "syncscope.atomic": {"syncscope.errors"},
        "syncscope.capture.sites": {"syncscope"},
        "syncscope.analysis.exposed": {"syncscope.text", "syncscope.load.trace.overlap"},
    }
    assert _layer_violations(graph) == [
        "syncscope.analysis.exposed imports syncscope.load.trace.overlap (analysis imports "
        "nothing above it)",
        "syncscope.capture.session imports syncscope.load.trace.read (capture never imports load)",
        "syncscope.capture.sites imports the package root (nothing reaches up to it)",
        "syncscope.model.figures imports syncscope.text (model imports nothing above it)",
        "syncscope.render.summary imports syncscope.analysis.advice (render never imports analysis)",
        "syncscope.rundir imports syncscope.capture.recorder.records (rundir never imports capture)",
    ]
    # the graph the rules read holds imports inside functions and those for the type checker
    graph = _import_graph(typing=True)
    assert "syncscope.load.traces" in graph["syncscope.load.inputs"]  # inside a function
    assert "syncscope.testing.track" in graph["syncscope"]  # only under TYPE_CHECKING


def test_the_package_root_holds_only_entry_points_format_and_foundation() -> None:
    root = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(root) <= MAX_ROOT_MODULES, f"{len(root)} modules at syncscope/: {root}"


def test_every_folder_is_on_the_map() -> None:
    """docs/concepts.md's map of the stages is the list of syncscope's folders, one line each."""
    concepts = PACKAGE.parent / "docs" / "concepts.md"
    if not concepts.is_file():  # an installed package without its docs
        pytest.skip(f"{concepts} is not beside the package")
    text = concepts.read_text(encoding="utf-8")
    mapped = re.findall(r"^\| `syncscope/(\w+)/` \| \S", text, flags=re.M)
    folders = sorted(p.parent.name for p in PACKAGE.glob("*/__init__.py"))
    assert sorted(mapped) == folders
    assert len(mapped) == len(set(mapped))


def test_every_stage_maps_its_modules() -> None:
    """Each folder's ``__init__`` opens with a docstring that names what its modules do: at
    least one module of the folder (or the stage's entry point) by name."""
    unmapped: list[str] = []
    for init in sorted(PACKAGE.glob("*/__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
        modules = {p.stem for p in init.parent.glob("*.py") if p.name != "__init__.py"}
        modules |= {p.parent.name for p in init.parent.glob("*/__init__.py")}
        if len(doc.splitlines()) < 3 or not any(re.search(rf"\b{m}\b", doc) for m in modules):
            unmapped.append(init.parent.name)
    assert not unmapped, f"stages whose __init__ maps none of their modules: {unmapped}"
