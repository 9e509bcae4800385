"""Capture cost on a GPU: plain torchrun against ``syncscope profile``, NCCL.

    python benchmarks/bench_gpu.py [--reps 4] [--budget-s 100] [--hidden 2048 --layers 4 ...]

The workload is the ``no_sync`` loop (examples/ddp_no_sync.py run as a benchmark workload,
benchmarks/workloads/_bench.py) with ``--device cuda`` (a window ends with
``torch.cuda.synchronize()``), one rank per GPU. Launches alternate (plain, profile,
profile, plain, ...) so drift hits both alike; the figure is the median of the paired
per-repetition ratios of median window time, with CPU time of rank 0 beside it, and the
run-to-run noise beside that: how far the plain runs' window times lie from each other (half
their range over their median), the same for the profiled runs, and the spread of the paired
ratios. The verdict is "within" the limit (x1.03) only when that noise is below the 3% margin
too, "over" when the ratio exceeds 1 by more than the noise, else "not resolved".
The defaults finish in under 2 minutes on one H100: a repetition is not started once
``--budget-s`` would be passed (at least 2 run). Prints the device, the versions and the
table; writes nothing. Without CUDA it says so and exits 2; ``--device cpu`` runs the same
steps on CPU ranks over gloo (a check of this script, not a GPU figure).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _harness import Launch, LaunchFailed, workload

LIMIT = 1.03
MIN_REPS = 2
VERDICTS = {
    "within": "within the limit",
    "over": "over the limit",
    "not resolved": "not resolved (the run-to-run noise is larger than the margin)",
}


def spread(values: list[float]) -> float:
    """Half the range of ``values`` over their median: the run-to-run noise, as a fraction."""
    return (max(values) - min(values)) / 2 / statistics.median(values)


def summarize(plain: list[float], profiled: list[float]) -> dict[str, Any]:
    """Paired ratio of profiled to plain (one pair per repetition) and the noise beside it.

    ``verdict``: "over" (above LIMIT by more than the run-to-run noise), "within" (at most
    LIMIT, with noise smaller than the margin LIMIT allows), else "not resolved" (the noise
    is too large for this run to tell)."""
    paired = [p / q for p, q in zip(profiled, plain, strict=True)]
    ratio = statistics.median(paired)
    noise = max(spread(plain), spread(profiled))
    if ratio > LIMIT and ratio - 1 > noise:
        verdict = "over"
    elif ratio <= LIMIT and noise <= LIMIT - 1:
        verdict = "within"
    else:
        verdict = "not resolved"
    return {
        "ratio": ratio,
        "low": min(paired),
        "high": max(paired),
        "plain_noise": spread(plain),
        "profiled_noise": spread(profiled),
        "noise": noise,
        "verdict": verdict,
        "reps": len(paired),
    }


def _versions(device: str) -> list[str]:
    import torch

    if device == "cpu":
        return [
            "device: CPU ranks over gloo (a check of this script, not a GPU figure)",
            f"torch {torch.__version__}",
        ]
    return [
        f"device: {torch.cuda.get_device_name(0)} x{torch.cuda.device_count()}",
        f"torch {torch.__version__}, CUDA {torch.version.cuda}, NCCL "
        + ".".join(str(v) for v in torch.cuda.nccl.version()),  # type: ignore[no-untyped-call]
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=4)
    parser.add_argument("--budget-s", type=float, default=100.0,
                        help="start no repetition that would end past this (at least 2 run)")  # fmt: skip
    parser.add_argument("--nproc", type=int, default=1, help="ranks (one GPU each)")
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--windows", type=int, default=10)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    args = parser.parse_args(argv)

    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print(
            "bench_gpu: error: needs a CUDA GPU (none is visible here); --device cpu checks "
            "this script on CPU ranks",
            file=sys.stderr,
        )
        return 2
    workload_args = [
        "--device", args.device, "--hidden", str(args.hidden), "--layers", str(args.layers),
        "--batch", str(args.batch), "--accum", "4", "--windows", str(args.windows),
        "--warmup", "2",
    ]  # fmt: skip
    launches = [Launch("torchrun", nproc=args.nproc), Launch("profile", nproc=args.nproc)]
    for line in _versions(args.device):
        print(line)
    print(f"workload: no_sync {' '.join(workload_args)}; {args.nproc} rank(s); up to {args.reps} "
          f"reps in {args.budget_s:.0f} s")  # fmt: skip
    rows: dict[str, list[dict[str, float]]] = {"torchrun": [], "profile": []}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="syncscope-bench-gpu-") as tmp:
        for rep in range(args.reps):
            elapsed = time.monotonic() - started
            if rep >= MIN_REPS and elapsed + elapsed / rep > args.budget_s:
                print(f"stopped after {rep} reps: another would pass the {args.budget_s:.0f} s "
                      "budget")  # fmt: skip
                break
            order = launches if rep % 2 == 0 else launches[::-1]
            for launch in order:
                try:
                    record = launch.run(workload("no_sync"), workload_args, Path(tmp))
                except LaunchFailed as exc:
                    print(f"bench_gpu: error: {exc}", file=sys.stderr)
                    return 1
                rows[launch.launcher].append(
                    {
                        "window_s": statistics.median(record["window_s"]),
                        "cpu_s": statistics.median(record["window_cpu_s"]),
                    }
                )
    plain, profiled = rows["torchrun"], rows["profile"]
    window = summarize([r["window_s"] for r in plain], [r["window_s"] for r in profiled])
    cpu = summarize([r["cpu_s"] for r in plain], [r["cpu_s"] for r in profiled])
    print("| launch | window ms (median) | run-to-run noise | CPU ms (median) |")
    print("|---|---:|---:|---:|")
    for name, runs in rows.items():
        times = [r["window_s"] for r in runs]
        ms = statistics.median(times) * 1e3
        cpu_ms = statistics.median(r["cpu_s"] for r in runs) * 1e3
        print(f"| {name} | {ms:.2f} | ±{spread(times):.1%} | {cpu_ms:.2f} |")
    print(
        f"capture cost: paired window ratio x{window['ratio']:.3f} (min {window['low']:.3f}, "
        f"max {window['high']:.3f}, {window['reps']} pairs), run-to-run noise "
        f"±{window['noise']:.1%}; CPU x{cpu['ratio']:.3f}; limit x{LIMIT}: "
        f"{VERDICTS[window['verdict']]}; {time.monotonic() - started:.0f} s"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
