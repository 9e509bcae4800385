"""A GradScaler run whose first steps overflow: ``scaler.step(optimizer)`` finds inf in the
unscaled gradients and skips ``optimizer.step()``, then the loop calls ``zero_grad()``, as
every AMP loop does; the scale backs off and later steps are taken.

Public shape: torch's AMP recipe (``scaler.scale(loss).backward()``, ``scaler.step``,
``scaler.update``, ``optimizer.zero_grad()``) with DDP and ``no_sync`` accumulation. On CPU
the overflow is made real rather than injected: the forward runs under fp16 autocast and the
scaler starts at ``init_scale=2**18``, so the fp16 gradients overflow to inf (fp16's largest
value is 65504); each skipped step halves the scale (GradScaler's default backoff), so the
first steps are skipped until it fits.

    torchrun --nproc-per-node 2 amp_skipped_step.py [--windows 5] [--accum 4]

Expected truth: every window reduces once (DDP's buckets, last micro-batch); the first
windows' steps are skipped (the parameters do not move), later ones are taken; replicas
equal after every window.
"""

import contextlib
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the checkout: tests.helpers
from tests.helpers.truth import Truth, parse


def main(truth: Truth) -> None:
    args = parse(default_windows=5)
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4)))
    truth.ddp_comm_hook(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**18)
    g = torch.Generator().manual_seed(dist.get_rank())
    skipped = []
    for _ in range(args.windows):
        for micro in range(args.accum):
            truth.micro(micro)
            last = micro == args.accum - 1
            with contextlib.nullcontext() if last else model.no_sync():
                with torch.autocast("cpu", dtype=torch.float16):
                    loss = model(torch.randn(8, 16, generator=g)).pow(2).mean() / args.accum
                truth.backward(scaler.scale(loss))
        before = [p.detach().clone() for p in model.parameters()]
        scaler.step(optimizer)
        scaler.update()
        moved = any(not torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))
        skipped.append(not moved)
        truth.compare_replicas(dict(model.module.named_parameters()))
        optimizer.zero_grad()
        truth.end_window()
    truth.notes["skipped"] = skipped
    dist.destroy_process_group()


if __name__ == "__main__":
    t = Truth("amp_skipped_step")
    t.run(lambda: main(t))
