"""FSDP2 ``set_requires_gradient_sync(is_last, recurse=False)`` on the root only, with the
inner blocks ``fully_shard``'ed too.

Public shape: pytorch/pytorch issue #124318 (FSDP2 gradient accumulation: the toggle
applies to the module it is called on and, with ``recurse=True`` (the default), to every
FSDP module under it; ``recurse=False`` leaves the inner FSDP modules syncing). The root's
own parameters wait for the last micro-batch, the blocks still reduce-scatter on every one.

    torchrun --nproc-per-node 2 fsdp2_recurse_false.py [--windows 3] [--accum 4]

Expected truth: the blocks reduce-scatter on micro-batches 0-3, the root on 3 only: 4 rounds
per window with --accum 4; the parameters (full tensors) equal across ranks.
"""

import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the checkout: tests.helpers
from tests.helpers.truth import Truth, parse


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(16, 16) for _ in range(2))
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = torch.relu(block(x))
        return self.head(x)


def main(truth: Truth) -> None:
    args = parse()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = Net()
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(rank)
    for _ in range(args.windows):
        for micro in range(args.accum):
            truth.micro(micro)
            is_last = micro == args.accum - 1
            model.set_requires_gradient_sync(is_last, recurse=False)  # the root only
            loss = model(torch.randn(8, 16, generator=g)).pow(2).mean() / args.accum
            with truth.phase("backward"):
                loss.backward()
        optimizer.step()
        truth.compare_replicas(dict(model.named_parameters()))
        optimizer.zero_grad()
        truth.end_window()
    dist.destroy_process_group()


if __name__ == "__main__":
    t = Truth("fsdp2_recurse_false")
    t.run(lambda: main(t))
