"""Real training frameworks under ``syncscope profile`` on 2 gloo ranks: Lightning's Trainer
(last micro-batch inside ``optimizer.step(closure)``), the Hugging Face Trainer (DDP with
``find_unused_parameters``) and Accelerate's ``accumulate()``. Exact counts per window, the
verdict, the framework recorded, and grad-sync bytes equal to the model's gradient bytes
(printed by the script itself). Scripts: tests/scripts/frameworks/ and examples/.
"""

from __future__ import annotations

import re

import pytest

from tests.conftest import EXAMPLES, ROOT, ProfiledRun

FRAMEWORKS = ROOT / "tests" / "scripts" / "frameworks"
LIGHTNING = FRAMEWORKS / "lightning_accumulate.py"
HF_TRAINER = FRAMEWORKS / "hf_trainer.py"

pytestmark = pytest.mark.slow


def grad_bytes(run: ProfiledRun) -> int:
    found = re.search(r"grad_bytes=(\d+)", run.proc.stdout + run.proc.stderr)
    assert found, run.proc.stdout[-2000:] + run.proc.stderr[-2000:]
    return int(found.group(1))


def assert_windows(run: ProfiledRun, accum: int, syncs: int, positions: list[int]) -> None:
    assert run.proc.returncode == 0, run.proc.stderr[-3000:]
    expected_bytes = grad_bytes(run) * syncs
    for rank in (0, 1):
        windows = run.complete_windows(rank)
        assert len(windows) == 2, windows
        for w in windows:
            assert w["micro_batches"] == accum
            assert (w["grad_syncs"], w["grad_sync_micro_batches"]) == (syncs, positions)
            assert w["grad_sync_collectives"] == syncs  # one bucket per sync: a tiny model
            assert w["grad_sync_bytes"] == expected_bytes
            assert w["fingerprint_match"] is True
    assert run.report["grad_syncs_per_window"] == [syncs, syncs]


def framework(run: ProfiledRun) -> set[tuple[str, str]]:
    return {(r["framework"]["name"], r["framework"]["version"]) for r in run.report["ranks"]}


def test_lightning_accumulate_4_with_sync_dist_logging_is_clean(profiled) -> None:  # type: ignore[no-untyped-def]
    # GIVEN Lightning (accumulate_grad_batches=4) logging the loss with sync_dist=True
    run = profiled(LIGHTNING, "4", "log")
    # THEN one sync per window, on the last micro-batch (run inside optimizer.step(closure))
    assert_windows(run, accum=4, syncs=1, positions=[3])
    assert run.report["verdict"] == "clean", run.report["findings"]
    assert run.report["findings"] == []
    # the 1-element loss all-reduce of every micro-batch is a collective, not a grad sync
    w1 = run.complete_windows(0)[1]
    assert w1["collectives"]["all_reduce"] == 4 + 1
    import lightning

    assert framework(run) == {("lightning", lightning.__version__)}


def test_lightning_without_accumulation_is_clean(profiled) -> None:  # type: ignore[no-untyped-def]
    run = profiled(LIGHTNING, "1")
    assert_windows(run, accum=1, syncs=1, positions=[0])
    assert run.report["verdict"] == "clean", run.report["findings"]
    assert run.complete_windows(0)[1]["collectives"]["all_reduce"] == 1


def test_hf_trainer_accumulate_4_is_clean(profiled) -> None:  # type: ignore[no-untyped-def]
    run = profiled(HF_TRAINER)
    assert_windows(run, accum=4, syncs=1, positions=[3])
    assert run.report["verdict"] == "clean", run.report["findings"]
    # find_unused_parameters: DDP's int used-parameter map is all-reduced beside the bucket,
    # counted as a collective of the window but not in the grad-sync bytes
    assert run.complete_windows(0)[1]["collectives"]["all_reduce"] == 2
    import transformers

    assert framework(run) == {("transformers", transformers.__version__)}


def test_hf_trainer_sync_each_batch_is_deliberate_with_trainer_advice(profiled) -> None:  # type: ignore[no-untyped-def]
    run = profiled(HF_TRAINER, "sync-each-batch")
    assert_windows(run, accum=4, syncs=4, positions=[0, 1, 2, 3])
    assert run.report["verdict"] == "clean"
    (finding,) = run.report["findings"]
    assert (finding["kind"], finding["cause"], finding["severity"]) == (
        "redundant-sync",
        "sync-each-batch",
        "info",
    )
    assert finding["fix"]["style"] == "hf-trainer-sync-each-batch"
    assert "accelerator_config" in finding["fix"]["snippet"]
    assert finding["cost"]["wasted_bytes_per_window"] == 3 * grad_bytes(run)


def test_accelerate_accumulate_is_clean_and_recorded(profiled) -> None:  # type: ignore[no-untyped-def]
    run = profiled(EXAMPLES / "accelerate_accumulate.py", "--steps", "2")
    assert run.proc.returncode == 0, run.proc.stderr[-3000:]
    hidden, layers = 32, 2  # examples/common.py defaults
    model_grad_bytes = layers * (hidden * hidden + hidden) * 4
    for rank in (0, 1):
        for w in run.complete_windows(rank):
            assert (w["micro_batches"], w["grad_syncs"]) == (4, 1)
            assert w["grad_sync_micro_batches"] == [3]
            assert w["grad_sync_bytes"] == model_grad_bytes
    assert run.report["verdict"] == "clean"
    import accelerate

    assert framework(run) == {("accelerate", accelerate.__version__)}
