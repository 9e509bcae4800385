"""DeepSpeed 0.19.8 for real (``DS_ACCELERATOR=cpu``, gloo, 2 ranks, a tiny MLP,
``gradient_accumulation_steps=4``) under ``syncscope profile``: ZeRO stages 0-3 and the
misuses of an engine that accumulates by itself, every count checked against the ground
truth the script takes itself (a wrapper of torch.distributed's API counting each collective
per micro-batch and phase, and the parameters every rank holds after each boundary step),
not against constants.

Needs the ``deepspeed`` extra (see .ci/run: built with ``DS_BUILD_OPS=0`` and no build
isolation). The first DeepSpeed init on a machine compiles its shared-memory op (about
2.5 minutes, cached in the torch extensions directory afterwards). One launch per job,
cached for the session.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, ProfiledRun, profile

SCRIPT = ROOT / "tests" / "scripts" / "frameworks" / "deepspeed_zero.py"
ACCELERATE = ROOT / "tests" / "scripts" / "frameworks" / "accelerate_deepspeed.py"
GAS = 4

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("deepspeed") is None,
        reason="DeepSpeed is not installed (the `deepspeed` extra; .ci/run installs it)",
    ),
]

REDUCING = {"all_reduce", "reduce_scatter_tensor", "reduce_scatter", "reduce"}
GATHERS = {"all_gather_into_tensor", "all_gather"}

_runs: dict[tuple[int, str], tuple[ProfiledRun, list[dict[str, Any]]]] = {}
SHM_OP_BUILD_TIMEOUT = 900  # seconds: about 150 s on 2 shared cores, once per machine

_BUILD_SHM_OP = (
    "from deepspeed.ops.op_builder.cpu.comm import ShareMemCommBuilder; "
    "ShareMemCommBuilder().load(verbose=False); "
    # the HF Trainer's DeepSpeed optimizer on CPU: FusedAdam, compiled at first use
    "from deepspeed.accelerator import get_accelerator; "
    "get_accelerator().create_op_builder('FusedAdamBuilder').load(verbose=False)"
)


def _break_stale_op_locks() -> None:
    """torch's extension lock of a DeepSpeed op whose build was killed (a job stopped by its
    timeout mid-build) is never released, and every later load waits on it forever: one
    older than a build can take is removed first."""
    import time

    from torch.utils.cpp_extension import _get_build_directory

    for op in ("deepspeed_shm_comm", "fused_adam"):
        lock = Path(_get_build_directory(op, False)) / "lock"
        with contextlib.suppress(OSError):
            if time.time() - lock.stat().st_mtime > SHM_OP_BUILD_TIMEOUT:
                lock.unlink()


@pytest.fixture(scope="session")
def shm_op() -> None:
    """DeepSpeed's CPU shared-memory op, compiled once into the torch extensions directory
    (reused by every later session: about 3 s to load) before any job's launch, so that no
    profiled job spends its timeout compiling it."""
    _break_stale_op_locks()
    env = dict(os.environ, DS_ACCELERATOR="cpu")
    proc = subprocess.run(
        [sys.executable, "-c", _BUILD_SHM_OP],
        capture_output=True,
        text=True,
        timeout=SHM_OP_BUILD_TIMEOUT,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.fixture(scope="session")
def deepspeed_job(tmp_path_factory: pytest.TempPathFactory, shm_op: None):  # type: ignore[no-untyped-def]
    """deepspeed_job(stage, mode) -> (run, ground truth of each rank), once per session."""

    def get(stage: int, mode: str = "clean") -> tuple[ProfiledRun, list[dict[str, Any]]]:
        key = (stage, mode)
        if key not in _runs:
            tmp = tmp_path_factory.mktemp(f"deepspeed-{stage}-{mode}")
            truth_dir = tmp / "truth"
            truth_dir.mkdir()
            run = profile(tmp, SCRIPT, str(stage), mode, str(truth_dir))
            assert run.proc.returncode == 0, run.proc.stderr[-4000:]
            truths = [json.loads((truth_dir / f"rank{r}.json").read_text()) for r in (0, 1)]
            _runs[key] = (run, truths)
        return _runs[key]

    return get


def truth_windows(truth: dict[str, Any]) -> list[dict[str, Any]]:
    """Per boundary window, from the script's own count: grad syncs (reductions issued
    inside engine.backward), their bytes and micro-batches, the all-gathers in forward and
    in the step, the micro-batches."""
    out = []
    starts = [-1, *truth["boundaries"]]
    for w in range(len(truth["boundaries"])):
        colls = [c for c in truth["collectives"] if c["window"] == w]
        syncs = [c for c in colls if c["phase"] in ("backward", "user") and c["op"] in REDUCING]
        gathers = [c for c in colls if c["op"] in GATHERS and c["phase"] in ("forward", "step")]
        out.append(
            {
                "micro_batches": starts[w + 1] - starts[w],
                "grad_sync_collectives": len(syncs),
                "grad_sync_bytes": sum(c["bytes"] for c in syncs),
                "grad_sync_micro_batches": sorted({c["micro"] for c in syncs}),
                "all_gather": len(gathers),
            }
        )
    return out


def assert_counts_match_truth(run: ProfiledRun, truths: list[dict[str, Any]]) -> None:
    for rank, truth in enumerate(truths):
        windows = run.complete_windows(rank)
        expected = truth_windows(truth)
        assert len(windows) == len(expected) == 3, (windows, expected)
        for w, t in zip(windows, expected, strict=True):
            measured = {
                "micro_batches": w["micro_batches"],
                "grad_sync_collectives": w["grad_sync_collectives"],
                "grad_sync_bytes": w["grad_sync_bytes"],
                "grad_sync_micro_batches": w["grad_sync_micro_batches"],
                "all_gather": w["collectives"]["all_gather"],
            }
            if w["index"] == 0:  # window 0 also holds deepspeed.initialize's own set-up
                assert measured["all_gather"] >= t["all_gather"]
                measured["all_gather"] = t["all_gather"]
            assert measured == t, (rank, w["index"])


def params_equal(truths: list[dict[str, Any]]) -> list[bool]:
    return [a == b for a, b in zip(truths[0]["params"], truths[1]["params"], strict=True)]


def framework(run: ProfiledRun) -> set[tuple[str, str, int]]:
    return {
        (r["framework"]["name"], r["framework"]["version"], r["framework"]["zero_stage"])
        for r in run.report["ranks"]
    }


@pytest.mark.parametrize("stage", [0, 1])
def test_zero_0_and_1_reduce_once_per_window_and_are_clean(deepspeed_job, stage: int) -> None:  # type: ignore[no-untyped-def]
    # GIVEN DeepSpeed ZeRO-0/1, gas 4, engine.backward + engine.step on every micro-batch
    run, truths = deepspeed_job(stage)
    # THEN every count equals the script's own, on both ranks
    assert_counts_match_truth(run, truths)
    for rank in (0, 1):
        for w in run.complete_windows(rank):
            assert (w["grad_syncs"], w["grad_sync_micro_batches"]) == (1, [GAS - 1])
            assert w["grad_sync_bytes"] == truths[rank]["grad_bytes"]  # the model's gradients
            assert w["fingerprint_match"] is True  # the parameters after the step
    assert all(params_equal(truths))
    assert run.report["verdict"] == "clean", run.report["findings"]
    assert run.report["findings"] == []
    assert framework(run) == {("deepspeed", _ds_version(), stage)}


@pytest.mark.parametrize(("stage", "mode"), [(2, "clean"), (2, "buckets"), (3, "clean")])
def test_zero_2_and_3_reduce_every_micro_batch_as_a_deliberate_trade_off(  # type: ignore[no-untyped-def]
    deepspeed_job, stage: int, mode: str
) -> None:
    # GIVEN ZeRO-2 (also with overlap_comm, contiguous_gradients and small buckets: several
    # collectives per reduction, some from gradient hooks) or ZeRO-3
    run, truths = deepspeed_job(stage, mode)
    assert_counts_match_truth(run, truths)
    for w in run.complete_windows(0):
        # one reduction per micro-batch, however many collectives it takes
        assert w["grad_syncs"] == GAS
        assert w["grad_sync_micro_batches"] == list(range(GAS))
        # ZeRO-3: parameters gathered in the first forward and after the step, in this window
        if stage == 3:
            assert w["collectives"]["all_gather"] >= 2
            # each rank holds its own shard: not compared, never a divergence
            assert w["fingerprint_match"] is None
        else:
            assert w["fingerprint_match"] is True
    assert all(params_equal(truths))
    assert run.report["verdict"] == "clean", run.report["findings"]
    (finding,) = run.report["findings"]
    assert (finding["kind"], finding["cause"], finding["severity"]) == (
        "redundant-sync",
        "zero-partitioned-gradients",
        "info",
    )
    assert finding["fix"]["style"] == "deepspeed-zero-stage"
    assert '"stage": 1' in finding["fix"]["summary"]
    grad_bytes = truths[0]["grad_bytes"]
    assert finding["cost"]["wasted_bytes_per_window"] == (GAS - 1) * grad_bytes
    assert finding["cost"]["redundant_time_ns_per_window"] > 0
    assert finding["cost"]["extra_memory_bytes_if_stage_1"] == grad_bytes // 2
    assert framework(run) == {("deepspeed", _ds_version(), stage)}


def _ds_version() -> str:
    import deepspeed

    return str(deepspeed.__version__)


def params_equal_before(truths: list[dict[str, Any]]) -> list[bool]:
    return [a == b for a, b in zip(*(t["params_before"] for t in truths), strict=False)]


@pytest.mark.parametrize(("stage", "mode"), [(0, "diverge"), (1, "rank0-load")])
def test_rank_divergence_is_still_proven_under_deepspeed(deepspeed_job, stage, mode) -> None:  # type: ignore[no-untyped-def]
    # GIVEN ZeRO-0 where rank 0 alone scales a weight after each boundary step, or ZeRO-1
    # where rank 0 alone changes its weights after deepspeed.initialize (the post-step
    # all-gather of the partitions makes them equal again from window 1 on)
    run, truths = deepspeed_job(stage, mode)
    assert_counts_match_truth(run, truths)
    expected = params_equal_before(truths)  # the script's own comparison
    assert expected == ([True, False, False] if mode == "diverge" else [False, True, True])
    for rank in (0, 1):
        assert [w["fingerprint_match"] for w in run.complete_windows(rank)] == expected
    (finding,) = [f for f in run.report["findings"] if f["kind"] == "rank-divergence"]
    assert finding["severity"] == "error"
    assert finding["windows"] == [i for i, same in enumerate(expected) if not same]


def test_step_once_per_two_micro_batches_is_named(deepspeed_job) -> None:  # type: ignore[no-untyped-def]
    run, truths = deepspeed_job(0, "step-every-2")
    assert_counts_match_truth(run, truths)
    assert [w["micro_batches"] for w in run.complete_windows(0)] == [2 * GAS] * 3
    finding = next(f for f in run.report["findings"] if f["cause"] == "deepspeed-step-every-n")
    assert finding["kind"] == "irregular-window"
    assert finding["evidence"]["micro_batches_per_engine_step"] == 2
    assert finding["fix"]["style"] == "deepspeed-step"
    assert "N x gradient_accumulation_steps" in finding["fix"]["summary"]


def test_manual_all_reduce_beside_deepspeed_is_named(deepspeed_job) -> None:  # type: ignore[no-untyped-def]
    # GIVEN the user all-reduces the gradients on the boundary micro-batch, as DeepSpeed does
    run, truths = deepspeed_job(0, "manual-twice")
    assert_counts_match_truth(run, truths)
    for w in run.complete_windows(0):
        assert w["grad_syncs"] == 2 and w["grad_sync_micro_batches"] == [GAS - 1]
    finding = next(f for f in run.report["findings"] if f["cause"] == "deepspeed-reduced-twice")
    assert finding["kind"] == "redundant-sync"
    assert finding["cost"]["wasted_bytes_per_window"] == truths[0]["grad_bytes"]
    assert finding["fix"]["style"] == "deepspeed-manual-all-reduce"


def test_manual_all_reduce_every_micro_batch_advice_is_not_no_sync(deepspeed_job) -> None:  # type: ignore[no-untyped-def]
    run, truths = deepspeed_job(1, "manual-every")
    assert_counts_match_truth(run, truths)
    causes = {f["cause"]: f for f in run.report["findings"]}
    finding = causes["deepspeed-manual-all-reduce"]
    assert finding["kind"] == "redundant-sync"
    assert finding["fix"]["style"] == "deepspeed-manual-all-reduce"
    for f in run.report["findings"]:
        assert "model.no_sync()" not in (f["fix"] or {}).get("snippet", "")


def test_zero_2_with_gas_1_and_hand_accumulation_loses_gradients(deepspeed_job) -> None:  # type: ignore[no-untyped-def]
    run, truths = deepspeed_job(2, "gas1-by-hand")
    assert_counts_match_truth(run, truths)
    finding = next(
        f for f in run.report["findings"] if f["cause"] == "deepspeed-boundary-every-micro-batch"
    )
    assert (finding["kind"], finding["severity"]) == ("grad-reset-mid-window", "error")
    assert finding["cost"]["lost_share_of_gradient"] == (GAS - 1) / GAS
    assert finding["fix"]["style"] == "deepspeed-gas"


def test_deepspeed_under_accelerate_is_recorded_as_deepspeed_and_clean(profiled, shm_op) -> None:  # type: ignore[no-untyped-def]
    # GIVEN Accelerate's DeepSpeedPlugin (ZeRO-1, gas 4), accumulate() and optimizer.step()
    run = profiled(ACCELERATE, "1")
    assert run.proc.returncode == 0, run.proc.stderr[-3000:]
    out = run.proc.stdout + run.proc.stderr
    grad_bytes = int(re.search(r"grad_bytes=(\d+)", out).group(1))  # type: ignore[union-attr]
    for rank in (0, 1):
        batches = int(re.search(rf"rank{rank}_batches=(\d+)", out).group(1))  # type: ignore[union-attr]
        windows = run.complete_windows(rank)
        assert len(windows) == batches // GAS
        for w in windows:
            assert (w["micro_batches"], w["grad_syncs"]) == (GAS, 1)
            assert w["grad_sync_micro_batches"] == [GAS - 1]
            assert w["grad_sync_bytes"] == grad_bytes
            assert w["fingerprint_match"] is True
    assert run.report["verdict"] == "clean", run.report["findings"]
    assert framework(run) == {("deepspeed", _ds_version(), 1)}


TRAINER = ROOT / "tests" / "scripts" / "frameworks" / "hf_trainer_deepspeed.py"


@pytest.mark.parametrize("stage", [1, 2])
def test_deepspeed_under_the_hf_trainer_is_recorded_as_deepspeed(  # type: ignore[no-untyped-def]
    tmp_path_factory, shm_op, stage: int
) -> None:
    # GIVEN the HF Trainer with TrainingArguments(deepspeed={... ZeRO stage}), gas 4, 3 steps,
    # on 2 CPU ranks (a PartialState(backend="gloo") made first: see the script)
    pytest.importorskip("transformers")
    tmp = tmp_path_factory.mktemp(f"trainer-deepspeed-{stage}")
    truth_dir = tmp / "truth"
    truth_dir.mkdir()
    run = profile(tmp, TRAINER, str(stage), str(truth_dir))
    assert run.proc.returncode == 0, run.proc.stderr[-4000:]
    truths = [json.loads((truth_dir / f"rank{r}.json").read_text()) for r in (0, 1)]
    # THEN the framework is DeepSpeed with its stage, not the Trainer or Accelerate
    assert framework(run) == {("deepspeed", _ds_version(), stage)}
    for rank, truth in enumerate(truths):
        assert truth["world_size"] == 2  # the Trainer's own world size
        windows = run.complete_windows(rank)
        expected = truth_windows(truth)
        assert len(windows) == len(expected) == 3, (windows, expected)
        for w, t in zip(windows, expected, strict=True):
            gathers = [
                c for c in truth["collectives"] if c["window"] == w["index"] and c["op"] in GATHERS
            ]
            measured = {
                "micro_batches": w["micro_batches"],
                "grad_sync_collectives": w["grad_sync_collectives"],
                "grad_sync_bytes": w["grad_sync_bytes"],
                "grad_sync_micro_batches": w["grad_sync_micro_batches"],
                "all_gather": len(gathers),  # also the Trainer's own gathers of its counts
            }
            assert measured == {**t, "all_gather": w["collectives"]["all_gather"]}, (rank, w)
            # ZeRO-1 reduces once per window, ZeRO-2 on every micro-batch
            syncs = (1, [GAS - 1]) if stage == 1 else (GAS, list(range(GAS)))
            assert (w["grad_syncs"], w["grad_sync_micro_batches"]) == syncs
            assert w["grad_sync_bytes"] == (1 if stage == 1 else GAS) * truth["grad_bytes"]
            assert w["fingerprint_match"] is True
    assert run.report["verdict"] == "clean", run.report["findings"]
    causes = {f["cause"] for f in run.report["findings"]}
    assert causes == (set() if stage == 1 else {"zero-partitioned-gradients"})
