"""Two FSDP2 models stepped in one loop (a GAN): D and G, each ``fully_shard``-ed on its own
(two roots), each with its own sync gate, both backwards in every micro-batch, both
optimizers stepped once per window.

FSDP decides at backward, so each model's gate is ``set_requires_gradient_sync(last)`` set
before the backward of its own phase (the FSDP2 form of stylegan2-ada's ``ddp_sync``).

    torchrun --nproc-per-node 2 fsdp_gan_two_models.py [--windows 3] [--accum 4] [--d-gate ...]

Expected truth: per window, D's gradients reduce-scattered once (in D's backward of the last
micro-batch) and G's once (in G's backward of the last micro-batch): one round per model;
parameters of both models equal across ranks. The truth names the model of each reduction by
the phase that ran it: in the D phase G runs under ``no_grad``, in the G phase D is frozen
(``requires_grad_(False)``), so each backward gives gradients to one model only.

``--d-gate none``: D is never toggled (FSDP's sharded accumulation: D reduce-scatters on every
micro-batch, G stays gated): D's rounds are 4 per window, G's 1. ``--d-gate forever``: D's
sync is turned off once and never on again (D never reduces: parameters never change, G's
still do).
"""

import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the checkout: tests.helpers
from tests.helpers.truth import Truth


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
    generator = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16))
    discriminator = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    fully_shard(generator)
    fully_shard(discriminator)
    opt_g = torch.optim.Adam(generator.parameters(), lr=1e-3)
    opt_d = torch.optim.Adam(discriminator.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(rank)
    if args.d_gate == "forever":
        discriminator.set_requires_gradient_sync(False)
    for _ in range(args.windows):
        for micro in range(args.accum):
            truth.micro(micro)
            last = micro == args.accum - 1
            real = torch.randn(8, 16, generator=g)
            z = torch.randn(8, 8, generator=g)
            # D phase: D on real and on fakes made without autograd
            with torch.no_grad():
                fake = generator(z)
            d_loss = (discriminator(fake) - discriminator(real)).mean() / args.accum
            if args.d_gate == "last":
                discriminator.set_requires_gradient_sync(last)
            truth.backward(d_loss, model="D")
            # G phase: D frozen, so only G's gradients are made
            discriminator.requires_grad_(False)
            g_loss = -discriminator(generator(z)).mean() / args.accum
            generator.set_requires_gradient_sync(last)
            truth.backward(g_loss, model="G")
            discriminator.requires_grad_(True)
        opt_d.step()
        opt_g.step()
        truth.compare_replicas(
            {
                **{f"G.{n}": p for n, p in generator.named_parameters()},
                **{f"D.{n}": p for n, p in discriminator.named_parameters()},
            }
        )
        opt_d.zero_grad()
        opt_g.zero_grad()
        truth.end_window()
    dist.destroy_process_group()


if __name__ == "__main__":
    t = Truth("fsdp_gan_two_models")
    t.run(lambda: main(t))
