"""A small decoder-only transformer under DDP: the small-step capture-cost workload.

nanoGPT-shaped (token and position embeddings, pre-norm blocks of causal self-attention and
an MLP, a tied head), our own code, synthetic tokens. The defaults give optimizer steps of
about 15-20 ms on 2 CPU ranks of a quiet 2-core machine (measured 2026-11-24; ``--batch 2``
gives about 10 ms), with 4 micro-batches under ``no_sync()``, where the fixed cost of each
hook weighs most. The machine's speed varies from day to day: on 2026-11-23 batch 2 gave
15-25 ms and batch 8 50-85 ms. ``--compile`` wraps the DDP model in ``torch.compile``
(``--backend``, default ``aot_eager``; inductor also works where a C++ compiler is present);
its compilation happens in the warm-up windows.

    torchrun --standalone --nproc-per-node 2 small_transformer.py [--compile]
"""

from __future__ import annotations

import argparse
import contextlib
import math

import torch
import torch.nn.functional as F
from _bench import Clock, finish, init
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--windows", type=int, default=20, help="timed optimizer steps")
    parser.add_argument("--warmup", type=int, default=5, help="untimed optimizer steps first")
    parser.add_argument("--accum", type=int, default=4, help="micro-batches per step")
    parser.add_argument("--blocks", type=int, default=2)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=256)
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--backend", default="aot_eager")
    args = parser.parse_args()
    args.steps = args.warmup + args.windows
    # what Clock and init read
    args.layers, args.hidden, args.torch_profiler, args.device = (
        args.blocks,
        args.width,
        None,
        "cpu",
    )
    return args


class Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.ln2 = nn.LayerNorm(width)
        self.fc = nn.Linear(width, 4 * width)
        self.out = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class TinyGPT(nn.Module):
    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__()
        self.tok = nn.Embedding(args.vocab, args.width)
        self.pos = nn.Embedding(args.seq, args.width)
        self.blocks = nn.ModuleList(Block(args.width, args.heads) for _ in range(args.blocks))
        self.ln = nn.LayerNorm(args.width)
        self.head = nn.Linear(args.width, args.vocab, bias=False)
        self.head.weight = self.tok.weight  # tied, as nanoGPT does
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * args.blocks))

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.tok(idx) + self.pos(positions)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln(x))
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def main() -> None:
    args = parse_args()
    rank = init(args)
    torch.manual_seed(0)
    model: nn.Module = DDP(TinyGPT(args))
    ddp = model
    if args.compile:
        model = torch.compile(model, backend=args.backend)
    optimizer = torch.optim.AdamW(ddp.parameters(), lr=3e-4)
    data = make_data(args, rank)
    clock = Clock(args, rank, "small_transformer" + ("_compiled" if args.compile else ""))

    for step in range(args.steps):  # noqa: B007 (the shape users write)
        for micro in range(args.accum):
            is_last = micro == args.accum - 1
            tokens = data[micro]
            with ddp.no_sync() if not is_last else contextlib.nullcontext():
                loss = model(tokens[:, :-1], tokens[:, 1:]) / args.accum
                loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        clock.tick()
    clock.report()
    finish(args, rank)


def make_data(args: argparse.Namespace, rank: int) -> list[torch.Tensor]:
    """One batch of tokens per micro-batch, different on every rank."""
    g = torch.Generator().manual_seed(1000 + rank)
    shape = (args.batch, args.seq + 1)
    return [torch.randint(0, args.vocab, shape, generator=g) for _ in range(args.accum)]


if __name__ == "__main__":
    main()
