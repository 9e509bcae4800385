"""A small MLP under DDP: the second small-step capture-cost workload (issue 31).

4 x (Linear(512, 512) + ReLU), batch 16, a mean-squared-error loss against a fixed target,
AdamW, 4 micro-batches under ``no_sync()`` on 2 gloo ranks with one thread each: optimizer
steps of about 14-20 ms on a 2-core machine, two DDP bucket all-reduces per step and little
else, so that whatever capture does per micro-batch and per collective weighs as much as it
can beside the model's compute. ``--compile`` wraps the DDP model in ``torch.compile``
(``--backend``, default ``aot_eager``); its compilation happens in the warm-up windows.

    torchrun --standalone --nproc-per-node 2 small_mlp.py [--compile]
"""

from __future__ import annotations

import argparse
import contextlib

import torch
import torch.nn.functional as F
from _bench import Clock, finish, init
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

LAYERS, HIDDEN, BATCH = 4, 512, 16


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--windows", type=int, default=112, help="timed optimizer steps")
    parser.add_argument("--warmup", type=int, default=8, help="untimed optimizer steps first")
    parser.add_argument("--accum", type=int, default=4, help="micro-batches per step")
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--backend", default="aot_eager")
    args = parser.parse_args()
    args.steps = args.warmup + args.windows
    # what Clock and init read
    args.layers, args.hidden, args.batch, args.torch_profiler, args.device = (
        LAYERS,
        HIDDEN,
        BATCH,
        None,
        "cpu",
    )
    return args


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for _ in range(LAYERS):
            layers += [nn.Linear(HIDDEN, HIDDEN), nn.ReLU()]
        self.body = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(self.body(x), target)


def make_data(rank: int, accum: int = 4) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """One (input, target) per micro-batch, different on every rank."""
    g = torch.Generator().manual_seed(1000 + rank)
    return [
        (torch.randn(BATCH, HIDDEN, generator=g), torch.randn(BATCH, HIDDEN, generator=g))
        for _ in range(accum)
    ]


def main() -> None:
    args = parse_args()
    rank = init(args)
    torch.manual_seed(0)
    model: nn.Module = DDP(Net())
    ddp = model
    if args.compile:
        model = torch.compile(model, backend=args.backend)
    optimizer = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
    data = make_data(rank, args.accum)
    clock = Clock(args, rank, "small_mlp" + ("_compiled" if args.compile else ""))

    for step in range(args.steps):  # noqa: B007 (the shape users write)
        for micro in range(args.accum):
            is_last = micro == args.accum - 1
            with ddp.no_sync() if not is_last else contextlib.nullcontext():
                loss = model(*data[micro]) / args.accum
                loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        clock.tick()
    clock.report()
    finish(args, rank)


if __name__ == "__main__":
    main()
