"""Every benchmark and machine-tooling script runs: each imports (its own imports resolve,
nothing of it runs at import), each command answers ``--help``, and the workloads that are
plain scripts compile. The measurements themselves are the benchmarks' own (slow) business."""

from __future__ import annotations

import importlib.util
import py_compile
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
FOLDERS = [ROOT / "benchmarks", ROOT / "benchmarks" / "internals", ROOT / "tools" / "gpu"]
MODULES = sorted(p for folder in FOLDERS for p in folder.glob("*.py"))
# commands: the modules with a ``main``, run as ``python SCRIPT``; ``--help`` is asked of
# those that import no torch before parsing (a fresh torch import costs seconds each)
COMMANDS = [p for p in MODULES if 'if __name__ == "__main__":' in p.read_text(encoding="utf-8")]
LIGHT = [p for p in COMMANDS if "\nimport torch" not in p.read_text(encoding="utf-8")]
# workloads run by the harness as torchrun scripts (their top level is the training loop)
WORKLOADS = sorted((ROOT / "benchmarks" / "workloads").glob("*.py"))


@pytest.fixture
def on_path(request: pytest.FixtureRequest) -> Iterator[None]:
    """The script's folder, benchmarks/ and its workloads on the path, as when it runs."""
    saved = list(sys.path)
    sys.path[:0] = [str(request.param.parent), str(ROOT / "benchmarks"), str(ROOT / "benchmarks" / "workloads"), str(ROOT)]  # fmt: skip
    try:
        yield
    finally:
        sys.path[:] = saved


def _name(path: Path) -> str:
    return str(path.relative_to(ROOT))


def test_the_smoke_test_sees_every_script() -> None:
    names = {_name(p) for p in MODULES}
    assert {"benchmarks/run_all.py", "benchmarks/bench_fix.py", "tools/gpu/gpu_check.py"} <= names
    assert (
        len(COMMANDS) >= 15
        and len(LIGHT) >= 10
        and "benchmarks/workloads/run_example.py" in map(_name, WORKLOADS)
    )


@pytest.mark.parametrize("on_path", MODULES, ids=_name, indirect=True)
def test_each_benchmark_module_imports(on_path: None, request: pytest.FixtureRequest) -> None:
    path: Path = request.node.callspec.params["on_path"]
    spec = importlib.util.spec_from_file_location(f"_smoke_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    if path in COMMANDS:
        assert callable(getattr(module, "main", None)), f"{_name(path)} has no main()"


@pytest.mark.parametrize("path", LIGHT, ids=_name)
def test_each_benchmark_command_answers_help(path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(path), "--help"], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert proc.returncode == 0, proc.stdout[-1000:] + proc.stderr[-2000:]
    assert "usage" in proc.stdout.lower() or path.stem in proc.stdout, proc.stdout[:500]


@pytest.mark.parametrize("path", WORKLOADS, ids=_name)
def test_each_workload_compiles(path: Path, tmp_path: Path) -> None:
    py_compile.compile(str(path), cfile=str(tmp_path / "out.pyc"), doraise=True)


def test_bench_fix_measures_a_tiny_file() -> None:
    # its own inputs (no test module of tests/ imported): 2 and 4 loops, fixed in-process
    proc = subprocess.run(
        [sys.executable, "benchmarks/bench_fix.py", "--loops", "2", "4", "--lines"],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "    2 loops" in proc.stdout and "    4 loops" in proc.stdout
    assert "(4 problems)" in proc.stdout
