"""What a job costs after bounded capture has detached (``profile --windows N``).

Side by side, interleaved repetitions of the no_sync workload on 2 gloo ranks:

- plain torchrun;
- ``syncscope profile`` capturing every window;
- ``syncscope profile --windows 2``: the two warm-up windows are captured, then every hook is
  removed; all timed windows run after the detach.

Prints the median timed window, wall and CPU, and the paired ratio to plain (same
repetition) for each; after detaching the ratio should be 1.00 within noise::

    python benchmarks/detach_cost.py [--reps 5] [-- WORKLOAD_ARGS]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import WORKLOADS, Launch, Spread, rotated

LAUNCHES = {
    "plain torchrun": Launch("torchrun"),
    "syncscope profile (all windows)": Launch("profile"),
    "syncscope profile --windows 2 (after detach)": Launch("profile", extra=("--windows", "2")),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("workload_args", nargs="*")
    opts = parser.parse_args(argv)
    args = ["--warmup", "2", "--windows", "6", *opts.workload_args]
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="syncscope-detach-") as tmp:
        for rep in range(opts.reps):
            for name in rotated(list(LAUNCHES), rep):
                record = LAUNCHES[name].run(WORKLOADS / "no_sync.py", args, Path(tmp))
                runs.append(
                    {
                        "name": name,
                        "rep": rep,
                        "window_s": statistics.median(record["window_s"]),
                        "cpu_s": statistics.median(record["window_cpu_s"]),
                    }
                )
                print(f"rep {rep} {name}: {runs[-1]['window_s'] * 1e3:.1f} ms/window", flush=True)
    plain = {r["rep"]: r for r in runs if r["name"] == "plain torchrun"}
    print(f"\nno_sync workload, 2 gloo ranks, {' '.join(args)}, {opts.reps} interleaved reps")
    print(f"{'launch':46} {'window ms':>10} {'cpu ms':>8} {'paired ratio (min-max)':>24}")
    for name in LAUNCHES:
        mine = [r for r in runs if r["name"] == name]
        window = Spread.of([r["window_s"] for r in mine])
        cpu = Spread.of([r["cpu_s"] for r in mine])
        paired = Spread.of([r["window_s"] / plain[r["rep"]]["window_s"] for r in mine])
        cpu_ratio = cpu.median / Spread.of([r["cpu_s"] for r in plain.values()]).median
        print(
            f"{name:46} {window.median * 1e3:10.1f} {cpu.median * 1e3:8.1f} "
            f"{paired.median:10.3f} ({paired.low:.3f}-{paired.high:.3f})  cpu x{cpu_ratio:.3f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
