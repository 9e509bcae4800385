"""The command line as a user meets it: its errors in process through ``main()``, and real
``syncscope profile`` launches (marked slow) for exit codes, the launcher and what runs keep.
Argument parsing itself is tests/unit/test_cli.py's."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from syncscope import cli
from tests.conftest import EXAMPLES, LOOPS, ROOT, run_syncscope

SINGLE = ROOT / "tests" / "scripts" / "single.py"


def one_line_error(capsys: pytest.CaptureFixture[str], argv: list[str], needle: str) -> None:
    """``syncscope *argv`` in process: exit status 2 and one ``syncscope: error:`` line."""
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("syncscope: error: ")
    assert needle in lines[0]
    assert "Traceback" not in err


def main_out(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``syncscope *argv`` in process: its exit status, stdout and stderr."""
    capsys.readouterr()
    status = cli.main(list(argv))
    out = capsys.readouterr()
    return status, out.out, out.err


def profile_loop(out: Path, pattern: str) -> subprocess.CompletedProcess[str]:
    """``syncscope profile`` of one tests/scripts/loops.py pattern on 2 ranks."""
    return run_syncscope("profile", "--nproc-per-node", "2", "--out", str(out), str(LOOPS), pattern)


@pytest.mark.slow
@pytest.mark.parametrize("entry", [["syncscope"], [sys.executable, "-m", "syncscope"]])
def test_help_from_console_script_and_module(entry: list[str]) -> None:
    exe = shutil.which(entry[0]) if entry[0] == "syncscope" else entry[0]
    assert exe, "console script 'syncscope' is not installed"
    proc = subprocess.run(
        [exe, *entry[1:], "profile", "--help"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0
    assert "--nproc-per-node" in proc.stdout and "--hang-timeout" in proc.stdout


def test_missing_script(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["profile", "--out", str(tmp_path / "r"), "nope.py"]
    one_line_error(capsys, argv, "script not found: nope.py")


def test_script_with_syntax_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import torch\nfor x in range(3)\n    pass\n")
    one_line_error(capsys, ["profile", "--out", str(tmp_path / "r"), str(bad)], "bad.py:2")


@pytest.mark.slow
def test_out_under_missing_parents_creates_them(tmp_path: Path) -> None:
    out = tmp_path / "runs" / "before"
    proc = run_syncscope("profile", "--out", str(out), str(SINGLE))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (out / "report.json").is_file()
    # no --nproc-per-node: one line says so, with the flag to add
    said = [line for line in proc.stderr.splitlines() if "--nproc-per-node" in line]
    assert said == [
        "syncscope: no --nproc-per-node given: running 1 rank per node (world size 1 on one "
        "node); add --nproc-per-node N to run N"
    ]


def test_out_under_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    argv = ["profile", "--out", str(blocker / "r"), str(SINGLE)]
    one_line_error(capsys, argv, "cannot create")


def test_world_size_the_machine_cannot_host(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["profile", "--nproc-per-node", "100000", "--out", str(tmp_path / "r"), str(SINGLE)]
    one_line_error(capsys, argv, "cannot host")
    assert not (tmp_path / "r").exists()


def test_bad_fail_on_value(capsys: pytest.CaptureFixture[str]) -> None:
    one_line_error(capsys, ["profile", "--fail-on", "sometimes", str(SINGLE)], "--fail-on")


@pytest.mark.slow
def test_script_that_never_initialises_distributed_in_the_default_run_directory(
    tmp_path: Path,
) -> None:
    # GIVEN a fresh working directory (no syncscope-out/ yet), WHEN profiling without --out
    proc = run_syncscope("profile", "--nproc-per-node", "1", str(SINGLE), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "single done" in proc.stdout
    # THEN the run lands in syncscope-out/<name>-<timestamp>/
    (run_dir,) = (tmp_path / "syncscope-out").iterdir()
    assert run_dir.name.startswith("single-")
    assert (run_dir / "report.html").exists()
    report = json.loads((run_dir / "report.json").read_text())
    assert report["world_size"] == 1
    assert any("never initialised" in note for note in report["notes"])
    assert [w["micro_batches"] for w in report["ranks"][0]["windows"]] == [3, 3]
    assert report["findings"] == [] and report["verdict"] == "clean"


@pytest.mark.slow
def test_script_failure_propagates_and_keeps_data(tmp_path: Path) -> None:
    proc = profile_loop(tmp_path / "r", "raise-on-rank-1")
    assert proc.returncode == 1
    assert "boom on rank 1" in proc.stderr
    assert "the script failed on rank 1" in proc.stderr
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    rank1 = report["ranks"][1]
    assert rank1["exit_status"] == 1 and "boom on rank 1" in rank1["exit_reason"]
    assert [w["grad_syncs"] for w in rank1["windows"] if w["complete"]] == [4, 4]
    # the run failed: its own verdict and finding, naming rank 1 (not a collective mismatch)
    assert report["verdict"] == "failed"
    failed = report["findings"][0]
    assert (failed["kind"], failed["ranks"], failed["evidence"]["exit_status"]) == (
        "run-failed",
        [1],
        1,
    )
    assert failed["evidence"]["complete_windows"] == 2
    assert "collective-mismatch" not in [f["kind"] for f in report["findings"]]
    # the windows before the failure are still diagnosed (no no_sync: redundant syncs)
    assert "redundant-sync" in [f["kind"] for f in report["findings"]]


@pytest.mark.slow
def test_script_crashing_on_every_rank_is_failed_not_clean(tmp_path: Path) -> None:
    proc = profile_loop(tmp_path / "r", "raise-in-backward-everywhere")
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "verdict: failed" in proc.stdout
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    assert report["verdict"] == "failed"
    assert [r["exit_status"] for r in report["ranks"]] == [1, 1]
    (failed,) = [f for f in report["findings"] if f["kind"] == "run-failed"]
    assert failed["ranks"] == [0, 1] and failed["severity"] == "error"
    evidence = failed["evidence"]
    assert (
        evidence["exit_status"] == 1 and "RuntimeError: boom in backward" in evidence["exit_reason"]
    )
    assert evidence["last_seen"] == "in backward of micro-batch 2 of window 1"
    assert evidence["complete_windows"] == 1
    assert [f["kind"] for f in report["findings"]] == ["run-failed"]  # window 0 was right
    html = (tmp_path / "r" / "report.html").read_text()
    assert '<div class="verdict failed" id="verdict">' in html
    assert "The run failed" in html and "Still measured: 1 complete window on 2 ranks" in html
    assert "as it should be" not in html


@pytest.mark.slow
def test_crash_in_shutdown_after_the_script_finished_is_a_warning(tmp_path: Path) -> None:
    """A process that dies after every rank recorded a normal end lost nothing: say so."""
    proc = profile_loop(tmp_path / "r", "abort-at-shutdown-on-rank-1")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "warning: rank 1 finished the script" in proc.stderr
    assert "exit status 134" in proc.stderr
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    assert [r["exit_status"] for r in report["ranks"]] == [0, 0]
    assert [w["grad_syncs"] for w in report["ranks"][1]["windows"] if w["complete"]] == [4, 4]


@pytest.mark.slow
def test_fail_on_controls_exit_status(tmp_path: Path) -> None:
    # profile itself: a warning-only run fails with --fail-on warning
    proc = run_syncscope(
        "profile",
        "-q",
        "--fail-on",
        "warning",
        "--nproc-per-node",
        "2",
        "--out",
        str(tmp_path / "r"),
        str(EXAMPLES / "ddp_sync_every_step.py"),
        "--steps",
        "1",
        "--quiet",
    )
    assert proc.returncode == 1, proc.stderr
    # the same rule, from the saved run, for every level
    for fail_on, code in (("never", 0), ("error", 0), ("warning", 1)):
        again = run_syncscope(
            "analyze",
            "-q",
            "--fail-on",
            fail_on,
            "--out",
            str(tmp_path / fail_on),
            str(tmp_path / "r"),
        )
        assert again.returncode == code, (fail_on, again.stderr)


@pytest.mark.slow
def test_terminal_summary_and_module_mode(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    shutil.copy(EXAMPLES / "common.py", package / "common.py")
    text = (
        (EXAMPLES / "ddp_no_sync_backward_only.py")
        .read_text()
        .replace("from common", "from pkg.common")
    )
    (package / "train.py").write_text(text)
    proc = run_syncscope(
        "profile",
        "--nproc-per-node",
        "2",
        "--out",
        str(tmp_path / "r"),
        "-m",
        "pkg.train",
        "--steps",
        "1",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "Gradient syncs per window" in out
    assert "redundant-sync" in out and "no_sync-backward-only" in out
    assert "verdict: warnings" in out
    assert "pkg/train.py:" in out  # source lines point into the user's module
    assert (tmp_path / "r" / "report.html").exists()


@pytest.mark.slow
def test_attach_under_torchrun_then_report(tmp_path: Path) -> None:
    run_dir = tmp_path / "attached"
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
            str(run_dir),
            str(EXAMPLES / "ddp_no_sync.py"),
            "--steps",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = run_syncscope("report", str(run_dir), "--format", "json")
    assert report.returncode == 0, report.stderr
    data = json.loads(report.stdout)
    assert data["world_size"] == 2
    assert [w["grad_syncs"] for w in data["ranks"][1]["windows"]] == [1, 1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_two_nodes_through_multi_node_rendezvous_then_merge(tmp_path: Path) -> None:
    port = _free_port()
    launcher = [
        sys.executable,
        "-m",
        "syncscope",
        "profile",
        "-q",
        "--nnodes",
        "2",
        "--nproc-per-node",
        "1",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{port}",
        "--rdzv-id",
        "twonodes",
    ]
    nodes = [
        subprocess.Popen(
            [
                *launcher,
                "--node-rank",
                str(i),
                "--out",
                str(tmp_path / f"node{i}"),
                str(EXAMPLES / "ddp_sync_every_step.py"),
                "--steps",
                "2",
                "--quiet",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        for i in range(2)
    ]
    for node in nodes:
        _, err = node.communicate(timeout=180)
        assert node.returncode == 0, err[-2000:]
    one = json.loads((tmp_path / "node0" / "report.json").read_text())
    assert one["world_size"] == 2 and [r["rank"] for r in one["ranks"]] == [0]
    assert any("merge" in note for note in one["notes"])
    merged = run_syncscope(
        "analyze",
        "-q",
        "--fail-on",
        "never",
        "--out",
        str(tmp_path / "merged"),
        str(tmp_path / "node0"),
        str(tmp_path / "node1"),
    )
    assert merged.returncode == 0, merged.stderr
    data = json.loads((tmp_path / "merged" / "report.json").read_text())
    assert [r["rank"] for r in data["ranks"]] == [0, 1]
    assert data["grad_syncs_per_window"] == [4, 4]
    assert all(w["fingerprint_match"] for r in data["ranks"] for w in r["windows"] if w["complete"])


@pytest.mark.slow
def test_analyze_of_a_run_directory_gives_the_live_findings(profiled, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    live = profiled(LOOPS, "flag-after-forward")
    proc = run_syncscope(
        "analyze", "-q", "--fail-on", "never", "--out", str(tmp_path / "a"), str(live.run_dir)
    )
    assert proc.returncode == 0, proc.stderr
    again = json.loads((tmp_path / "a" / "report.json").read_text())
    assert again["findings"] == live.report["findings"]
    assert again["ranks"] == live.report["ranks"]
    assert again["verdict"] == live.report["verdict"] == "errors"


@pytest.mark.slow
def test_killed_launcher_still_reports_what_was_captured(tmp_path: Path) -> None:
    import os
    import signal
    import time

    run_dir = tmp_path / "r"
    env = dict(os.environ, LOOPS_STEPS="100000", OMP_NUM_THREADS="1")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "syncscope",
            "profile",
            "-q",
            "--nproc-per-node",
            "2",
            "--out",
            str(run_dir),
            str(LOOPS),
            "flag-before-forward",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=env,
    )
    rank0 = run_dir / "ranks" / "rank-00000.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if rank0.exists() and rank0.read_bytes().count(b'"step_end"') >= 3:
            break
        time.sleep(0.2)
    else:
        proc.kill()
        pytest.fail("the job never reached 3 optimizer steps")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]
    assert "the launcher stopped" in err
    report = json.loads((run_dir / "report.json").read_text())
    windows = [w for w in report["ranks"][0]["windows"] if w["complete"]]
    assert len(windows) >= 3
    assert all(w["grad_syncs"] == 1 for w in windows)


# The argparse command line: what belongs to syncscope, what to the script ---------------------

ARGV_PROBE = """\
import json
import sys
from pathlib import Path

Path(__file__).with_name("argv.json").write_text(json.dumps(sys.argv[1:]))
print("probe done")
"""


@pytest.mark.slow
def test_options_after_the_script_belong_to_the_script(tmp_path: Path) -> None:
    # GIVEN a script that records its own arguments
    script = tmp_path / "probe.py"
    script.write_text(ARGV_PROBE)
    # WHEN syncscope's options come first, then SCRIPT, then options of the same names
    proc = run_syncscope(
        "profile",
        "--quiet",
        "--nproc-per-node",
        "1",
        "--out",
        str(tmp_path / "r"),
        "--",
        str(script),
        "--foo",
        "--out",
        "elsewhere",
        "-q",
        "--",
        "-m",
        "x",
    )
    # THEN everything after SCRIPT reaches the script unchanged, and syncscope used its own
    assert proc.returncode == 0, proc.stderr
    assert "probe done" in proc.stdout
    expected = ["--foo", "--out", "elsewhere", "-q", "--", "-m", "x"]
    assert json.loads((tmp_path / "argv.json").read_text()) == expected
    meta = json.loads((tmp_path / "r" / "meta.json").read_text())
    assert meta["command"] == [str(script), *expected] and meta["module"] is False
    assert (tmp_path / "r" / "report.json").is_file()
    assert not (tmp_path / "elsewhere").exists()


@pytest.mark.slow
def test_module_arguments_belong_to_the_module(tmp_path: Path) -> None:
    package = tmp_path / "probepkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "probe.py").write_text(ARGV_PROBE)
    proc = run_syncscope(
        "profile",
        "--nproc-per-node",
        "1",
        "--out",
        str(tmp_path / "r"),
        "-m",
        "probepkg.probe",
        "--lr",
        "3",
        "--quiet",
        "--nproc-per-node",
        "7",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    expected = ["--lr", "3", "--quiet", "--nproc-per-node", "7"]
    assert json.loads((package / "argv.json").read_text()) == expected
    meta = json.loads((tmp_path / "r" / "meta.json").read_text())
    assert meta["command"] == ["probepkg.probe", *expected] and meta["module"] is True
    assert meta["world_size"] == 1  # syncscope's own --nproc-per-node, not the module's
    # --quiet went to the module: syncscope printed its terminal summary
    assert "verdict:" in proc.stdout


def test_bad_fix_nproc_per_node_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    one_line_error(capsys, ["fix", "--nproc-per-node", "two", "x.py"], "--nproc-per-node")


def test_missing_script_argument_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    one_line_error(capsys, ["profile", "-q"], "missing SCRIPT (or -m MODULE) to profile")


def test_no_arguments_lists_the_commands_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = main_out(capsys)
    assert (status, out) == (2, "")
    assert err.startswith("usage: syncscope")
    for command in ("profile", "report", "analyze", "diff", "fix"):
        assert f"\n    {command} " in err, command


def test_help_lists_the_commands_on_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = main_out(capsys, "--help")
    assert status == 0 and err == ""
    assert "Run SCRIPT on N ranks through torch's launcher" in out
    assert "Compare two runs" in out


def test_importing_the_cli_imports_no_typer_click_or_pydantic() -> None:
    code = (
        "import sys, syncscope.cli as cli\n"
        "cli.build_parser()\n"
        "heavy = {'typer', 'click', 'pydantic', 'rich', 'torch'}\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


@pytest.mark.slow
def test_profile_trace_records_the_chosen_windows_and_reports_both_sources(
    tmp_path: Path,
) -> None:
    import gzip

    run_dir = tmp_path / "run"
    proc = run_syncscope(
        "profile", "--nproc-per-node", "2", "--trace", "--trace-windows", "1:2", "--quiet",
        "--fail-on", "never", "--out", str(run_dir), str(LOOPS), "forward-only-no_sync",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "USDT" not in proc.stderr and "profiler_start" not in proc.stderr  # torch's noise
    for rank in (0, 1):
        trace = json.loads(
            gzip.decompress((run_dir / "traces" / f"rank-{rank}.json.gz").read_bytes())
        )
        names = {e.get("name") for e in trace["traceEvents"]}
        assert "syncscope.window#1" in names and "syncscope.window#0" not in names
        assert {"syncscope.micro_batch#1.0", "syncscope.micro_batch#1.3"} <= names
        assert trace["distributedInfo"]["rank"] == rank
    report = json.loads((run_dir / "report.json").read_text())
    assert report["source"] == "live" and report["grad_syncs_per_window"] == [1, 1]
    for r in report["ranks"]:  # overlap from the trace, for the traced window only
        exposed = [w["exposed_comm_ns"] for w in r["windows"]]
        assert exposed[0] is None and exposed[1] is not None and exposed[1] >= 0
    assert any("not traced" in note for note in report["notes"])
    # the traces alone tell the same story for the window they hold
    proc = run_syncscope(
        "analyze", "-q", "--fail-on", "never", "--out", str(tmp_path / "a"), str(run_dir / "traces")
    )
    assert proc.returncode == 0, proc.stderr
    from_traces = json.loads((tmp_path / "a" / "report.json").read_text())
    assert from_traces["source"] == "trace"
    for r in from_traces["ranks"]:
        (window,) = r["windows"]
        assert window["index"] == 1 and window["grad_syncs"] == 1
        assert window["micro_batches"] == 4  # one per micro-batch, not one per pass


# Every torchrun option passes through (torch's own parser is the list) ------------------------

EVERY_RANK_PRINTS = """\
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank = dist.get_rank()
model = DDP(nn.Linear(4, 4))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _step in range(2):
    for _micro in range(3):  # no no_sync: every backward syncs
        model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
print(f"hello from rank {rank}", flush=True)
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_formerly_rejected_launcher_options_reach_torchrun(tmp_path: Path) -> None:
    # GIVEN a script whose every rank prints a line
    script = tmp_path / "hello.py"
    script.write_text(EVERY_RANK_PRINTS)
    logs = tmp_path / "logs"
    # WHEN it is profiled with torchrun's --tee and --local-ranks-filter (once "unrecognized")
    proc = run_syncscope(
        "profile", "-q", "--fail-on", "never", "--nproc-per-node", "2", "--tee", "3",
        "--local-ranks-filter", "0", "--log-dir", str(logs), "--out", str(tmp_path / "r"),
        str(script),
    )  # fmt: skip
    # THEN the run is measured as without them: 3 grad syncs in each of 2 windows, 2 ranks
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    assert report["world_size"] == 2 and report["grad_syncs_per_window"] == [3, 3]
    assert [[w["grad_syncs"] for w in r["windows"]] for r in report["ranks"]] == [[3, 3], [3, 3]]
    # AND torchrun did what they say: every rank's output tee'd to its log file, and only
    # local rank 0's shown on the console (with torchrun's [role rank] prefix)
    for rank in (0, 1):
        (log,) = logs.glob(f"*/attempt_0/{rank}/stdout.log")
        assert f"hello from rank {rank}" in log.read_text()
    assert "[default0]:hello from rank 0" in proc.stdout
    assert "hello from rank 1" not in proc.stdout + proc.stderr
    meta = json.loads((tmp_path / "r" / "meta.json").read_text())
    assert meta["launcher"] == {
        "nproc_per_node": "2",
        "tee": "3",
        "local_ranks_filter": "0",
        "log_dir": str(logs),
    }
