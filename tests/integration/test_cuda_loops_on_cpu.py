"""The GPU tests' loops and their comparison, run on CPU ranks over gloo
(``CUDA_LOOPS_DEVICE=cpu``): tests/scripts/cuda_loops.py counts its own collectives and DDP
buckets, and syncscope's report must equal that count (tests/helpers/truth.py), as
tests/gpu/test_cuda_capture.py checks on CUDA. The world-size-1 fact that holds on CPU as on
the GPU is asserted too: FSDP2 on a shard group of one issues no reduce-scatter.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, ProfiledRun, profile
from tests.helpers.truth import (
    assert_communication_timed,
    assert_matches_truth,
    read_truths,
    truth_windows,
)

pytestmark = pytest.mark.slow

CUDA_LOOPS = ROOT / "tests" / "scripts" / "cuda_loops.py"


def _profile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pattern: str, nproc: int
) -> tuple[ProfiledRun, list[dict[str, Any]]]:
    truth_dir = tmp_path / "truth"
    truth_dir.mkdir()
    monkeypatch.setenv("CUDA_LOOPS_DEVICE", "cpu")
    monkeypatch.setenv("CUDA_LOOPS_TRUTH", str(truth_dir))
    run = profile(tmp_path, CUDA_LOOPS, pattern, nproc=nproc)
    assert run.proc.returncode == 0, run.proc.stderr[-3000:]
    return run, read_truths(truth_dir, nproc)


def test_ddp_backward_only_on_two_cpu_ranks_matches_the_scripts_count(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run, truths = _profile(tmp_path, monkeypatch, "backward_only", 2)
    for truth in truths:
        assert truth["model_type"] == "DistributedDataParallel"
        assert truth["buckets"], truth  # the pass-through hook saw DDP's buckets
    assert_matches_truth(run.report, truths)
    assert_communication_timed(run.report, truths)


def test_fsdp2_on_a_shard_group_of_one_matches_the_scripts_count(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run, truths = _profile(tmp_path, monkeypatch, "fsdp2_toggle", 1)
    assert_matches_truth(run.report, truths)
    (truth,) = truths
    assert truth["collectives"] == []  # no reduce-scatter (nor anything else) at shard size 1
    assert [w["grad_syncs"] for w in truth_windows(truth)] == run.report["grad_syncs_per_window"]


def test_accelerate_on_two_cpu_ranks_matches_the_scripts_count(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the script's windows end where Accelerate really stepped (sync_gradients), and the
    # buckets of the DDP model Accelerate made are counted by the same hook
    run, truths = _profile(tmp_path, monkeypatch, "accelerate", 2)
    for truth in truths:
        assert truth["model_type"] == "DistributedDataParallel"
        assert truth["framework"]["num_processes"] == 2
        assert truth["buckets"], truth
    assert_matches_truth(run.report, truths)
    assert_communication_timed(run.report, truths)
