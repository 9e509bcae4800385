"""``DDP(static_graph=True)`` with ``no_sync()`` around forward and backward on every
micro-batch but the last: the textbook accumulation loop.

Public shape: huggingface/accelerate issue #3679 (``accumulate()``, which enters
``no_sync()``, on a model prepared with ``static_graph=True``; pytorch/pytorch #187732 is
the same failure in torch). With a static graph DDP records the graph on its first
iteration; a first backward under ``no_sync()`` never arms the autograd hooks and fails on
every rank with the reducer's internal assert (``expect_autograd_hooks_``).

    torchrun --nproc-per-node 2 static_graph_no_sync.py [--windows 3] [--accum 4]

Expected: the first backward raises on both ranks (recorded as the truth's ``error``,
window 0, no optimizer step). Measured on torch 2.13: in that backward DDP still hands its
one bucket to the comm hook (1 all-reduce of 1360 bytes at micro-batch 0) before the
reducer's assert. static_graph_workaround.py is the loop that runs.
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
    args = parse()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4)), static_graph=True)
    truth.ddp_comm_hook(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(rank)
    for _ in range(args.windows):
        for micro in range(args.accum):
            truth.micro(micro)
            is_last = micro == args.accum - 1
            with contextlib.nullcontext() if is_last else model.no_sync():
                loss = model(torch.randn(8, 16, generator=g)).pow(2).mean() / args.accum
                with truth.phase("backward"):
                    loss.backward()
        optimizer.step()
        truth.compare_replicas(dict(model.module.named_parameters()))
        optimizer.zero_grad()
        truth.end_window()
    dist.destroy_process_group()


if __name__ == "__main__":
    t = Truth("static_graph_no_sync")
    t.run(lambda: main(t))
