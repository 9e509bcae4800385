"""Predicted vs measured: how right is the projected window time after a fix?

    python benchmarks/bench_prediction.py             # 2 interleaved repetitions
    python benchmarks/bench_prediction.py --reps 1    # quicker

For each configuration: ``syncscope profile`` the buggy loop and record the window time its
report projects after the fix (``syncscope.model.figures.projection``: window time minus the
exposed sync time of every micro-batch but the last), then profile the fixed loop and take
its measured window time (``syncscope.model.figures.window_time``: median over ranks and steady
windows). Both sides run under the same capture, so its overhead cancels. The error is
(predicted - measured) / measured. The previous model (window time minus the *sum* of the
early collectives' durations) is computed from the same buggy runs for comparison.

Jobs are interleaved: every repetition runs every (configuration, buggy/fixed) job once, in
an order rotated by the repetition, so drift in machine load spreads across all of them.

``--mode examples``: the bundled examples as ``fix --verify`` runs them
(``prediction_examples.py``).
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

from _harness import ROOT, WORKLOADS, Launch, rotated, workload

sys.path.insert(0, str(ROOT))

from syncscope.load.runs import load_run
from syncscope.model import Run, Window, figures

MODELS = {
    "small": ["--hidden", "128", "--layers", "2", "--batch", "16"],
    "base": ["--hidden", "512", "--layers", "4", "--batch", "32"],
    "large": ["--hidden", "1024", "--layers", "8", "--batch", "32"],
}
LAST_ONLY = ["--sync-last-only"]
# name, label, nodes, model, (buggy workload, args), (fixed workload, args): _harness.workload
CASES: list[dict[str, Any]] = [
    {"name": "ddp-every-1x2", "loop": "ddp-every", "label": "DDP, sync every micro-batch, 1 node x 2 ranks",
     "nodes": 1, "model": "base", "buggy": ("sync_every_microbatch", []),
     "fixed": ("no_sync", [])},
    {"name": "ddp-bwd-only-1x2", "loop": "ddp-bwd-only", "label": "DDP, no_sync around backward only, 1 x 2",
     "nodes": 1, "model": "base", "buggy": ("no_sync_backward_only", []),
     "fixed": ("no_sync", [])},
    {"name": "ddp-every-2x1", "loop": "ddp-every", "label": 'DDP, sync every micro-batch, 2 "nodes" x 1 rank',
     "nodes": 2, "model": "base", "buggy": ("sync_every_microbatch", []),
     "fixed": ("no_sync", [])},
    {"name": "ddp-bwd-only-2x1", "loop": "ddp-bwd-only", "label": 'DDP, no_sync around backward only, 2 "nodes" x 1',
     "nodes": 2, "model": "base", "buggy": ("no_sync_backward_only", []),
     "fixed": ("no_sync", [])},
    {"name": "fsdp2-every-1x2", "loop": "fsdp2", "label": "FSDP2, reduce-scatter every micro-batch, 1 x 2",
     "nodes": 1, "model": "base", "buggy": ("fsdp2_every_microbatch", []),
     "fixed": ("fsdp2_last_only", [])},
    {"name": "per-param-1x2", "loop": "per-param", "label": "manual per-parameter all-reduce every micro-batch",
     "nodes": 1, "model": "base", "buggy": ("per_param_every_microbatch.py", []),
     "fixed": ("per_param_every_microbatch.py", LAST_ONLY)},
    {"name": "ddp-every-small", "loop": "ddp-every", "label": "DDP, sync every micro-batch, small model (2x128)",
     "nodes": 1, "model": "small", "buggy": ("sync_every_microbatch", []),
     "fixed": ("no_sync", [])},
    {"name": "ddp-every-large", "loop": "ddp-every", "label": "DDP, sync every micro-batch, large model (8x1024)",
     "nodes": 1, "model": "large", "buggy": ("sync_every_microbatch", []),
     "fixed": ("no_sync", [])},
]  # fmt: skip
COMMON = ["--accum", "4", "--warmup", "1"]


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _load(record: dict[str, Any], nodes: int) -> Run:
    out = Path(record["run_dir"])
    return load_run([out / f"node{n}" for n in range(nodes)] if nodes > 1 else out)


def _old_projected(w: Window) -> float:
    """The previous projection: window minus the sum of the early collectives' durations."""
    n = len(w.micro_batches)
    wasted = sum(c.duration_ns for c in w.grad_sync_collectives if c.micro_batch < n - 1)
    return float(max(0, w.duration_ns - wasted))


def _old_model(run: Run) -> float:
    """The previous projection: window minus the sum of the early collectives' durations."""
    steady = figures.steady_windows(run)
    values = []
    for r in run.ranks:
        for w in r.windows:
            if w.complete and w.index in steady:
                n = len(w.micro_batches)
                wasted = sum(
                    c.duration_ns for c in w.grad_sync_collectives if c.micro_batch < n - 1
                )
                values.append(max(0, w.duration_ns - wasted))
    return float(statistics.median(values)) if values else float("nan")


def _top_model(run: Run, windows: list[Window]) -> float:
    """The other end of the projected range on CPU (figures.projection's ``widened``): window
    minus the early syncs' whole time in flight, median over ``windows``."""
    saved = figures.saved_ns(run, in_flight=True)
    return _med([max(1, w.duration_ns - saved.get(w.index, 0)) for w in windows])


def _steady(run: Run) -> list[Window]:
    steady = figures.steady_windows(run)
    return [w for r in run.ranks for w in r.windows if w.complete and w.index in steady]


def _iqr(run: Run) -> float:
    steady = figures.steady_windows(run)
    values = sorted(
        w.duration_ns for r in run.ranks for w in r.windows if w.complete and w.index in steady
    )
    if len(values) < 2:
        return 0.0
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[2] - q[0]


def measure(work: Path, reps: int, windows: int, cases: list[dict[str, Any]]) -> dict[str, Any]:
    work.mkdir(parents=True, exist_ok=True)
    jobs = [(case["name"], variant) for case in cases for variant in ("buggy", "fixed")]
    by_name = {case["name"]: case for case in cases}
    runs: list[dict[str, Any]] = []
    for rep in range(reps):
        for name, variant in rotated(jobs, rep * 3):
            case = by_name[name]
            script, extra = case[variant]
            args = [*MODELS[case["model"]], *COMMON, "--windows", str(windows), *extra]
            record = Launch("profile", nodes=case["nodes"]).run(workload(script), args, work)
            run = _load(record, case["nodes"])
            window = figures.window_time(run)
            row: dict[str, Any] = {
                "case": name,
                "variant": variant,
                "rep": rep,
                "window_ns": window.median if window else None,
                "iqr_ns": _iqr(run),
                "steady_windows": len(figures.steady_windows(run).windows),
                "windows_ns": figures.window_durations(run),
            }
            if variant == "buggy":
                row.update(_projected(run))
                row["old_predicted_ns"] = _old_model(run)
            row["run_dir"] = record["run_dir"]
            runs.append(row)
            log(f"rep {rep} {name} {variant}: window {row['window_ns'] / 1e6:.1f} ms")
    result = summarize(runs, cases)
    result.update(reps=reps, windows=windows)
    return result


def _projected(run: Run) -> dict[str, Any]:
    """The buggy run's projection, as its report shows it (speed-up range, floor)."""
    p = figures.projection(run)
    s = p.speedup if p.shown else None
    return {
        "predicted_ns": p.projected.median if p.projected else None,
        "top_ns": _top_model(run, _steady(run)),
        "omitted": p.omitted,
        "speedup": [s.median, s.low, s.high, s.n] if s else None,
        "floor": p.floor,
    }


def _agreements(buggy: list[dict[str, Any]], fixed: list[dict[str, Any]]) -> list[str]:
    """Per repetition, the fixed run's measured speed-up against the buggy run's projected
    range, judged as ``fix --verify`` judges it (``figures.judge``)."""
    out = []
    for b in buggy:
        f = next((f for f in fixed if f["rep"] == b["rep"]), None)
        if f is None or not b.get("speedup") or not b.get("windows_ns"):
            continue
        measured = figures.measured_speedup(b["windows_ns"], f.get("windows_ns") or [])
        if measured is not None:
            out.append(figures.judge(measured, figures.Stat(*b["speedup"]), b["floor"]))
    return out


def same_process(
    work: Path, reps: int, windows: int, cases: list[dict[str, Any]]
) -> dict[str, Any]:
    """The buggy and the fixed loop on alternate windows of one job (workloads/alternating.py):
    predicted from the buggy windows, measured on the fixed ones, seconds apart."""
    work.mkdir(parents=True, exist_ok=True)
    runs: list[dict[str, Any]] = []
    for rep in range(reps):
        for case in rotated(cases, rep * 3):
            args = [*MODELS[case["model"]], *COMMON, "--windows", str(2 * windows),
                    "--loop", case["loop"]]  # fmt: skip
            record = Launch("profile", nodes=case["nodes"]).run(
                WORKLOADS / "alternating.py", args, work
            )
            run = _load(record, case["nodes"])
            steady = figures.steady_windows(run)
            chosen = [w for r in run.ranks for w in r.windows if w.complete and w.index in steady]
            buggy = [w for w in chosen if w.index % 2 == 0]
            fixed = [w for w in chosen if w.index % 2 == 1]
            saved = figures.saved_ns(run)
            row = {
                "case": case["name"],
                "rep": rep,
                "buggy_ns": _med([w.duration_ns for w in buggy]),
                "predicted_ns": _med([max(1, w.duration_ns - saved[w.index]) for w in buggy]),
                "old_predicted_ns": _med([_old_projected(w) for w in buggy]),
                "top_ns": _top_model(run, buggy),
                "measured_ns": _med([w.duration_ns for w in fixed]),
                "iqr_ns": _iqr_of([w.duration_ns for w in fixed]),
                "run_dir": record["run_dir"],
            }
            # the two ends bench_prediction has always shown: exposed wait and in flight
            measured = figures.measured_speedup(
                [w.duration_ns for w in buggy], [w.duration_ns for w in fixed]
            )
            ends = [row["buggy_ns"] / row["predicted_ns"], row["buggy_ns"] / row["top_ns"]]
            projected = figures.Stat(ends[0], min(ends), max(ends), len(buggy))
            row["agreement"] = figures.judge(measured, projected) if measured else None
            runs.append(row)
            log(
                f"same-process rep {rep} {case['name']}: buggy {row['buggy_ns'] / 1e6:.1f} ms, "
                f"predicted {row['predicted_ns'] / 1e6:.1f} ms, "
                f"measured {row['measured_ns'] / 1e6:.1f} ms"
            )
    rows = []
    for case in cases:
        mine = [r for r in runs if r["case"] == case["name"]]
        predicted = _med([r["predicted_ns"] for r in mine])
        measured = _med([r["measured_ns"] for r in mine])
        old = _med([r["old_predicted_ns"] for r in mine])
        rows.append({
            "case": case["name"], "label": case["label"], "model": case["model"],
            "buggy_ns": _med([r["buggy_ns"] for r in mine]), "predicted_ns": predicted,
            "measured_ns": measured, "error": (predicted - measured) / measured,
            "old_predicted_ns": old, "old_error": (old - measured) / measured,
            "top_ns": _med([r["top_ns"] for r in mine]),
            "noise_iqr": _med([r["iqr_ns"] for r in mine]) / measured,
            "noise_reps": (max(r["measured_ns"] for r in mine)
                           - min(r["measured_ns"] for r in mine)) / measured,
            "agreements": [r["agreement"] for r in mine if r["agreement"]],
        })  # fmt: skip
    return {
        "runs": runs,
        "rows": rows,
        "reps": reps,
        "windows": windows,
        "median_abs_error": _med([abs(r["error"]) for r in rows]),
        "old_median_abs_error": _med([abs(r["old_error"]) for r in rows]),
    }


def _iqr_of(values: list[int]) -> float:
    if len(values) < 2:
        return 0.0
    q = statistics.quantiles(sorted(values), n=4, method="inclusive")
    return q[2] - q[0]


def _med(values: list[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


def summarize(runs: list[dict[str, Any]], cases: list[dict[str, Any]]) -> dict[str, Any]:
    rows = []
    for case in cases:
        buggy = [r for r in runs if r["case"] == case["name"] and r["variant"] == "buggy"]
        fixed = [r for r in runs if r["case"] == case["name"] and r["variant"] == "fixed"]
        predicted = _med([r["predicted_ns"] for r in buggy])
        old = _med([r["old_predicted_ns"] for r in buggy])
        measured = _med([r["window_ns"] for r in fixed])
        before = _med([r["window_ns"] for r in buggy])
        rows.append({
            "case": case["name"], "label": case["label"], "model": case["model"],
            "buggy_ns": before, "predicted_ns": predicted, "measured_ns": measured,
            "error": (predicted - measured) / measured, "old_predicted_ns": old,
            "old_error": (old - measured) / measured,
            "top_ns": _med([r["top_ns"] for r in buggy if r.get("top_ns")]),
            "predicted_speedup": before / predicted, "measured_speedup": before / measured,
            # noise: the fixed runs' window-time IQR over ranks and steady windows, and the
            # spread of their medians across repetitions, both relative to the measured time
            "noise_iqr": _med([r["iqr_ns"] for r in fixed]) / measured,
            "noise_reps": (max(r["window_ns"] for r in fixed) - min(r["window_ns"] for r in fixed))
            / measured,
            "claimed": sum(not r["omitted"] for r in buggy), "reps": len(buggy),
            "omitted": sorted({r["omitted"].split(" (")[0] for r in buggy if r["omitted"]}),
            "agreements": _agreements(buggy, fixed),
        })  # fmt: skip
    return {
        "runs": runs,
        "rows": rows,
        "median_abs_error": _med([abs(r["error"]) for r in rows]),
        "old_median_abs_error": _med([abs(r["old_error"]) for r in rows]),
    }


def table(result: dict[str, Any]) -> str:
    head = (
        f"{'configuration':<52} {'buggy':>8} {'predicted':>9} {'measured':>9} {'error':>7} "
        f"{'old err':>8} {'noise':>6} {'in-flight':>9} {'claimed':>7}  against projection"
    )
    lines = [head, "-" * len(head)]
    for r in result["rows"]:
        claimed = f"{r['claimed']:>3}/{r['reps']}" if "claimed" in r else ""
        lines.append(
            f"{r['label']:<52} {r['buggy_ns'] / 1e6:>6.1f}ms {r['predicted_ns'] / 1e6:>7.1f}ms "
            f"{r['measured_ns'] / 1e6:>7.1f}ms {r['error']:>+7.0%} {r['old_error']:>+8.0%} "
            f"{r['noise_iqr']:>6.0%} {r['top_ns'] / 1e6:>7.1f}ms {claimed:>7}  {_bracket(r)}"
        )
    lines.append(
        f"median absolute error: {result['median_abs_error']:.0%} "
        f"(previous model: {result['old_median_abs_error']:.0%})"
    )
    return "\n".join(lines)


def _bracket(row: dict[str, Any]) -> str:
    """Per repetition, the measured speed-up against the projected range (``figures.judge``:
    inside, within noise, below, above)."""
    return ", ".join(row.get("agreements") or []) or "-"


def reanalyze(saved: dict[str, Any], cases: list[dict[str, Any]]) -> dict[str, Any]:
    """Separate-runs results again, predictions recomputed from the kept run directories with
    the current model (the measured fixed-loop times are the same runs')."""
    nodes = {case["name"]: case["nodes"] for case in cases}
    runs = []
    for row in saved["runs"]:
        row = dict(row)
        run = _load(row, nodes[row["case"]])
        row["windows_ns"] = figures.window_durations(run)
        if row["variant"] == "buggy":
            row.update(_projected(run))
        runs.append(row)
    result = summarize(runs, cases)
    result.update(reps=saved.get("reps", 2), windows=saved.get("windows", 4))
    return result


def run_modes(
    work: Path, reps: int, windows: int, cases: list[dict[str, Any]], mode: str = "both"
) -> dict[str, Any]:
    result: dict[str, Any] = {}
    if mode in ("both", "same-process"):
        result["same_process"] = same_process(work / "same", reps, windows, cases)
    if mode in ("both", "separate"):
        result["separate"] = measure(work / "separate", reps, windows, cases)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=2, help="interleaved repetitions")
    parser.add_argument("--windows", type=int, default=4, help="timed windows per job")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--only", nargs="*", help="case names (default: all)")
    parser.add_argument("--keep", type=Path, help="keep the run directories here")
    parser.add_argument("--doc", type=Path, help="--mode examples: also write this markdown page")
    parser.add_argument(
        "--reanalyze", type=Path, metavar="JSON",
        help="recompute the separate-runs predictions of a --json file (kept run directories)",
    )  # fmt: skip
    parser.add_argument(
        "--mode", choices=("both", "separate", "same-process", "examples"), default="both",
        help="separate runs (profile, fix, profile again), alternate windows of one run, or both;"
        " examples: the bundled examples as fix --verify runs them",
    )  # fmt: skip
    opts = parser.parse_args(argv)
    cases = [c for c in CASES if not opts.only or c["name"] in opts.only]
    if opts.mode == "examples":
        from prediction_examples import run_examples

        return run_examples(opts.reps, opts.only, opts.keep, opts.json, opts.doc, opts.reanalyze)
    if opts.reanalyze:
        saved = json.loads(opts.reanalyze.read_text())
        separate = reanalyze(saved.get("separate", saved), cases)
        print("separate (reanalyzed):")
        print(table(separate))
        if opts.json:
            opts.json.write_text(json.dumps({**saved, "separate": separate}, indent=1))
        return 0
    with tempfile.TemporaryDirectory(prefix="syncscope-predict-") as tmp:
        work = opts.keep or Path(tmp)
        result = run_modes(work, opts.reps, opts.windows, cases, opts.mode)
    for mode in ("separate", "same_process"):
        if mode in result:
            print(f"{mode.replace('_', ' ')}:")
            print(table(result[mode]))
    if opts.json:
        opts.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
