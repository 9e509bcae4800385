"""The GPU check's CPU-side logic (tools/gpu/gpu_check.py and gpu_prepare.py, benchmarks/
bench_gpu.py): the offline install from carried wheels into a fresh virtual environment, the
clean skip without CUDA, the reading of pytest's output into docs/gpu.md rows, and the
capture-cost verdict beside the run-to-run noise."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from syncscope._version import __version__

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def benchmarks() -> Iterator[None]:
    """benchmarks/ and tools/gpu/ on the path (no packages), for the test's imports only."""
    folders = [str(ROOT / "benchmarks"), str(ROOT / "tools" / "gpu")]
    sys.path[:0] = folders
    try:
        yield
    finally:
        for folder in folders:
            sys.path.remove(folder)


def _module(name: str) -> ModuleType:
    return importlib.import_module(name)


def test_the_verdict_weighs_the_ratio_against_the_run_to_run_noise(benchmarks: None) -> None:
    bench = _module("bench_gpu")
    # steady runs, 1% dearer: within the limit, the noise beside it
    steady = bench.summarize([1.0, 1.0, 1.0], [1.01, 1.01, 1.01])
    assert steady["verdict"] == "within" and steady["noise"] == 0.0
    assert steady["ratio"] == pytest.approx(1.01)
    # runs that differ by ±10% from one to the next cannot resolve a 3% limit
    noisy = bench.summarize([1.0, 1.2, 1.1], [1.02, 1.22, 1.12])
    assert noisy["noise"] == pytest.approx(bench.spread([1.0, 1.2, 1.1]))
    assert noisy["verdict"] == "not resolved"
    # a cost larger than the noise is over the limit
    dear = bench.summarize([1.0, 1.01], [1.2, 1.21])
    assert dear["verdict"] == "over" and dear["low"] <= dear["ratio"] <= dear["high"]


@pytest.mark.slow
def test_bench_gpu_says_why_it_stops_without_cuda(benchmarks: None) -> None:
    import torch

    if torch.cuda.is_available():  # the message is for machines without CUDA
        env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    else:
        env = dict(os.environ)
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_gpu.py")],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "needs a CUDA GPU" in proc.stderr and "--device cpu" in proc.stderr


def test_prepare_downloads_the_wheels_for_the_gpu_images_python(benchmarks: None) -> None:
    # the command only (the test downloads nothing): binary wheels, no dependencies, for
    # CPython 3.12 on x86-64 manylinux, of each package the image lacks
    prepare = _module("gpu_prepare")
    command = prepare.download_command(Path("/tmp/w"), "3.12")
    assert {"--no-deps", "--only-binary=:all:"} <= set(command)
    assert command[command.index("--python-version") + 1] == "3.12"
    assert "manylinux_2_28_x86_64" in command
    assert [c.split(">")[0] for c in command[-6:]] == [
        "orjson", "msgspec", "libcst", "plotly", "traceinsight", "pydot",
    ]  # fmt: skip


@pytest.mark.slow
def test_rows_list_every_gpu_test_as_pytest_reported_it(benchmarks: None) -> None:
    # GIVEN pytest's own output of the GPU tests, as gpu_check.py runs them (all skipped on
    # a machine without CUDA, each with its reason)
    check = _module("gpu_check")
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    args = ["-m", "gpu", "--slow", "-p", "no:cacheprovider", "tests/gpu"]
    run = [sys.executable, "-m", "pytest", *args]
    proc = subprocess.run([*run, "-v", "-rA"], capture_output=True, text=True, env=env, cwd=ROOT)
    listed = subprocess.run(
        [*run, "--collect-only", "-q"], capture_output=True, text=True, env=env, cwd=ROOT
    )
    collected = {line for line in listed.stdout.splitlines() if "::" in line}
    # WHEN the check reads it
    outcomes = check.outcomes(proc.stdout)
    # THEN every collected test is there, with the outcome pytest gave it
    assert set(outcomes) == collected and len(collected) > 10
    assert {outcome for outcome, _ in outcomes.values()} == {"SKIPPED"}
    header = ["device: a GPU x1", "torch 2.x"]
    rows = check.rows(header, outcomes, "0 passed, 0 failed in 1 s", "x1.000")
    assert rows.startswith("### ") and "a GPU x1" in rows.splitlines()[0]
    table = [line for line in rows.splitlines() if line.startswith("| `")]
    assert len(table) == len(collected)
    # a failure's first line comes from pytest's short summary
    failed = "FAILED tests/gpu/test_x.py::test_y[1-nccl] - AssertionError: 0 != 1"
    assert check.outcomes(failed) == {
        "tests/gpu/test_x.py::test_y[1-nccl]": ("FAILED", "AssertionError: 0 != 1")
    }


@pytest.mark.slow
def test_gpu_check_installs_offline_in_a_fresh_venv_and_skips_without_cuda(
    tmp_path: Path,
) -> None:
    # GIVEN syncscope's wheel, built here without the network, as gpu_prepare.py carries it
    wheels = tmp_path / "wheels"
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--no-index", "-q", "-w", str(wheels), str(ROOT)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert build.returncode == 0, build.stderr[-2000:]
    # and a fresh virtual environment that sees this machine's packages (torch among them),
    # as the GPU image's Python does
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    site = tmp_path / "site"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["CUDA_VISIBLE_DEVICES"] = ""  # no GPU, whatever the machine
    # WHEN the check runs there
    proc = subprocess.run(
        [str(venv / "bin" / "python"), str(ROOT / "tools" / "gpu" / "gpu_check.py"),
         "--wheels", str(wheels), "--site", str(site), "--out", str(tmp_path / "out")],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300,
    )  # fmt: skip
    # THEN it installed the wheel offline, imports syncscope from it, and stops, saying why
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    assert f"installed 1 wheels from {wheels} into {site}" in proc.stdout
    assert f"syncscope: {__version__} {site}/syncscope/__init__.py" in proc.stdout
    assert "gpu_check: skipped: no CUDA GPU is visible" in proc.stdout
    assert "nothing here is a GPU result" in proc.stdout
    assert not (tmp_path / "out" / "gpu-rows.md").exists()  # no GPU figure written


@pytest.mark.slow
def test_the_steps_after_the_cuda_gate_run_and_write_the_rows(
    benchmarks: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN the check told that CUDA is there (it is not: the GPU tests then skip, and
    # bench_gpu.py, in its own process, stops with exit 2): every step after the gate runs
    import torch

    check = _module("gpu_check")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(check, "versions", lambda: ["device: none x0", "torch (CPU)"])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    out = tmp_path / "out"
    # WHEN it runs, with no wheels to install
    code = check.main(["--wheels", str(tmp_path / "none"), "--out", str(out), "--workers", "1"])
    # THEN the tests' outcomes and the pair's failure are in the rows it wrote, and the
    # check fails (the pair did not run)
    assert code == 1
    rows = (out / "gpu-rows.md").read_text()
    assert rows.startswith("### ") and rows.splitlines()[0].endswith("none x0")
    assert "0 passed, 0 failed" in rows
    assert "bench_gpu.py did not finish (exit 2)" in rows
    table = [line for line in rows.splitlines() if line.startswith("| `")]
    assert table and all("| skipped |" in line for line in table)
    assert {p.name for p in out.iterdir()} == {
        "gpu-rows.md", "gpu-tests.log", "gpu-junit.xml", "bench-gpu.log",
    }  # fmt: skip
