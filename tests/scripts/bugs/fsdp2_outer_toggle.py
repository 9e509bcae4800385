"""FSDP2's sync toggle looked up on a PEFT-style outer module that is not an ``FSDPModule``.

Public shape: verl-project/verl PR #7095 (review): with LoRA, the trained object is a
PEFT-style wrapper around the FSDP2-sharded model, and the accumulation loop's
``if hasattr(model, "set_requires_gradient_sync"): model.set_requires_gradient_sync(is_last)``
(the guard many trainers write so that plain DDP is a no-op) finds no such method on the
wrapper: the toggle does nothing, and every micro-batch reduce-scatters.

    torchrun --nproc-per-node 2 fsdp2_outer_toggle.py [--windows 3] [--accum 4]

The inner model: two blocks and the inner root each ``fully_shard``'ed (the root holds a
head); ``PeftLikeModel`` holds it as ``base_model`` and is a plain ``nn.Module``. Expected
truth: reduce-scatters on every micro-batch (4 rounds per window with --accum 4); the
parameters (full tensors) equal across ranks, as FSDP keeps one copy of each shard.
"""

import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the checkout: tests.helpers
from tests.helpers.truth import Truth, parse


class Inner(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(16, 16) for _ in range(2))
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = torch.relu(block(x))
        return self.head(x)


class PeftLikeModel(nn.Module):
    """What PEFT's ``PeftModel`` is to FSDP: an outer module, not an FSDPModule."""

    def __init__(self, base_model: nn.Module) -> None:
        super().__init__()
        self.base_model = base_model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base_model(x)


def main(truth: Truth) -> None:
    args = parse()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    inner = Inner()
    for block in inner.blocks:
        fully_shard(block)
    fully_shard(inner)
    model = PeftLikeModel(inner)
    truth.notes["toggle_found"] = hasattr(model, "set_requires_gradient_sync")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(rank)
    for _ in range(args.windows):
        for micro in range(args.accum):
            truth.micro(micro)
            is_last = micro == args.accum - 1
            if hasattr(model, "set_requires_gradient_sync"):  # False: the wrapper has none
                model.set_requires_gradient_sync(is_last)
            loss = model(torch.randn(8, 16, generator=g)).pow(2).mean() / args.accum
            with truth.phase("backward"):
                loss.backward()
        optimizer.step()
        truth.compare_replicas(dict(model.named_parameters()))
        optimizer.zero_grad()
        truth.end_window()
    dist.destroy_process_group()


if __name__ == "__main__":
    t = Truth("fsdp2_outer_toggle")
    t.run(lambda: main(t))
