"""Smoke runs of benchmarks/internals/: the diagnostics that patch syncscope's private capture
internals. Each runs once with its smallest arguments, in one process of one gloo rank (the
launcher's environment set by hand: no torchrun), and must print its figures: a change to
the internals they patch shows up here, not on the day someone needs the diagnostic."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
INTERNALS = ROOT / "benchmarks" / "internals"
TIMEOUT_S = 120


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(script: str, *args: str) -> str:
    """``script`` as rank 0 of a world of 1; its stdout (the test fails on a non-zero exit)."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = dict(
        os.environ, PYTHONPATH=path, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore",
        RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_port()),
    )  # fmt: skip
    proc = subprocess.run(
        [sys.executable, str(INTERNALS / script), *args],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=TIMEOUT_S,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc.stdout


@pytest.mark.slow
def test_capture_breakdown_prints_a_row_per_variant() -> None:
    out = _run(
        "capture_breakdown.py", "--rounds", "1", "--layers", "1", "--hidden", "32",
        "--batch", "4", "--variants", "all hooks",
    )  # fmt: skip
    rows = [line.split(" wall ")[0].strip() for line in out.splitlines() if " wall " in line]
    assert rows == ["plain", "all hooks"]
    assert "plain                wall" in out and "paired x" in out and "us/window)" in out


@pytest.mark.slow
def test_hook_time_prints_the_time_inside_the_recorder_by_hook() -> None:
    out = _run("hook_time.py", "--tiny", "--windows", "2")
    assert out.startswith("window ") and "inside the recorder" in out
    assert any(
        line.startswith("  hook ") and line.endswith("us/window") for line in out.splitlines()
    )


@pytest.mark.slow
def test_hook_bytecodes_counts_what_capture_adds() -> None:
    out = _run("hook_bytecodes.py", "--windows", "1", "--top", "3")
    first = out.splitlines()[0]
    assert first.startswith("mlp: ") and "bytecodes per window plain" in first
    assert " captured (+" in first and first.endswith(", 1 windows")


@pytest.mark.slow
def test_hook_wrapping_compares_the_three_wrappings() -> None:
    out = _run("hook_wrapping.py", "--rounds", "1", "--calls", "200", "--steps", "3")
    assert "hook call, bare function:" in out and "hook call, opaque():" in out
    assert "captured micro-batch + step, hooks disable:" in out
    assert "opaque / bare: median of 1 paired rounds" in out
