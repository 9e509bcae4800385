"""A trainer's own sync helpers, as public trainers write them: ``sync_helpers.py PATTERN``.

- ``grad-sync-context-fsdp2``: ``grad_sync_context(model, is_boundary)`` handles only
  ``DistributedDataParallel``; the model is FSDP2, so it enters nothing.
- ``no-sync-outer-module``: a ``no_sync(model)`` helper that looks at the outermost module
  only; DDP sits inside the user's ``Outer`` module, so it enters nothing.
- ``grad-sync-context-ddp``: the same helper on a DDP model: it works (clean).
"""

import contextlib
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

PATTERN = sys.argv[1]
ACCUM = 4


@contextlib.contextmanager
def grad_sync_context(model, is_boundary):
    """Skip DDP's gradient all-reduce off the accumulation boundary."""
    if isinstance(model, DDP) and not is_boundary:
        with model.no_sync():
            yield
    else:
        yield


def no_sync(model, enabled=True):
    """DDP's no_sync() when the model is DDP-wrapped, else nothing."""
    if enabled and isinstance(model, DDP):
        return model.no_sync()
    return contextlib.nullcontext()


class Outer(nn.Module):
    """The trainer's model: a head over a DDP-wrapped body."""

    def __init__(self, body):
        super().__init__()
        self.body = body
        self.head = nn.Identity()

    def forward(self, x):
        return self.head(self.body(x))


def build():
    net = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 16))
    if PATTERN == "grad-sync-context-fsdp2":
        from torch.distributed.fsdp import fully_shard

        for layer in net:
            if isinstance(layer, nn.Linear):
                fully_shard(layer)
        return fully_shard(net)
    if PATTERN == "no-sync-outer-module":
        return Outer(DDP(net))
    return DDP(net)


def main():
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = build()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(dist.get_rank())
    for _step in range(2):
        for micro in range(ACCUM):
            x = torch.randn(4, 16, generator=g)
            is_boundary = micro == ACCUM - 1
            if PATTERN == "no-sync-outer-module":
                with no_sync(model, enabled=not is_boundary):
                    loss = model(x).pow(2).mean() / ACCUM
                    loss.backward()
            else:
                with grad_sync_context(model, is_boundary):
                    loss = model(x).pow(2).mean() / ACCUM
                    loss.backward()
        opt.step()
        opt.zero_grad()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
