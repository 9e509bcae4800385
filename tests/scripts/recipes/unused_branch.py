"""A DDP model with a branch some micro-batches skip, built with ``find_unused_parameters=False``
(DDP's default), accumulated with a correct ``no_sync`` gate: on the first window whose last
micro-batch skips the branch, DDP's reducer waits for gradients that never come and torch
stops the job at the next forward ("Expected to have finished reduction in the prior
iteration ... find_unused_parameters=True").

Public shape: the multi-task and mixture-of-experts loops of DDP's own issue tracker (a head
used by some batches only), with the accumulation of torch's DDP tutorial.

    torchrun --nproc-per-node 2 unused_branch.py [--windows 3] [--accum 4]

Expected truth: window 0 (its last micro-batch uses the branch) reduces once, on the last
micro-batch; window 1's last micro-batch skips it, its reduction never finishes, and the job
fails at window 2's first forward with torch's RuntimeError. The loop's sync gate is right.
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


class TwoHeads(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(16, 16)
        self.head = nn.Linear(16, 4)
        self.aux = nn.Linear(16, 4)  # used on some micro-batches only

    def forward(self, x: torch.Tensor, use_aux: bool) -> torch.Tensor:
        h = torch.relu(self.body(x))
        out = self.head(h)
        return out + self.aux(h) if use_aux else out


def main(truth: Truth) -> None:
    args = parse()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(TwoHeads())  # find_unused_parameters=False: the default
    truth.ddp_comm_hook(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(dist.get_rank())
    for window in range(args.windows):
        for micro in range(args.accum):
            truth.micro(micro)
            last = micro == args.accum - 1
            use_aux = window == 0 or micro % 2 == 0  # window 1's last micro-batch skips it
            with contextlib.nullcontext() if last else model.no_sync():
                loss = model(torch.randn(8, 16, generator=g), use_aux).pow(2).mean()
                truth.backward(loss / args.accum)
        optimizer.step()
        optimizer.zero_grad()
        truth.end_window()
    dist.destroy_process_group()


if __name__ == "__main__":
    t = Truth("unused_branch")
    t.run(lambda: main(t))
