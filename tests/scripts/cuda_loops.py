"""Accumulation loops on CUDA for tests/gpu: ``cuda_loops.py PATTERN``.

The backend comes from ``CUDA_LOOPS_BACKEND`` (``nccl``, the default, or ``gloo``: DDP over
gloo on CUDA tensors lets two ranks share one GPU, which NCCL refuses). Every rank uses
``cuda:LOCAL_RANK % device_count``. ``CUDA_LOOPS_DEVICE=cpu`` runs the same loops on the CPU
over gloo (tests/integration/test_cuda_loops_on_cpu.py: the GPU tests' comparison, run where
there is no GPU). Patterns follow tests/scripts/loops.py and patterns.md; the tests assert what
syncscope measures against what this script counted, never against the pattern's name.

Ground truth (``CUDA_LOOPS_TRUTH=DIR``: each rank writes ``DIR/truth-RANK.json``), taken
without syncscope by tests/helpers/truth.py: every ``torch.distributed``
collective of the loop (op, bytes, window, micro-batch, phase), the buckets a DDP model
reduced (a pass-through comm hook: DDP's reducer calls c10d from C++), the micro-batches of
each window (a window ends with a real optimizer step: Accelerate's ``sync_gradients``), the
wrapped model's type, and the device memory allocated at the end of each backward.

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

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout: tests.helpers
from tests.helpers.truth import all_ops, count_buckets, count_collectives

STATE: dict[str, object] = {"counting": False, "window": 0, "micro": 0, "phase": "other"}
LOG: list[dict[str, object]] = []
BUCKETS: list[dict[str, object]] = []
count_collectives(STATE, LOG, all_ops())  # before FSDP or Accelerate is imported

from torch import nn  # noqa: E402

PATTERN = sys.argv[1]
STEPS = int(os.environ.get("LOOPS_STEPS", "2"))
ACCUM = 4
WIDTH = int(os.environ.get("CUDA_LOOPS_WIDTH", "256"))
ON_CPU = os.environ.get("CUDA_LOOPS_DEVICE", "cuda") == "cpu"
BACKEND = "gloo" if ON_CPU else os.environ.get("CUDA_LOOPS_BACKEND", "nccl")
LOCAL = int(os.environ.get("LOCAL_RANK", "0"))
if ON_CPU:
    DEVICE = torch.device("cpu")
else:
    DEVICE = torch.device("cuda", LOCAL % torch.cuda.device_count())
    torch.cuda.set_device(DEVICE)
dist.init_process_group(BACKEND)
RANK = dist.get_rank()
torch.manual_seed(0)
MICROS: list[int] = []  # micro-batches of each window closed by a real optimizer step
ALLOCATED: list[int] = []  # per window: the most device memory allocated after a backward


def data(step: int, micro: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(100 * step + 10 * micro + RANK)
    return torch.randn(8, WIDTH, generator=g).to(DEVICE)


def mlp(layers: int = 3) -> nn.Sequential:
    return nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(layers)]).to(DEVICE)


def forward(model, x: torch.Tensor) -> torch.Tensor:  # type: ignore[no-untyped-def]
    STATE["phase"] = "forward"
    loss = model(x).pow(2).mean()
    STATE["phase"] = "other"
    return loss  # type: ignore[no-any-return]


def backward(loss: torch.Tensor, how=torch.Tensor.backward) -> None:  # type: ignore[no-untyped-def]
    STATE["phase"] = "backward"
    how(loss)
    STATE["phase"] = "other"
    if not ON_CPU:
        allocated = torch.cuda.memory_allocated(DEVICE)
        window = int(STATE["window"])  # type: ignore[call-overload]
        if len(ALLOCATED) <= window:
            ALLOCATED.append(allocated)
        ALLOCATED[window] = max(ALLOCATED[window], allocated)


def boundary(micros: int) -> None:
    """A real optimizer step closed the window of ``micros`` micro-batches."""
    MICROS.append(micros)
    STATE["window"] = int(STATE["window"]) + 1  # type: ignore[call-overload]
    STATE["micro"] = 0


def loop(model, optimizer, mode: str) -> None:  # type: ignore[no-untyped-def]
    """``mode``: "every" (no no_sync), "no_sync" (forward and backward inside, correct),
    "backward_only" (forward outside: DDP still syncs)."""
    for step in range(STEPS):
        for micro in range(ACCUM):
            STATE["micro"] = micro
            last = micro == ACCUM - 1
            ctx = contextlib.nullcontext() if last or mode == "every" else model.no_sync()
            if mode == "backward_only":
                loss = forward(model, data(step, micro))
                with ctx:
                    backward(loss)
            else:
                with ctx:
                    backward(forward(model, data(step, micro)))
        optimizer.step()
        optimizer.zero_grad()
        boundary(ACCUM)


def ddp(module: nn.Module) -> nn.Module:
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(module, device_ids=None if ON_CPU else [DEVICE.index])
    count_buckets(model, STATE, BUCKETS)
    return model


MODEL: object = None
FRAMEWORK: dict[str, object] = {}
STATE["counting"] = True
if PATTERN in ("every", "no_sync", "backward_only"):
    MODEL = ddp(mlp())
    loop(MODEL, torch.optim.SGD(MODEL.parameters(), 0.1), PATTERN)  # type: ignore[attr-defined]
elif PATTERN == "accelerate":
    # Accelerate gives DDP ``device_ids=[local rank]``; ranks sharing one GPU need its own
    # switch ACCELERATE_BYPASS_DEVICE_MAP=true (DDP then takes the module's device), which the
    # test sets where the GPUs are fewer than the ranks
    from accelerate import Accelerator

    accelerator = Accelerator(gradient_accumulation_steps=ACCUM, cpu=ON_CPU)
    plain = mlp()
    MODEL, opt = accelerator.prepare(plain, torch.optim.SGD(plain.parameters(), 0.1))
    if isinstance(MODEL, torch.nn.parallel.DistributedDataParallel):
        count_buckets(MODEL, STATE, BUCKETS)
    FRAMEWORK = {
        "distributed_type": str(accelerator.distributed_type),
        "num_processes": accelerator.num_processes,
        "device": str(accelerator.device),
    }
    micros = 0
    for step in range(STEPS * ACCUM):
        STATE["micro"] = micros
        with accelerator.accumulate(MODEL):
            backward(forward(MODEL, data(step, 0)), accelerator.backward)
            opt.step()
            opt.zero_grad()
        micros += 1
        if accelerator.sync_gradients:  # the optimizer really stepped
            boundary(micros)
            micros = 0
elif PATTERN == "fsdp1_no_sync":  # FSDP1 decides at backward: no_sync holds unsharded grads
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    MODEL = FSDP(mlp(), device_id=DEVICE)
    loop(MODEL, torch.optim.SGD(MODEL.parameters(), 0.1), "no_sync")  # type: ignore[attr-defined]
elif PATTERN in ("fsdp2_toggle", "fsdp2_no_toggle", "hsdp_no_toggle", "hsdp_toggle"):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = None
    if PATTERN.startswith("hsdp"):
        world = dist.get_world_size()
        mesh = init_device_mesh(
            DEVICE.type, (1, world), mesh_dim_names=("replicate", "shard")
        )  # 1 x N: HSDP's code path with one replica
    model = mlp()
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    MODEL = model
    opt = torch.optim.SGD(model.parameters(), 0.1)
    for step in range(STEPS):
        for micro in range(ACCUM):
            STATE["micro"] = micro
            last = micro == ACCUM - 1
            if PATTERN == "fsdp2_toggle":
                model.set_requires_gradient_sync(last)  # type: ignore[operator]
            elif PATTERN == "hsdp_toggle":
                model.set_requires_all_reduce(last)  # type: ignore[operator]
            backward(forward(model, data(step, micro)))
        opt.step()
        opt.zero_grad()
        boundary(ACCUM)
elif PATTERN == "compiled_no_sync":  # inductor on CUDA
    import torch._dynamo.utils

    MODEL = ddp(mlp())
    compiled = torch.compile(MODEL, backend="inductor")
    loop(compiled, torch.optim.SGD(compiled.parameters(), 0.1), "no_sync")  # type: ignore[attr-defined]
    out = os.environ.get("CUDA_LOOPS_COUNTERS")
    if out:
        counters = {k: dict(v) for k, v in torch._dynamo.utils.counters.items()}
        Path(out, f"counters-{RANK}.json").write_text(json.dumps(counters, default=str))
else:
    raise SystemExit(f"unknown pattern {PATTERN}")
STATE["counting"] = False
if not ON_CPU:
    torch.cuda.synchronize()
truth_dir = os.environ.get("CUDA_LOOPS_TRUTH")
if truth_dir:
    truth = {
        "rank": RANK,
        "world_size": dist.get_world_size(),
        "backend": dist.get_backend(),
        "device": str(DEVICE),
        "model_type": type(MODEL).__name__,
        "framework": FRAMEWORK,
        "micro_batches": MICROS,
        "collectives": LOG,
        "buckets": BUCKETS,
        "allocated": ALLOCATED,
    }
    Path(truth_dir, f"truth-{RANK}.json").write_text(json.dumps(truth))
dist.destroy_process_group()
