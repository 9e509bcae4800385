"""Capture cost on small optimizer steps, two model shapes, eager and torch.compile'd.

    python benchmarks/small_steps.py [--reps 8] [--shapes transformer,mlp] [--windows N]
                                     [--side-by-side]

Where each hook's fixed cost weighs most, on two shapes of small step (2 gloo ranks, one
thread each, 4 micro-batches under ``no_sync()``):

- ``transformer``: ``workloads/small_transformer.py`` (nanoGPT-shaped, 2 blocks, 64 wide;
  steps of about 15-25 ms on a quiet 2-core machine), 40 timed windows after 5 warm-up ones;
- ``mlp``: ``workloads/small_mlp.py`` (4 x Linear(512, 512) + ReLU, batch 16; steps of
  about 14-20 ms, two bucket all-reduces each), 112 timed windows after 8 warm-up ones;
- ``large`` (only when named in ``--shapes``): run_all.py's capture-cost shape,
  examples/ddp_no_sync.py with 6 x Linear(1024), batch 32, 8 timed windows after 2.

``SYNCSCOPE_NATIVE=0`` in the environment makes every profiled run use the Python collective
kernel (the report says which kernel ran).

Per shape, four configurations, plain ``torchrun`` and ``syncscope profile`` (counting
mode), each eager and compiled (``--backend``, default ``aot_eager``), run in a rotated
order every repetition so that machine noise hits them alike. Each run reports the median
of its timed windows (warm-up, compilation included, not timed): wall time, CPU time of the
rank process (every thread) and CPU time of the training thread alone (``thread_time``).
Printed: per configuration the medians over repetitions, and for the profiled runs the
ratio to plain torchrun, as the ratio of the medians and as the median of the ratios
paired within a repetition (the limit: 1.03). ``--json FILE`` keeps every run.

Two methods. By default the runs go one after another, as a user would compare them. On a
shared host whose speed comes and goes over seconds (another tenant), that pairs runs that
met different machines: on this 2-core machine (2026-11-25) two plain runs one after another
differed by up to 20% in training-thread CPU per window, more than the effect measured.
``--side-by-side`` starts each plain job and its profiled twin at once and times their
windows over the same seconds (``_harness.side_by_side``: both warm up, then both start
their clocks): two plain jobs run so differed by 0.2-1.4% (4 pairs of the MLP's loop, 300
windows each); in two runs of 4 repetitions each configuration's paired training-thread
ratios spanned at most 0.13 (1.008-1.134) side by side, and up to 0.66 (0.688-1.349) one
after another, the same day. The jobs then share the cores (4 ranks on 2 here), so wall
time includes each other's; the CPU-time ratios are the figures to read, and they include
what sharing the caches costs each.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import Launch, Spread, interval_text, rotated, side_by_side, verdict, workload

LIMIT = 1.03
# shape -> (workload, timed windows, warm-up windows)
SHAPES: dict[str, tuple[str, int, int, tuple[str, ...]]] = {
    "transformer": ("small_transformer.py", 40, 5, ()),
    "mlp": ("small_mlp.py", 112, 8, ()),
    # run_all.py's capture-cost shape (examples/ddp_no_sync.py, 6 x Linear(1024), batch 32)
    "large": ("no_sync", 8, 2, ("--layers", "6", "--hidden", "1024", "--batch", "32")),
}
DEFAULT_SHAPES = ("transformer", "mlp")
CONFIGS = {
    "plain eager": (Launch("torchrun"), False),
    "profile eager": (Launch("profile"), False),
    "plain compiled": (Launch("torchrun"), True),
    "profile compiled": (Launch("profile"), True),
}
MODES = ("eager", "compiled")


def kernel_in_use() -> str:
    """Which collective kernel the profiled runs use (``SYNCSCOPE_NATIVE`` in this
    environment, which the launches inherit)."""
    word = os.environ.get("SYNCSCOPE_NATIVE", "").strip().lower()
    return "python" if word in ("0", "false", "no", "off") else "compiled where built"


def measure(
    reps: int,
    windows: int | None,
    backend: str,
    work: Path,
    shapes: tuple[str, ...] = DEFAULT_SHAPES,
    together: bool = False,
    modes: tuple[str, ...] = MODES,
) -> dict[str, Any]:
    """Every shape's figures (``windows``: timed windows per run, None: each shape's own;
    ``together``: plain and profiled jobs side by side, else one after another; ``modes``:
    eager, compiled or both)."""
    results = {
        shape: _measure_shape(shape, reps, windows, backend, work, together, modes)
        for shape in shapes
    }
    return {
        "method": "side by side" if together else "one after another",
        "backend": backend,
        "limit": LIMIT,
        "kernel": kernel_in_use(),
        "shapes": results,
        "measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "load": [round(x, 2) for x in os.getloadavg()],
    }


def _measure_shape(
    shape: str,
    reps: int,
    windows: int | None,
    backend: str,
    work: Path,
    together: bool,
    modes: tuple[str, ...] = MODES,
) -> dict[str, Any]:
    name_of, timed, warmup, shape_args = SHAPES[shape]
    script = workload(name_of)
    runs: list[dict[str, Any]] = []

    def args_of(name: str) -> list[str]:
        args = [*shape_args, "--windows", str(windows or timed), "--warmup", str(warmup)]
        if CONFIGS[name][1]:
            args += ["--compile", "--backend", backend]
        return args

    def note(rep: int, name: str, record: dict[str, Any]) -> None:
        run = {
            "config": name,
            "rep": rep,
            "window_s": statistics.median(record["window_s"]),
            "cpu_s": statistics.median(record["window_cpu_s"]),
            "thread_s": statistics.median(record["window_thread_cpu_s"]),
        }
        runs.append(run)
        print(
            f"[{time.strftime('%H:%M:%S')}] {shape} rep {rep} {name}: "
            f"{run['window_s'] * 1e3:.2f} ms/window, {run['cpu_s'] * 1e3:.2f} ms CPU, "
            f"{run['thread_s'] * 1e3:.2f} ms training thread",
            file=sys.stderr,
            flush=True,
        )

    configs = [n for n in CONFIGS if n.split()[1] in modes]
    for rep in range(reps):
        if not together:
            for name in rotated(configs, rep):
                note(rep, name, CONFIGS[name][0].run(script, args_of(name), work))
            continue
        for mode in rotated(list(modes), rep):
            pair = rotated([f"plain {mode}", f"profile {mode}"], rep)  # who starts first
            records = side_by_side([(CONFIGS[n][0], script, args_of(n)) for n in pair], work)
            for name, record in zip(pair, records, strict=True):
                note(rep, name, record)
    return summarize(runs, script.name, modes)


def summarize(
    runs: list[dict[str, Any]], workload: str, modes: tuple[str, ...] = MODES
) -> dict[str, Any]:
    def of(config: str, key: str) -> list[float]:
        return [r[key] for r in runs if r["config"] == config]

    result: dict[str, Any] = {"workload": workload, "runs": runs, "configs": {}}
    for name in (n for n in CONFIGS if n.split()[1] in modes):
        result["configs"][name] = {
            "window": Spread.of(of(name, "window_s")).__dict__,
            "cpu": Spread.of(of(name, "cpu_s")).__dict__,
            "thread": Spread.of(of(name, "thread_s")).__dict__,
        }
    for mode in modes:
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
    lines: list[str] = [
        f"method: {result.get('method', 'one after another')}; kernel: "
        f"{result.get('kernel', 'compiled where built')}; load {result.get('load')}"
    ]
    for shape, figures in result["shapes"].items():
        lines += _report_shape(shape, figures, result["backend"], result["limit"])
    return "\n".join(lines)


def _report_shape(shape: str, result: dict[str, Any], backend: str, limit: float) -> list[str]:
    lines = [f"small steps, {shape} ({result['workload']}, compiled with backend {backend}):"]
    for name, figures in result["configs"].items():
        w, c, t = figures["window"], figures["cpu"], figures["thread"]
        lines.append(
            f"  {name:<17} window {w['median'] * 1e3:6.2f} ms "
            f"(range {w['low'] * 1e3:.2f}-{w['high'] * 1e3:.2f}, n={w['n']}), "
            f"CPU {c['median'] * 1e3:6.2f} ms, training thread {t['median'] * 1e3:6.2f} ms"
        )
    for mode in (m for m in MODES if m in result):
        r = result[mode]
        p, pc, pt = r["paired"], r["paired_cpu"], r["paired_thread"]
        lines.append(
            f"  profile/plain {mode:<8} wall x{r['ratio']:.3f} (medians), paired "
            f"x{p['median']:.3f} ({p['low']:.3f}-{p['high']:.3f}); process CPU paired "
            f"x{pc['median']:.3f} ({pc['low']:.3f}-{pc['high']:.3f}); training thread CPU "
            f"paired x{pt['median']:.3f} ({pt['low']:.3f}-{pt['high']:.3f}); limit x{limit:.2f}"
        )
        if p.get("ci_low") is not None:
            lines.append(
                f"    wall paired: {interval_text(p)}: {verdict(p, limit)}; "
                f"training thread: {interval_text(pt)}: {verdict(pt, limit)}"
            )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=8)
    parser.add_argument(
        "--windows", type=int, help="timed windows per run (default: each shape's own)"
    )
    parser.add_argument(
        "--shapes",
        default=",".join(DEFAULT_SHAPES),
        help=f"comma-separated, of {', '.join(SHAPES)}",
    )
    parser.add_argument("--backend", default="aot_eager", help="torch.compile backend")
    parser.add_argument(
        "--side-by-side",
        action="store_true",
        help="run each plain job and its profiled twin at once, timed over the same seconds "
        "(see the module's docstring), instead of one after another",
    )
    parser.add_argument(
        "--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}"
    )
    parser.add_argument("--json", type=Path, help="write every run here")
    opts = parser.parse_args(argv)
    modes = tuple(m.strip() for m in opts.modes.split(",") if m.strip())
    if not modes or any(m not in MODES for m in modes):
        parser.error(f"--modes: of {', '.join(MODES)}")
    shapes = tuple(s.strip() for s in opts.shapes.split(",") if s.strip())
    unknown = [s for s in shapes if s not in SHAPES]
    if unknown or not shapes:
        parser.error(f"--shapes: unknown {', '.join(unknown) or 'none given'}")
    with tempfile.TemporaryDirectory(prefix="syncscope-small-") as tmp:
        result = measure(
            opts.reps, opts.windows, opts.backend, Path(tmp), shapes, opts.side_by_side, modes
        )
    result["command"] = " ".join(["python benchmarks/small_steps.py", *(argv or sys.argv[1:])])
    print(report(result))
    if opts.json:
        opts.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
