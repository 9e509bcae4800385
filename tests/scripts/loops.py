"""Accumulation loops as people write them, right and wrong: ``loops.py PATTERN``.

Run under syncscope by the integration tests (2 gloo ranks). Each pattern is a loop of
patterns.md (numbers in brackets) or a failure mode: the tests assert what syncscope
measures, never the pattern's name.
"""

import contextlib
import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

PATTERN = sys.argv[1]
STEPS = int(os.environ.get("LOOPS_STEPS", "2"))
ACCUM = 4
dist.init_process_group("gloo")
RANK = dist.get_rank()
torch.manual_seed(0)


def data(step, micro):
    g = torch.Generator().manual_seed(100 * step + 10 * micro + RANK)
    return torch.randn(4, 16, generator=g)


def mlp(layers=2):
    return nn.Sequential(*[nn.Linear(16, 16) for _ in range(layers)])


def ddp_loop(model, optimizer, before=None, around=None, after_forward=None, reset_each=False):
    for step in range(STEPS):
        for micro in range(ACCUM):
            is_last = micro == ACCUM - 1
            if reset_each:
                optimizer.zero_grad()
            if before:
                before(is_last)
            ctx = around(is_last) if around else contextlib.nullcontext()
            with ctx:
                loss = model(data(step, micro)).pow(2).mean()
                if after_forward:
                    after_forward(is_last)
                loss.backward()
        optimizer.step()
        optimizer.zero_grad()


def fsdp_model():
    from torch.distributed.fsdp import fully_shard

    model = mlp()
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    return model


if PATTERN == "flag-before-forward":  # [6] nanoGPT: correct
    model = DDP(mlp())
    ddp_loop(
        model,
        torch.optim.SGD(model.parameters(), 0.1),
        before=lambda last: setattr(model, "require_backward_grad_sync", last),
    )
elif PATTERN == "flag-after-forward":  # [7] build-nanogpt bug: last micro-batch never synced
    model = DDP(mlp())
    ddp_loop(
        model,
        torch.optim.SGD(model.parameters(), 0.1),
        after_forward=lambda last: setattr(model, "require_backward_grad_sync", last),
    )
elif PATTERN == "forward-only-no_sync":  # [4] correct under DDP
    model = DDP(mlp())
    opt = torch.optim.SGD(model.parameters(), 0.1)
    for step in range(STEPS):
        for micro in range(ACCUM):
            with model.no_sync() if micro < ACCUM - 1 else contextlib.nullcontext():
                loss = model(data(step, micro)).pow(2).mean()
            loss.backward()
        opt.step()
        opt.zero_grad()
elif PATTERN == "step-inside-no_sync":  # [8] never syncs: ranks diverge
    model = DDP(mlp())
    opt = torch.optim.SGD(model.parameters(), 0.1)
    with model.no_sync():
        ddp_loop(model, opt)
elif PATTERN == "zero-grad-each-micro":  # [9] only the last micro-batch survives
    model = DDP(mlp())
    opt = torch.optim.SGD(model.parameters(), 0.1)
    ddp_loop(
        model,
        opt,
        around=lambda last: model.no_sync() if not last else contextlib.nullcontext(),
        reset_each=True,
    )
elif PATTERN == "grad-none-mid-window":  # a hand-written reset: p.grad = None
    model = DDP(mlp())
    opt = torch.optim.SGD(model.parameters(), 0.1)
    for step in range(STEPS):
        for micro in range(ACCUM):
            if micro == 2:
                for p in model.parameters():
                    p.grad = None
            with model.no_sync() if micro < ACCUM - 1 else contextlib.nullcontext():
                model(data(step, micro)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
elif PATTERN == "off-by-one-gate":  # [10] it % N == 0 with it from 0
    model = DDP(mlp())
    opt = torch.optim.SGD(model.parameters(), 0.1)
    for it in range(ACCUM * STEPS + 1):
        is_step = it % ACCUM == 0
        with model.no_sync() if not is_step else contextlib.nullcontext():
            model(data(it, 0)).pow(2).mean().backward()
        if is_step:
            opt.step()
            opt.zero_grad()
elif PATTERN == "manual-flat-allreduce":  # no DDP: one flattened all-reduce before the step
    from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

    model = mlp()
    for p in model.parameters():
        dist.broadcast(p.data, 0)
    opt = torch.optim.SGD(model.parameters(), 0.1)
    for step in range(STEPS):
        for micro in range(ACCUM):
            model(data(step, micro)).pow(2).mean().backward()
        grads = [p.grad for p in model.parameters()]
        flat = _flatten_dense_tensors(grads)
        dist.all_reduce(flat)
        flat /= dist.get_world_size()
        for g, s in zip(grads, _unflatten_dense_tensors(flat, grads), strict=False):
            g.copy_(s)
        opt.step()
        opt.zero_grad()
elif PATTERN in ("per-param-allreduce", "per-param-allreduce-mlp3"):  # fragmented
    # one all-reduce per parameter tensor: 20 tensors, or 6 (a 3-layer MLP)
    model = mlp(layers=3 if PATTERN.endswith("mlp3") else 10)
    opt = torch.optim.SGD(model.parameters(), 0.1)
    for step in range(STEPS):
        for micro in range(ACCUM):
            model(data(step, micro)).pow(2).mean().backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        opt.step()
        opt.zero_grad()
elif PATTERN == "fsdp2-forward-only-toggle":  # [5] FSDP decides at backward: syncs anyway
    model = fsdp_model()
    opt = torch.optim.SGD(model.parameters(), 0.1)
    for step in range(STEPS):
        for micro in range(ACCUM):
            model.set_requires_gradient_sync(micro == ACCUM - 1)
            loss = model(data(step, micro)).pow(2).mean()
            model.set_requires_gradient_sync(True)
            loss.backward()
        opt.step()
        opt.zero_grad()
elif PATTERN == "fsdp2-never-reenabled":  # [14] parameters never change
    model = fsdp_model()
    opt = torch.optim.SGD(model.parameters(), 0.1)
    model.set_requires_gradient_sync(False)
    ddp_loop(model, opt)
elif PATTERN in ("hsdp-no-toggle", "hsdp-all-reduce-toggle"):  # 4 ranks, 2x2 mesh
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
    model = mlp()
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), 0.1)
    for step in range(STEPS):
        for micro in range(ACCUM):
            if PATTERN == "hsdp-all-reduce-toggle":  # reduce-scatter stays, all-reduce last only
                model.set_requires_all_reduce(micro == ACCUM - 1)
            model(data(step, micro)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
elif PATTERN == "mismatch-hang":  # [16] rank 1 issues one more collective, then everyone waits
    model = DDP(mlp())
    opt = torch.optim.SGD(model.parameters(), 0.1)
    ddp_loop(model, opt)
    if RANK == 1:
        dist.all_reduce(torch.ones(3))
    dist.barrier()
elif PATTERN == "raise-on-rank-1":
    model = DDP(mlp())
    opt = torch.optim.SGD(model.parameters(), 0.1)
    ddp_loop(model, opt)
    if RANK == 1:
        raise RuntimeError("boom on rank 1")
    time.sleep(0.5)
elif PATTERN == "raise-in-backward-everywhere":  # every rank: micro-batch 2 of window 1

    def boom(grad):
        raise RuntimeError(f"boom in backward on rank {RANK}")

    model = DDP(mlp())
    opt = torch.optim.SGD(model.parameters(), 0.1)
    for step in range(STEPS):
        for micro in range(ACCUM):
            with model.no_sync() if micro < ACCUM - 1 else contextlib.nullcontext():
                loss = model(data(step, micro)).pow(2).mean()
                if (step, micro) == (1, 2):
                    loss.register_hook(boom)
                loss.backward()
        opt.step()
        opt.zero_grad()
elif PATTERN == "abort-at-shutdown-on-rank-1":  # the script ends well, the process does not
    model = DDP(mlp())
    opt = torch.optim.SGD(model.parameters(), 0.1)
    ddp_loop(model, opt)
    if RANK == 1:
        import atexit
        import os

        def late_abort() -> None:  # after the script and syncscope's exit record
            time.sleep(2)  # rank 0 writes its own exit record meanwhile
            os.abort()

        atexit.register(late_abort)
elif PATTERN == "accelerate-sync-each-batch":  # deliberate: sync every micro-batch (memory)
    from accelerate import Accelerator
    from accelerate.utils import GradientAccumulationPlugin

    plugin = GradientAccumulationPlugin(num_steps=ACCUM, sync_each_batch=True)
    accelerator = Accelerator(gradient_accumulation_plugin=plugin, cpu=True)
    plain = mlp()
    model, opt = accelerator.prepare(plain, torch.optim.SGD(plain.parameters(), 0.1))
    for step in range(STEPS * ACCUM):
        with accelerator.accumulate(model):
            accelerator.backward(model(data(step, 0)).pow(2).mean())
            opt.step()
            opt.zero_grad()
elif PATTERN == "no-dist":
    pass
else:
    raise SystemExit(f"unknown pattern {PATTERN}")
if dist.is_initialized():
    dist.destroy_process_group()
