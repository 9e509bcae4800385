"""Functional collectives (``_c10d_functional``) are counted like any other.

tests/scripts/functional.py issues, per window of 2 micro-batches, one activation
all-reduce per micro-batch (a collective, not a grad sync) and one gradient all-reduce per
parameter (4 parameters) at the end: eager, inside an inductor-compiled function, and as a
tensor-parallel MLP on a (2, 2) mesh of 4 gloo ranks (activations on the tp group, gradients
on the dp group).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, ProfiledRun, profile

pytestmark = pytest.mark.slow
SCRIPT = ROOT / "tests" / "scripts" / "functional.py"


def colls(run: ProfiledRun, rank: int) -> list[dict[str, Any]]:
    path = run.run_dir / "ranks" / f"rank-{rank:05d}.jsonl"
    events = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    groups: dict[str, Any] = {}  # format 2: a group's ranks once, in its "pg" event
    out = []
    for e in events:
        if e.get("type") == "pg":
            groups[e["pg"]] = e["group"]
        elif e.get("type") == "coll":
            out.append({"group": groups.get(e["pg"]), **e})
    return out


def dones(run: ProfiledRun, rank: int) -> set[int]:
    path = run.run_dir / "ranks" / f"rank-{rank:05d}.jsonl"
    events = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {e["seq"] for e in events if e.get("type") == "done"}


@pytest.mark.parametrize("mode", ["eager", "compiled"])
def test_functional_all_reduces_counted(profiled, mode: str) -> None:  # type: ignore[no-untyped-def]
    run = profiled(SCRIPT, "--mode", mode)
    assert run.proc.returncode == 0, run.proc.stderr[-3000:]
    for rank in (0, 1):
        windows = run.complete_windows(rank)
        assert len(windows) == 2
        for w in windows:
            assert w["collectives"]["all_reduce"] == 2 + 4  # 2 activations, 4 gradients
            assert w["grad_sync_collectives"] == 4
            assert w["grad_syncs"] == 1
        functional = [c for c in colls(run, rank) if c["raw"].startswith("_c10d_functional::")]
        assert len(functional) == 12  # never the calls made while a graph is traced
        grads = [c for c in functional if c["grad_storage"]]
        assert sorted(c["bytes"] for c in grads) == sorted([8 * 8 * 4, 8 * 4] * 2 * 2)
        assert all(c["group"] == [0, 1] and c["dtype"] == "float32" for c in functional)
        # a collective and its wait are one collective: every one is done, none is pending
        assert {c["seq"] for c in functional} <= dones(run, rank)
    # the script reduces its 4 gradients one by one: fragmented-sync when those 3 extra
    # calls cost a material share of the window (measured), nothing else
    findings = run.report["findings"]
    assert {(f["kind"], f["cause"]) for f in findings} <= {("fragmented-sync", "unbucketed")}
    for f in findings:
        assert f["evidence"]["collectives_per_round"] == 4
        assert f["cost"]["extra_collectives_per_window"] == 3


def test_tensor_parallel_activation_collectives_are_not_grad_syncs(tmp_path: Path) -> None:
    run = profile(tmp_path, SCRIPT, "--mode", "tp", nproc=4)
    assert run.proc.returncode == 0, run.proc.stderr[-3000:]
    for rank in range(4):
        tp_group = [rank - rank % 2, rank - rank % 2 + 1]  # mesh [[0, 1], [2, 3]]: ("dp", "tp")
        dp_group = [rank % 2, rank % 2 + 2]
        windows = run.complete_windows(rank)
        assert len(windows) == 2
        for w in windows:
            assert w["collectives"]["all_reduce"] == 6
            assert w["grad_sync_collectives"] == 4
            assert w["grad_syncs"] == 1
        functional = [c for c in colls(run, rank) if c["raw"].startswith("_c10d_functional::")]
        kinds = Counter((tuple(c["group"]), c["grad_storage"], c["issuer"]) for c in functional)
        # activations: the row-parallel output all-reduce on the tp group, one per micro-batch
        assert kinds[(tuple(tp_group), False, "torch")] == 4
        # gradients: one all-reduce per parameter shard on the dp group, per window
        assert kinds[(tuple(dp_group), True, "user")] == 8
        assert len(functional) == 12


def test_compiled_autograd_ddp_python_reducer(profiled) -> None:  # type: ignore[no-untyped-def]
    run = profiled(ROOT / "tests" / "scripts" / "compiled_autograd.py")
    assert run.proc.returncode == 0, run.proc.stderr[-3000:]
    assert "rank 0 compiled autograd captures 2" in run.proc.stdout  # torch did use it
    for rank in (0, 1):
        windows = run.complete_windows(rank)
        assert len(windows) == 2
        for w in windows:
            assert w["collectives"]["all_reduce"] == 4  # one per gradient, last micro-batch
            assert w["grad_sync_collectives"] == 4
            assert w["grad_syncs"] == 1
            assert w["grad_sync_micro_batches"] == [3]
        functional = [c for c in colls(run, rank) if c["raw"].startswith("_c10d_functional::")]
        assert len(functional) == 8 and all(c["issuer"] == "ddp" for c in functional)
    assert run.report["verdict"] == "clean", run.report["findings"]
