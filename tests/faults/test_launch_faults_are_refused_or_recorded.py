"""Launch, capture, attach and the test API under faults: each is refused in one line or
recorded, never silently wrong."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from syncscope.errors import BadRunDirectory
from syncscope.rundir import LOCK_FILE, lock_run_dir, read_events, unlock_run_dir

ROOT = Path(__file__).resolve().parents[2]

STEPS = textwrap.dedent(
    """
    import sys, time
    import torch, torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo")
    model = DDP(nn.Linear(4, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(int(sys.argv[1])):
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
        opt.zero_grad()
        time.sleep(float(sys.argv[2]))
    """
)


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


def _profile(out: Path, script: Path, *args: str, nproc: int = 2) -> list[str]:
    command = [sys.executable, "-m", "syncscope", "profile", "-q", "--nproc-per-node", str(nproc)]
    return [*command, "--out", str(out), str(script), *args]


# --- two profile runs on one --out ----------------------------------------------------------


def test_run_dir_lock_refuses_a_live_holder(tmp_path: Path) -> None:
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / LOCK_FILE).write_text(str(holder.pid))
        with pytest.raises(BadRunDirectory, match=f"another syncscope profile \\(pid {holder.pid}"):
            lock_run_dir(tmp_path)
    finally:
        holder.kill()
        holder.wait()


def test_run_dir_lock_takes_over_a_dead_holders_lock(tmp_path: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / LOCK_FILE).write_text(str(dead.pid))
    lock = lock_run_dir(tmp_path)
    assert lock.read_text() == str(os.getpid())
    with pytest.raises(BadRunDirectory):  # held by this process now: a second claim fails
        lock_run_dir(tmp_path)
    unlock_run_dir(lock)
    assert not lock.exists()


@pytest.mark.slow
def test_second_profile_on_the_same_out_is_refused(tmp_path: Path) -> None:
    script = tmp_path / "steps.py"
    script.write_text(STEPS)
    out = tmp_path / "run"
    first = subprocess.Popen(
        _profile(out, script, "20", "0.2"),
        env=_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(0.5)
    second = subprocess.run(
        _profile(out, script, "10", "0.0"), env=_env(), capture_output=True, text=True, timeout=120
    )
    _, first_err = first.communicate(timeout=300)
    assert second.returncode == 2, second.stderr
    lines = [line for line in second.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "another syncscope profile" in lines[0], second.stderr
    assert first.returncode == 0, first_err
    for rank in (0, 1):  # the first run alone: 20 windows per rank, one header
        events = list(read_events(out / "ranks" / f"rank-{rank:05d}.jsonl"))
        assert sum(e["type"] == "header" for e in events) == 1
        assert sum(e["type"] == "step" for e in events) == 20
    assert not (out / LOCK_FILE).exists()


# --- attach's environment and --out --------------------------------------------------------


@pytest.mark.slow  # starts a process
@pytest.mark.parametrize(
    ("env", "argv", "message"),
    [
        ({"RANK": "abc", "WORLD_SIZE": "2"}, [], "RANK='abc'"),
        ({"RANK": "0", "WORLD_SIZE": "-1"}, [], "WORLD_SIZE='-1'"),
        ({"RANK": "5", "WORLD_SIZE": "2"}, [], "RANK=5 is not below WORLD_SIZE=2"),
        ({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "x"}, [], "LOCAL_RANK='x'"),
        ({"RANK": "0", "WORLD_SIZE": "1"}, ["--out", ""], "--out needs a directory"),
    ],
)
def test_attach_refuses_bad_rank_environment_and_empty_out(
    tmp_path: Path, env: dict[str, str], argv: list[str], message: str
) -> None:
    script = tmp_path / "noop.py"
    script.write_text("print('ran')\n")
    result = subprocess.run(
        [sys.executable, "-m", "syncscope.launch.attach", *argv, str(script)],
        env=_env(**env),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr
    assert "ran" not in result.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["noop.py"]  # nothing written


# --- overlapping track() blocks ------------------------------------------------------------


def _one_step(model: object) -> None:
    import torch

    opt = torch.optim.SGD(model.parameters(), lr=0.1)  # type: ignore[attr-defined]
    model(torch.randn(2, 4)).sum().backward()  # type: ignore[operator]
    opt.step()
    opt.zero_grad()


@pytest.mark.usefixtures("process_group")
def test_overlapping_track_blocks_each_keep_their_hooks() -> None:
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    from syncscope.testing.track import track

    model = DDP(nn.Linear(4, 4))
    a_block, b_block = track(), track()
    a = a_block.__enter__()
    b = b_block.__enter__()
    _one_step(model)
    a_block.__exit__(None, None, None)  # a ends first: b's hooks must stay
    _one_step(model)
    b_block.__exit__(None, None, None)
    assert a.grad_syncs_per_window == [1]
    assert b.grad_syncs_per_window == [1, 1]
    # afterwards nothing of either is left: DDP's forward is DDP's own again
    assert DDP.forward.__qualname__ == "DistributedDataParallel.forward"
    with track() as c:  # and a fresh block still counts
        _one_step(model)
    assert c.grad_syncs_per_window == [1]


# --- one HF Trainer callback listed twice --------------------------------------------------


@pytest.mark.usefixtures("process_group")
def test_hf_callback_listed_twice_counts_once_and_leaves_the_other_counting() -> None:
    pytest.importorskip("transformers")
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP
    from transformers.trainer_callback import TrainerState

    from syncscope.integrations.transformers import SyncscopeCallback

    model = DDP(nn.Linear(4, 4))
    a = SyncscopeCallback(max_grad_syncs_per_window=1)
    b = SyncscopeCallback(grad_syncs_per_window=1)
    callbacks = [a, b, a]  # the Trainer calls every listed callback, in order
    state = TrainerState()
    for cb in callbacks:
        cb.on_train_begin(None, state, None)
    _one_step(model)
    _one_step(model)
    for cb in callbacks:
        cb.on_train_end(None, state, None)
    assert b.stats.grad_syncs_per_window == [1, 1]
    assert a.stats.grad_syncs_per_window == [1, 1]
    assert a.stats.verdict == b.stats.verdict == "clean"
    # a later train() (a new state) is a new run for the same callback
    later = TrainerState()
    a.on_train_begin(None, later, None)
    _one_step(model)
    a.on_train_end(None, later, None)
    assert a.stats.grad_syncs_per_window == [1]


# --- a job restarted by torchrun --max-restarts ---------------------------------------------


@pytest.mark.slow  # starts a process
def test_a_restarted_attempt_writes_a_file_of_its_own(tmp_path: Path) -> None:
    """torchrun --max-restarts: each attempt's ranks run attach again, with
    TORCHELASTIC_RESTART_COUNT set; the attempt before is set aside, one header per file."""
    script = tmp_path / "noop.py"
    script.write_text("print('ran')\n")
    out = tmp_path / "run"
    for restart in ("0", "1"):
        env = _env(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", TORCHELASTIC_RESTART_COUNT=restart)
        subprocess.run(
            [sys.executable, "-m", "syncscope.launch.attach", "--out", str(out), str(script)],
            env=env,
            check=True,
            capture_output=True,
            timeout=120,
        )
    first = out / "attempts" / "attempt-0"
    for path in (out / "ranks" / "rank-00000.jsonl", first / "ranks" / "rank-00000.jsonl"):
        events = list(read_events(path))
        assert [e["type"] for e in events if e["type"] in ("header", "exit")] == [
            "header",
            "exit",
        ]
    assert (first / "meta.json").is_file()
    from syncscope.load.runs import load_run

    assert len(load_run(out).ranks) == len(load_run(first).ranks) == 1


def test_profile_notes_the_earlier_attempts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from syncscope.launch.job import _note_attempts

    (tmp_path / "attempts" / "attempt-0" / "ranks").mkdir(parents=True)
    _note_attempts(tmp_path)
    err = capsys.readouterr().err
    assert "restarted 1 time(s)" in err and "attempt-0" in err and "last attempt" in err


# --- rough edges: spawn()'s arguments -------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"world_size": "2"}, TypeError, "world_size must be an int, not '2'"),
        ({"timeout": float("nan")}, ValueError, "positive, finite number of seconds, not nan"),
        ({"timeout": float("inf")}, ValueError, "positive, finite number of seconds, not inf"),
        ({"timeout": "5"}, TypeError, "timeout must be a number of seconds"),
    ],
)
def test_spawn_refuses_bad_arguments_in_one_line(
    kwargs: dict[str, object], error: type[Exception], message: str
) -> None:
    from syncscope.testing import spawn

    with pytest.raises(error, match=message.replace("(", r"\(")):
        spawn(print, **kwargs)  # type: ignore[arg-type]


# --- a script that ends in os._exit(0) -----------------------------------------------------


@pytest.mark.slow  # starts a process
def test_os_exit_records_the_exit_and_keeps_every_window(tmp_path: Path) -> None:
    script = tmp_path / "os_exit.py"
    script.write_text(
        textwrap.dedent(
            """
            import os, torch
            model = torch.nn.Linear(4, 4)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for _ in range(5):
                model(torch.randn(2, 4)).sum().backward()
                opt.step()
                opt.zero_grad()
            os._exit(0)  # skips atexit and every finally
            """
        )
    )
    out = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-m", "syncscope.launch.attach", "--out", str(out), str(script)],
        env=_env(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    events = list(read_events(out / "ranks" / "rank-00000.jsonl"))
    assert sum(e["type"] == "step" for e in events) == 5
    exits = [e for e in events if e["type"] == "exit"]
    assert len(exits) == 1 and exits[0]["status"] == 0, exits
    from syncscope.analysis.diagnose import diagnose
    from syncscope.load.runs import load_run

    run = load_run(out)
    assert run.ranks[0].finished and run.ranks[0].exit_status == 0
    assert not [f for f in diagnose(run) if f.kind in ("run-failed", "hang")]


# --- rough edges: an empty script, --skip-windows past the end ------------------------------


@pytest.mark.slow  # starts a process
def test_a_run_with_nothing_captured_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from syncscope.launch.job import report_run

    script = tmp_path / "empty.py"
    script.write_text("")
    out = tmp_path / "run"
    subprocess.run(
        [sys.executable, "-m", "syncscope.launch.attach", "--out", str(out), str(script)],
        env=_env(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0"),
        check=True,
        capture_output=True,
        timeout=120,
    )
    report_run(out, 0, None, "error", quiet=True)
    assert "nothing was captured" in capsys.readouterr().err


@pytest.mark.parametrize("rdzv_id", ["../../..", "/etc/x", "a/../../b", "..", "ok-1.2"])
def test_rdzv_id_never_leaves_syncscope_out(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, rdzv_id: str
) -> None:
    from syncscope.launch.attach import default_out

    monkeypatch.setenv("TORCHELASTIC_RUN_ID", rdzv_id)
    out = default_out("train.py")
    assert out.parent == Path("syncscope-out")
    assert ".." not in out.parts and len(out.parts) == 2
    resolved = (tmp_path / out).resolve()
    assert resolved.is_relative_to((tmp_path / "syncscope-out").resolve())
    if rdzv_id == "ok-1.2":
        assert out.name == "train-ok-1.2"
