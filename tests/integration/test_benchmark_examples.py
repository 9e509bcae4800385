"""The benchmark workloads that are examples/ scripts, wrapped from outside by
benchmarks/workloads/run_example.py (``_bench.ExampleBench``): they time their windows and
print the ``SYNCSCOPE_BENCH`` line; run by itself the example prints what it always did."""

from __future__ import annotations

import itertools
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"
WORKLOADS = BENCHMARKS / "workloads"
MARK = "SYNCSCOPE_BENCH "


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(script: Path, *args: str, bench: bool) -> str:
    """``script`` as rank 0 of a world of 1 (no launcher), with ``bench`` through the
    harness's wrapper; its stdout."""
    paths = [str(ROOT), *([str(WORKLOADS)] if bench else []), os.environ.get("PYTHONPATH", "")]
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(p for p in paths if p), OMP_NUM_THREADS="1",
        PYTHONWARNINGS="ignore", RANK="0", LOCAL_RANK="0", WORLD_SIZE="1",
        LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_port()),
    )  # fmt: skip
    wrapper = [str(WORKLOADS / "run_example.py")] if bench else []
    proc = subprocess.run(
        [sys.executable, *wrapper, str(script), *args],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc.stdout


def test_every_example_workload_names_its_configuration_back() -> None:
    # the harness's configuration -> example map and the clock's example -> configuration map
    sys.path[:0] = [str(BENCHMARKS), str(WORKLOADS)]
    try:
        from _bench import EXAMPLE_CONFIGS
        from _harness import EXAMPLE_WORKLOADS, EXAMPLES, script_argv, workload
    finally:
        del sys.path[:2]
    assert {f"{stem}.py": name for stem, name in EXAMPLE_CONFIGS.items()} == {
        script: name for name, script in EXAMPLE_WORKLOADS.items()
    }
    for name, script in EXAMPLE_WORKLOADS.items():
        assert workload(name) == workload(f"{name}.py") == EXAMPLES / script
        assert workload(name).is_file()
        # an example starts through the wrapper; the workloads of benchmarks/ by themselves
        assert script_argv(workload(name)) == [
            str(WORKLOADS / "run_example.py"),
            str(EXAMPLES / script),
        ]
    assert workload("alternating") == WORKLOADS / "alternating.py"
    assert script_argv(workload("alternating")) == [str(WORKLOADS / "alternating.py")]


def test_the_examples_know_nothing_of_benchmarks() -> None:
    for script in (ROOT / "examples").glob("*.py"):
        text = script.read_text(encoding="utf-8")
        assert "SYNCSCOPE_BENCH" not in text and "_bench" not in text, script.name


@pytest.mark.slow
@pytest.mark.parametrize(
    ("example", "config"),
    [
        ("ddp_sync_every_step.py", "sync_every_microbatch"),
        ("accelerate_accumulate.py", "accelerate_accumulate"),
        ("fsdp2_toggle.py", "fsdp2_last_only"),
    ],
)
def test_an_example_run_as_a_workload_prints_its_timed_windows(example: str, config: str) -> None:
    args = ("--hidden", "32", "--layers", "2", "--batch", "4", "--windows", "2", "--warmup", "1")
    out = _run(ROOT / "examples" / example, *args, bench=True)
    lines = out.splitlines()
    assert len(lines) == 1 and lines[0].startswith(MARK)  # no "step N loss" lines
    record = json.loads(lines[0][len(MARK) :])
    assert record["config"] == config
    assert len(record["window_s"]) == 2 and len(record["warmup_s"]) == 1
    assert len(record["window_cpu_s"]) == len(record["window_thread_cpu_s"]) == 2
    assert (record["accum"], record["layers"], record["hidden"], record["batch"]) == (4, 2, 32, 4)
    assert record["world_size"] == 1 and record["torch_profiler"] is False


@pytest.mark.slow
def test_an_example_run_by_itself_is_the_example() -> None:
    out = _run(ROOT / "examples" / "ddp_sync_every_step.py", bench=False)
    assert [line.split(" loss ")[0] for line in out.splitlines()] == [f"step {i}" for i in range(6)]
    assert MARK.strip() not in out
    # the example learns: at its default size (the tests' size) its loss falls every step
    losses = [float(line.split(" loss ")[1]) for line in out.splitlines()]
    assert all(later < earlier for earlier, later in itertools.pairwise(losses)), losses
