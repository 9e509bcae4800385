"""The one benchmark command: writes docs/benchmarks.md, its charts and raw results.

    python benchmarks/run_all.py            # full run, about 50 minutes on 2 quiet cores
    python benchmarks/run_all.py --quick    # one repetition, small sets, to a temp dir:
                                            # every section in about 5-7 minutes

Every section is measured here (each says on the page which script measured it, run by
which command, and when):

1. the Accelerate table: seconds per micro-batch for the four gradient-accumulation loops
   and the baseline after ``syncscope fix``, on 1 node x 2 gloo ranks and on 2 "nodes" x 1
   rank (torchrun multi-node rendezvous on loopback); configurations interleaved;
2. capture cost: plain torchrun vs ``syncscope profile`` (with torch's Flight Recorder on,
   its default, and off: the recorder's share, paired; and its CPU per collective alone,
   benchmarks/bench_flight.py's loop) vs ``--trace`` vs a bare ``torch.profiler`` trace
   (window-time ratios with their min-max; the limit for counting mode: 1.03), one run
   after another; and on small steps (benchmarks/small_steps.py, eager): the small
   transformer and MLP one after another, and those and the large shape side by side;
3. ``syncscope analyze`` vs HTA's ``TraceAnalysis`` load (benchmarks/bench_analyze.py), then
   benchmarks/bench_scale.py's scale table (16k ranks, 8 x 1 GB, run directories; HTA's load
   of 8 x 256 MB, 15 minutes alone, is left to a separate run the page names) and its
   parse-speed table (MB per CPU-second on real traces, sample_traces/ and
   ../shared/data/kineto where present, 512 ranks and 8 x 256 MB, HTA's load beside);
4. grad-sync bytes per window against the gradient bytes of one reduction;
6. predicted vs measured: the projected window time after a fix against the fixed loop's
   (benchmarks/bench_prediction.py; section 5 is the GPU note).

Each figure of sections 1, 2, 4 and 6 is measured inside the training script, start-up
excluded; section 3's are whole CLI runs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import (
    EXAMPLE_WORKLOADS,
    EXAMPLES,
    ROOT,
    Launch,
    LaunchFailed,
    Spread,
    interval_text,
    per_micro_batch,
    rotated,
    verdict,
    workload,
)
from _report import render
from _trace_speed import parse_speed, scale
from bench_analyze import hta_ranks
from bench_flight import per_collective
from bench_prediction import CASES as PREDICTION_CASES
from bench_prediction import run_modes as measure_prediction
from small_steps import measure as measure_small_steps

CONFIGS = [
    {"name": "sync_every_microbatch", "label": "sync every micro-batch (baseline)"},
    {"name": "no_sync_backward_only", "label": "no_sync improperly (backward only)"},
    {"name": "no_sync", "label": "no_sync (forward and backward)"},
    {"name": "accelerate_accumulate", "label": "accelerator.accumulate"},
    {"name": "fixed", "label": "baseline after syncscope fix"},
]
TOPOLOGIES = {"1x2": "1 node x 2 ranks", "2x1": '2 "nodes" x 1 rank (c10d rendezvous)'}
CAPTURE_MODES = [
    {"name": "plain", "label": "plain torchrun"},
    {"name": "profile", "label": "syncscope profile (counting; Flight Recorder on, its default)"},
    {"name": "profile_no_fr", "label": "syncscope profile, Flight Recorder off"},
    {"name": "trace", "label": "syncscope profile --trace"},
    {"name": "torch_profiler", "label": "bare torch.profiler trace"},
    # bounded capture: the warm-up windows are captured, every timed window runs detached
    {"name": "detached", "label": "syncscope profile --windows 2, after detaching"},
]
# Accelerate's published figures (T4 GPUs, batch 16/GPU, accumulate 4, seconds per batch)
PUBLISHED = {
    "2x1": {"sync_every_microbatch": 2.0, "no_sync_backward_only": 2.13, "no_sync": 0.91,
            "accelerate_accumulate": 0.91},
    "1x2": {"sync_every_microbatch": 0.50, "no_sync_backward_only": 0.50, "no_sync": 0.41,
            "accelerate_accumulate": 0.41},
}  # fmt: skip
COUNTING_LIMIT = 1.03
# --quick's section 6: one DDP and one FSDP2 loop (every case's path is the same code)
QUICK_CASES = ("ddp-every-1x2", "fsdp2-every-1x2")


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def fixed_script(work: Path) -> tuple[Path, str]:
    """The baseline (the example examples/ddp_sync_every_step.py, beside a copy of its
    common.py) rewritten by ``syncscope fix --apply``; returns (path, unified diff)."""
    fixed = work / "fixed"
    fixed.mkdir()
    baseline = EXAMPLE_WORKLOADS["sync_every_microbatch"]
    for name in ("common.py", baseline):
        shutil.copy(EXAMPLES / name, fixed / name)
    cmd = [sys.executable, "-m", "syncscope", "fix", baseline]
    diff = subprocess.run(cmd, cwd=fixed, capture_output=True, text=True, check=False).stdout
    subprocess.run([*cmd, "--apply", "--no-backup"], cwd=fixed, capture_output=True, check=True)
    return fixed / baseline, diff


def script_for(name: str, fixed: Path) -> Path:
    return fixed if name == "fixed" else workload(name)


def accelerate_table(work: Path, fixed: Path, reps: int, args: list[str]) -> dict[str, Any]:
    runs: list[dict[str, Any]] = []
    names = [c["name"] for c in CONFIGS]
    for rep in range(reps):
        for topo in TOPOLOGIES:
            launch = Launch("torchrun", nodes=1 if topo == "1x2" else 2)
            for name in rotated(names, rep):
                record = launch.run(script_for(name, fixed), args, work)
                runs.append({"config": name, "topology": topo, "rep": rep,
                             "s_per_micro_batch": per_micro_batch(record),
                             "window_s": record["window_s"]})  # fmt: skip
                log(f"accelerate {topo} rep {rep} {name}: {runs[-1]['s_per_micro_batch']:.4f} s")
    spreads: dict[str, dict[str, Spread]] = {}
    for topo in TOPOLOGIES:
        spreads[topo] = {
            name: Spread.of([r["s_per_micro_batch"] for r in runs
                             if r["config"] == name and r["topology"] == topo])
            for name in names
        }  # fmt: skip
    return {"configs": CONFIGS, "topologies": list(TOPOLOGIES), "topology_labels": TOPOLOGIES,
            "args": args, "runs": runs, "spreads": spreads, "published": PUBLISHED}  # fmt: skip


def capture_cost(work: Path, reps: int, args: list[str]) -> dict[str, Any]:
    launches = {
        "plain": Launch("torchrun"),
        "profile": Launch("profile"),
        "profile_no_fr": Launch("profile", env=(("TORCH_FR_BUFFER_SIZE", "0"),)),
        "trace": Launch("profile", trace=True),
        "torch_profiler": Launch("torchrun"),
        "detached": Launch("profile", extra=("--windows", "2")),
    }
    script = workload("no_sync")
    runs: list[dict[str, Any]] = []
    for rep in range(reps):
        for mode in rotated(list(launches), rep):
            extra = (
                ["--torch-profiler", str(work / f"tp-{rep}")] if mode == "torch_profiler" else []
            )
            record = launches[mode].run(script, [*args, *extra], work)
            runs.append({"mode": mode, "rep": rep,
                         "window_s": statistics.median(record["window_s"]),
                         "cpu_s": statistics.median(record["window_cpu_s"])})  # fmt: skip
            log(f"capture rep {rep} {mode}: {runs[-1]['window_s'] * 1e3:.1f} ms/window")
    by = lambda mode, key: [r[key] for r in runs if r["mode"] == mode]  # noqa: E731
    window, cpu, ratio, paired, cpu_ratio, paired_cpu = {}, {}, {}, {}, {}, {}
    for mode in launches:
        window[mode] = Spread.of(by(mode, "window_s"))
        cpu[mode] = Spread.of(by(mode, "cpu_s"))
        ratio[mode] = window[mode].median / window["plain"].median
        cpu_ratio[mode] = cpu[mode].median / cpu["plain"].median
        paired[mode] = paired_ratio(runs, mode, "plain", "window_s")
        paired_cpu[mode] = paired_ratio(runs, mode, "plain", "cpu_s")
    return {"modes": CAPTURE_MODES, "args": args, "runs": runs, "window": window, "cpu": cpu,
            "ratio": ratio, "paired": paired, "cpu_ratio": cpu_ratio, "paired_cpu": paired_cpu,
            # Flight Recorder's share: profile (recorder on) over profile (off), per repetition
            "fr_share": paired_ratio(runs, "profile", "profile_no_fr", "window_s"),
            "fr_share_cpu": paired_ratio(runs, "profile", "profile_no_fr", "cpu_s"),
            "limit": COUNTING_LIMIT}  # fmt: skip


def paired_ratio(runs: list[dict[str, Any]], mode: str, base: str, key: str) -> Spread:
    """``mode``'s runs over ``base``'s of the same repetition: median, min-max."""
    of_base = {r["rep"]: r[key] for r in runs if r["mode"] == base}
    return Spread.of([r[key] / of_base[r["rep"]] for r in runs if r["mode"] == mode])


def flight_recorder_per_collective(reps: int, n: int) -> dict[str, Any]:
    """bench_flight.py's one-rank loop: CPU microseconds per collective, the recorder off
    and on in turn, and the recorder's own (on minus off, paired by repetition)."""
    try:
        found = per_collective(reps, n)
    except (RuntimeError, OSError, ValueError) as exc:  # the other figures are kept
        log(f"Flight Recorder per collective failed: {exc}")
        return {"n": n, "error": str(exc)}
    on, off = [c for _, c in found["2000"]], [c for _, c in found["0"]]
    return {"n": n, "on_cpu_us": Spread.of(on), "off_cpu_us": Spread.of(off),
            "extra_cpu_us": Spread.of([b - a for a, b in zip(off, on, strict=True)])}  # fmt: skip


# bench_analyze.py's result line (its owner may reshape it; the raw output is kept anyway)
ANALYZE_LINE = re.compile(
    r"^(?P<name>\S.*?)\s+(?P<files>\d+) files, largest\s+(?P<mib>[\d.]+) MiB \| "
    r"syncscope analyze\s+(?P<cli_s>[\d.]+) s, tree RSS\s+(?P<cli_mib>[\d.]+) MiB.*?"
    r"(?:HTA load\s+(?P<hta_s>[\d.]+) s,\s+(?P<hta_mib>[\d.]+) MiB|HTA load skipped)"
)


def analysis_speed(work: Path, quick: bool) -> dict[str, Any]:
    """Runs benchmarks/bench_analyze.py on synthetic jobs written here (HTA must see every rank)."""
    from tests.helpers.synth_traces import write_job

    mib = 1.0 if quick else 3.0
    synthetic = work / "synthetic"
    ranks_seen = {}
    for ranks in (8,) if quick else (8, 64):
        job = synthetic / f"synthetic-{ranks}"
        write_job(job, ranks, int(mib * (1 << 20)))
        ranks_seen[ranks] = hta_ranks(job)
    cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_analyze.py"), "--mb", f"{mib:g}",
           "--synthetic-dir", str(synthetic)]  # fmt: skip
    cmd += ["--reps", "1"] if quick else ["--big", "--hta-big"]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    rows = []
    for line in proc.stdout.splitlines():
        m = ANALYZE_LINE.match(line)
        if m is None:
            continue
        row: dict[str, Any] = {"name": m["name"].strip(), "files": int(m["files"])}
        for key in ("mib", "cli_s", "hta_s", "cli_mib", "hta_mib"):
            row[key] = float(m[key]) if m[key] else None
        rows.append(row)
        log(f"analyze {row['name']}: syncscope {row['cli_s']} s, HTA {row['hta_s']} s")
    return {"command": " ".join(["python benchmarks/bench_analyze.py", *cmd[2:]]),
            "synthetic_mib": mib, "hta_ranks": ranks_seen, "rows": rows, "stdout": proc.stdout,
            "status": proc.returncode, "stderr_tail": proc.stderr.strip().splitlines()[-3:]}  # fmt: skip


def sync_bytes(work: Path, fixed: Path, args: list[str]) -> dict[str, Any]:
    rows = []
    for config in CONFIGS:
        record = Launch("profile").run(script_for(config["name"], fixed), args, work)
        report = json.loads((Path(record["run_dir"]) / "report.json").read_text())
        rank0 = next(r for r in report["ranks"] if r["rank"] == 0)
        windows = [w for w in rank0["windows"] if w["complete"]]
        minimum = sum(w["param_bytes"] for w in rank0["wrappers"])
        per_window = statistics.median(w["grad_sync_bytes"] for w in windows)
        rows.append({"config": config["name"], "label": config["label"],
                     "grad_syncs": statistics.median(w["grad_syncs"] for w in windows),
                     "bytes_per_window": per_window, "minimum_bytes": minimum,
                     "ratio": per_window / minimum if minimum else None,
                     "verdict": report["verdict"],
                     "findings": sorted({f["kind"] for f in report["findings"]})})  # fmt: skip
        log(f"bytes {config['name']}: {rows[-1]['ratio']}")
    return {"args": args, "rows": rows}


def machine() -> dict[str, Any]:
    def version(dist: str) -> str:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return "not installed"

    cpu = "unknown"
    with open("/proc/cpuinfo") as fh:
        for line in fh:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    with open("/proc/meminfo") as fh:
        mem_kib = int(fh.readline().split()[1])
    rev = _git_rev()
    return {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(mem_kib / 2**20, 1),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": version("torch"),
        "accelerate": version("accelerate"),
        "traceinsight": version("traceinsight"),
        "syncscope": version("syncscope"),
        "git": rev,
        "load_start": os.getloadavg(),
    }


def _git_rev() -> str:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                          text=True, check=False).stdout.strip()  # fmt: skip


def _respread(value: Any) -> Any:
    """``value`` read back from results.json with its spreads made ``Spread`` again."""
    if isinstance(value, dict):
        if {"median", "low", "high", "n"} <= set(value) <= set(Spread.__dataclass_fields__):
            return Spread(**value)
        return {k: _respread(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_respread(v) for v in value]
    return value


def kept_results(out: Path) -> dict[str, Any]:
    """``out``'s benchmarks/results.json as measured (small_steps as written, the rest with
    its spreads made ``Spread`` again)."""
    raw = json.loads((out / "benchmarks" / "results.json").read_text())
    return {k: v if k == "small_steps" else _respread(v) for k, v in raw.items()}


def rerender_small_steps(small_json: list[Path], out: Path) -> Path:
    """The page again from ``out``'s results.json, its small-step figures from
    ``small_json`` (``small_steps.py --json`` files, with when, how and how loaded each ran;
    several: one table each, say one per method)."""
    results = kept_results(out)
    small = [json.loads(path.read_text()) for path in small_json]
    results["small_steps"] = small[0] if len(small) == 1 else small
    return render(results, out)


SECTION_KEYS = ("accelerate", "capture", "small_steps", "bytes", "prediction", "analyze",
                "parse_speed", "scale")  # fmt: skip


def _sections(text: str) -> frozenset[str]:
    keys = frozenset(k.strip() for k in text.split(",") if k.strip())
    unknown = sorted(keys - set(SECTION_KEYS))
    if unknown or not keys:
        raise argparse.ArgumentTypeError(
            f"unknown section(s) {', '.join(unknown) or '(none named)'}; "
            f"sections: {', '.join(SECTION_KEYS)}"
        )
    return keys


class Sections:
    """Runs each section, logging it and keeping in ``results["made_by"]`` which script
    measured it, with which command, and when (the page says so under each heading)."""

    def __init__(
        self, results: dict[str, Any], command: str, only: frozenset[str] = frozenset()
    ) -> None:
        self.results = results
        self.command = command
        self.only = only  # these sections alone (the others kept as results.json has them)
        self.rev = _git_rev()  # the commit measured
        if not only:
            results["made_by"] = {}

    def run(self, key: str, title: str, how: str, measure: Callable[[], Any]) -> None:
        if self.only and key not in self.only:
            return
        log(title)
        start, clock = datetime.now(timezone.utc), time.monotonic()
        self.results[key] = measure()
        self.results["made_by"][key] = {
            "how": f"{how}, run by `{self.command}`",
            "date": start.strftime("%Y-%m-%d"),
            "from": start.strftime("%H:%M"),
            "to": datetime.now(timezone.utc).strftime("%H:%M"),
            "seconds": round(time.monotonic() - clock, 1),
            "git": self.rev,
        }


def small_steps_both_ways(work: Path, quick: bool, command: str) -> list[dict[str, Any]]:
    """Capture cost on small steps by both methods: one after another (the small shapes;
    the large one is the capture-cost table above) and side by side (the large one too)."""
    runs = []
    # repetitions enough for a median's interval of two order statistics in from each end
    # (12: the 3rd, 96%; 8: the 2nd, 93%): the whole range is the interval below 8
    for together, reps, shapes in ((False, 1 if quick else 12, ("transformer", "mlp")),
                                   (True, 1 if quick else 8, ("transformer", "mlp", "large"))):  # fmt: skip
        result = measure_small_steps(reps, 10 if quick else None, "aot_eager", work, shapes,
                                     together, ("eager",))  # fmt: skip
        result["command"] = f"{command} (benchmarks/small_steps.py's measure)"
        runs.append(result)
    return runs


def measure_all(opts: argparse.Namespace, results: dict[str, Any], work: Path) -> None:
    quick = opts.quick
    reps = results["reps"]
    command = "python benchmarks/run_all.py" + (" --quick" if quick else "")
    windows = ["--windows", "2" if quick else "4", "--warmup", "2"]
    table_args = ["--layers", "8", "--hidden", "1024", "--batch", "8", "--accum", "4", *windows]
    capture_args = ["--layers", "6", "--hidden", "1024", "--batch", "32", "--accum", "4",
                    "--windows", "3" if quick else "8", "--warmup", "2"]  # fmt: skip
    sections = Sections(results, command, opts.only)
    fixed, diff = fixed_script(work)
    results["fix_diff"] = diff
    sections.run("accelerate", "section 1: the Accelerate table", "run_all.py's accelerate_table",
                 lambda: accelerate_table(work, fixed, reps, table_args))  # fmt: skip
    capture_reps = opts.capture_reps or (1 if quick else 8)
    sections.run("capture", "section 2: capture cost", "run_all.py's capture_cost and "
                 "benchmarks/bench_flight.py's per-collective loop",
                 lambda: capture_cost(work, capture_reps, capture_args)
                 | {"fr_per_collective": flight_recorder_per_collective(
                     3 if quick else 6, 1000 if quick else 5000)})  # fmt: skip
    sections.run("small_steps", "section 2, small steps (small_steps.py)",
                 "benchmarks/small_steps.py's measure",
                 lambda: small_steps_both_ways(work, quick, command))  # fmt: skip
    sections.run("bytes", "section 4: grad-sync bytes per window", "run_all.py's sync_bytes",
                 lambda: sync_bytes(work, fixed, [*table_args[:8], "--windows", "2"]))  # fmt: skip
    prediction_reps = opts.prediction_reps or (1 if quick else 2)
    cases = [c for c in PREDICTION_CASES if c["name"] in QUICK_CASES] if quick else PREDICTION_CASES
    sections.run("prediction", "section 6: predicted vs measured (bench_prediction.py)",
                 "benchmarks/bench_prediction.py's run_modes",
                 lambda: measure_prediction(work / "prediction", prediction_reps,
                                            2 if quick else 4, cases))  # fmt: skip
    if not opts.skip_analyze:
        sections.run("analyze", "section 3: analysis speed (bench_analyze.py)",
                     "benchmarks/bench_analyze.py", lambda: analysis_speed(work, quick))  # fmt: skip
    if not opts.skip_trace_speed:
        sections.run("parse_speed", "section 3: parse speed (bench_scale.py)",
                     "benchmarks/bench_scale.py", lambda: parse_speed(work, quick))  # fmt: skip
        sections.run("scale", "section 3: scale (bench_scale.py)", "benchmarks/bench_scale.py",
                     lambda: scale(work, quick))  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 repetition, small trace sets")
    parser.add_argument("--reps", type=int, help="repetitions (default 5; --quick: 1)")
    parser.add_argument(
        "--out", type=Path, help="output folder (default docs/; --quick: a temp dir)"
    )
    parser.add_argument(
        "--skip-analyze", action="store_true", help="leave out section 3's HTA table"
    )
    parser.add_argument(
        "--skip-trace-speed",
        action="store_true",
        help="leave out section 3's parse-speed and scale tables (bench_scale.py; the page "
        "then shows those last written to docs/benchmarks/parse-speed.md and scale.md)",
    )
    parser.add_argument(
        "--prediction-reps", type=int, help="repetitions of section 6 (default 2; --quick: 1)"
    )
    parser.add_argument(
        "--capture-reps", type=int, help="repetitions of section 2 (default 8; --quick: 1)"
    )
    parser.add_argument(
        "--only",
        type=_sections,
        default=frozenset(),
        metavar="SECTION[,SECTION]",
        help=f"measure these sections alone ({', '.join(SECTION_KEYS)}), keep the others as the "
        "output folder's benchmarks/results.json has them, and render the page again (each "
        "section says when, and at which commit, it was measured)",
    )
    parser.add_argument(
        "--small-steps-from",
        type=Path,
        nargs="+",
        metavar="JSON",
        help="measure nothing: put these small_steps.py --json results (one table each) in the "
        "page's small-step figures, the rest from the output folder's "
        "benchmarks/results.json, and render again",
    )
    opts = parser.parse_args(argv)
    if opts.small_steps_from:
        page = rerender_small_steps(opts.small_steps_from, opts.out or ROOT / "docs")
        log(f"wrote {page}")
        return 0
    out = opts.out or (Path(tempfile.gettempdir()) / "syncscope-bench-quick" if opts.quick
                       else ROOT / "docs")  # fmt: skip
    started = time.monotonic()
    if opts.only:
        kept = out / "benchmarks" / "results.json"
        if not kept.is_file():
            print(f"run_all: --only needs an earlier full run's {kept}", file=sys.stderr)
            return 2
        results = kept_results(out)
    else:
        results = {"machine": machine(), "quick": opts.quick,
                   "reps": opts.reps or (1 if opts.quick else 5)}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="syncscope-bench-") as tmp:
        try:
            measure_all(opts, results, Path(tmp))
        except LaunchFailed as exc:
            print(f"run_all: a launch failed: {exc}", file=sys.stderr)
            return 1
    if not opts.only:  # (the page's run: the full one its other sections come from)
        results["machine"]["load_end"] = os.getloadavg()
        results["machine"]["run_s"] = round(time.monotonic() - started, 1)
    page = render(results, out)
    log(f"wrote {page} in {time.monotonic() - started:.0f} s")
    cap = results["capture"]
    paired = cap["paired"]["profile"]
    print(f"counting-mode capture: window time x{paired.median:.3f} of plain torchrun (paired "
          f"median; {interval_text(paired) or 'no interval'}): "
          f"{verdict(paired, COUNTING_LIMIT)} x{COUNTING_LIMIT}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
