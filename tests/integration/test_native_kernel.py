"""The compiled kernel for DDP's bucket all-reduces (``syncscope.capture.native``).

It must record exactly what the Python kernel records (only the cost differs), take the
calls it is meant for, hand every other call on, and, where it cannot be had, leave capture
on the Python kernel with the reason in the header and one line from ``syncscope profile``.
It is built once per torch (cached in torch's extension directory) by tests/conftest.py
before the slow tests, as ``syncscope build-kernel`` builds it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from syncscope.analysis import window_rules
from syncscope.capture import native
from syncscope.commands.saved import load_and_diagnose
from tests.conftest import PROFILE_TIMEOUT, ROOT

pytestmark = pytest.mark.slow

BUCKETS = ROOT / "tests" / "scripts" / "buckets.py"
needs_compiler = pytest.mark.skipif(
    shutil.which(os.environ.get("CXX", "c++")) is None or shutil.which("ninja") is None,
    reason="no C++ compiler or ninja here: the compiled kernel cannot be built (capture uses "
    "the Python kernel, which the rest of the suite tests)",
)


@pytest.fixture(scope="module")
def built() -> Path:
    path, why = native.build()
    assert path is not None, f"the compiled kernel did not build: {why}"
    return path


def _use(monkeypatch: pytest.MonkeyPatch, path: Path | None) -> None:
    """This process's capture loads the kernel at ``path`` (None: none, the Python kernel)."""
    monkeypatch.setattr(native, "_loaded", [])
    monkeypatch.setattr(native, "_why_not", [] if path else ["turned off by the test"])
    if path is not None:
        monkeypatch.setenv(native.NATIVE_PATH_ENV, str(path))


def _ddp_events() -> list[dict[str, Any]]:
    """A DDP loop with 4 buckets per synced backward, captured in this process: window 0
    syncs every micro-batch, window 1 only the last; a user all-reduce after each step."""
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    from syncscope.capture.session import CaptureSession

    session, sink = CaptureSession.in_memory(rank=0, world_size=1)
    session.start()
    try:
        torch.manual_seed(0)
        model = DDP(nn.Sequential(*[nn.Linear(64, 64) for _ in range(4)]), bucket_cap_mb=1 / 64)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        for step in range(2):
            for micro in range(3):
                with model.no_sync() if step and micro < 2 else contextlib.nullcontext():
                    model(torch.ones(8, 64)).pow(2).mean().backward()
            optimizer.step()
            optimizer.zero_grad()
            dist.all_reduce(torch.ones(2))
    finally:
        session.close()
    return sink.events


def _comparable(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The events less what differs run to run: times, and where a ``done`` falls (polled at
    the rank's next event, whenever the collective completed)."""
    out = []
    for event in events:
        if event["type"] in ("done", "header"):
            continue
        out.append({k: v for k, v in event.items() if k not in ("t", "t_end", "mem", "fp")})
    return out


@needs_compiler
def test_the_compiled_kernel_records_what_the_python_kernel_records(
    built: Path, process_group: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    _use(monkeypatch, None)
    by_python = _ddp_events()
    _use(monkeypatch, built)
    module = native.get()
    assert module is not None
    before = module.recorded()
    compiled = _ddp_events()
    taken = module.recorded() - before

    buckets = [e for e in compiled if e["type"] == "coll" and e["bucket"] is not None]
    # DDP's first backward reduces one bucket (its first-iteration layout), the 3 synced ones
    # after it 4 each (16 KiB buckets)
    assert [e["bucket"] for e in buckets] == [0] + [0, 1, 2, 3] * 3
    assert taken == len(buckets), "the compiled kernel took every bucket and nothing else"
    assert _comparable(compiled) == _comparable(by_python)
    # the fingerprints too: the compiled sampler copies the bytes torch.cat would
    fingerprints = [[e["fp"] for e in run if e["type"] == "step"] for run in (compiled, by_python)]
    assert fingerprints[0] == fingerprints[1] and all(fingerprints[0])
    assert sorted(e["seq"] for e in compiled if e["type"] == "done") == sorted(
        e["seq"] for e in compiled if e["type"] == "coll"
    ), "every collective seen complete, the compiled kernel's too"
    assert not native.why_not()


@needs_compiler
def test_the_grad_sampler_copies_what_torch_cat_of_the_views_copies(
    built: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fingerprint's samples, taken by the compiled ``GradSampler``: the same bytes as
    the Python path's views and concatenation, for every share of a plan; None (the Python
    path decides) for a gradient missing, not contiguous, of another dtype, needing grad."""
    import torch

    from syncscope.capture import fingerprint as fpm

    _use(monkeypatch, built)
    torch.manual_seed(0)
    shapes = [(512, 512), (512,), (7,), (3000,), (100, 33), (2049,), (64, 64, 3)]
    for dtype in (torch.float32, torch.float64):
        params = [torch.nn.Parameter(torch.randn(*shape, dtype=dtype)) for shape in shapes]
        for p in params:
            p.grad = torch.randn_like(p)
        plan = fpm._plan(torch.optim.SGD(params, lr=0.1))
        assert plan.cycle == 2 and all(s is not None for s in plan.samplers)
        for sampler, share in zip(plan.samplers, plan.shares, strict=True):
            views = [
                p.grad.as_strided((size,), (step,), p.grad.storage_offset()) if step else p.grad
                for p, size, step in share
            ]
            taken = sampler.take()
            assert taken.dtype == dtype and not taken.requires_grad
            assert torch.equal(taken, torch.cat(views))
            assert taken.data_ptr() not in {p.grad.data_ptr() for p, _, _ in share}  # a copy
    first = params[0]
    sampler = plan.samplers[0]
    first.grad = None
    assert sampler.take() is None
    first.grad = torch.randn(512, 512, dtype=torch.float64).t()
    assert sampler.take() is None  # not contiguous
    first.grad_dtype = None
    first.grad = torch.randn(512, 512, dtype=torch.float32)
    assert sampler.take() is None  # a float32 gradient beside float64 ones
    first.grad = torch.randn(512, 512, dtype=torch.float64, requires_grad=True)
    assert sampler.take() is None
    first.grad = torch.randn(512, 512, dtype=torch.float64)
    assert torch.is_tensor(sampler.take())
    module = native.get()
    with pytest.raises(RuntimeError, match="beyond its parameter"):
        module.GradSampler([params[1]], [513], [1])  # 512 elements: the plan never asks so


@needs_compiler
def test_the_kernel_leaves_collectives_of_unrecorded_blocks_alone(
    built: Path, process_group: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Inside ``unrecorded()`` (syncscope's own collectives) neither kernel records."""
    import torch
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    from syncscope.capture.hooks.collectives import unrecorded
    from syncscope.capture.session import CaptureSession

    _use(monkeypatch, built)
    module = native.get()
    assert module is not None
    session, sink = CaptureSession.in_memory(rank=0, world_size=1)
    session.start()
    try:
        model = DDP(nn.Linear(8, 8))
        model(torch.ones(2, 8)).sum().backward()  # recorded
        before = module.recorded()
        with unrecorded():
            model(torch.ones(2, 8)).sum().backward()
        assert module.recorded() == before
    finally:
        session.close()
    buckets = [e for e in sink.events if e["type"] == "coll" and e["phase"] == "backward"]
    assert len(buckets) == 1


def _profile(out: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "syncscope", "profile", "--fail-on", "never"]
    command += ["--nproc-per-node", "2", "--out", str(out), str(BUCKETS)]
    full = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", **env)
    return subprocess.run(
        command, capture_output=True, text=True, timeout=PROFILE_TIMEOUT, cwd=ROOT, env=full
    )


def _rank_events(run_dir: Path, rank: int) -> list[dict[str, Any]]:
    lines = (run_dir / "ranks" / f"rank-{rank:05d}.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


@needs_compiler
def test_profile_records_the_same_run_with_either_kernel(
    built: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    compiled = _profile(tmp_path / "compiled", {})
    python = _profile(tmp_path / "python", {native.ENV: "0"})
    assert compiled.returncode == python.returncode == 0, compiled.stderr + python.stderr
    assert "compiled collective kernel" not in compiled.stderr + python.stderr
    for rank in (0, 1):
        a = _rank_events(tmp_path / "compiled", rank)
        b = _rank_events(tmp_path / "python", rank)
        assert a[0]["collective_kernel"] == "compiled"
        assert b[0]["collective_kernel"] == f"python ({native.ENV}=0)"
        assert _comparable(a) == _comparable(b)
    reports = [
        json.loads((tmp_path / name / "report.json").read_text()) for name in ("compiled", "python")
    ]
    assert reports[0]["grad_syncs_per_window"] == reports[1]["grad_syncs_per_window"]
    # Only the times differ, and fragmented-sync is the finding they decide: it is reported
    # from a measured share of 1% (the calls' issue time; the compiled kernel's is the call
    # alone, the Python kernel's has its own dispatch in it), which on this fixture's 16 KiB
    # gloo buckets reads 0.3-5% window to window (docs/findings/fragmented-sync.md). Each
    # report has it or not by its times; without the share's gate, both find the same rounds.
    for report in reports:
        assert {f["kind"] for f in report["findings"]} - {"fragmented-sync"} == {"redundant-sync"}
    monkeypatch.setattr(window_rules, "FRAGMENT_MIN_SHARE", 0.0)
    found = [_fragments(tmp_path / name) for name in ("compiled", "python")]
    assert found[0] == found[1] == {(r, w, 6 if w == 0 else 3) for r in (0, 1) for w in (0, 1, 2)}


def _fragments(run_dir: Path) -> set[tuple[int, int, int]]:
    """(rank, window, extra collectives) of each fragmented window: 4 buckets where one
    would carry their bytes, in 2 synced micro-batches of window 0 (its first is DDP's
    first-iteration bucket) and the one of windows 1-2."""
    run, _ = load_and_diagnose(run_dir)
    out = set()
    for rank in run.ranks:
        for window in rank.windows:
            if window.complete:
                for o in window_rules._fragmented(rank, window):
                    assert o.evidence["collectives_per_round"] == 4
                    out.add((rank.rank, window.index, int(o.cost["extra_collectives_per_window"])))
    return out


def test_without_a_compiler_profile_says_so_and_records_with_python(tmp_path: Path) -> None:
    """No compiled kernel can be built (the compiler named by CXX does not exist, an empty
    extension directory): one line says so, and the run is recorded all the same."""
    env = {"CXX": str(tmp_path / "no-such-compiler"), "TORCH_EXTENSIONS_DIR": str(tmp_path / "ext")}
    proc = _profile(tmp_path / "run", env)
    assert proc.returncode == 0, proc.stderr
    notes = [line for line in proc.stderr.splitlines() if "no compiled collective kernel" in line]
    assert len(notes) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    header = _rank_events(tmp_path / "run", 0)[0]
    assert header["collective_kernel"] == "python (not built)"
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    # fragmented-sync is decided by the measured share (see the test above)
    assert {f["kind"] for f in report["findings"]} - {"fragmented-sync"} == {"redundant-sync"}
