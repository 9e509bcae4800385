"""The CUDA/NCCL path on a real GPU (issue 16): capture, memory, traces with NCCL kernels.

Marked ``gpu``: without CUDA these are skipped with that reason and never counted as a pass
(tests/conftest.py). They run on one GPU: NCCL at world size 1 (DDP still all-reduces), and
DDP over gloo on CUDA tensors for two ranks sharing the GPU (NCCL refuses that).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from syncscope.analysis.assemble import load_run
from tests.conftest import ROOT, ProfiledRun, profile, run_syncscope

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

CUDA_LOOPS = ROOT / "tests" / "scripts" / "cuda_loops.py"

DDP_CASES = [
    # pattern, grad syncs per window, on micro-batches
    ("every", 4, [0, 1, 2, 3]),
    ("backward_only", 4, [0, 1, 2, 3]),
    ("no_sync", 1, [3]),
    ("accelerate", 1, [3]),
]
LAUNCHES = [(1, "nccl"), (2, "gloo")]


def _profile(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    pattern: str,
    nproc: int,
    backend: str,
    options: tuple[str, ...] = (),
) -> ProfiledRun:
    monkeypatch.setenv("CUDA_LOOPS_BACKEND", backend)
    return profile(tmp_path, CUDA_LOOPS, pattern, nproc=nproc, options=options)


@pytest.mark.parametrize(("nproc", "backend"), LAUNCHES)
@pytest.mark.parametrize(("pattern", "syncs", "positions"), DDP_CASES)
def test_ddp_on_cuda_counts_exactly(  # type: ignore[no-untyped-def]
    tmp_path, monkeypatch, pattern, syncs, positions, nproc, backend
) -> None:
    run = _profile(tmp_path, monkeypatch, pattern, nproc, backend)
    assert run.proc.returncode == 0, run.proc.stderr[-3000:]
    assert run.report["grad_syncs_per_window"] == [syncs, syncs]
    for rank in range(nproc):
        assert run.report["ranks"][rank]["device"] == "cuda"
        windows = run.complete_windows(rank)
        assert len(windows) == 2
        for w in windows:
            assert w["micro_batches"] == 4
            assert w["grad_syncs"] == syncs
            assert w["grad_sync_micro_batches"] == positions
            assert w["peak_memory_bytes"] > 0  # from the CUDA allocator, not RSS
    # the completion of asynchronous work is noticed, after its issue
    model = load_run(run.run_dir)
    for rank_run in model.ranks:
        for window in rank_run.windows:
            for c in window.grad_sync_collectives:
                assert c.done_ns is not None, c
                assert c.done_ns >= c.start_ns


def test_cuda_peak_memory_is_the_allocator_peak(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # a wider model must show a higher device peak: the figure tracks the allocator
    small = _profile(tmp_path / "s", monkeypatch, "no_sync", 1, "nccl")
    monkeypatch.setenv("CUDA_LOOPS_WIDTH", "2048")
    large = _profile(tmp_path / "l", monkeypatch, "no_sync", 1, "nccl")
    peak = [w["peak_memory_bytes"] for w in small.complete_windows(0)]
    peak_large = [w["peak_memory_bytes"] for w in large.complete_windows(0)]
    # 3 x Linear(2048, 2048) in fp32 with grads: at least 100 MB more than 3 x Linear(256, 256)
    assert min(peak_large) - max(peak) > 100 * 2**20, (peak, peak_large)


@pytest.mark.parametrize("pattern", ["fsdp1_no_sync", "fsdp2_toggle"])
def test_fsdp_skipped_sync_reports_unsharded_grad_memory(tmp_path, monkeypatch, pattern) -> None:  # type: ignore[no-untyped-def]
    run = _profile(tmp_path, monkeypatch, pattern, 1, "nccl")
    assert run.proc.returncode == 0, run.proc.stderr[-3000:]
    assert run.report["grad_syncs_per_window"] == [1, 1]
    finding = run.finding("unsharded-grad-memory")
    assert finding["severity"] == "info"
    assert finding["cost"]["peak_memory_bytes"] > 0  # measured on the device


@pytest.mark.parametrize(("pattern", "syncs"), [("hsdp_no_toggle", 4), ("hsdp_toggle", 4)])
def test_hsdp_on_a_one_by_one_mesh(tmp_path, monkeypatch, pattern, syncs) -> None:  # type: ignore[no-untyped-def]
    # 1 x 1 mesh: the reduce-scatter runs every micro-batch either way (the toggle only
    # skips the cross-replica all-reduce), so both read as deliberate sharded accumulation
    run = _profile(tmp_path, monkeypatch, pattern, 1, "nccl")
    assert run.proc.returncode == 0, run.proc.stderr[-3000:]
    assert run.report["grad_syncs_per_window"] == [syncs, syncs]
    assert run.report["verdict"] != "errors", run.report["findings"]


def test_trace_with_nccl_kernels_counts_as_live_capture(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    run = _profile(
        tmp_path, monkeypatch, "no_sync", 1, "nccl", options=("--trace", "--trace-windows", "1:2")
    )
    assert run.proc.returncode == 0, run.proc.stderr[-3000:]
    live = run.complete_windows(0)[1]
    out = tmp_path / "analyzed"
    proc = run_syncscope(
        "analyze", "-q", "--fail-on", "never", "--hta", "--out", str(out),
        str(run.run_dir / "traces"),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    (window,) = report["ranks"][0]["windows"]
    assert window["grad_syncs"] == live["grad_syncs"] == 1
    assert window["micro_batches"] == live["micro_batches"] == 4
    assert window["collectives"]["all_reduce"] == live["collectives"]["all_reduce"]
    # exposed communication measured from the GPU's NCCL kernels
    assert window["comm_ns"] is not None and window["comm_ns"] > 0
    assert window["exposed_comm_ns"] is not None and window["exposed_comm_ns"] >= 0


def test_compiled_inductor_on_cuda_adds_no_graph_breaks(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    plain_dir = tmp_path / "plain"
    plain_dir.mkdir()
    env = dict(
        os.environ,
        CUDA_LOOPS_BACKEND="nccl",
        CUDA_LOOPS_COUNTERS=str(plain_dir),
        OMP_NUM_THREADS="1",
    )
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1",
         str(CUDA_LOOPS), "compiled_no_sync"],
        capture_output=True, text=True, env=env, timeout=600, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    profiled_dir = tmp_path / "profiled"
    profiled_dir.mkdir()
    monkeypatch.setenv("CUDA_LOOPS_COUNTERS", str(profiled_dir))
    run = _profile(tmp_path, monkeypatch, "compiled_no_sync", 1, "nccl")
    assert run.proc.returncode == 0, run.proc.stderr[-3000:]
    assert run.report["grad_syncs_per_window"] == [1, 1]
    assert "syncscope" not in run.proc.stderr.lower().replace("syncscope:", "")
    plain = json.loads((plain_dir / "counters-0.json").read_text())
    profiled = json.loads((profiled_dir / "counters-0.json").read_text())
    for key in ("graph_break", "recompiles"):
        assert profiled.get(key, {}) == plain.get(key, {}), key
    assert profiled.get("stats", {}).get("unique_graphs") == plain.get("stats", {}).get(
        "unique_graphs"
    )
