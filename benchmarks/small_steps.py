"""Capture cost on small optimizer steps: a tiny transformer, eager and torch.compile'd.

    python benchmarks/small_steps.py [--reps 8] [--windows 40]

Where each hook's fixed cost weighs most: ``workloads/small_transformer.py`` (nanoGPT-shaped,
2 blocks, 64 wide, 4 micro-batches under ``no_sync()``, 2 gloo ranks, one thread each: steps
of about 15-25 ms on a quiet 2-core machine). Four configurations, plain ``torchrun`` and
``syncscope profile`` (counting mode), each eager and compiled (``--backend``, default
``aot_eager``), run in a rotated order every repetition so that machine noise hits them
alike. Each run reports the median of its timed windows (the warm-up windows, compilation
included, are not timed). Printed: per configuration the median window time and CPU time
over repetitions, and for the profiled runs the ratio to plain torchrun, as the ratio of the
medians and as the median of the ratios paired within a repetition (issue 2's limit: 1.03).
``--json FILE`` keeps every run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import WORKLOADS, Launch, Spread, rotated

LIMIT = 1.03
CONFIGS = {
    "plain eager": (Launch("torchrun"), False),
    "profile eager": (Launch("profile"), False),
    "plain compiled": (Launch("torchrun"), True),
    "profile compiled": (Launch("profile"), True),
}


def measure(reps: int, windows: int, backend: str, work: Path) -> dict[str, Any]:
    script = WORKLOADS / "small_transformer.py"
    runs: list[dict[str, Any]] = []
    for rep in range(reps):
        for name in rotated(list(CONFIGS), rep):
            launch, compiled = CONFIGS[name]
            args = ["--windows", str(windows), "--warmup", "5"]
            if compiled:
                args += ["--compile", "--backend", backend]
            record = launch.run(script, args, work)
            run = {
                "config": name,
                "rep": rep,
                "window_s": statistics.median(record["window_s"]),
                "cpu_s": statistics.median(record["window_cpu_s"]),
                "thread_s": statistics.median(record["window_thread_cpu_s"]),
            }
            runs.append(run)
            print(
                f"[{time.strftime('%H:%M:%S')}] rep {rep} {name}: "
                f"{run['window_s'] * 1e3:.2f} ms/window, {run['cpu_s'] * 1e3:.2f} ms CPU",
                file=sys.stderr,
                flush=True,
            )
    return summarize(runs, backend)


def summarize(runs: list[dict[str, Any]], backend: str) -> dict[str, Any]:
    def of(config: str, key: str) -> list[float]:
        return [r[key] for r in runs if r["config"] == config]

    result: dict[str, Any] = {"backend": backend, "runs": runs, "limit": LIMIT, "configs": {}}
    for name in CONFIGS:
        result["configs"][name] = {
            "window": Spread.of(of(name, "window_s")).__dict__,
            "cpu": Spread.of(of(name, "cpu_s")).__dict__,
        }
    for mode in ("eager", "compiled"):
        plain = {r["rep"]: r for r in runs if r["config"] == f"plain {mode}"}
        prof = [r for r in runs if r["config"] == f"profile {mode}"]
        paired = [r["window_s"] / plain[r["rep"]]["window_s"] for r in prof]
        paired_cpu = [r["cpu_s"] / plain[r["rep"]]["cpu_s"] for r in prof]
        paired_thread = [r["thread_s"] / plain[r["rep"]]["thread_s"] for r in prof]
        result[mode] = {
            "ratio": statistics.median(of(f"profile {mode}", "window_s"))
            / statistics.median(of(f"plain {mode}", "window_s")),
            "cpu_ratio": statistics.median(of(f"profile {mode}", "cpu_s"))
            / statistics.median(of(f"plain {mode}", "cpu_s")),
            "paired": Spread.of(paired).__dict__,
            "paired_cpu": Spread.of(paired_cpu).__dict__,
            "paired_thread": Spread.of(paired_thread).__dict__,
        }
    return result


def report(result: dict[str, Any]) -> str:
    lines = [f"small steps (small_transformer.py, compiled with backend {result['backend']}):"]
    for name, figures in result["configs"].items():
        w, c = figures["window"], figures["cpu"]
        lines.append(
            f"  {name:<17} window {w['median'] * 1e3:6.2f} ms "
            f"(range {w['low'] * 1e3:.2f}-{w['high'] * 1e3:.2f}, n={w['n']}), "
            f"CPU {c['median'] * 1e3:6.2f} ms"
        )
    for mode in ("eager", "compiled"):
        r = result[mode]
        p = r["paired"]
        lines.append(
            f"  profile/plain {mode:<8} x{r['ratio']:.3f} (medians), paired x{p['median']:.3f} "
            f"(range {p['low']:.3f}-{p['high']:.3f}), CPU x{r['cpu_ratio']:.3f} "
            f"(paired x{r['paired_cpu']['median']:.3f}), training thread CPU paired "
            f"x{r['paired_thread']['median']:.3f}; limit x{result['limit']:.2f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=8)
    parser.add_argument("--windows", type=int, default=40, help="timed windows per run")
    parser.add_argument("--backend", default="aot_eager", help="torch.compile backend")
    parser.add_argument("--json", type=Path, help="write every run here")
    opts = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="syncscope-small-") as tmp:
        result = measure(opts.reps, opts.windows, opts.backend, Path(tmp))
    print(report(result))
    if opts.json:
        opts.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
