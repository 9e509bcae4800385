"""Shared fixtures: real multi-process profile runs, cached per session (they cost seconds)."""

from __future__ import annotations

import gc
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
LOOPS = ROOT / "tests" / "scripts" / "loops.py"
PROFILE_TIMEOUT = int(os.environ.get("SYNCSCOPE_TEST_TIMEOUT", "180"))
# torch's gloo teardown (``destroy_process_group`` at a script's end) aborts about 1 plain
# torchrun job in 12 on the 2-core machine (measured 2026-11-24, syncscope not involved)
TEARDOWN_ABORT = "terminate called without an active exception"


def torchrun(
    script: Path, *args: str, writes: Sequence[Path] = ()
) -> subprocess.CompletedProcess[str]:
    """``script`` under plain torchrun on 2 local ranks (one thread each, this tree's
    syncscope importable); a job that torch's teardown aborted is run again, up to 3 runs
    in all (two aborts in a row happened in a clean-clone CI run, 2026-11-24). ``writes``:
    directories the job writes, removed before each run, so a job run again leaves only its
    own files (an aborted run's traces beside them read as a second job)."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, PYTHONPATH=path, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc-per-node", "2", str(script), *args]
    for _ in range(3):
        for directory in writes:
            shutil.rmtree(directory, ignore_errors=True)
        proc = subprocess.run(
            command, capture_output=True, text=True, timeout=PROFILE_TIMEOUT, cwd=ROOT, env=env
        )
        if proc.returncode == 0 or TEARDOWN_ABORT not in proc.stderr:
            break
    return proc


@pytest.fixture
def process_group(tmp_path: Path) -> Iterator[None]:
    """A one-rank gloo process group for the test (the in-process tracking tests)."""
    import torch.distributed as dist  # torch only for the tests that use it

    from syncscope.capture.release import torch_release

    store = dist.FileStore(str(tmp_path / "store"), 1)  # type: ignore[attr-defined]
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        yield
    finally:
        # the test's garbage first (a DDP model in a reference cycle holds the group): torch
        # 2.6 and 2.7's gloo aborts the process when it is collected after the group ended
        # (a full collection takes about 0.4 s with torch loaded: only where it is needed)
        if torch_release() < (2, 8):
            gc.collect()
        dist.destroy_process_group()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--slow",
        action="store_true",
        help="also run the tests marked slow (they launch ranks or processes); .ci/run does",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The quick loop leaves out ``slow`` tests unless ``--slow``, any ``-m`` or a test's own
    id (``file.py::test``) is given; ``gpu`` tests need CUDA: without it they are skipped,
    with the reason, never passed."""
    named = any("::" in arg for arg in config.args)
    if not (config.getoption("--slow") or config.option.markexpr or named):
        slow = [item for item in items if item.get_closest_marker("slow")]
        if slow:
            config.hook.pytest_deselected(items=slow)
            items[:] = [item for item in items if not item.get_closest_marker("slow")]
    if any(item.get_closest_marker("slow") for item in items):
        _build_native_kernel()
    gpu = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu:
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU: not run here, not a pass")
    for item in gpu:
        item.add_marker(skip)


def _build_native_kernel() -> None:
    """Build syncscope's compiled collective kernel before the tests that launch ranks (once
    per torch, waiting for it as ``syncscope build-kernel`` does): otherwise the first
    ``syncscope profile`` would run on the Python kernel, say so on its stderr and build it
    in the background while later tests run. Where it cannot be built the suite runs on the
    Python kernel (tests/integration/test_native_kernel.py skips its compiled-kernel tests,
    with the reason)."""
    from syncscope.capture import native

    native.build()


@dataclass
class ProfiledRun:
    proc: subprocess.CompletedProcess[str]
    run_dir: Path
    report: dict[str, Any]

    def windows(self, rank: int = 0) -> list[dict[str, Any]]:
        return list(self.report["ranks"][rank]["windows"])

    def complete_windows(self, rank: int = 0) -> list[dict[str, Any]]:
        return [w for w in self.windows(rank) if w["complete"]]

    def kinds(self) -> set[tuple[str, str]]:
        return {(f["kind"], f["cause"]) for f in self.report["findings"]}

    def finding(self, kind: str) -> dict[str, Any]:
        matches = [f for f in self.report["findings"] if f["kind"] == kind]
        assert matches, f"no {kind} finding in {self.kinds()}"
        return matches[0]


def run_syncscope(
    *args: str, cwd: Path | None = None, timeout: int = PROFILE_TIMEOUT
) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    return subprocess.run(
        [sys.executable, "-m", "syncscope", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd or ROOT,
        env=env,
    )


def profile(
    tmp: Path, script: Path, *script_args: str, nproc: int = 2, options: tuple[str, ...] = ()
) -> ProfiledRun:
    run_dir = tmp / "run"
    proc = run_syncscope(
        "profile",
        "--quiet",
        "--fail-on",
        "never",
        "--nproc-per-node",
        str(nproc),
        "--out",
        str(run_dir),
        *options,
        str(script),
        *script_args,
    )
    report_path = run_dir / "report.json"
    assert report_path.exists(), f"no report.json; stderr:\n{proc.stderr[-3000:]}"
    return ProfiledRun(proc, run_dir, json.loads(report_path.read_text()))


_cache: dict[tuple[str, ...], ProfiledRun] = {}


@pytest.fixture(scope="session")
def profiled(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """profiled(script, *args) -> ProfiledRun, each distinct run made once per session."""

    def get(script: Path, *args: str, options: tuple[str, ...] = ()) -> ProfiledRun:
        key = (str(script), *args, "|", *options)
        if key not in _cache:
            tmp = tmp_path_factory.mktemp(script.stem)
            _cache[key] = profile(tmp, script, *args, options=options)
        return _cache[key]

    return get
