"""What the package needs and ships, read from its source and pyproject.toml:

- every third-party package that ``syncscope/`` imports is declared (a core dependency, or an
  extra when the import is optional and guarded; torch, the job's own, by the ``torch`` extra:
  the commands that need it say so where it is missing, tests/unit/test_torch_releases.py);
- every file of the package is named by the wheel's ``include`` patterns, the page's
  stylesheet and script among them, and those assets load through importlib.resources and end
  up inlined in a written page.
"""

from __future__ import annotations

import ast
import io
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from 3.11")

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "syncscope"

# import name -> distribution name, where they differ
DISTRIBUTION = {"hta": "traceinsight", "pygments": "pygments", "yaml": "pyyaml"}

# modules that import an optional package at their top on purpose: importing the module is
# the opt-in (a framework's callback, the pytest11 plugin that only pytest itself loads)
OPTIONAL_HOMES = ("syncscope/integrations/", "syncscope/testing/plugin.py")

# calls that load a package named by a string rather than an import statement
_BY_NAME = {"find_spec", "import_module", "get_data"}


@dataclass(frozen=True)
class Use:
    module: str  # top-level import name
    file: str  # relative to the repository root
    line: int
    lazy: bool  # inside a function body
    guarded: bool  # inside a try that catches ImportError


def _catches_import_error(node: ast.Try) -> bool:
    names = {"ImportError", "ModuleNotFoundError", "Exception"}
    for handler in node.handlers:
        caught = handler.type
        kinds = caught.elts if isinstance(caught, ast.Tuple) else [caught]
        if any(isinstance(k, ast.Name) and k.id in names for k in kinds):
            return True
    return False


def _imported(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        return [node.module]
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name | ast.Attribute)
        and (node.func.id if isinstance(node.func, ast.Name) else node.func.attr) in _BY_NAME
        and node.args
        and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, str)
    ):
        return [node.args[0].value]
    return []


def _walk(node: ast.AST, lazy: bool, guarded: bool) -> Iterator[tuple[ast.AST, bool, bool]]:
    yield node, lazy, guarded
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
        lazy = True
    for child in ast.iter_child_nodes(node):
        inner = guarded or (
            isinstance(node, ast.Try) and child in node.body and _catches_import_error(node)
        )
        yield from _walk(child, lazy, inner)


def _third_party_uses() -> list[Use]:
    stdlib = sys.stdlib_module_names
    uses = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node, lazy, guarded in _walk(tree, lazy=False, guarded=False):
            for name in _imported(node):
                top = name.split(".")[0]
                if top and top not in stdlib and top != "syncscope":
                    rel = path.relative_to(ROOT).as_posix()
                    uses.append(Use(top, rel, getattr(node, "lineno", 0), lazy, guarded))
    return uses


def _pyproject() -> dict[str, Any]:
    with (ROOT / "pyproject.toml").open("rb") as f:
        return dict(tomllib.load(f))


def _names(requirements: list[str]) -> set[str]:
    """Distribution names of PEP 508 requirement strings, normalized (PEP 503)."""
    return {_normalize(re.split(r"[\s\[<>=!~;@]", req, maxsplit=1)[0]) for req in requirements}


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _distribution(module: str) -> str:
    return _normalize(DISTRIBUTION.get(module, module))


def _core() -> set[str]:
    """The core dependencies, and torch where the ``torch`` extra declares it: syncscope runs
    on the job's torch, never installs one of its own choosing (pip would fetch the newest
    build over the job's), and its file-reading commands run without it."""
    project = _pyproject()["project"]
    runtime = {"torch"} & _names(project["optional-dependencies"].get("torch", []))
    return _names(project["dependencies"]) | runtime


def test_the_import_scan_sees_the_packages_known_to_be_imported() -> None:
    """A check that the scan itself works (a scan that found nothing would pass the rest)."""
    # GIVEN / WHEN: every third-party import of the package
    seen = {use.module for use in _third_party_uses()}
    # THEN: the ones the package is known to use are among them, plotly (located by name,
    # never imported) and hta (a guarded lazy import) included
    assert {"torch", "rich", "orjson", "libcst", "pygments", "plotly", "hta"} <= seen


def test_every_package_imported_at_module_level_is_a_core_dependency() -> None:
    # GIVEN: the declared core dependencies (torch: the ``torch`` extra)
    core = _core()
    # WHEN: the package's imports that run on import, outside the opt-in modules, and those
    # made lazily but without an ImportError fallback
    required = [
        use
        for use in _third_party_uses()
        if not use.file.startswith(OPTIONAL_HOMES) and not use.guarded
    ]
    # THEN: each is a core dependency
    missing = [
        f"{u.file}:{u.line} {u.module}" for u in required if _distribution(u.module) not in core
    ]
    assert not missing, f"imported but not in [project] dependencies: {missing}"


def test_every_optional_import_is_declared_by_an_extra_and_guarded() -> None:
    # GIVEN: the declared dependencies and extras
    project = _pyproject()["project"]
    core = _core()
    extras = {name: _names(reqs) for name, reqs in project["optional-dependencies"].items()}
    # WHEN: the imports of packages that are not core dependencies
    optional = [u for u in _third_party_uses() if _distribution(u.module) not in core]
    # THEN: each is in an extra, and either lives in an opt-in module or is a lazy import
    # with an ImportError fallback (importing syncscope never needs it)
    undeclared = [
        f"{u.file}:{u.line} {u.module}"
        for u in optional
        if not any(_distribution(u.module) in reqs for reqs in extras.values())
    ]
    unguarded = [
        f"{u.file}:{u.line} {u.module}"
        for u in optional
        if not u.file.startswith(OPTIONAL_HOMES) and not (u.lazy and u.guarded)
    ]
    assert not undeclared, f"imported but in no extra: {undeclared}"
    assert not unguarded, f"optional packages imported without a guard: {unguarded}"
    # and each framework callback has an extra of its own to install it by
    for extra in ("lightning", "pytorch-lightning", "transformers"):
        assert extra in extras[extra]


def _wheel_patterns() -> list[str]:
    return list(_pyproject()["tool"]["hatch"]["build"]["targets"]["wheel"]["include"])


def _package_files() -> set[Path]:
    return {
        p
        for p in PACKAGE.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix not in {".pyc", ".pyo"}
    }


def test_the_wheel_includes_every_file_of_the_package() -> None:
    # GIVEN: the wheel's include patterns (hatchling's, which read like these globs here)
    patterns = _wheel_patterns()
    shipped = {p for pattern in patterns for p in ROOT.glob(pattern) if p.is_file()}
    # WHEN / THEN: every file of the package is named, the package data among them
    left_out = sorted(p.relative_to(ROOT).as_posix() for p in _package_files() - shipped)
    assert not left_out, f"files of the package that no wheel include pattern names: {left_out}"
    for data in ("py.typed", "render/assets/report.css", "render/assets/report.js"):
        assert PACKAGE / data in shipped


def test_the_page_assets_load_as_package_resources_and_are_inlined_in_a_written_page() -> None:
    from syncscope.render import page

    # GIVEN: the stylesheet and the boot script, read as package resources
    assets = resources.files("syncscope.render").joinpath("assets")
    css = assets.joinpath("report.css").read_text(encoding="utf-8")
    js = assets.joinpath("report.js").read_text(encoding="utf-8")
    assert ":root {" in css and "--ink:" in css
    assert "Plotly.newPlot" in js
    assert page.asset(page.STYLESHEET) == css and page.asset(page.SCRIPT) == js
    # WHEN: a page is written
    out = io.BytesIO()
    page.write_page(out, "t", "<p>body</p>")
    html = out.getvalue().decode("utf-8")
    # THEN: both are inlined in it, once each, in their own <style> and <script> elements:
    # the page stays one file that fetches nothing
    assert html.count(css) == 1 and f"<style>\n{css}</style>" in html
    assert html.count(js) == 1 and f"<script>\n{js}</script>" in html
    assert page.page("t", "<p>body</p>") == html


def test_numpy_comes_with_torch_because_torch_warns_without_it() -> None:
    # GIVEN: torch imported where numpy cannot be (a clean venv with only the declared deps)
    import subprocess

    code = "import sys; sys.modules['numpy'] = None; import warnings; import torch"
    done = subprocess.run(
        [sys.executable, "-W", "always", "-c", code], capture_output=True, text=True, timeout=120
    )
    # THEN: torch warns on every import, so the extra that brings torch brings numpy too
    assert "Failed to initialize NumPy" in done.stderr, done.stderr[-500:]
    extra = _names(_pyproject()["project"]["optional-dependencies"]["torch"])
    assert {"torch", "numpy"} <= extra
    # and none of them is a core dependency: the pre-commit hook and `fix --check` install
    # light (no torch, no CUDA libraries) and pip never replaces the job's torch
    assert not {"torch", "numpy", "ninja"} & _names(_pyproject()["project"]["dependencies"])


# --- extras against the examples they exist for -------------------------------------------

# example -> its extra; what the example imports, and what it needs at run time without
# importing it (the HF Trainer refuses to run without accelerate: transformers' own "torch"
# extra), must be installed by that extra alone
EXAMPLE_EXTRAS = {
    "hf_trainer_callback.py": ("transformers", {"accelerate"}),
    "lightning_callback.py": ("lightning", set()),
}


def _requirement_closure(requirements: list[str]) -> set[str]:
    """The distributions pip installs for ``requirements`` (names normalised), from the
    installed distributions' metadata, extras and markers evaluated."""
    from importlib import metadata

    from packaging.requirements import Requirement

    seen: set[str] = set()
    todo = [Requirement(r) for r in requirements]
    while todo:
        req = todo.pop()
        name = req.name.lower().replace("_", "-")
        key = f"{name}[{','.join(sorted(req.extras))}]"
        if key in seen:
            continue
        seen.add(key)
        try:
            requires = metadata.requires(req.name) or []
        except metadata.PackageNotFoundError:
            continue
        for line in requires:
            sub = Requirement(line)
            envs = [{"extra": e} for e in req.extras] or [{"extra": ""}]
            if sub.marker is None or any(sub.marker.evaluate(env) for env in envs):
                todo.append(sub)
    return {k.split("[", 1)[0] for k in seen}


@pytest.mark.parametrize("example", sorted(EXAMPLE_EXTRAS))
def test_each_extra_installs_what_its_example_needs(example: str) -> None:
    from importlib import metadata

    extra, runtime = EXAMPLE_EXTRAS[example]
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    closure = _requirement_closure(project["optional-dependencies"][extra])
    source = ast.parse((ROOT / "examples" / example).read_text())
    imported = {name.split(".")[0] for node in ast.walk(source) for name in _imported(node)}
    distributions = metadata.packages_distributions()
    needed = set(runtime)
    for module in imported - set(sys.stdlib_module_names) - {"syncscope", "torch"}:
        needed.update(d.lower() for d in distributions.get(module, [module]))
    assert needed <= closure, f"syncscope[{extra}] lacks {sorted(needed - closure)} ({example})"


# --- the test extra: what the tests import or run, nothing more ----------------------------

# distributions of the test extra that no test imports, each with what uses it
TEST_TOOLS = {
    "pytest": "runs the suite",
    "hatchling": "builds the wheel tests/unit/tools/test_gpu_check.py installs, offline",
}


def _imported_by_tests() -> set[str]:
    """Distributions that tests/ imports (its scripts and helpers included; ``importorskip``
    counts), read from the source."""
    stdlib = sys.stdlib_module_names
    found: set[str] = set()
    for path in sorted((ROOT / "tests").rglob("*.py")):
        if "fixtures" in path.relative_to(ROOT / "tests").parts:
            continue  # `fix`'s before/after files: read as text, never run
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            names = _imported(node)
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "importorskip"
                and node.args
                and isinstance(node.args[0], ast.Constant)
            ):
                names = [str(node.args[0].value)]
            for name in names:
                top = name.split(".")[0]
                if top and top not in stdlib and top not in ("syncscope", "tests"):
                    found.add(_distribution(top))
    return found


def test_the_test_extra_holds_only_what_the_tests_import_or_run() -> None:
    # GIVEN the test extra, and the distributions the tests import
    extra = _names(_pyproject()["project"]["optional-dependencies"]["test"]) - {"syncscope"}
    imported = _imported_by_tests()
    assert {"accelerate", "pyyaml", "distributed"} <= imported  # the scan sees imports
    # THEN each distribution of the extra is imported by a test, or is a tool a test runs
    unused = sorted(extra - imported - set(TEST_TOOLS))
    assert not unused, f"in the test extra, imported by no test: {unused}"
    # and HTA, whose extra brings a notebook server, is not among them
    assert "traceinsight" not in extra
