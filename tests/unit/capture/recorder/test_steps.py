"""Closure steps and what a gradient reduction is, in-process (``track()``, a real gloo
process group of world size 1: DDP still all-reduces there)."""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from syncscope.capture.fingerprint import fingerprint
from syncscope.testing.track import track

ACCUM = 4
STEPS = 2


def data(step: int, micro: int) -> torch.Tensor:
    return torch.randn(4, 8, generator=torch.Generator().manual_seed(10 * step + micro))


def model_of(**kwargs: object) -> DDP:
    torch.manual_seed(0)
    return DDP(nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1)), **kwargs)  # type: ignore[arg-type]


@pytest.mark.usefixtures("process_group")
def test_last_micro_batch_inside_step_closure_is_the_windows_sync() -> None:
    # GIVEN Lightning's shape: micro-batches 0-2 under no_sync, micro-batch 3's forward and
    # backward inside optimizer.step(closure)
    model = model_of()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    seen: list[list[float]] = []
    with track() as stats:
        for step in range(STEPS):
            for micro in range(ACCUM - 1):
                with model.no_sync():
                    model(data(step, micro)).pow(2).mean().backward()

            def closure(step: int = step) -> torch.Tensor:
                loss = model(data(step, ACCUM - 1)).pow(2).mean()
                loss.backward()
                fp = fingerprint(opt)
                assert fp is not None
                seen.append(fp.result())
                return loss

            opt.step(closure)
            opt.zero_grad()
    # THEN the closure's backward is the window's last micro-batch, and its all-reduce the
    # one grad sync
    assert [w["micro_batches"] for w in stats.windows] == [ACCUM] * STEPS
    assert stats.grad_syncs_per_window == [1] * STEPS
    assert [w["grad_sync_micro_batches"] for w in stats.windows] == [[ACCUM - 1]] * STEPS
    assert stats.findings == []
    # the fingerprint is of the gradients the update used: taken after the closure ran
    assert [list(w.fingerprint or ()) for w in stats.run.ranks[0].windows] == seen
    phases = {c.phase for w in stats.run.ranks[0].windows for c in w.collectives if c.grad_sync}
    assert phases == {"backward"}


@pytest.mark.usefixtures("process_group")
def test_closure_only_window_has_a_fingerprint() -> None:
    # no gradient exists at the step pre-hook: only a fingerprint after the closure sees one
    model = model_of()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with track() as stats:
        for step in range(STEPS):
            opt.zero_grad(set_to_none=True)

            def closure(step: int = step) -> torch.Tensor:
                loss = model(data(step, 0)).pow(2).mean()
                loss.backward()
                return loss

            opt.step(closure=closure)  # keyword form
    windows = stats.run.ranks[0].windows
    assert [len(w.micro_batches) for w in windows] == [1] * STEPS
    assert all(w.fingerprint is not None for w in windows)
    assert stats.grad_syncs_per_window == [1] * STEPS
    assert all(w.step_ns < w.duration_ns for w in windows)


@pytest.mark.usefixtures("process_group")
def test_lbfgs_calls_its_closure_several_times_in_one_window() -> None:
    model = model_of()
    opt = torch.optim.LBFGS(model.parameters(), lr=0.1, max_iter=3)
    calls = [0] * STEPS
    with track() as stats:
        for step in range(STEPS):

            def closure(step: int = step) -> torch.Tensor:
                calls[step] += 1
                opt.zero_grad()
                loss = model(data(step, 0)).pow(2).mean()
                loss.backward()
                return loss

            opt.step(closure)
    # one window per step; every closure evaluation is a micro-batch that reduces
    assert len([w for w in stats.windows if w["complete"]]) == STEPS
    assert [w["micro_batches"] for w in stats.windows] == calls
    assert min(calls) > 1
    assert [w["grad_sync_micro_batches"] for w in stats.windows] == [list(range(n)) for n in calls]


@pytest.mark.usefixtures("process_group")
def test_closure_running_several_micro_batches() -> None:
    model = model_of()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with track() as stats:
        for step in range(STEPS):

            def closure(step: int = step) -> None:
                for micro in range(ACCUM):
                    ctx = model.no_sync() if micro < ACCUM - 1 else contextlib.nullcontext()
                    with ctx:
                        model(data(step, micro)).pow(2).mean().backward()

            opt.step(closure)
            opt.zero_grad()
    assert [w["micro_batches"] for w in stats.windows] == [ACCUM] * STEPS
    assert [w["grad_sync_micro_batches"] for w in stats.windows] == [[ACCUM - 1]] * STEPS
    assert stats.findings == []


@pytest.mark.usefixtures("process_group")
def test_metric_all_reduce_of_a_bias_sized_tensor_is_not_a_grad_sync() -> None:
    # GIVEN a one-output head (bias gradient: 1 element) and a 1-element loss all-reduce
    model = model_of()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with track() as stats:
        for step in range(STEPS):
            for micro in range(ACCUM):
                ctx = model.no_sync() if micro < ACCUM - 1 else contextlib.nullcontext()
                with ctx:
                    loss = model(data(step, micro)).pow(2).mean()
                    loss.backward()
                metric = loss.detach().reshape(1).clone()
                dist.all_reduce(metric)  # what self.log(..., sync_dist=True) does
            opt.step()
            opt.zero_grad()
    # THEN the metric all-reduces are collectives of the window, never grad syncs
    for w in stats.windows:
        assert w["collectives"]["all_reduce"] == ACCUM + 1
        assert (w["grad_syncs"], w["grad_sync_collectives"]) == (1, 1)
        assert w["grad_sync_bytes"] == (8 * 8 + 8 + 8 + 1) * 4
    assert stats.findings == []


@pytest.mark.usefixtures("process_group")
def test_user_reductions_of_gradients_by_storage_or_content() -> None:
    from torch._utils import _flatten_dense_tensors

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 1))
    with track() as stats:
        opt = torch.optim.SGD(model.parameters(), lr=0.01)  # known from its creation
        for step, how in enumerate(("grad", "flat", "clone", "other")):
            model(data(step, 0)).pow(2).mean().backward()
            grads = [p.grad for p in model.parameters() if p.grad is not None]
            if how == "grad":
                for g in grads:
                    dist.all_reduce(g)  # shares storage with .grad
            elif how == "flat":
                dist.all_reduce(_flatten_dense_tensors(grads))  # holds their values
            elif how == "clone":
                dist.all_reduce(grads[0].clone())  # one gradient's values
            else:
                # the size of all gradients flattened, not their values
                dist.all_reduce(torch.ones(sum(g.numel() for g in grads)))
            opt.step()
            opt.zero_grad()
    assert [w["grad_sync_collectives"] for w in stats.windows] == [4, 1, 1, 0]


@pytest.mark.usefixtures("process_group")
def test_unused_parameter_map_of_find_unused_parameters_is_bookkeeping() -> None:
    # the HF Trainer turns find_unused_parameters on: DDP all-reduces an int map in backward
    model = model_of(find_unused_parameters=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with track() as stats:
        for step in range(STEPS):
            model(data(step, 0)).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
    grad_bytes = (8 * 8 + 8 + 8 + 1) * 4
    for w in stats.run.ranks[0].windows:
        reduces = [c for c in w.collectives if c.op == "all_reduce" and c.phase == "backward"]
        assert sorted(c.dtype for c in reduces) == ["float32", "int32"]
        assert [c.bucket for c in w.grad_sync_collectives] == [0]
        assert w.grad_sync_bytes == grad_bytes


@pytest.mark.usefixtures("process_group")
def test_python_comm_hook_reducing_the_bucket_is_a_grad_sync() -> None:
    model = model_of()

    def hook(state, bucket):  # type: ignore[no-untyped-def]  # (string annotations fail DDP's check)
        work = dist.all_reduce(bucket.buffer(), async_op=True)
        assert work is not None
        return work.get_future().then(lambda fut: fut.value()[0])

    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with track() as stats:
        model.register_comm_hook(None, hook)  # seen registered: its bucket is known
        for step in range(STEPS):
            model(data(step, 0)).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
    assert stats.grad_syncs_per_window == [1] * STEPS
    assert all(w["grad_sync_bytes"] == (8 * 8 + 8 + 8 + 1) * 4 for w in stats.windows)
