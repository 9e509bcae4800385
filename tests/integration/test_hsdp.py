"""HSDP (4 gloo ranks, a 2x2 ``("replicate", "shard")`` mesh): advice in HSDP's terms.

Without a toggle the cross-replica all-reduce runs on every micro-batch: the cause names it
and the fix is ``set_requires_all_reduce(is_last)``, with ``set_requires_gradient_sync`` only
as the memory-for-bytes alternative. With ``set_requires_all_reduce(micro == last)`` only the
reduce-scatter runs early, which keeps gradients sharded: a deliberate trade-off (info).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.conftest import LOOPS, profile, run_syncscope

STEP_FUNCTION = Path(__file__).parents[1] / "scripts" / "hsdp_step_function.py"

pytestmark = pytest.mark.slow  # 4-rank profile runs


@pytest.fixture(scope="module")
def hsdp(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    runs = {}
    for pattern in ("hsdp-no-toggle", "hsdp-all-reduce-toggle"):
        run = profile(tmp_path_factory.mktemp(pattern), LOOPS, pattern, nproc=4)
        assert len(run.report["ranks"]) == 4, run.proc.stderr[-2000:]
        runs[pattern] = run
    return runs


def test_all_reduce_every_micro_batch_is_named_and_fixed_with_set_requires_all_reduce(
    hsdp: dict[str, Any],
) -> None:
    run = hsdp["hsdp-no-toggle"]
    for rank in range(4):
        for w in run.complete_windows(rank):  # measured: both reductions on every micro-batch
            assert w["grad_sync_micro_batches"] == [0, 1, 2, 3]
            assert w["collectives"]["reduce_scatter"] > 0 and w["collectives"]["all_reduce"] > 0
    finding = run.finding("redundant-sync")
    assert (finding["cause"], finding["severity"]) == (
        "hsdp-all-reduce-every-micro-batch",
        "warning",
    )
    assert finding["ranks"] == [0, 1, 2, 3]
    assert finding["fix"]["style"] == "hsdp"
    assert "set_requires_all_reduce(is_last)" in finding["fix"]["snippet"]
    # set_requires_gradient_sync appears only as the alternative, with its memory cost
    assert "alternative, set_requires_gradient_sync" in finding["fix"]["summary"]
    assert finding["cost"]["extra_memory_bytes_if_gradient_sync_skipped"] > 0
    assert finding["cost"]["all_reduce_bytes_skipped_per_window"] > 0
    assert (
        finding["cost"]["all_reduce_bytes_skipped_per_window"]
        < finding["cost"]["wasted_bytes_per_window"]
    )


def test_set_requires_all_reduce_toggle_is_sharded_accumulation(hsdp: dict[str, Any]) -> None:
    run = hsdp["hsdp-all-reduce-toggle"]
    no_toggle = hsdp["hsdp-no-toggle"].complete_windows(0)
    for w, every in zip(run.complete_windows(0), no_toggle, strict=True):
        assert w["grad_sync_micro_batches"] == [0, 1, 2, 3]  # reduce-scatter on each
        assert w["collectives"]["reduce_scatter"] == every["collectives"]["reduce_scatter"]
        assert 0 < w["collectives"]["all_reduce"] < every["collectives"]["all_reduce"]
    assert run.report["verdict"] == "clean"
    assert run.kinds() == {("redundant-sync", "fsdp-sharded-accumulation")}
    assert run.finding("redundant-sync")["severity"] == "info"


@pytest.mark.slow
def test_fix_from_an_hsdp_run_rewrites_a_step_function_with_set_requires_all_reduce(
    tmp_path: Path,
) -> None:
    # GIVEN an HSDP run of `training_step(model, opt, batches)` (step after the loop)
    script = tmp_path / "train.py"
    script.write_text(STEP_FUNCTION.read_text())
    for name in ("before", "after"):
        (tmp_path / name).mkdir()
    before = profile(tmp_path / "before", script, nproc=4)
    finding = before.finding("redundant-sync")
    assert finding["cause"] == "hsdp-all-reduce-every-micro-batch"
    # WHEN fixed from that run
    done = run_syncscope(
        "fix",
        "--from",
        str(before.run_dir),
        "--apply",
        "--no-backup",
        "--allow-outside",
        str(script),
    )
    assert done.returncode == 0, done.stderr  # found, and fixed in place
    assert "no finding of the profile" not in done.stdout + done.stderr
    assert "model.set_requires_all_reduce(is_last)" in script.read_text()
    assert "set_requires_gradient_sync" not in script.read_text()
    # THEN the fixed script all-reduces across replicas once per window, keeps its
    # reduce-scatters on every micro-batch, and is the deliberate trade-off (info)
    after = profile(tmp_path / "after", script, nproc=4)
    for rank in range(4):
        for w, was in zip(after.complete_windows(rank), before.complete_windows(rank), strict=True):
            assert w["collectives"]["reduce_scatter"] == was["collectives"]["reduce_scatter"]
            assert 0 < w["collectives"]["all_reduce"] < was["collectives"]["all_reduce"]
    assert after.report["verdict"] == "clean"
    assert after.kinds() == {("redundant-sync", "fsdp-sharded-accumulation")}
