"""The fix corpus end to end: every runnable loop of tests/fixtures/fix/ profiled on 2 gloo
ranks, before and after its rewrite (the ``.out.py`` beside it).

A buggy loop's rewrite must reach one grad sync per window and train exactly as the
original did (the final parameters, saved by the script itself, equal within float32
reduction-order tolerance); a correct loop (its ``.out.py`` is the same text) already syncs
once per window. The scripts save their parameters where ``CHECKPOINT`` says, as a training
script saves its final checkpoint.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import PROFILE_TIMEOUT, ROOT

FIXTURES = ROOT / "tests" / "fixtures" / "fix"
RUNNABLE = sorted(p for p in FIXTURES.glob("*.in.py") if "CHECKPOINT" in p.read_text())

pytestmark = pytest.mark.slow


def _name(path: Path) -> str:
    return path.name.removesuffix(".in.py")


def _profile(script: Path, tmp: Path, tag: str) -> tuple[list[list[int]], Path]:
    """Grad syncs per complete window, per rank, and the saved parameters."""
    run_dir, checkpoint = tmp / f"run-{tag}", tmp / f"{tag}.pt"
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, PYTHONPATH=path, OMP_NUM_THREADS="1", CHECKPOINT=str(checkpoint))
    command = [sys.executable, "-m", "syncscope", "profile", "--quiet", "--fail-on", "never"]
    command += ["--nproc-per-node", "2", "--out", str(run_dir), str(script)]
    proc = subprocess.run(
        command, capture_output=True, text=True, timeout=PROFILE_TIMEOUT, cwd=tmp, env=env
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((run_dir / "report.json").read_text())
    syncs = [
        [w["grad_syncs"] for w in rank["windows"] if w["complete"]] for rank in report["ranks"]
    ]
    assert checkpoint.is_file(), proc.stderr[-3000:]
    return syncs, checkpoint


def test_the_corpus_has_thirty_runnable_shapes() -> None:
    assert len(RUNNABLE) >= 30, [p.name for p in RUNNABLE]


@pytest.mark.parametrize("source", RUNNABLE, ids=_name)
def test_rewrite_syncs_once_and_trains_the_same(source: Path, tmp_path: Path) -> None:
    import torch

    fixed = source.with_name(_name(source) + ".out.py")
    original_text, fixed_text = source.read_text(), fixed.read_text()
    # GIVEN the loop as written, profiled on 2 ranks
    (tmp_path / "original.py").write_text(original_text)
    before, before_params = _profile(tmp_path / "original.py", tmp_path, "original")
    if fixed_text == original_text:
        # THEN a loop left alone was right: one grad sync per window on every rank
        assert all(rank == [1] * len(rank) and rank for rank in before), before
        return
    # WHEN its rewrite is profiled the same way
    (tmp_path / "fixed.py").write_text(fixed_text)
    after, after_params = _profile(tmp_path / "fixed.py", tmp_path, "fixed")
    # THEN the original synced more than once a window, the rewrite exactly once
    assert any(n > 1 for rank in before for n in rank), before
    assert all(rank == [1] * len(rank) and rank for rank in after), after
    assert [len(rank) for rank in after] == [len(rank) for rank in before]
    # AND training did the same: every parameter equal within reduction-order tolerance
    expected = torch.load(before_params)
    got = torch.load(after_params)
    assert expected.keys() == got.keys()
    for key in expected:
        torch.testing.assert_close(got[key], expected[key], rtol=1e-5, atol=1e-6, msg=key)
