"""Accumulation loops on CUDA for tests/gpu (issue 16): ``cuda_loops.py PATTERN``.

The backend comes from ``CUDA_LOOPS_BACKEND`` (``nccl``, the default, or ``gloo``: DDP over
gloo on CUDA tensors lets two ranks share one GPU, which NCCL refuses). Every rank uses
``cuda:LOCAL_RANK % device_count``. Patterns follow tests/scripts/loops.py and patterns.md;
the tests assert what syncscope measures, never the pattern's name.

With ``CUDA_LOOPS_COUNTERS=DIR`` each rank writes its Dynamo counters to
``DIR/counters-RANK.json`` (the compiled patterns), so a test can compare graph breaks with
and without capture.
"""

import contextlib
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

PATTERN = sys.argv[1]
STEPS = int(os.environ.get("LOOPS_STEPS", "2"))
ACCUM = 4
WIDTH = int(os.environ.get("CUDA_LOOPS_WIDTH", "256"))
BACKEND = os.environ.get("CUDA_LOOPS_BACKEND", "nccl")
LOCAL = int(os.environ.get("LOCAL_RANK", "0"))
DEVICE = torch.device("cuda", LOCAL % torch.cuda.device_count())
torch.cuda.set_device(DEVICE)
dist.init_process_group(BACKEND)
RANK = dist.get_rank()
torch.manual_seed(0)


def data(step: int, micro: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(100 * step + 10 * micro + RANK)
    return torch.randn(8, WIDTH, generator=g).to(DEVICE)


def mlp(layers: int = 3) -> nn.Sequential:
    return nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(layers)]).to(DEVICE)


def loop(model, optimizer, mode: str) -> None:  # type: ignore[no-untyped-def]
    """``mode``: "every" (no no_sync), "no_sync" (forward and backward inside, correct),
    "backward_only" (forward outside: DDP still syncs)."""
    for step in range(STEPS):
        for micro in range(ACCUM):
            last = micro == ACCUM - 1
            ctx = contextlib.nullcontext() if last or mode == "every" else model.no_sync()
            if mode == "backward_only":
                loss = model(data(step, micro)).pow(2).mean()
                with ctx:
                    loss.backward()
            else:
                with ctx:
                    model(data(step, micro)).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()


def ddp(module: nn.Module) -> nn.Module:
    from torch.nn.parallel import DistributedDataParallel as DDP

    return DDP(module, device_ids=[DEVICE.index])


if PATTERN in ("every", "no_sync", "backward_only"):
    model = ddp(mlp())
    loop(model, torch.optim.SGD(model.parameters(), 0.1), PATTERN)
elif PATTERN == "accelerate":
    from accelerate import Accelerator

    accelerator = Accelerator(gradient_accumulation_steps=ACCUM)
    plain = mlp()
    model, opt = accelerator.prepare(plain, torch.optim.SGD(plain.parameters(), 0.1))
    for step in range(STEPS * ACCUM):
        with accelerator.accumulate(model):
            accelerator.backward(model(data(step, 0)).pow(2).mean())
            opt.step()
            opt.zero_grad()
elif PATTERN == "fsdp1_no_sync":  # FSDP1 decides at backward: no_sync holds unsharded grads
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    model = FSDP(mlp(), device_id=DEVICE)
    loop(model, torch.optim.SGD(model.parameters(), 0.1), "no_sync")
elif PATTERN in ("fsdp2_toggle", "fsdp2_no_toggle", "hsdp_no_toggle", "hsdp_toggle"):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = None
    if PATTERN.startswith("hsdp"):
        world = dist.get_world_size()
        mesh = init_device_mesh(
            "cuda", (1, world), mesh_dim_names=("replicate", "shard")
        )  # 1 x N: HSDP's code path with one replica
    model = mlp()
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), 0.1)
    for step in range(STEPS):
        for micro in range(ACCUM):
            last = micro == ACCUM - 1
            if PATTERN == "fsdp2_toggle":
                model.set_requires_gradient_sync(last)
            elif PATTERN == "hsdp_toggle":
                model.set_requires_all_reduce(last)
            model(data(step, micro)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
elif PATTERN == "compiled_no_sync":  # inductor on CUDA
    import torch._dynamo.utils

    model = torch.compile(ddp(mlp()), backend="inductor")
    loop(model, torch.optim.SGD(model.parameters(), 0.1), "no_sync")
    out = os.environ.get("CUDA_LOOPS_COUNTERS")
    if out:
        counters = {k: dict(v) for k, v in torch._dynamo.utils.counters.items()}
        Path(out, f"counters-{RANK}.json").write_text(json.dumps(counters, default=str))
else:
    raise SystemExit(f"unknown pattern {PATTERN}")
torch.cuda.synchronize()
dist.destroy_process_group()
