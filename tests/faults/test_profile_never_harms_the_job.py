"""``syncscope profile`` under faults: real processes, kept few and lean (2 gloo ranks)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from syncscope.rundir import read_events

ROOT = Path(__file__).resolve().parents[2]

SLEEPER = textwrap.dedent(
    """
    import os, sys, time
    import torch, torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo")
    model = DDP(nn.Linear(4, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with open(os.path.join(sys.argv[1], f"pid-{dist.get_rank()}"), "w") as f:
        f.write(str(os.getpid()))
    for step in range(int(sys.argv[2])):
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
        opt.zero_grad()
        time.sleep(float(sys.argv[3]))
    """
)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (its parent is gone, reaped by init soon) counts as ended
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.slow
def test_sigkill_of_profile_leaves_no_orphans(tmp_path: Path) -> None:
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    out = tmp_path / "run"
    command = [sys.executable, "-m", "syncscope", "profile", "-q", "--nproc-per-node", "2"]
    command += ["--out", str(out), str(script), str(tmp_path), "1000", "0.2"]
    proc = subprocess.Popen(
        command, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 120
        pids: list[int] = []
        while time.monotonic() < deadline and len(pids) < 2:
            pids = [int(p.read_text()) for p in tmp_path.glob("pid-*") if p.read_text()]
            time.sleep(0.2)
        assert len(pids) == 2, "the ranks did not start"
        time.sleep(1.5)  # a few windows
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        killed = time.monotonic()
        while time.monotonic() - killed < 15 and any(_alive(p) for p in pids):
            time.sleep(0.1)
        gone_after = time.monotonic() - killed
        assert not any(_alive(p) for p in pids), "ranks outlived syncscope profile"
        print(f"ranks gone {gone_after:.2f} s after SIGKILL")
        assert gone_after < 10
    finally:
        for p in tmp_path.glob("pid-*"):
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(p.read_text()), signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
    reasons = []
    for rank in (0, 1):
        events = list(read_events(out / "ranks" / f"rank-{rank:05d}.jsonl"))
        assert sum(e.get("type") == "step_end" for e in events) >= 2
        exits = [e for e in events if e.get("type") == "exit"]
        assert len(exits) == 1, f"rank {rank}: one exit record, got {exits}"
        reasons.append(exits[0]["reason"])
    # every rank records how it ended; the first to get its SIGTERM may take its peer down
    # with it (gloo: "Connection reset by peer") before the peer's own watchdog fires
    assert "killed by signal SIGTERM" in reasons, reasons
    assert all(r == "killed by signal SIGTERM" or "Connection" in r for r in reasons), reasons


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--trace", "--trace-windows", "5:2"], "--trace-windows 5:2: B must be greater than A"),
        # was: ignored without a word
        (["--trace-windows", "0:2"], "--trace-windows 0:2 picks the windows --trace records"),
        (["--hang-timeout", "nan"], "--hang-timeout must be a number of seconds from 0"),
        (["--hang-timeout", "-5"], "--hang-timeout must be a number of seconds from 0"),
        (["--hang-timeout", "inf"], "--hang-timeout must be a number of seconds from 0"),
        # was accepted, and the run's own meta.json was then refused by every reader
        (["--hang-timeout", "1e308"], "from 0 (0: never) to 1e+18, not 1e+308"),
        (["--hang-timeout", "1.1e18"], "from 0 (0: never) to 1e+18, not 1.1e+18"),
    ],
)
def test_bad_option_values_stop_before_any_rank(
    options: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from syncscope import cli

    script = tmp_path / "never.py"
    script.write_text("raise SystemExit('must not run')\n")
    status = cli.main(["profile", "--out", str(tmp_path / "r"), *options, str(script)])
    err = capsys.readouterr().err
    assert status == 2
    assert err.count("\n") == 1 and message in err
    assert not (tmp_path / "r").exists()


USER_ERROR = textwrap.dedent(
    """
    import torch


    class Boom(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            raise ValueError("user bug in backward")


    def train():
        x = torch.ones(2, requires_grad=True)
        Boom.apply(x).sum().backward()


    train()
    """
)


@pytest.mark.slow
def test_user_traceback_shows_only_user_frames(tmp_path: Path) -> None:
    script = tmp_path / "user_error.py"
    script.write_text(USER_ERROR)
    command = [
        sys.executable,
        "-m",
        "syncscope.launch.attach",
        "--out",
        str(tmp_path / "r"),
        str(script),
    ]
    proc = subprocess.run(
        command, env=_env(), capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert proc.returncode == 1
    err = proc.stderr
    assert err.startswith("Traceback (most recent call last):"), err
    assert 'user_error.py", line 20, in <module>' in err
    assert 'user_error.py", line 17, in train' in err
    assert 'user_error.py", line 12, in backward' in err
    assert err.rstrip().endswith("ValueError: user bug in backward")
    assert "syncscope" not in err.replace(str(tmp_path), "")
    assert "runpy" not in err


@pytest.mark.slow
def test_disk_full_during_profile_lets_the_script_finish(tmp_path: Path) -> None:
    """The 4th write of each rank's event file fails (ENOSPC seam; one write carries the
    events held since the previous one: the header, the process group and DDP's first
    collectives make the first three, before the flusher's first): the script runs to its
    end."""
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER + "\nprint('script reached its end', flush=True)\n")
    out = tmp_path / "run"
    env = _env()
    env["SYNCSCOPE_FAULT_WRITE_ENOSPC"] = "4"
    command = [sys.executable, "-m", "syncscope", "profile", "-q", "--nproc-per-node", "2"]
    command += ["--out", str(out), str(script), str(tmp_path), "6", "0"]
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.stdout.count("script reached its end") == 2
    assert "syncscope: capture stopped on rank 0: cannot write" in proc.stderr
    assert "No space left on device; the script continues" in proc.stderr
    events = list(read_events(out / "ranks" / "rank-00000.jsonl"))
    # everything the 3 writes before the failure carried is kept, and nothing after it
    assert len(events) >= 3
    assert events[0]["type"] == "header"
    assert not any(e["type"] == "exit" for e in events)
    import json

    notes = json.loads((out / "report.json").read_text())["notes"]
    assert any(n.startswith("capture stopped early on rank 0 (cannot write") for n in notes)


ODD = textwrap.dedent(
    """
    import multiprocessing as mp
    import os
    import torch, torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP


    def work(i):
        m = nn.Linear(4, 4)
        m(torch.randn(2, 4)).sum().backward()  # a forked worker's backward is not the rank's
        return i


    if __name__ == "__main__":
        dist.init_process_group("gloo")
        os.makedirs("elsewhere", exist_ok=True)
        os.chdir("elsewhere")  # relative --out/--trace paths must not follow the script
        model = DDP(nn.Linear(4, 4))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with mp.get_context("fork").Pool(2) as pool:
            for step in range(3):
                for micro in range(2):
                    with model.no_sync() if micro == 0 else open(os.devnull):
                        model(torch.randn(2, 4)).sum().backward()
                    pool.map(work, range(2))
                opt.step()
                opt.zero_grad()
    """
)


@pytest.mark.slow
def test_forking_chdir_script_records_only_the_rank(tmp_path: Path) -> None:
    (tmp_path / "odd.py").write_text(ODD)
    command = [sys.executable, "-m", "syncscope", "profile", "-q", "--nproc-per-node", "2"]
    command += ["--trace", "--out", "run", "odd.py"]
    proc = subprocess.run(
        command, env=_env(), capture_output=True, text=True, timeout=240, cwd=tmp_path
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    import json

    report = json.loads((tmp_path / "run" / "report.json").read_text())
    for rank in report["ranks"]:
        sizes = [w["micro_batches"] for w in rank["windows"] if w["complete"]]
        assert sizes == [2, 2, 2], sizes
    assert sorted(p.name for p in (tmp_path / "run" / "traces").iterdir()) == [
        "rank-0.json.gz",
        "rank-1.json.gz",
    ]
    assert not (tmp_path / "elsewhere" / "run").exists()
    for rank in (0, 1):
        exits = [
            e
            for e in read_events(tmp_path / "run" / "ranks" / f"rank-{rank:05d}.jsonl")
            if e.get("type") == "exit"
        ]
        assert len(exits) == 1
