"""Two DDP models stepped in one loop (a GAN): D and G, each with its own correct sync gate,
both backwards in every micro-batch, both optimizers stepped once per window.

Public shape: stylegan2-ada's ``training_loop.py``, whose ``ddp_sync(module, sync)`` helper
(``misc.ddp_sync``) returns ``module.no_sync()`` on every accumulation round but the last and
is entered around each phase's forward (DDP decides at forward, so that is correct); here the
D phase and the G phase of each micro-batch, and each model's optimizer stepped after the last.

    torchrun --nproc-per-node 2 gan_two_models.py [--windows 3] [--accum 4] [--d-gate ...]

Expected truth: per window, D's buckets reduced once (in D's backward of the last
micro-batch) and G's once (in G's backward of the last micro-batch): one round per model;
parameters of both models equal across ranks.

``--d-gate none``: D's phase runs with no gate (D reduces on every micro-batch, G stays
right): D's rounds are 4 per window, G's 1. ``--d-gate forever``: D's forward is always under
``no_sync`` (D never reduces: D's replicas diverge, G's stay equal).
"""

import contextlib
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the checkout: tests.helpers
from tests.helpers.truth import Truth


def ddp_sync(module: nn.Module, sync: bool):  # stylegan2-ada's torch_utils/misc.py
    assert isinstance(module, nn.Module)
    if sync or not isinstance(module, DDP):
        return contextlib.nullcontext()
    return module.no_sync()


def parse():
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--windows", type=int, default=3)
    parser.add_argument("--accum", type=int, default=4)
    parser.add_argument("--d-gate", choices=("last", "none", "forever"), default="last")
    return parser.parse_args()


def main(truth: Truth) -> None:
    args = parse()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    generator = DDP(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16)))
    discriminator = DDP(nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 1)))
    truth.ddp_comm_hook(generator, "G")
    truth.ddp_comm_hook(discriminator, "D")
    opt_g = torch.optim.Adam(generator.parameters(), lr=1e-3)
    opt_d = torch.optim.Adam(discriminator.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(rank)
    for _ in range(args.windows):
        for micro in range(args.accum):
            truth.micro(micro)
            sync = micro == args.accum - 1
            d_sync = {"last": sync, "none": True, "forever": False}[args.d_gate]
            real = torch.randn(8, 16, generator=g)
            z = torch.randn(8, 8, generator=g)
            # D phase: D on real and on detached fakes; G not run under autograd
            with ddp_sync(discriminator, d_sync):
                with torch.no_grad():
                    fake = generator.module(z)
                d_loss = (discriminator(fake) - discriminator(real)).mean() / args.accum
            truth.backward(d_loss)
            # G phase: D's weights frozen, its forward under no_sync (it must not reduce)
            discriminator.requires_grad_(False)
            with ddp_sync(generator, sync), ddp_sync(discriminator, False):
                g_loss = -discriminator(generator(z)).mean() / args.accum
            truth.backward(g_loss)
            discriminator.requires_grad_(True)
        opt_d.step()
        opt_g.step()
        truth.compare_replicas(
            {
                **{f"G.{n}": p for n, p in generator.module.named_parameters()},
                **{f"D.{n}": p for n, p in discriminator.module.named_parameters()},
            }
        )
        opt_d.zero_grad()
        opt_g.zero_grad()
        truth.end_window()
    dist.destroy_process_group()


if __name__ == "__main__":
    t = Truth("gan_two_models")
    t.run(lambda: main(t))
