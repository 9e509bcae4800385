"""What keeping the hooks out of Dynamo costs in eager mode (no torch.compile anywhere).

Every hook body syncscope runs is wrapped in ``torch.compiler.disable`` so that a compiled
model never traces it (docs/concepts.md, "torch.compile"). This prints, side by side and
interleaved, the time of one hook call with and without that wrapping, and the time of a
micro-batch's ``loss.backward()`` under capture with and without it::

    python benchmarks/hook_wrapping.py [--rounds 15]

Single process, no process group: the hooks' cost does not depend on the collectives.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from syncscope.capture import instrument
from syncscope.capture.recorder import MemorySink, Recorder


def per_call_ns(fn: Callable[[], Any], calls: int) -> float:
    t0 = time.perf_counter_ns()
    for _ in range(calls):
        fn()
    return (time.perf_counter_ns() - t0) / calls


def backward_us(wrapped: bool, steps: int) -> float:
    """Median time of one captured micro-batch (forward, backward) and optimizer step."""
    original = instrument._opaque
    if not wrapped:
        instrument._opaque = lambda fn: fn  # type: ignore[assignment]
    rec = Recorder(MemorySink(), rank=0, world_size=1)
    undo = instrument.install(rec)
    try:
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)
        )
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        x = torch.randn(16, 64)
        times = []
        for _ in range(steps):
            t0 = time.perf_counter_ns()
            model(x).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
            times.append(time.perf_counter_ns() - t0)
        return statistics.median(times) / 1e3
    finally:
        undo()
        instrument._opaque = original


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=20000)
    args = parser.parse_args()
    torch.set_num_threads(1)

    def hook() -> int:
        return 1

    disabled = torch.compiler.disable(hook)
    bare_ns, wrapped_ns, eager_us, opaque_us = [], [], [], []
    for i in range(args.rounds):  # interleaved, alternating order
        pair = [("bare", hook), ("wrapped", disabled)]
        for name, fn in pair if i % 2 == 0 else pair[::-1]:
            (bare_ns if name == "bare" else wrapped_ns).append(per_call_ns(fn, args.calls))
        for wrapped in (True, False) if i % 2 == 0 else (False, True):
            (opaque_us if wrapped else eager_us).append(backward_us(wrapped, 40))
    b, w = statistics.median(bare_ns), statistics.median(wrapped_ns)
    e, o = statistics.median(eager_us), statistics.median(opaque_us)
    ratios = [x / y for x, y in zip(opaque_us, eager_us, strict=True)]
    print(f"hook call, bare function:            {b:8.0f} ns")
    print(f"hook call, torch.compiler.disable:   {w:8.0f} ns  (+{w - b:.0f} ns per call)")
    print(f"captured micro-batch + step, hooks bare:     {e:8.1f} us")
    print(f"captured micro-batch + step, hooks wrapped:  {o:8.1f} us")
    print(
        f"wrapped / bare: median of {len(ratios)} paired rounds {statistics.median(ratios):.3f} "
        f"(min {min(ratios):.3f}, max {max(ratios):.3f})"
    )


if __name__ == "__main__":
    main()
