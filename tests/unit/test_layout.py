"""The tests mirror the package: ``tests/unit/<stage>/test_<module>.py`` guards
``syncscope/<stage>/<module>.py``, so the tests of a module are found from its path.

- Every folder under tests/unit/ is a folder of the package (``tests/unit/load/trace/`` for
  ``syncscope/load/trace/``), or one of ``OUTSIDE_THE_PACKAGE`` (the tests of the repository's
  other code), and holds an ``__init__.py`` (two ``test_diff.py`` in two folders import as two
  modules).
- Every ``test_<name>.py`` in a package folder names a module of that folder (``<name>.py``,
  ``_<name>.py`` or the subpackage ``<name>/``); at tests/unit/ itself also the
  ``REPOSITORY_WIDE`` checks, which read the whole package, pyproject.toml or the docs.
- No two test files of tests/ share a name: a failure's file name says which file it is.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUTSIDE_THE_PACKAGE = {
    "benchmarks": "benchmarks/",
    "tools": "the GPU check's machine tooling",
    "helpers": "tests/helpers/",
}
REPOSITORY_WIDE = {"architecture", "layout", "packaging", "torch_releases", "user_docs"}


def _is_module(package: Path, name: str) -> bool:
    return (
        (package / f"{name}.py").is_file()
        or (package / f"_{name}.py").is_file()
        or (package / name / "__init__.py").is_file()
    )


def layout_problems(tests: Path, package: Path) -> list[str]:
    """What in ``tests`` (a tests/ folder) does not mirror ``package`` (syncscope/)."""
    unit = tests / "unit"
    problems: list[str] = []
    folders = [unit, *(p for p in sorted(unit.rglob("*")) if p.is_dir())]
    for folder in folders:
        if folder.name == "__pycache__":
            continue
        rel = folder.relative_to(unit)
        if not (folder / "__init__.py").is_file():
            problems.append(f"tests/unit/{rel}/ has no __init__.py")
        if rel.parts and rel.parts[0] in OUTSIDE_THE_PACKAGE:
            continue
        mirrored = package.joinpath(*rel.parts)
        if not (mirrored / "__init__.py").is_file():
            problems.append(f"tests/unit/{rel}/ mirrors no folder of the package")
            continue
        for test in sorted(folder.glob("test_*.py")):
            name = test.stem.removeprefix("test_")
            if not rel.parts and name in REPOSITORY_WIDE:
                continue
            if not _is_module(mirrored, name):
                where = "/".join(("syncscope", *rel.parts))
                problems.append(f"{test.relative_to(tests.parent)} names no module of {where}/")
    names = Counter(p.name for p in tests.rglob("test_*.py") if "fixtures" not in p.parts)
    problems += [f"{n} files are named {name}" for name, n in sorted(names.items()) if n > 1]
    return problems


def test_the_unit_tests_mirror_the_package() -> None:
    problems = layout_problems(ROOT / "tests", ROOT / "syncscope")
    assert not problems, "tests/ does not mirror syncscope/:\n" + "\n".join(problems)


def test_the_layout_check_sees_what_it_checks(tmp_path: Path) -> None:
    package, tests = tmp_path / "syncscope", tmp_path / "tests"
    for path in ("load/trace/read.py", "render/html.py", "cli.py", "atomic.py"):
        (package / path).parent.mkdir(parents=True, exist_ok=True)
        (package / path).touch()
    for folder in ("", "load", "load/trace", "render"):
        (package / folder / "__init__.py").touch()
    for path in (
        "unit/test_cli.py",
        "unit/test_atomic.py",
        "unit/test_architecture.py",
        "unit/load/trace/test_read.py",
        "unit/render/test_charts.py",  # no render/charts.py
        "unit/trace/test_read.py",  # no syncscope/trace/, and a second test_read.py
        "unit/helpers/test_truth.py",
        "integration/test_cli.py",  # a second test_cli.py
    ):
        (tests / path).parent.mkdir(parents=True, exist_ok=True)
        (tests / path).touch()
    for folder in ("unit", "unit/load", "unit/load/trace", "unit/trace", "unit/helpers"):
        (tests / folder / "__init__.py").touch()
    assert layout_problems(tests, package) == [
        "tests/unit/render/ has no __init__.py",
        "tests/unit/render/test_charts.py names no module of syncscope/render/",
        "tests/unit/trace/ mirrors no folder of the package",
        "2 files are named test_cli.py",
        "2 files are named test_read.py",
    ]
