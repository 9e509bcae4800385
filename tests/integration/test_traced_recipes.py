"""torch's recipes traced by torch.profiler alone (no syncscope in the run), then read by
``syncscope analyze``: what a Chrome trace can tell, checked against the count the recipe's
truth makes (tests/helpers/truth.py) and against what a trace cannot tell.

- GradScaler skipping steps: the trace has no ``Optimizer.step#`` span for a skipped step,
  but GradScaler's ``update()`` (``aten::_amp_update_scale_``) still ends the window.
- Two models stepped in one loop (DDP or FSDP2): the trace names no model, but each model's
  gradient reductions keep their sizes: each size is a model of its own, judged on its own,
  and one line says what the trace cannot tell.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from syncscope.text import human_bytes
from tests.conftest import ROOT, run_syncscope, torchrun

pytestmark = pytest.mark.slow

RECIPES = ROOT / "tests" / "scripts" / "recipes"
WINDOWS = 3


def _traced(tmp: Path, recipe: str, *args: str) -> tuple[dict[str, Any], dict[int, Any]]:
    """(the report of ``syncscope analyze`` on the recipe's traces, its truth by rank)."""
    traces, truth_dir, out = tmp / "traces", tmp / "truth", tmp / "report"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("BUG_TRUTH_DIR", str(truth_dir))
        proc = torchrun(
            RECIPES / "traced.py", str(traces), recipe, *args, writes=[traces, truth_dir]
        )
    assert proc.returncode == 0, proc.stderr[-3000:]
    done = run_syncscope("analyze", str(traces), "--out", str(out), "--quiet")
    assert done.returncode in (0, 1), done.stdout + done.stderr
    truth = {
        int(p.stem.removeprefix("truth-rank")): json.loads(p.read_text())
        for p in truth_dir.glob("truth-rank*.json")
    }
    assert sorted(truth) == [0, 1]
    return json.loads((out / "report.json").read_text()), truth


def _windows(report: dict[str, Any], rank: int) -> list[dict[str, Any]]:
    (r,) = [r for r in report["ranks"] if r["rank"] == rank]
    return [w for w in r["windows"] if w["complete"]]


def test_trace_of_grad_scaler_skips_has_a_window_per_step(tmp_path: Path) -> None:
    report, truth = _traced(tmp_path, "amp_skipped_step", "--windows", "5")
    for rank, t in truth.items():
        skipped = t["notes"]["skipped"]
        assert 0 < sum(skipped) < 5, skipped  # the truth: some steps skipped, later ones taken
        windows = _windows(report, rank)
        assert [w["step_skipped"] for w in windows] == skipped
        for w, true in zip(windows, t["windows"], strict=True):
            assert w["micro_batches"] == 4
            assert w["grad_syncs"] == true["rounds"] == 1
            assert w["grad_sync_micro_batches"] == true["reduced_at_micro_batch"] == [3]
    kinds = {(f["kind"], f["cause"], f["severity"]) for f in report["findings"]}
    assert ("skipped-step", "grad-scaler-found-inf", "info") in kinds
    assert not [k for k in kinds if k[0] in ("grad-reset-mid-window", "irregular-window")]
    (skips,) = [f for f in report["findings"] if f["kind"] == "skipped-step"]
    assert skips["windows"] == [i for i, s in enumerate(truth[0]["notes"]["skipped"]) if s]


@pytest.mark.parametrize("recipe", ["gan_two_models", "fsdp_gan_two_models"])
def test_trace_of_two_models_counts_each_reduction_and_says_what_it_cannot_tell(
    tmp_path: Path, recipe: str
) -> None:
    report, truth = _traced(tmp_path, recipe)
    (note,) = [n for n in report["notes"] if "distinct gradient reductions" in n]
    assert "2 wrapped models, judged each on its own" in note
    # each model reduced once per window after its last backward: no false alarm
    assert not [f for f in report["findings"] if f["kind"] in ("redundant-sync", "missing-sync")], (
        report["findings"]
    )
    for t in truth.values():
        # the truth's models: one round per window each, of a size of its own
        sizes = {m: v["bytes"] for w in t["windows"] for m, v in w["models"].items()}
        assert sorted(sizes) == ["D", "G"]
        assert all(v["rounds"] == 1 for w in t["windows"] for v in w["models"].values())
        for (size,) in sizes.values():
            assert f"{human_bytes(size)} reduced 1x per window" in note, (note, sizes)
        windows = _windows(report, t["rank"])
        assert len(windows) == WINDOWS
        assert all(w["grad_syncs"] == 2 for w in windows)
