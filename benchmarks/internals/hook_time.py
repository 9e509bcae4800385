"""Time spent inside syncscope's recorder per window, by hook: a diagnostic, not a benchmark.

    torchrun --standalone --nproc-per-node 1 benchmarks/internals/hook_time.py [--windows 100] [--tiny]

Runs ``workloads/small_transformer.py``'s model (``--tiny``: a near-zero-compute one) under
DDP with 4 micro-batches under ``no_sync()``, every hook installed, and times each outermost
recorder call (and a few helpers, inclusive) with ``time.perf_counter_ns`` (``--cpu``: the
thread's CPU time, which a busy machine's preemption does not inflate). What it shows is
the work done at the hook points *as the training loop meets them*: right after the model's
forward or backward, when syncscope's objects are no longer in the CPU caches, which costs
several times what a warm micro-benchmark of the same call says. The timing wrappers add
about a microsecond per call; the figures are upper bounds.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workloads"))

import small_mlp as mlp
import small_transformer as st

import syncscope.capture.recorder.core as recorder_module
import syncscope.capture.recorder.steps as steps_module
from syncscope.capture import sites
from syncscope.capture.hooks import install as instrument
from syncscope.capture.recorder.core import Recorder
from syncscope.capture.writer import EventWriter

HOOKS = (
    "on_forward_begin",
    "on_forward_end",
    "on_backward_begin",
    "on_backward_end",
    "on_step_begin",
    "on_step_end",
    "on_toggle",
    "on_grad_reset",
    "on_collective",
    "before_collective",
)
HELPERS = ("emit", "poll_works", "_count_grads", "sync_state", "_params")


def small_step(model: str, rank: int, tiny: bool = False) -> Callable[[], None]:
    """One window of small_steps.py's shape ``model`` ("mlp" or "transformer"; ``tiny``: the
    transformer with almost no compute) under DDP: 4 micro-batches, the first 3 under
    ``no_sync()``, then an AdamW step and ``zero_grad``. The process group is initialized."""
    saved, sys.argv[1:] = sys.argv[1:], []
    args = st.parse_args()  # the workload's own defaults
    sys.argv[1:] = saved
    if tiny:
        args.width, args.seq, args.batch, args.vocab, args.heads = 8, 4, 1, 16, 2
    ddp: Any
    if model == "mlp":
        ddp = DDP(mlp.Net())
        data = mlp.make_data(rank)
    else:
        ddp = DDP(st.TinyGPT(args))
        data = [(t[:, :-1], t[:, 1:]) for t in st.make_data(args, rank)]
    optimizer = torch.optim.AdamW(ddp.parameters(), lr=1e-3)

    def window() -> None:
        for micro in range(4):
            with ddp.no_sync() if micro < 3 else contextlib.nullcontext():
                (ddp(*data[micro]) / 4).backward()  # both models return their loss
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return window


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--windows", type=int, default=100)
    parser.add_argument("--tiny", action="store_true", help="a model of almost no compute")
    parser.add_argument(
        "--model",
        choices=("transformer", "mlp"),
        default="transformer",
        help="mlp: small_steps.py's MLP shape (4 x Linear(512, 512) + ReLU, batch 16)",
    )
    parser.add_argument(
        "--cpu",
        action="store_true",
        help="time the hooks in thread CPU time (not inflated by preemption on a busy machine)",
    )
    opts = parser.parse_args()
    dist.init_process_group("gloo")
    step = small_step(opts.model, dist.get_rank(), opts.tiny)

    spent: dict[str, int] = {}
    depth = [0]
    clock = time.thread_time_ns if opts.cpu else time.perf_counter_ns

    def timed(name: str, fn: Callable[..., Any], outermost: bool) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(*a: Any, **k: Any) -> Any:
            if outermost and depth[0]:
                return fn(*a, **k)
            depth[0] += outermost
            t0 = clock()
            try:
                return fn(*a, **k)
            finally:
                spent[name] = spent.get(name, 0) + clock() - t0
                depth[0] -= outermost

        return wrapper

    for name in (*HOOKS, *HELPERS):
        setattr(Recorder, name, timed(name, getattr(Recorder, name), name in HOOKS))
    sites.user_site = timed("user_site", sites.user_site, False)  # type: ignore[assignment]
    sites.issuer_of_collective = timed("issuer", sites.issuer_of_collective, False)  # type: ignore[assignment]
    steps_module.fingerprint = timed("fingerprint", steps_module.fingerprint, False)  # type: ignore[assignment]
    recorder_module.rss_bytes = timed("rss_bytes", recorder_module.rss_bytes, False)  # type: ignore[assignment]

    def window() -> int:
        t0 = clock()
        step()
        return clock() - t0

    with tempfile.TemporaryDirectory(prefix="syncscope-hook-time-") as tmp:
        rec = Recorder(EventWriter(Path(tmp) / "rank.jsonl"), rank=0, world_size=1)
        undo = instrument.install(rec)
        for _ in range(10):
            window()
        spent.clear()
        times = [window() for _ in range(opts.windows)]
        undo()
    n = opts.windows
    total = sum(v for k, v in spent.items() if k in HOOKS)
    print(
        f"window {statistics.median(times) / 1e3:.0f} us (median); inside the recorder "
        f"{total / n / 1e3:.0f} us per window ({100 * total / sum(times):.1f}% of window time)"
    )
    for name, value in sorted(spent.items(), key=lambda kv: -kv[1]):
        kind = "hook" if name in HOOKS else "  in"
        print(f"  {kind} {name:20s} {value / n / 1e3:7.1f} us/window")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
