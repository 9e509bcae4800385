"""HSDP (4 gloo ranks, 2x2 mesh): an accumulation loop inside a function, step after it.

No toggle: the cross-replica all-reduce runs on every micro-batch. ``syncscope fix --from``
a profile of it must rewrite ``training_step`` with ``set_requires_all_reduce``.
"""

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard


def training_step(model, opt, batches):
    for i, (x, y) in enumerate(batches):  # noqa: B007 (as written by users; fix uses i)
        loss = nn.functional.mse_loss(model(x), y) / len(batches)
        loss.backward()
    opt.step()
    opt.zero_grad()


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
    model = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 16))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(rank)
    for _ in range(2):
        batches = [
            (torch.randn(4, 16, generator=g), torch.randn(4, 16, generator=g)) for _ in range(4)
        ]
        training_step(model, opt, batches)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
