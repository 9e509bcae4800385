"""Runs a diagnosis cannot judge are never reported clean, nor as a false error.

A script with no optimizer step, N copies of a script that never joined a process group, and
a run whose rank data is missing or unreadable: each says what happened, in every output.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from syncscope import cli
from tests.helpers.hostile import profile_script, run_events, write_run


def _analyze(run: Path, tmp: Path, *options: str) -> tuple[int, dict[str, Any]]:
    out = tmp / "report"
    status = cli.main(["analyze", "-q", "--out", str(out), *options, str(run)])
    return status, json.loads((out / "report.json").read_text())


def _kinds(report: dict[str, Any]) -> list[str]:
    return [f["kind"] for f in report["findings"]]


def _no_steps(rank: int) -> list[dict[str, Any]]:
    return [e for e in run_events(rank) if e["type"] not in ("step", "step_end")]


def _independent(rank: int) -> list[dict[str, Any]]:
    """Two copies with no process group: no collectives, different gradients."""
    events = []
    for e in run_events(rank):
        if e["type"] in ("coll", "done", "dist", "wrapper"):
            continue
        if e["type"] == "step":
            e = {**e, "fp": [1.0 + rank, 2.0]}
        if e["type"] == "exit":
            e = {**e, "dist_initialized": False, "backend": ""}
        events.append(e)
    return events


@pytest.mark.parametrize("target", ["/dev/zero", "missing", "empty"])
def test_a_run_with_a_rank_missing_is_incomplete_never_clean(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], target: str
) -> None:
    run = write_run(tmp_path, ranks=2)
    rank_file = run / "ranks" / "rank-00001.jsonl"
    rank_file.unlink()
    if target == "/dev/zero":
        rank_file.symlink_to(target)
    elif target == "empty":
        rank_file.write_bytes(b"")
    status, report = _analyze(run, tmp_path)
    assert report["verdict"] == "incomplete"
    assert status == 0  # --fail-on error: an incomplete report is a warning
    finding = next(f for f in report["findings"] if f["kind"] == "ranks-missing")
    assert finding["severity"] == "warning" and finding["ranks"] == [1]
    assert "1 rank of 2" in finding["message"]
    status, _ = _analyze(run, tmp_path / "strict", "--fail-on", "warning")
    assert status == 1
    text = capsys.readouterr()
    cli.main(["report", str(run), "-f", "text"])
    assert "verdict: incomplete" in capsys.readouterr().out, text.err


def test_a_run_with_no_optimizer_step_is_incomplete_never_clean(tmp_path: Path) -> None:
    run = write_run(tmp_path, events=_no_steps)
    status, report = _analyze(run, tmp_path, "--fail-on", "warning")
    assert report["verdict"] == "incomplete" and status == 1
    finding = next(f for f in report["findings"] if f["kind"] == "no-optimizer-step")
    assert finding["evidence"]["micro_batches_recorded"] == 4
    assert finding["evidence"]["grad_syncs_recorded"] == 2
    assert "torch.optim.Optimizer" in finding["fix"]["summary"]
    html = (tmp_path / "report" / "report.html").read_text()
    assert "as it should be" not in html and "no optimizer step was recognised" in html
    assert "0 windows x 0 micro-batches" not in html and "no complete window" in html


def test_copies_that_never_joined_a_process_group_are_not_a_divergence(tmp_path: Path) -> None:
    run = write_run(tmp_path, events=_independent)
    status, report = _analyze(run, tmp_path)
    assert "rank-divergence" not in _kinds(report)
    assert _kinds(report) == ["no-process-group"]
    assert report["verdict"] == "warnings" and status == 0
    assert "2 independent copies" in report["findings"][0]["message"]


NO_STEP = """\
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo")
model = DDP(torch.nn.Linear(8, 8))
for step in range(2):
    for micro in range(3):
        model(torch.randn(4, 8)).pow(2).mean().backward()
dist.destroy_process_group()
"""

NO_DIST = """\
import os, torch
torch.manual_seed(int(os.environ["RANK"]))
model = torch.nn.Linear(8, 8)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    for micro in range(2):
        model(torch.randn(4, 8)).pow(2).mean().backward()
    optimizer.step()
    optimizer.zero_grad()
"""


@pytest.mark.slow
def test_profile_of_a_loop_without_optimizer_step_says_so(tmp_path: Path) -> None:
    done, out = profile_script(tmp_path, "nostep.py", NO_STEP, "--fail-on", "warning")
    assert done.returncode == 1, done.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["verdict"] == "incomplete"
    assert _kinds(report) == ["no-optimizer-step"]
    assert report["findings"][0]["evidence"]["grad_syncs_recorded"] == 6


@pytest.mark.slow
def test_profile_of_a_script_without_distributed_code_says_copies(tmp_path: Path) -> None:
    done, out = profile_script(tmp_path, "nodist.py", NO_DIST)
    assert done.returncode == 0, done.stderr
    report = json.loads((out / "report.json").read_text())
    assert _kinds(report) == ["no-process-group"]
    assert report["verdict"] == "warnings"


def test_one_ranks_view_by_choice_is_not_missing_ranks() -> None:
    """``track(gather=False)`` keeps this rank's events by choice: the others are not missing."""
    from syncscope.analysis.diagnose import diagnose
    from syncscope.load.runs import build_run
    from syncscope.model import RunMeta, verdict_of

    mine = {0: run_events(0)}
    gathered = build_run(RunMeta(world_size=2, command=("track()",)), mine)
    assert [f.kind for f in diagnose(gathered)] == ["ranks-missing"]
    local = build_run(RunMeta(world_size=2, command=("track()",), one_rank_view=True), mine)
    assert diagnose(local) == [] and verdict_of(diagnose(local)) == "clean"
