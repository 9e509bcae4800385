"""The CUDA/NCCL path on a real GPU: capture, memory, traces with NCCL kernels.

Marked ``gpu``: without CUDA these are skipped with that reason and never counted as a pass
(tests/conftest.py). They run on one GPU: NCCL at world size 1, and gloo on CUDA tensors for
two ranks sharing the GPU (NCCL refuses that).

Every count is checked against the ground truth the script takes itself, without syncscope
(tests/scripts/cuda_loops.py, ``CUDA_LOOPS_TRUTH``: the ``torch.distributed`` collectives of
each micro-batch and phase, and a DDP model's buckets through a pass-through comm hook),
compared by tests/helpers/truth.py, the comparison tests/integration/test_cuda_loops_on_cpu.py
runs on CPU ranks. The world-size-1 facts of the first GPU run (H100, torch 2.11, 2026-11-27,
docs/gpu.md) are asserted on that count: Accelerate with one process wraps nothing in DDP and
issues no collective; FSDP2 on a shard group of one reduce-scatters nothing; HSDP on a 1 x 1
mesh keeps the replicate all-reduce. Communication time is asserted positive only where
communication happens (two ranks over gloo); NCCL at world size 1 launches no kernel.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from syncscope.load.runs import load_run
from tests.conftest import ROOT, ProfiledRun, profile, run_syncscope
from tests.helpers.truth import (
    assert_communication_timed,
    assert_matches_truth,
    read_truths,
    truth_windows,
)

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

CUDA_LOOPS = ROOT / "tests" / "scripts" / "cuda_loops.py"
LAUNCHES = [(1, "nccl"), (2, "gloo")]
FACTS = "a world-size-1 fact of docs/gpu.md no longer holds on this stack: update the docs"


def _profile(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    pattern: str,
    nproc: int,
    backend: str,
    options: tuple[str, ...] = (),
) -> tuple[ProfiledRun, list[dict[str, Any]]]:
    """The profiled run and each rank's own count of it."""
    truth_dir = tmp_path / "truth"
    truth_dir.mkdir(parents=True)
    monkeypatch.setenv("CUDA_LOOPS_BACKEND", backend)
    monkeypatch.setenv("CUDA_LOOPS_TRUTH", str(truth_dir))
    run = profile(tmp_path, CUDA_LOOPS, pattern, nproc=nproc, options=options)
    assert run.proc.returncode == 0, run.proc.stderr[-3000:]
    return run, read_truths(truth_dir, nproc)


def _assert_on_cuda(run: ProfiledRun, truths: list[dict[str, Any]]) -> None:
    for truth in truths:
        assert truth["device"].startswith("cuda"), truth["device"]
        assert run.report["ranks"][truth["rank"]]["device"] == "cuda"


def _assert_completion_seen(run: ProfiledRun) -> None:
    """The completion of asynchronous work is noticed, after its issue."""
    for rank_run in load_run(run.run_dir).ranks:
        for window in rank_run.windows:
            for c in window.grad_sync_collectives:
                assert c.done_ns is not None, c
                assert c.done_ns >= c.start_ns


def _assert_peak_at_least_allocated(run: ProfiledRun, truths: list[dict[str, Any]]) -> None:
    """The device peak of a window is at least what the allocator held after any of its
    backward passes (the script's own torch.cuda.memory_allocated), and within the card."""
    import torch

    total = torch.cuda.get_device_properties(0).total_memory
    for truth in truths:
        windows = run.complete_windows(truth["rank"])
        assert len(truth["allocated"]) == len(windows)
        for w, allocated in zip(windows, truth["allocated"], strict=True):
            assert allocated <= w["peak_memory_bytes"] <= total, (w, allocated)


@pytest.mark.parametrize(("nproc", "backend"), LAUNCHES)
@pytest.mark.parametrize("pattern", ["every", "backward_only", "no_sync"])
def test_ddp_on_cuda_counts_what_ddp_reduced(  # type: ignore[no-untyped-def]
    tmp_path, monkeypatch, pattern, nproc, backend
) -> None:
    run, truths = _profile(tmp_path, monkeypatch, pattern, nproc, backend)
    for truth in truths:
        assert truth["model_type"] == "DistributedDataParallel"
        # the counter saw DDP reduce: at least the last micro-batch of every window syncs
        assert all(w["grad_syncs"] >= 1 for w in truth_windows(truth)), truth
    assert_matches_truth(run.report, truths)
    _assert_on_cuda(run, truths)
    _assert_completion_seen(run)
    _assert_peak_at_least_allocated(run, truths)
    if nproc == 2:
        assert_communication_timed(run.report, truths)


@pytest.mark.parametrize(("nproc", "backend"), LAUNCHES)
def test_accelerate_on_cuda_counts_what_accelerate_did(  # type: ignore[no-untyped-def]
    tmp_path, monkeypatch, nproc, backend
) -> None:
    import torch

    if nproc > torch.cuda.device_count():
        # Accelerate hands DDP device_ids=[local rank] (cuda:1 on a one-GPU machine, where
        # DDP fails); its own switch makes DDP take the module's device, which Accelerate put
        # on cuda:(local rank % GPUs)
        monkeypatch.setenv("ACCELERATE_BYPASS_DEVICE_MAP", "true")
    run, truths = _profile(tmp_path, monkeypatch, "accelerate", nproc, backend)
    assert_matches_truth(run.report, truths)
    _assert_on_cuda(run, truths)
    if nproc == 1:
        # one process: Accelerate leaves the model as it is, and nothing communicates
        (truth,) = truths
        assert truth["framework"]["num_processes"] == 1, truth["framework"]
        assert truth["model_type"] != "DistributedDataParallel", FACTS
        assert truth["collectives"] == [] and truth["buckets"] == [], FACTS
        assert run.report["grad_syncs_per_window"] == [0, 0]
    else:
        for truth in truths:
            assert truth["model_type"] == "DistributedDataParallel"
            assert truth["buckets"], truth
        assert_communication_timed(run.report, truths)


def test_cuda_peak_memory_is_the_allocator_peak(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # a wider model must show a higher device peak: the figure tracks the allocator
    small, small_truth = _profile(tmp_path / "s", monkeypatch, "no_sync", 1, "nccl")
    monkeypatch.setenv("CUDA_LOOPS_WIDTH", "2048")
    large, large_truth = _profile(tmp_path / "l", monkeypatch, "no_sync", 1, "nccl")
    _assert_peak_at_least_allocated(small, small_truth)
    _assert_peak_at_least_allocated(large, large_truth)
    peak = [w["peak_memory_bytes"] for w in small.complete_windows(0)]
    peak_large = [w["peak_memory_bytes"] for w in large.complete_windows(0)]
    assert min(large_truth[0]["allocated"]) > max(peak)  # the wider model needs more
    assert min(peak_large) > max(peak), (peak, peak_large)


def test_fsdp1_no_sync_reports_unsharded_grad_memory(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    run, truths = _profile(tmp_path, monkeypatch, "fsdp1_no_sync", 1, "nccl")
    assert_matches_truth(run.report, truths)
    assert truths[0]["model_type"] == "FullyShardedDataParallel"
    finding = run.finding("unsharded-grad-memory")
    assert finding["severity"] == "info"
    assert finding["cost"]["peak_memory_bytes"] > 0  # measured on the device


def test_fsdp2_on_a_shard_group_of_one_reduces_nothing(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    run, truths = _profile(tmp_path, monkeypatch, "fsdp2_toggle", 1, "nccl")
    assert_matches_truth(run.report, truths)
    (truth,) = truths
    assert not [c for c in truth["collectives"] if "reduce_scatter" in c["op"]], FACTS
    assert run.report["grad_syncs_per_window"] == [0, 0]


@pytest.mark.parametrize("pattern", ["hsdp_no_toggle", "hsdp_toggle"])
def test_hsdp_on_a_one_by_one_mesh_keeps_the_replicate_all_reduce(  # type: ignore[no-untyped-def]
    tmp_path, monkeypatch, pattern
) -> None:
    run, truths = _profile(tmp_path, monkeypatch, pattern, 1, "nccl")
    assert_matches_truth(run.report, truths)
    (truth,) = truths
    ops = {c["op"] for c in truth["collectives"] if c["phase"] == "backward"}
    assert ops == {"all_reduce"}, FACTS  # no reduce-scatter at shard size 1
    # the toggle skips the all-reduce on all but the last micro-batch
    last = [w["micro_batches"] - 1 for w in truth_windows(truth)]
    positions = [w["grad_sync_micro_batches"] for w in truth_windows(truth)]
    if pattern == "hsdp_toggle":
        assert positions == [[m] for m in last], FACTS
    else:
        assert positions == [list(range(m + 1)) for m in last], FACTS


def _nccl_kernels(trace: Path) -> list[dict[str, Any]]:
    """The NCCL kernels of a Kineto trace, read from the file itself."""
    with gzip.open(trace, "rt") as f:
        events = json.load(f).get("traceEvents", [])
    return [
        e
        for e in events
        if e.get("cat") == "kernel"
        and str(e.get("name", "")).startswith(("nccl", "ncclKernel", "ncclDevKernel"))
    ]


def test_trace_with_nccl_counts_as_live_capture_and_times_only_kernels(  # type: ignore[no-untyped-def]
    tmp_path, monkeypatch
) -> None:
    run, truths = _profile(
        tmp_path, monkeypatch, "no_sync", 1, "nccl", options=("--trace", "--trace-windows", "1:2")
    )
    assert_matches_truth(run.report, truths)
    live = run.complete_windows(0)[1]
    out = tmp_path / "analyzed"
    proc = run_syncscope(
        "analyze", "-q", "--fail-on", "never", "--hta", "--out", str(out),
        str(run.run_dir / "traces"),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    (window,) = report["ranks"][0]["windows"]
    expected = truth_windows(truths[0])[1]
    for key in ("grad_syncs", "micro_batches", "grad_sync_micro_batches"):
        assert window[key] == live[key] == expected[key], key
    assert window["collectives"]["all_reduce"] == expected["all_reduce"]
    # communication time comes from NCCL kernels: NCCL at world size 1 launches none, so the
    # trace's figure is 0 there; it is positive only where the trace holds such kernels
    kernels = _nccl_kernels(run.run_dir / "traces" / "rank-0.json.gz")
    if kernels:
        assert window["comm_ns"] > 0
    else:
        assert window["comm_ns"] == 0
    assert window["exposed_comm_ns"] is not None and window["exposed_comm_ns"] >= 0


def test_compiled_inductor_on_cuda_adds_no_graph_breaks(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    plain_dir = tmp_path / "plain"
    plain_dir.mkdir()
    env = dict(
        os.environ,
        CUDA_LOOPS_BACKEND="nccl",
        CUDA_LOOPS_COUNTERS=str(plain_dir),
        CUDA_LOOPS_TRUTH=str(plain_dir),
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
    run, truths = _profile(tmp_path / "run", monkeypatch, "compiled_no_sync", 1, "nccl")
    assert_matches_truth(run.report, truths)
    # the loop reduced the same under capture as without it
    (plain_truth,) = read_truths(plain_dir, 1)
    assert truth_windows(plain_truth) == truth_windows(truths[0])
    assert "syncscope" not in run.proc.stderr.lower().replace("syncscope:", "")
    plain = json.loads((plain_dir / "counters-0.json").read_text())
    profiled = json.loads((profiled_dir / "counters-0.json").read_text())
    for key in ("graph_break", "recompiles"):
        assert profiled.get(key, {}) == plain.get(key, {}), key
    assert profiled.get("stats", {}).get("unique_graphs") == plain.get("stats", {}).get(
        "unique_graphs"
    )
