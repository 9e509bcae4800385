"""2 gloo ranks: apply a fix to an example and profile it again to one grad sync per window."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from syncscope.fixes import fix_source
from syncscope.fixes.verify import render, verify
from tests.conftest import run_syncscope

ROOT = Path(__file__).parents[2]
EXAMPLE = ROOT / "examples" / "ddp_sync_every_step.py"

pytestmark = pytest.mark.slow


def _profile_available() -> bool:
    done = subprocess.run(
        [sys.executable, "-m", "syncscope", "profile", "--help"],
        capture_output=True,
        check=False,
        cwd=ROOT,
    )
    return done.returncode == 0 and EXAMPLE.is_file()


@pytest.mark.skipif(not _profile_available(), reason="syncscope profile or the example is missing")
def test_fixed_example_reaches_one_grad_sync_per_window(tmp_path: Path) -> None:
    # GIVEN the every-micro-batch DDP example, copied with its helper module
    for name in ("ddp_sync_every_step.py", "common.py"):
        shutil.copy(ROOT / "examples" / name, tmp_path / name)
    script = tmp_path / "ddp_sync_every_step.py"
    result = fix_source(script.read_text())
    assert [p.code for p in result.problems] == ["SYN101"]
    # WHEN original and fixed are profiled on 2 gloo ranks
    checked = verify(
        script, result.fixed, ["SYN101"], ("--nproc-per-node", "2", "--hang-timeout", "60")
    )
    # THEN the original syncs every micro-batch, the fix once per window, same training
    assert all(n == 4 for n in checked.original.grad_syncs)
    assert checked.minimum, render(checked)
    assert not checked.correctness_fix
    assert checked.training is not None and checked.training.status == "match", render(checked)
    assert not (tmp_path / "_syncscope_fixed_ddp_sync_every_step.py").exists()


FIXTURES = ROOT / "tests" / "fixtures" / "fix"
NANOGPT = "nanogpt_ddp_optional"


def _python(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=120
    )


def test_fixed_ddp_optional_script_runs_single_process_and_on_two_ranks(tmp_path: Path) -> None:
    # GIVEN a nanoGPT-style script that also runs without DDP, and its fix (the fixture pair)
    fixed = tmp_path / "train.py"
    fixed.write_text((FIXTURES / f"{NANOGPT}.out.py").read_text())
    assert fixed.read_text() == fix_source((FIXTURES / f"{NANOGPT}.in.py").read_text()).fixed
    # WHEN it runs as one plain process THEN the mode it had still works
    single = _python(str(fixed), cwd=tmp_path)
    assert single.returncode == 0, single.stderr[-2000:]
    assert single.stdout.count(" loss ") == 2
    # WHEN it runs on 2 gloo ranks under syncscope THEN it syncs once per window: clean
    out = tmp_path / "run"
    done = run_syncscope(
        "profile", "-q", "--nproc-per-node", "2", "--out", str(out), str(fixed), cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads((out / "report.json").read_text())
    assert report["verdict"] == "clean" and report["findings"] == []
    for rank in report["ranks"]:
        windows = [w for w in rank["windows"] if w["complete"]]
        assert [(w["grad_syncs"], w["grad_sync_micro_batches"]) for w in windows] == [
            (1, [3]),
            (1, [3]),
        ]


def test_fix_verify_passes_script_arguments_after_script(tmp_path: Path) -> None:
    # GIVEN the unfixed script, which takes --steps, in a project directory
    (tmp_path / "proj").mkdir()
    script = tmp_path / "proj" / "train.py"
    script.write_text((FIXTURES / f"{NANOGPT}.in.py").read_text())
    # WHEN fix --verify is run from the parent directory and given the script's own option
    # after SCRIPT, without --
    done = run_syncscope("fix", "--verify", "proj/train.py", "--steps", "1", cwd=tmp_path)
    # THEN both profiles ran one window (--steps 1 reached the script), the fix reached the
    # minimum, and nothing was written (a dry run with a problem: exit 1)
    assert done.returncode == 1, done.stderr[-2000:]
    table = {line.split("  ")[0]: line.split() for line in done.stdout.splitlines()}
    assert table["grad syncs per window"][-2:] == ["4", "1"], done.stdout
    assert "minimum reached: one grad sync per window" in done.stdout
    assert (
        "training matches: every parameter equal on every rank after its optimizer step"
        in done.stdout
    )
    assert script.read_text() == (FIXTURES / f"{NANOGPT}.in.py").read_text()


SLOW_WHEN_FIXED = """
import os, sys, time
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
model = DDP(torch.nn.Linear(4, 4))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
slow = "_syncscope_fixed_" in os.path.basename(__file__)  # the verify copy takes its time
for step in range(1000 if slow else 2):
    for micro in range(2):
        loss = model(torch.randn(2, 4)).sum() / 2
        loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    if slow:
        time.sleep(0.1)
dist.destroy_process_group()
"""


def test_sigterm_during_verify_leaves_nothing_behind(tmp_path: Path) -> None:
    # GIVEN fix --verify on a script whose fixed copy trains for a long time
    (tmp_path / "proj").mkdir()
    (tmp_path / "tmp").mkdir()
    script = tmp_path / "proj" / "train.py"
    script.write_text(SLOW_WHEN_FIXED)
    env = dict(os.environ, OMP_NUM_THREADS="1", TMPDIR=str(tmp_path / "tmp"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "syncscope", "fix", "--verify", "proj/train.py"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    copy = tmp_path / "proj" / "_syncscope_fixed_train.py"
    try:
        # WHEN it gets SIGTERM while the fixed copy is being profiled
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not copy.exists() and proc.poll() is None:
            time.sleep(0.1)
        assert copy.exists(), "the fixed copy was never profiled"
        time.sleep(2)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    # THEN it stops, the copy and the temporary run directories are gone, the script is intact
    assert proc.returncode != 0
    assert "Traceback" not in err, err[-2000:]
    assert not copy.exists()
    assert list((tmp_path / "tmp").glob("syncscope-verify-*")) == []
    assert script.read_text() == SLOW_WHEN_FIXED
    # and no rank of the interrupted profile outlives it
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and _processes_running(str(copy)):
        time.sleep(0.2)
    assert not _processes_running(str(copy))


RANKS_PRINT_IN_ANY_ORDER = """
import os
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
data = torch.Generator().manual_seed(rank)
accum = 4
for step in range(3):
    for micro in range(accum):
        loss = model(torch.randn(4, 8, generator=data)).pow(2).mean() / accum
        loss.backward()
    optimizer.step()
    optimizer.zero_grad()
# every rank says its loss; the ranks' lines reach the terminal in any order (here: the
# fixed copy's in the other order, so that the test does not depend on chance)
order = range(world - 1, -1, -1) if "_syncscope_fixed_" in __file__ else range(world)
for turn in order:
    if turn == rank:
        print(f"rank {rank} final loss {loss.item() * accum:.2f}", flush=True)
    dist.barrier()
dist.destroy_process_group()
"""


def test_a_redundant_sync_fix_is_accepted_whatever_the_printed_losses_say(
    tmp_path: Path,
) -> None:
    # GIVEN a script that syncs every micro-batch and whose ranks each print
    # "rank N final loss X", in an order that differs between the two runs
    script = tmp_path / "train.py"
    script.write_text(RANKS_PRINT_IN_ANY_ORDER)
    result = fix_source(script.read_text())
    assert [p.code for p in result.problems] == ["SYN101"]
    # WHEN fix --verify profiles the original and the fix
    checked = verify(script, result.fixed, ["SYN101"], ("--nproc-per-node", "2"))
    # THEN the printed losses differ as read, but training is the same: accepted
    assert checked.original.losses is not None and checked.fixed.losses is not None
    assert checked.original.losses != checked.fixed.losses
    assert checked.ok, render(checked)
    assert checked.training is not None and checked.training.status == "match", render(checked)
    assert checked.training.windows == 3
    assert checked.training.largest < 1e-6  # float32 reduction order only
    assert (
        "training matches: every parameter equal on every rank after each of 3 optimizer steps"
        in (render(checked)[-1])
    )


UNSEEDED = """
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
model = DDP(torch.nn.Linear(8, 1))  # initialised and fed from unseeded generators
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(2):
    for micro in range(2):
        loss = model(torch.randn(4, 8)).pow(2).mean() / 2
        loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    if dist.get_rank() == 0:
        print(f"step {step} loss {loss.item():.6f}", flush=True)
dist.destroy_process_group()
"""


def test_a_script_that_seeds_nothing_is_verified_from_seeded_runs(tmp_path: Path) -> None:
    # GIVEN a script whose parameters and data come from generators it never seeds
    script = tmp_path / "train.py"
    script.write_text(UNSEEDED)
    result = fix_source(script.read_text())
    # WHEN verified THEN both runs start alike and train alike: accepted
    checked = verify(script, result.fixed, [p.code for p in result.problems])
    assert checked.ok, render(checked)
    assert checked.training is not None and checked.training.status == "match"
    assert checked.original.losses == checked.fixed.losses


ACCELERATE_MANUAL_GATE = """
import torch
from accelerate import Accelerator

torch.manual_seed(0)
accum = 4
accelerator = Accelerator(cpu=True)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
dataset = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
loader = torch.utils.data.DataLoader(dataset, batch_size=4)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
for i, (x, y) in enumerate(loader):
    out = model(x)
    loss = torch.nn.functional.mse_loss(out, y) / accum
    accelerator.backward(loss)
    if (i + 1) % accum == 0:
        optimizer.step()
        optimizer.zero_grad()
        if accelerator.is_main_process:
            print(f"step {i // accum} loss {loss.item():.6f}", flush=True)
"""


def test_an_accelerate_fix_that_drops_the_loss_division_is_accepted(tmp_path: Path) -> None:
    # GIVEN an Accelerate loop with a hand % accum gate and loss / accum (8 batches a rank)
    script = tmp_path / "train.py"
    script.write_text(ACCELERATE_MANUAL_GATE)
    result = fix_source(script.read_text())
    # its rewrite: accelerator.accumulate, and the division left to accelerator.backward
    assert "with accelerator.accumulate(model):" in result.fixed
    assert "gradient_accumulation_steps=accum" in result.fixed
    assert "loss = torch.nn.functional.mse_loss(out, y)\n" in result.fixed
    # WHEN verified
    checked = verify(script, result.fixed, [p.code for p in result.problems])
    # THEN the printed loss is 4x the original's, and the fix is accepted: same training
    assert checked.original.losses and checked.fixed.losses
    for before, after in zip(checked.original.losses, checked.fixed.losses, strict=True):
        assert after == pytest.approx(4 * before, rel=1e-4)
    assert checked.ok, render(checked)
    assert checked.minimum, render(checked)
    assert checked.training is not None and checked.training.status == "match", render(checked)
    assert checked.training.windows == 2


def test_a_fix_that_changes_training_is_refused_naming_window_and_parameter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from syncscope.errors import SyncscopeError
    from syncscope.fixes import codemod
    from syncscope.fixes.driver import fix

    # GIVEN the every-micro-batch example and a wrong rewrite of it: one sync per window,
    # but at the first micro-batch (the other three never reduced)
    for name in ("ddp_sync_every_step.py", "common.py"):
        shutil.copy(ROOT / "examples" / name, tmp_path / name)
    script = tmp_path / "ddp_sync_every_step.py"
    original = script.read_text()
    right = fix_source(original)
    assert "is_last = micro == args.accum - 1" in right.fixed
    wrong = dataclasses.replace(
        right, fixed=right.fixed.replace("micro == args.accum - 1", "micro == 0")
    )
    monkeypatch.setattr(codemod, "fix_source", lambda *a, **k: wrong)
    monkeypatch.chdir(tmp_path)
    # WHEN fix --apply --verify runs it
    with pytest.raises(SyncscopeError) as refused:
        fix(script, apply=True, verify=True)
    # THEN it is refused (exit 2) naming the first window, the rank and the parameter with
    # both values, and nothing is written
    message = str(refused.value)
    number = r"-?[\d.]+(e-?\d+)?"
    assert re.search(
        rf"training differs after window 0's optimizer step, rank 0, parameter \d\.(weight|bias): "
        rf"original {number}, fixed {number} \(fingerprints; allowed difference {number}\)",
        message,
    ), message
    assert message.endswith("the fix was not applied")
    printed = capsys.readouterr().out
    assert "minimum reached: one grad sync per window" in printed
    assert "training DIFFERS although the original was only wasteful: after window 0's" in printed
    assert script.read_text() == original
    assert not (tmp_path / "ddp_sync_every_step.py.bak").exists()


def _processes_running(needle: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if needle in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found
