"""`profile --trace` on a script that runs its own torch.profiler. A second
profiler under the script's crashed rank 0 (SIGSEGV, 2 of 2), and `report`/`analyze` then
refused the run for its empty traces/. syncscope now starts none under the script's, says so
once, and the counting report stands; a run whose traces/ is empty reads as the counting run
with a note."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from syncscope.load.inputs import load
from tests.helpers.hostile import profile_script, tree_env, write_run

OWN_PROFILER = textwrap.dedent(
    """
    import torch, torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo")
    model = DDP(nn.Linear(4, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for step in range(3):
            model(torch.randn(2, 4)).sum().backward()
            opt.step()
            opt.zero_grad()
    print("own profiler events:", len(prof.key_averages()))
    """
)


def test_a_run_with_an_empty_traces_dir_reads_with_a_note(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path)
    (run_dir / "traces").mkdir()
    (run_dir / "traces" / "rank-1.not-traced").write_text("the script runs its own\n")
    run, _ = load([run_dir], skip_bad=True, progress=False)
    assert [len(r.windows) for r in run.ranks] == [2, 2]
    assert any("--trace on rank(s) 1: the script runs its own" in n for n in run.meta.notes)
    assert any("holds no trace file" in n for n in run.meta.notes)


@pytest.mark.slow
def test_profile_trace_under_the_scripts_own_profiler(tmp_path: Path) -> None:
    done, out = profile_script(tmp_path, "own.py", OWN_PROFILER, "--trace")
    assert done.returncode == 0, done.stderr[-3000:]  # no rank crashed
    assert done.stdout.count("own profiler events:") == 2  # the script's profiler worked
    assert done.stderr.count("does not start a second one") == 1  # said once, by rank 0
    report = json.loads((out / "report.json").read_text())
    assert [sum(w["complete"] for w in r["windows"]) for r in report["ranks"]] == [3, 3]
    assert any("--trace on rank(s) 0-1: no trace" in n for n in report["notes"])
    for sub in (["report", "-f", "text"], ["analyze"]):
        again = subprocess.run(
            [sys.executable, "-m", "syncscope", *sub, str(out)],
            env=tree_env(),
            capture_output=True,
            text=True,
            timeout=120,
            cwd=tmp_path,
        )
        assert again.returncode == 0, again.stderr[-2000:]  # was: "traces: no trace files"
        assert "does not start a second one" in " ".join((again.stdout + again.stderr).split())


LATE_PROFILER = textwrap.dedent(
    """
    import torch, torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo")
    model = DDP(nn.Linear(4, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step():
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
        opt.zero_grad()

    for _ in range(2):
        step()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(2):
            step()
    print("own profiler events:", len(prof.key_averages()))
    """
)


@pytest.mark.slow
def test_the_scripts_profiler_started_after_syncscopes_ends_its_trace(tmp_path: Path) -> None:
    """syncscope's trace runs from window 0; the script starts its own at window 2: the trace
    is exported there (windows 0-1) and the script's profiler runs alone."""
    from syncscope.load.traces import load_traces

    done, out = profile_script(tmp_path, "late.py", LATE_PROFILER, "--trace")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("own profiler events:") == 2
    assert done.stderr.count("syncscope's trace stops there") == 1
    report = json.loads((out / "report.json").read_text())
    assert [sum(w["complete"] for w in r["windows"]) for r in report["ranks"]] == [4, 4]
    assert any("--trace on rank(s) 0-1: the script started" in n for n in report["notes"])
    traced = load_traces([out / "traces"], skip_bad=False, progress=False)
    assert [[w.index for w in r.windows] for r in traced.ranks] == [[0, 1], [0, 1]]
