"""Bounded capture: ``--windows N``, ``--skip-windows W``, ``--then run|stop``.

tests/scripts/bounded.py runs 6 optimizer steps on 2 gloo ranks and records, after each
step's ``zero_grad``, whether syncscope's wrappers are still installed; it writes that list
at its last step (so the file exists only if the job ran to its end).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import PROFILE_TIMEOUT, ROOT, ProfiledRun, profile, run_syncscope

SCRIPT = ROOT / "tests" / "scripts" / "bounded.py"


def steps(dump: Path, rank: int) -> list[dict[str, object]]:
    return list(json.loads((dump / f"steps-{rank}.json").read_text()))


def events(run_dir: Path, rank: int) -> list[dict[str, object]]:
    path = run_dir / "ranks" / f"rank-{rank:05d}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def bounded(tmp: Path, *options: str) -> ProfiledRun:
    return profile(tmp, SCRIPT, "--dump", str(tmp / "dump"), options=options)


@pytest.mark.slow
def test_two_windows_then_the_job_runs_on_without_hooks(tmp_path: Path) -> None:
    run = bounded(tmp_path, "--windows", "2")
    assert run.proc.returncode == 0, run.proc.stderr[-3000:]
    for rank in (0, 1):
        windows = run.windows(rank)
        assert [(w["index"], w["complete"]) for w in windows] == [(0, True), (1, True)]
        assert all(w["micro_batches"] == 2 and w["grad_syncs"] == 1 for w in windows)
        # the script ran to its end: 6 steps, hooked only until the capture's last window
        hooked = [s["hooked_after_zero_grad"] for s in steps(tmp_path / "dump", rank)]
        assert hooked == [True, False, False, False, False, False]
        # nothing written after the rank's record of the capture's end
        evs = events(run.run_dir, rank)
        assert evs[-1]["type"] == "exit" and "capture complete" in str(evs[-1]["reason"])
        assert sum(e["type"] == "step_end" for e in evs) == 2
    assert "report written; the job runs on" in run.proc.stderr
    assert "ran on to its end" in run.proc.stderr
    assert "rank 0 reached its last step 5" in run.proc.stdout


@pytest.mark.slow
def test_then_stop_ends_every_rank_cleanly_after_the_windows(tmp_path: Path) -> None:
    run = bounded(tmp_path, "--windows", "2", "--then", "stop")
    assert run.proc.returncode == 0, run.proc.stderr[-3000:]
    assert not (tmp_path / "dump").exists()  # the script never reached its last step
    assert "reached its last step" not in run.proc.stdout
    for rank in (0, 1):
        assert len(run.complete_windows(rank)) == 2
        assert run.report["ranks"][rank]["exit_status"] == 0
    assert run.report["verdict"] == "clean", run.report["findings"]


@pytest.mark.slow
def test_skipped_windows_are_not_recorded_and_indices_stay_steps(tmp_path: Path) -> None:
    run = bounded(tmp_path, "--skip-windows", "1", "--windows", "1")
    assert run.proc.returncode == 0, run.proc.stderr[-3000:]
    for rank in (0, 1):
        windows = run.windows(rank)
        assert [(w["index"], w["complete"]) for w in windows] == [(1, True)]  # optimizer step 2
        assert windows[0]["grad_syncs"] == 1 and windows[0]["micro_batches"] == 2
        evs = events(run.run_dir, rank)
        assert [e["windows"] for e in evs if e["type"] == "skipped"] == [1]
        assert sum(e["type"] == "bwd" for e in evs) == 2  # window 0's two backwards: not kept
        hooked = [s["hooked_after_zero_grad"] for s in steps(tmp_path / "dump", rank)]
        assert hooked == [True, False, False, False, False, False]  # window 1 was the last


@pytest.mark.slow
def test_attach_reads_the_environment(tmp_path: Path) -> None:
    env = dict(
        os.environ,
        OMP_NUM_THREADS="1",
        SYNCSCOPE_WINDOWS="1",
        SYNCSCOPE_SKIP_WINDOWS="2",
        PYTHONPATH=str(ROOT),
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            "-m",
            "syncscope.launch.attach",
            "--out",
            str(tmp_path / "run"),
            "--then",
            "stop",
            str(SCRIPT),
            "--dump",
            str(tmp_path / "dump"),
        ],
        capture_output=True,
        text=True,
        timeout=PROFILE_TIMEOUT,
        env=env,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not (tmp_path / "dump").exists()  # stopped after optimizer step 3
    analyzed = run_syncscope(
        "analyze", "-q", "--fail-on", "never", "--out", str(tmp_path / "a"), str(tmp_path / "run")
    )
    for rank in (0, 1):
        evs = events(tmp_path / "run", rank)
        assert [e["windows"] for e in evs if e["type"] == "skipped"] == [2]
        assert sum(e["type"] == "step_end" for e in evs) == 1
    assert analyzed.returncode == 0, analyzed.stderr[-2000:]
    report = json.loads((tmp_path / "a" / "report.json").read_text())
    for rank in (0, 1):  # the job's third optimizer step, and nothing else
        assert [w["index"] for w in report["ranks"][rank]["windows"]] == [2]


@pytest.mark.parametrize(
    ("options", "needle"),
    [
        (("--windows", "-1"), "--windows must be a positive integer"),
        (("--windows", "0"), "--windows must be a positive integer"),
        (("--windows", "2.5"), "--windows must be a positive integer"),
        (("--skip-windows", "x"), "--skip-windows must be a non-negative integer"),
        (("--windows", "1", "--then", "later"), "--then must be run or stop"),
        (("--then", "stop"), "--then stop needs --windows N"),
        (
            ("--trace", "--trace-windows", "0:2", "--skip-windows", "3", "--windows", "1"),
            "lies outside the captured windows",
        ),
    ],
)
def test_bad_values_fail_before_any_rank_starts(
    tmp_path: Path, options: tuple[str, ...], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from syncscope import cli

    argv = ["profile", "--out", str(tmp_path / "run"), *options, str(SCRIPT), "--dump", "x"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], err
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_attach_rejects_a_bad_environment_value(tmp_path: Path) -> None:
    env = dict(os.environ, SYNCSCOPE_WINDOWS="two", PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, "-m", "syncscope.launch.attach", "--out", str(tmp_path), str(SCRIPT)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=ROOT,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "syncscope: error: SYNCSCOPE_WINDOWS must be a positive integer, not 'two'"
    )


@pytest.mark.slow
def test_trace_covers_only_the_captured_windows(tmp_path: Path) -> None:
    import gzip

    run = bounded(tmp_path, "--trace", "--skip-windows", "1", "--windows", "2")
    assert run.proc.returncode == 0, run.proc.stderr[-3000:]
    for rank in (0, 1):
        assert [w["index"] for w in run.complete_windows(rank)] == [1, 2]
        with gzip.open(run.run_dir / "traces" / f"rank-{rank}.json.gz") as fh:
            trace = json.loads(fh.read())
        names = {e.get("name", "") for e in trace["traceEvents"]}
        windows = sorted(n for n in names if n.startswith("syncscope.window#"))
        assert windows == ["syncscope.window#1", "syncscope.window#2"]
