"""What keeping the hooks out of Dynamo costs in eager mode (no torch.compile anywhere).

Every hook body syncscope runs is kept out of Dynamo's reach (docs/concepts.md,
"torch.compile") by ``syncscope.capture.hooks.opaque.opaque``: ``torch.compiler.disable`` where
Dynamo could see the call, the body itself otherwise. This prints, side by side and
interleaved, the time of one hook call bare, through ``opaque`` and through
``torch.compiler.disable`` alone, and the time of a captured micro-batch and optimizer step
with the hooks wrapped each of those three ways::

    python benchmarks/internals/hook_wrapping.py [--rounds 15] [--calls 20000] [--steps 40]

Single process, no process group: the hooks' cost does not depend on the collectives.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from syncscope.capture.hooks import install as instrument
from syncscope.capture.hooks.opaque import opaque
from syncscope.capture.recorder.core import MemorySink, Recorder

WRAPS: dict[str, Callable[[Callable[..., Any]], Callable[..., Any]]] = {
    "bare": lambda fn: fn,
    "opaque": opaque,
    "disable": torch.compiler.disable,
}


def per_call_ns(fn: Callable[[], Any], calls: int) -> float:
    t0 = time.perf_counter_ns()
    for _ in range(calls):
        fn()
    return (time.perf_counter_ns() - t0) / calls


def backward_us(wrap: str, steps: int) -> float:
    """Median time of one captured micro-batch (forward, backward) and optimizer step, the
    hooks wrapped the ``wrap`` way."""
    original = instrument._opaque
    instrument._opaque = WRAPS[wrap]  # type: ignore[assignment]
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
    parser.add_argument("--steps", type=int, default=40, help="captured steps timed per round")
    args = parser.parse_args()
    torch.set_num_threads(1)

    def hook() -> int:
        return 1

    calls: dict[str, list[float]] = {name: [] for name in WRAPS}
    steps: dict[str, list[float]] = {name: [] for name in WRAPS}
    hooks = {name: wrap(hook) for name, wrap in WRAPS.items()}
    for i in range(args.rounds):  # interleaved, the order rotated every round
        names = list(WRAPS)
        names = names[i % 3 :] + names[: i % 3]
        for name in names:
            calls[name].append(per_call_ns(hooks[name], args.calls))
        for name in names:
            steps[name].append(backward_us(name, args.steps))
    call = {name: statistics.median(v) for name, v in calls.items()}
    step = {name: statistics.median(v) for name, v in steps.items()}
    print(f"hook call, bare function:            {call['bare']:8.0f} ns")
    for name, label in (("opaque", "opaque()"), ("disable", "torch.compiler.disable")):
        print(
            f"hook call, {label + ':':<26}{call[name]:8.0f} ns  "
            f"(+{call[name] - call['bare']:.0f} ns per call)"
        )
    for name in WRAPS:
        print(f"captured micro-batch + step, hooks {name + ':':<9}{step[name]:8.1f} us")
    for name in ("opaque", "disable"):
        ratios = [x / y for x, y in zip(steps[name], steps["bare"], strict=True)]
        print(
            f"{name} / bare: median of {len(ratios)} paired rounds "
            f"{statistics.median(ratios):.3f} (min {min(ratios):.3f}, max {max(ratios):.3f})"
        )


if __name__ == "__main__":
    main()
