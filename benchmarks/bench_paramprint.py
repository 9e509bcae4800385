"""The cost of parameter fingerprints (``SYNCSCOPE_PARAM_FINGERPRINTS=1``, what ``fix --verify``
turns on), on a small and a large optimizer step, in one process on the CPU.

For each model: a training window (forward, backward, AdamW step) timed alone, and the
fingerprint's two parts timed after each step of the same loop: ``take`` (on the training
thread: one view per parameter and one copy) and ``fields`` (the sums, on the event
writer's thread). Reported: medians in milliseconds and ``take`` as a fraction of the
window. Run from the repository root: ``python benchmarks/bench_paramprint.py [--reps 20]``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from torch import nn

from syncscope.capture.paramprint import ParamPrints


def small() -> nn.Module:
    return nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 32))


def large() -> nn.Module:
    layer = nn.TransformerEncoderLayer(256, 4, 1024, batch_first=True)
    return nn.TransformerEncoder(layer, 12, enable_nested_tensor=False)


MODELS: dict[str, tuple[Callable[[], nn.Module], tuple[int, ...]]] = {
    "small (MLP, 4 parameters, 2k elements)": (small, (8, 32)),
    "large (12-layer transformer, 144 parameters, 9.5M elements)": (large, (4, 64, 256)),
}


def measure(make: Callable[[], nn.Module], shape: tuple[int, ...], reps: int) -> dict[str, float]:
    torch.manual_seed(0)
    model = make()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    plan, _ = ParamPrints().plan(optimizer, [model])
    x = torch.randn(*shape)
    window, take, fields = [], [], []
    for rep in range(reps + 2):
        t0 = time.perf_counter()
        model(x).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        t1 = time.perf_counter()
        pending = plan.take()
        t2 = time.perf_counter()
        assert pending is not None
        pending.fields()
        t3 = time.perf_counter()
        if rep >= 2:  # the first two warm up
            window.append(t1 - t0)
            take.append(t2 - t1)
            fields.append(t3 - t2)
    params = sum(1 for p in model.parameters())
    elements = sum(p.numel() for p in model.parameters())
    return {
        "params": params,
        "elements": elements,
        "window_ms": statistics.median(window) * 1e3,
        "take_ms": statistics.median(take) * 1e3,
        "fields_ms": statistics.median(fields) * 1e3,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(1)
    for name, (make, shape) in MODELS.items():
        m = measure(make, shape, args.reps)
        print(
            f"{name}: window {m['window_ms']:.2f} ms, take {m['take_ms']:.3f} ms "
            f"({m['take_ms'] / m['window_ms']:.1%} of the window), fields (writer thread) "
            f"{m['fields_ms']:.3f} ms"
        )


if __name__ == "__main__":
    main()
