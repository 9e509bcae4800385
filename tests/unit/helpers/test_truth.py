"""The ground-truth counter of the GPU tests (tests/helpers/truth.py's ``count_collectives``
and ``count_buckets``, used by tests/scripts/cuda_loops.py), checked on CPU against a second,
independent count: the ``c10d::`` ops torch.profiler records in the same loop, on a one-rank
gloo group, with no syncscope in the process. Also the world-size-1 facts the GPU tests rely
on, where they hold on CPU too: a shard group of one reduce-scatters nothing, an HSDP 1 x 1
mesh keeps the replicate all-reduce (docs/gpu.md).
"""

from __future__ import annotations

import contextlib
import re
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

from tests.helpers import truth
from tests.helpers.truth import assert_buckets_are_the_reductions, truth_windows

ACCUM = 4
# FSDP2 issues no reduce-scatter in a shard group of one on torch 2.11 (measured on CUDA,
# docs/gpu.md), 2.13 and 2.15 (CPU); torch 2.8 issues one per FSDP module on every
# micro-batch that syncs (measured); 2.9 and 2.10 were not run
TORCH_RELEASE = tuple(int(x) for x in torch.__version__.split(".")[:2])
FSDP2_SKIPS_REDUCE_SCATTER_ALONE = TORCH_RELEASE >= (2, 11)


def cpu_limit(pattern: str) -> str:
    """torch's own error where it cannot run this pattern on CPU ranks (gloo), by release
    (docs/torch-versions.md), or "": FSDP2's all-gather calls the CPU stream's
    ``record_event`` (from 2.7); HSDP's replicate all-reduce uses ``ReduceOp.AVG``, which gloo
    lacks, until 2.8."""
    if TORCH_RELEASE < (2, 7):
        return "'Stream' object has no attribute 'record_event'"
    if TORCH_RELEASE < (2, 8) and pattern.startswith("hsdp"):
        return "Cannot use ReduceOp.AVG with Gloo"
    return ""


# torch.profiler's op name -> torch.distributed's family, as tests/helpers/truth.py names it
C10D = {
    "c10d::allreduce_": "all_reduce",
    "c10d::reduce_scatter_tensor_coalesced_": "reduce_scatter",
    "c10d::_reduce_scatter_base_": "reduce_scatter",
    "c10d::allgather_into_tensor_coalesced_": "all_gather",
    "c10d::_allgather_base_": "all_gather",
}


class Counted:
    """One loop counted twice: by the truth counter's wrappers and comm hook, and by
    torch.profiler."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.truth = truth
        for name in self.truth.all_ops():  # the wrappers are undone after the test
            monkeypatch.setattr(dist, name, getattr(dist, name))
        self.state: dict[str, Any] = {"counting": True, "window": 0, "micro": 0, "phase": "other"}
        self.log: list[dict[str, Any]] = []
        self.buckets: list[dict[str, Any]] = []
        self.truth.count_collectives(self.state, self.log, self.truth.all_ops())
        self.profiled: list[tuple[int, str]] = []  # (micro-batch, op family)

    def run(self, model: nn.Module, micro_step: Callable[[int], None]) -> dict[str, Any]:
        """``ACCUM`` micro-batches, then the window's record in the GPU tests' terms."""
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            for micro in range(ACCUM):
                self.state["micro"] = micro
                with torch.profiler.record_function(f"micro#{micro}"):
                    micro_step(micro)
        self.profiled = _c10d_by_micro(prof)
        return {
            "micro_batches": [ACCUM],
            "collectives": self.log,
            "buckets": self.buckets,
        }

    def backward(self, loss: torch.Tensor) -> None:
        self.state["phase"] = "backward"
        loss.backward()  # type: ignore[no-untyped-call]
        self.state["phase"] = "other"


def _c10d_by_micro(prof: torch.profiler.profile) -> list[tuple[int, str]]:
    events = list(prof.events())  # type: ignore[no-untyped-call]
    micros = [
        (e.time_range.start, e.time_range.end, int(e.name.split("#")[1]))
        for e in events
        if e.name.startswith("micro#")
    ]
    out = []
    for e in events:
        if e.name in C10D:
            (micro,) = [m for lo, hi, m in micros if lo <= e.time_range.start <= hi]
            out.append((micro, C10D[e.name]))
    return sorted(out)


def _truth_by_micro(log: list[dict[str, Any]]) -> list[tuple[int, str]]:
    family = {"all_reduce": "all_reduce", "reduce_scatter_single": "reduce_scatter"}
    family |= {"reduce_scatter_tensor": "reduce_scatter", "all_gather_single": "all_gather"}
    family |= {"all_gather_into_tensor": "all_gather"}
    return sorted((c["micro"], family[c["op"]]) for c in log)


def _x(micro: int) -> torch.Tensor:
    return torch.randn(2, 16, generator=torch.Generator().manual_seed(micro))


@pytest.mark.parametrize("mode", ["every", "no_sync", "backward_only"])
def test_ddp_buckets_and_all_reduces_are_the_ops_the_profiler_records(
    process_group: None, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    # GIVEN DDP with the pass-through counting hook, on one gloo rank
    counted = Counted(monkeypatch)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(
        nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 1))
    )
    counted.truth.count_buckets(model, counted.state, counted.buckets)

    def micro_step(micro: int) -> None:
        last = micro == ACCUM - 1
        ctx = contextlib.nullcontext() if last or mode == "every" else model.no_sync()
        if mode == "backward_only":
            loss = model(_x(micro)).pow(2).mean()
            with ctx:
                counted.backward(loss)
        else:
            with ctx:
                counted.backward(model(_x(micro)).pow(2).mean())

    # WHEN the window runs
    truth = counted.run(model, micro_step)
    # THEN the wrappers' count is the profiler's, micro-batch by micro-batch
    assert _truth_by_micro(counted.log) == counted.profiled
    # and each bucket the hook saw is one of those all-reduces, in the same backward
    assert_buckets_are_the_reductions(truth)
    (window,) = truth_windows(truth)
    assert window["grad_sync_micro_batches"] == sorted({m for m, _ in counted.profiled})
    assert window["grad_sync_collectives"] == len(counted.buckets) == len(counted.profiled)
    grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    assert window["grad_sync_bytes"] == grad_bytes * window["grad_syncs"]  # one bucket each
    # DDP's own rule, seen by both counts: no_sync skips the reduction when forward and
    # backward are inside it, not when only backward is
    assert window["grad_syncs"] == (1 if mode == "no_sync" else ACCUM)


@pytest.mark.parametrize("pattern", ["fsdp2_toggle", "fsdp2_no_toggle", "hsdp_toggle", "hsdp"])
def test_world_size_1_facts_of_fsdp2_and_hsdp(
    process_group: None, monkeypatch: pytest.MonkeyPatch, pattern: str
) -> None:
    # GIVEN FSDP2 on a shard group of one, or HSDP on a 1 x 1 mesh, counted both ways
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    counted = Counted(monkeypatch)
    mesh = None
    if pattern.startswith("hsdp"):
        mesh = init_device_mesh("cpu", (1, 1), mesh_dim_names=("replicate", "shard"))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 16), nn.Linear(16, 16))
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)

    def micro_step(micro: int) -> None:
        last = micro == ACCUM - 1
        if pattern == "fsdp2_toggle":
            model.set_requires_gradient_sync(last)  # type: ignore[operator]
        elif pattern == "hsdp_toggle":
            model.set_requires_all_reduce(last)  # type: ignore[operator]
        counted.backward(model(_x(micro)).pow(2).mean())

    # WHEN the window runs
    if cpu_limit(pattern):  # THEN on a release that cannot run it on CPU, torch says why
        with pytest.raises((AttributeError, RuntimeError), match=re.escape(cpu_limit(pattern))):
            counted.run(model, micro_step)
        return
    truth = counted.run(model, micro_step)
    # THEN the wrappers' count is the profiler's
    assert _truth_by_micro(counted.log) == counted.profiled
    (window,) = truth_windows(truth)
    # and the facts of this torch (docs/torch-versions.md): HSDP's replicate all-reduce, one
    # per FSDP module, on the micro-batches it is enabled on; no reduce-scatter in a shard
    # group of one from torch 2.11, one per FSDP module and sync before it
    ops = Counter(op for _, op in counted.profiled)
    every = list(range(ACCUM))
    all_reduced = [ACCUM - 1] if pattern == "hsdp_toggle" else every
    if pattern.startswith("hsdp"):
        assert ops["all_reduce"] == len(model) * len(all_reduced)
    if FSDP2_SKIPS_REDUCE_SCATTER_ALONE:
        assert ops["reduce_scatter"] == 0
        if pattern.startswith("fsdp2"):
            assert window["grad_syncs"] == 0 and not counted.profiled
        else:
            assert window["grad_sync_micro_batches"] == all_reduced
    else:
        reduced = [ACCUM - 1] if pattern == "fsdp2_toggle" else every
        assert ops["reduce_scatter"] == len(model) * len(reduced)
        assert window["grad_sync_micro_batches"] == reduced


@pytest.mark.filterwarnings("ignore:FSDP is switching to use `NO_SHARD`:UserWarning")
def test_fsdp1_no_sync_reduction_is_the_one_the_profiler_records(
    process_group: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN FSDP1 (one rank: no sharding, its gradients all-reduced) under no_sync on all
    # micro-batches but the last, counted both ways
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    counted = Counted(monkeypatch)
    torch.manual_seed(0)
    model = FSDP(nn.Sequential(nn.Linear(16, 16), nn.Linear(16, 16)), device_id=torch.device("cpu"))

    def micro_step(micro: int) -> None:
        ctx = contextlib.nullcontext() if micro == ACCUM - 1 else model.no_sync()
        with ctx:
            counted.backward(model(_x(micro)).pow(2).mean())

    # WHEN the window runs
    truth = counted.run(model, micro_step)
    # THEN the wrappers see the reduction the profiler records, on the last micro-batch
    assert _truth_by_micro(counted.log) == counted.profiled
    (window,) = truth_windows(truth)
    assert (
        window["grad_sync_micro_batches"] == [ACCUM - 1] == sorted({m for m, _ in counted.profiled})
    )
