"""docs/benchmarks.md and its SVG charts, rendered from the results dict of run_all.py.

Nothing here measures anything: ``render(results, out_dir)`` only formats. The charts are
plain SVG (horizontal bars, a whisker from min to max) so that they show on GitHub and in
any browser without plotly's JavaScript or kaleido.
"""

from __future__ import annotations

import html
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from _harness import Spread, interval_text, verdict
from _report_prediction import prediction_section
from _report_small_steps import small_steps_section
from _trace_speed import HTA_BIG

BAR = "#3b6fd1"
BASE = "#c9ced6"
GOOD = "#2f9e6e"
WARN = "#e8a33d"
INK = "#1f2933"


def hbar_svg(title: str, rows: Sequence[tuple[str, Spread, str]], unit: str,
             scale: float = 1.0) -> str:  # fmt: skip
    """Bars at the median, whiskers from min to max; ``scale`` converts values to ``unit``."""
    label_w, plot_w, row_h, top = 330, 380, 26, 34
    height = top + row_h * len(rows) + 26
    top_value = max(s.high for _, s, _ in rows) * scale * 1.08 or 1.0
    x = lambda v: label_w + plot_w * (v * scale) / top_value  # noqa: E731
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{label_w + plot_w + 90}" '
        f'height="{height}" font-family="sans-serif" font-size="12" fill="{INK}">',
        f'<text x="8" y="20" font-size="14" font-weight="bold">{html.escape(title)}</text>',
    ]
    for i, (label, spread, color) in enumerate(rows):
        y = top + i * row_h
        mid = y + row_h / 2
        parts += [
            f'<text x="{label_w - 8}" y="{mid + 4}" text-anchor="end">{html.escape(label)}</text>',
            f'<rect x="{label_w}" y="{y + 4}" width="{x(spread.median) - label_w:.1f}" '
            f'height="{row_h - 8}" fill="{color}"/>',
            f'<line x1="{x(spread.low):.1f}" x2="{x(spread.high):.1f}" y1="{mid}" y2="{mid}" '
            f'stroke="{INK}" stroke-width="1.2"/>',
            f'<line x1="{x(spread.low):.1f}" x2="{x(spread.low):.1f}" y1="{mid - 5}" '
            f'y2="{mid + 5}" stroke="{INK}"/>',
            f'<line x1="{x(spread.high):.1f}" x2="{x(spread.high):.1f}" y1="{mid - 5}" '
            f'y2="{mid + 5}" stroke="{INK}"/>',
            f'<text x="{x(spread.high) + 6:.1f}" y="{mid + 4}">'
            f"{spread.median * scale:.3g} {html.escape(unit)}</text>",
        ]
    axis_y = top + row_h * len(rows) + 4
    parts.append(
        f'<line x1="{label_w}" x2="{label_w + plot_w}" y1="{axis_y}" y2="{axis_y}" stroke="{INK}"/>'
    )
    parts.append(f'<text x="{label_w}" y="{axis_y + 16}">0</text>')
    parts.append(
        f'<text x="{label_w + plot_w}" y="{axis_y + 16}" text-anchor="end">'
        f"{top_value:.3g} {html.escape(unit)}</text></svg>"
    )
    return "\n".join(parts) + "\n"


def made_by(results: dict[str, Any], key: str) -> list[str]:
    """The line saying which script measured section ``key``, with which command, and when
    (run_all.py's ``made_by``); none for results written before it kept them."""
    made = results.get("made_by", {}).get(key)
    if not made:
        return []
    rev = made.get("git")
    at = f", at git {rev}" if rev and rev != results.get("machine", {}).get("git") else ""
    return [
        f"*Measured by {made['how']} on {made['date']}, {made['from']}-{made['to']} UTC "
        f"({made['seconds']:.0f} s){at}.*",
        "",
    ]


def ms(s: Spread, scale: float = 1e3, digits: int = 1) -> str:
    return f"{s.median * scale:.{digits}f} ({s.low * scale:.{digits}f}-{s.high * scale:.{digits}f})"


def ratio_text(s: Spread) -> str:
    return f"{s.median:.3f} ({s.low:.3f}-{s.high:.3f})"


def write_charts(results: dict[str, Any], out_dir: Path) -> list[str]:
    charts = out_dir / "benchmarks"
    charts.mkdir(parents=True, exist_ok=True)
    names: list[str] = []
    acc = results["accelerate"]
    for topo in acc["topologies"]:
        rows = [
            (c["label"], acc["spreads"][topo][c["name"]],
             BASE if c["name"] == "sync_every_microbatch" else GOOD if c["name"] == "fixed" else BAR)
            for c in acc["configs"]
            if c["name"] in acc["spreads"][topo]
        ]  # fmt: skip
        name = f"accelerate-{topo}.svg"
        title = f"Seconds per micro-batch, {acc['topology_labels'][topo]} (median, min-max)"
        (charts / name).write_text(hbar_svg(title, rows, "ms", 1e3))
        names.append(name)
    cap = results["capture"]
    rows = [(m["label"], cap["window"][m["name"]], BASE if m["name"] == "plain" else BAR)
            for m in cap["modes"]]  # fmt: skip
    (charts / "capture.svg").write_text(
        hbar_svg("Capture cost: window time (median, min-max)", rows, "ms", 1e3)
    )
    names.append("capture.svg")
    if results.get("analyze", {}).get("rows"):
        rows = []
        for r in results["analyze"]["rows"]:
            rows.append((f"{r['name']}: syncscope analyze", Spread.of([r["cli_s"]]), BAR))
            if r.get("hta_s") is not None:
                rows.append((f"{r['name']}: HTA load", Spread.of([r["hta_s"]]), WARN))
        (charts / "analyze.svg").write_text(hbar_svg("Trace analysis wall time", rows, "s"))
        names.append("analyze.svg")
    return names


def _meta(results: dict[str, Any]) -> list[str]:
    m = results["machine"]
    load = lambda v: " / ".join(f"{x:.2f}" for x in v)  # noqa: E731
    return [
        f"Generated by `python benchmarks/run_all.py{' --quick' if results['quick'] else ''}` "
        f"on {m['date']} in {m['run_s']:.0f} s.",
        "",
        f"- Machine: {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB, {m['platform']}; "
        f"shared with other jobs (load average {load(m['load_start'])} at the start, "
        f"{load(m['load_end'])} at the end).",
        f"- Versions: Python {m['python']}, torch {m['torch']}, accelerate {m['accelerate']}, "
        f"traceinsight (HTA) {m['traceinsight']}, syncscope {m['syncscope']} (git {m['git']}).",
        f"- Every figure is measured inside the training script with `time.perf_counter` "
        f"around optimizer-step windows, after warm-up windows; start-up and teardown are "
        f"excluded. {results['reps']} repetitions, configurations interleaved (ABCD, BCDA, "
        f"...), so machine noise hits all alike. Medians, with min-max in parentheses.",
        "",
    ]


def _accelerate(results: dict[str, Any]) -> list[str]:
    acc = results["accelerate"]
    spreads = acc["spreads"]
    lines = [
        "## 1. The Accelerate table, reproduced",
        "",
        *made_by(results, "accelerate"),
        "Seconds per micro-batch (ms) for the four ways of writing gradient accumulation in "
        "Accelerate's table, plus the baseline script after `syncscope fix --apply`; "
        "DDP over gloo, model 8 x Linear(1024,1024), batch 8, 4 micro-batches per step, "
        f"workload arguments `{' '.join(acc['args'])}` (the examples/ loops, run as benchmark "
        "workloads: benchmarks/README.md). Ratio: "
        "median over the baseline's median. Published: Accelerate's docs (T4 GPUs, batch "
        "16/GPU; seconds per batch), ratio to their baseline.",
        "",
        "| configuration | "
        + " | ".join(
            f"{acc['topology_labels'][t]}: ms/micro-batch | ratio | published ratio"
            for t in acc["topologies"]
        )
        + " |",
        "|---|" + "---:|---:|---:|" * len(acc["topologies"]),
    ]
    for c in acc["configs"]:
        cells = []
        for t in acc["topologies"]:
            s = spreads[t][c["name"]]
            base = spreads[t]["sync_every_microbatch"].median
            pub = acc["published"][t].get(c["name"])
            pub_ratio = (f"{pub / acc['published'][t]['sync_every_microbatch']:.2f}"
                         if pub is not None else "-")  # fmt: skip
            cells += [ms(s), f"{s.median / base:.2f}", pub_ratio]
        lines.append(f"| {c['label']} | " + " | ".join(cells) + " |")
    lines += ["", *[f"![{t}](benchmarks/accelerate-{t}.svg)" for t in acc["topologies"]], ""]
    lines += ["**`syncscope fix` against `no_sync`.** "]
    for t in acc["topologies"]:
        fixed, ref = spreads[t]["fixed"], spreads[t]["no_sync"]
        inside = ref.contains(fixed.median) or fixed.contains(ref.median)
        lines[-1] += (
            f"{acc['topology_labels'][t]}: fixed {fixed.median * 1e3:.1f} ms vs no_sync "
            f"{ref.median * 1e3:.1f} ms (x{fixed.median / ref.median:.3f}), "
            f"{'within noise' if inside else 'OUTSIDE the noise'}. "
        )
    lines[-1] += "(Within noise: one median lies inside the other's min-max.)"
    lines += ["", "The rewrite `syncscope fix` made to the baseline:", "", "```diff",
              results["fix_diff"].rstrip(), "```", ""]  # fmt: skip
    return lines


def _capture(results: dict[str, Any]) -> list[str]:
    cap = results["capture"]
    paired = cap["paired"]["profile"]
    within = interval_text(paired)
    lines = [
        "## 2. Capture cost",
        "",
        *made_by(results, "capture"),
        f"**Counting-mode capture (`syncscope profile`): window time x{paired.median:.3f} of "
        f"plain torchrun, the median of the paired per-repetition ratios (min-max "
        f"{paired.low:.3f}-{paired.high:.3f}{'; ' + within if within else ''}); the limit is "
        f"x{cap['limit']:.2f}: {verdict(paired, cap['limit'])}.** Ratio of the medians: "
        f"x{cap['ratio']['profile']:.3f}. CPU time of the rank process per window: "
        f"x{cap['cpu_ratio']['profile']:.3f}"
        + (
            f" (paired x{ratio_text(cap['paired_cpu']['profile'])})."
            if "paired_cpu" in cap
            else "."
        ),
        "",
        "The same DDP loop (`no_sync` accumulation, 6 x Linear(1024,1024), batch 32, 4 "
        f"micro-batches, 2 gloo ranks; `{' '.join(cap['args'])}`) launched "
        f"{len(cap['modes'])} ways, "
        f"{cap['runs'][-1]['rep'] + 1} repetitions, interleaved. Window time is the median window of a run (rank 0); the ratio is "
        "against plain torchrun's median; *paired* divides each run by the plain run of the "
        "same repetition. CPU time is `time.process_time` of rank 0 over the same windows: it "
        "ignores time spent waiting for the cores, so it is the steadier figure on a shared "
        "machine.",
        "",
        "| launch | window ms | ratio | paired ratio | CPU ms | CPU ratio |"
        + (" paired CPU ratio |" if "paired_cpu" in cap else ""),
        "|---|---:|---:|---:|---:|---:|" + ("---:|" if "paired_cpu" in cap else ""),
    ]
    for m in cap["modes"]:
        n = m["name"]
        lines.append(
            f"| {m['label']} | {ms(cap['window'][n])} | {cap['ratio'][n]:.3f} | "
            f"{ratio_text(cap['paired'][n])} | {ms(cap['cpu'][n])} | {cap['cpu_ratio'][n]:.3f} |"
            + (f" {ratio_text(cap['paired_cpu'][n])} |" if "paired_cpu" in cap else "")
        )
    lines += ["", "![capture](benchmarks/capture.svg)", "", *_flight_recorder(cap)]
    return [*lines, *small_steps_section(results)]


def _flight_recorder(cap: dict[str, Any]) -> list[str]:
    """Flight Recorder's share of the capture cost: ``profile`` with the recorder on (its
    default) over ``profile`` with it off, paired by repetition; and its cost per collective
    alone (benchmarks/bench_flight.py's one-rank loop), where run_all measured it."""
    lines = []
    share, share_cpu = cap.get("fr_share"), cap.get("fr_share_cpu")
    if share and share_cpu:
        lines.append(
            "**Flight Recorder's share** (torch's recorder, which `syncscope profile` turns on): "
            f"the profiled run with it on over the one with it off, paired by repetition: window "
            f"time x{ratio_text(share)}, CPU time x{ratio_text(share_cpu)}."
        )
    per = cap.get("fr_per_collective")
    if per and per.get("error"):
        lines.append(
            f"Per collective (`benchmarks/bench_flight.py`'s loop): failed: {per['error']}"
        )
    elif per:
        on, off, extra = per["on_cpu_us"], per["off_cpu_us"], per["extra_cpu_us"]
        lines.append(
            f"Per collective (`benchmarks/bench_flight.py`'s loop: 1 gloo rank, {per['n']} "
            "1-element all-reduces a measurement, the recorder off and on in turn, "
            f"{on.n} measurements each): CPU {ms(off, 1, 1)} us off, {ms(on, 1, 1)} us on; "
            f"the recorder's own, paired: {ms(extra, 1, 1)} us a collective."
        )
    return [*lines, ""] if lines else []


def _analyze(results: dict[str, Any]) -> list[str]:
    ana = results.get("analyze")
    if not ana:
        return []
    seen = ", ".join(f"{n} of {r}" for r, n in ana["hta_ranks"].items())
    command = re.sub(r"/\S*/synthetic", "<tmp>/synthetic", ana["command"])
    lines = [
        "## 3. Analysis speed and peak memory",
        "",
        *made_by(results, "analyze"),
        f"`{command}`: benchmarks/bench_analyze.py, "
        "its figures as it prints them (fresh processes, tools alternating, medians; "
        "*syncscope analyze* is the whole CLI, start-up and report writing included; *HTA* is "
        "`TraceAnalysis(trace_dir=...)`, the load alone). Real traces from "
        f"../shared/data/kineto; synthetic DDP jobs of {ana['synthetic_mib']:g} MiB per rank "
        "from `tests.helpers.synth_traces`, whose header is spaced as torch.profiler writes it "
        '(`"rank": N`): HTA finds a file\'s rank with the regex `"rank":\\s+(\\d+)`, and on a '
        'compact `"rank":N` it would map every file to rank 0 and load one file of the job. '
        f"Ranks HTA found: {seen}.",
        "",
    ]
    if ana["rows"]:
        lines += [
            "| trace set | files | largest MiB | syncscope analyze s | tree RSS MiB | "
            "HTA load s | HTA RSS MiB | HTA / syncscope |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in ana["rows"]:
            hta = (f"{r['hta_s']:.2f} | {r['hta_mib']:.0f} | {r['hta_s'] / r['cli_s']:.1f}x"
                   if r["hta_s"] is not None else "- | - | -")  # fmt: skip
            lines.append(
                f"| {r['name']} | {r['files']} | {r['mib']:.1f} | {r['cli_s']:.2f} | "
                f"{r['cli_mib']:.1f} | {hta} |"
            )
        lines += ["", "![analyze](benchmarks/analyze.svg)", ""]
    if ana["status"]:
        lines += [f"bench_analyze.py exited {ana['status']}: {' '.join(ana['stderr_tail'])}", ""]
    return [*lines, "Its output:", "", "```", ana["stdout"].rstrip(), "```", ""]


def _bytes(results: dict[str, Any]) -> list[str]:
    b = results["bytes"]
    lines = [
        "## 4. Grad-sync bytes per window",
        "",
        *made_by(results, "bytes"),
        "Each configuration once under `syncscope profile` (1 node x 2 ranks, "
        f"`{' '.join(b['args'])}`): gradient-sync bytes per optimizer-step window on rank 0 "
        "(median over complete windows) against the minimum, the gradient bytes of one "
        "reduction (the DDP module's parameter bytes). The fix must bring the ratio to 1.0.",
        "",
        "| configuration | grad syncs / window | bytes / window | minimum | ratio | findings |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for r in b["rows"]:
        ratio = f"{r['ratio']:.2f}" if r["ratio"] is not None else "-"
        lines.append(
            f"| {r['label']} | {r['grad_syncs']:g} | {r['bytes_per_window'] / 2**20:.1f} MiB | "
            f"{r['minimum_bytes'] / 2**20:.1f} MiB | **{ratio}** | "
            f"{', '.join(r['findings']) or 'none'} ({r['verdict']}) |"
        )
    return [*lines, ""]


def _gpu() -> list[str]:
    """The GPU section: its figures come from a GPU machine (bench_gpu.py), not this run."""
    return [
        "## 5. On a GPU (CUDA, NCCL)",
        "",
        "Every figure above is from CPU ranks over gloo. The capture cost on a GPU is measured by "
        "`python benchmarks/bench_gpu.py` on a machine with CUDA (plain torchrun against "
        "`syncscope profile`, NCCL, interleaved repetitions, paired ratios); it names the device "
        "it ran on. **Not measured yet**: no GPU has been available to this project so far. "
        "What has and has not been verified on a GPU, and on which device and torch version, is "
        "kept in [gpu.md](gpu.md).",
        "",
    ]


def _method_note() -> list[str]:
    """How to read the capture-cost figures: what launched runs can resolve, and where a
    smaller cost is measured (the figures of a change to capture are in its commit message)."""
    return [
        "### Reading the capture cost",
        "",
        "- Whole launched runs of the same command differ by tens of percent on a shared "
        "2-core machine, so a launched ratio near 1 (either way) is noise, not a cost; the "
        "paired ratios and CPU time are the steadier figures.",
        "- A smaller cost is measured in one process: `benchmarks/internals/capture_breakdown.py` "
        "alternates blocks of windows with every hook installed and without any in the same "
        "ranks and takes paired ratios per round; `benchmarks/internals/hook_time.py` gives the time "
        "inside the recorder per window, by hook; `benchmarks/internals/hook_bytecodes.py` counts the "
        "Python bytecodes capture adds per window, by function, exactly (no noise), though a "
        "bytecode's time varies and a slow C call adds none.",
        "- The measurements behind a change to capture are in that change's commit message.",
        "",
    ]


# what the scale table leaves out, and the command that measures it (benchmarks/_trace_speed.py)
_SCALE_NOTE = (
    "RUN: a 2-rank `syncscope profile` of examples/ddp_no_sync.py, made by the same run. "
    "HTA's load is not in this table: on 8 x 256 MB it takes about 15 minutes and 6 GB of "
    "memory on 2 cores; `{command}` measures it. The parse-speed table below has HTA's load beside "
    "syncscope on the sets that fit."
)


def _trace_speed(results: dict[str, Any]) -> list[str]:
    """The parse-speed and scale tables, each as benchmarks/bench_scale.py wrote it (its
    command and when it ran in its first lines) under the line saying run_all.py ran it;
    for results without them (``--skip-trace-speed``), the tables last written to
    docs/benchmarks/parse-speed.md and scale.md, with their own commands and dates."""
    lines: list[str] = []
    for key, name in (("scale", "scale.md"), ("parse_speed", "parse-speed.md")):
        part = results.get(key)
        if part is None:
            lines += _written_table(name)
            continue
        body = part["markdown"].rstrip("\n").split("\n") if part["markdown"] else []
        head = body[:1] if body and body[0].startswith("### ") else []
        body = body[len(head) :]
        while body and not body[0].strip():
            body = body[1:]
        lines += [*head, "", *made_by(results, key)]
        if part["status"]:
            lines += [
                f"bench_scale.py exited {part['status']}: {' '.join(part['stderr_tail'])}",
                "",
            ]
        lines += [*body, ""]
        if key == "scale":
            lines += [_SCALE_NOTE.format(command=HTA_BIG), ""]
    return lines


def _keep_tables(results: dict[str, Any], where: Path) -> None:
    """The trace-speed tables this run measured, as bench_scale.py wrote them, kept in
    ``where`` (scale.md, parse-speed.md): a later ``--skip-trace-speed`` page shows them."""
    for key, name in (("scale", "scale.md"), ("parse_speed", "parse-speed.md")):
        part = results.get(key)
        if part and part.get("markdown") and not part.get("status"):
            note = "<!-- written by benchmarks/bench_scale.py --doc; benchmarks/_report.py puts it in -->"
            (where / name).write_text(f"{note}\n{part['markdown'].rstrip()}\n")


def _written_table(name: str) -> list[str]:
    notes = Path(__file__).resolve().parents[1] / "docs" / "benchmarks" / name
    if not notes.is_file():
        return []
    text = notes.read_text()
    if text.startswith("<!--"):
        text = text[text.index("-->") + 3 :].lstrip("\n")
    return [*text.rstrip("\n").split("\n"), ""]


def render(results: dict[str, Any], out_dir: Path) -> Path:
    """Write benchmarks.md, benchmarks/*.svg and benchmarks/results.json; returns the page."""
    import json

    out_dir.mkdir(parents=True, exist_ok=True)
    write_charts(results, out_dir)
    lines = [
        "# Benchmarks",
        "",
        *_meta(results),
        *_accelerate(results),
        *_capture(results),
        *_method_note(),
        *_analyze(results),
        *_trace_speed(results),
        *_bytes(results),
        *_gpu(),
        *prediction_section(results, made_by(results, "prediction")),
        "Raw figures: [benchmarks/results.json](benchmarks/results.json).",
        "",
    ]
    page = out_dir / "benchmarks.md"
    page.write_text("\n".join(lines))
    raw = json.dumps(results, default=lambda o: o.__dict__, indent=1)
    (out_dir / "benchmarks" / "results.json").write_text(raw + "\n")
    _keep_tables(results, out_dir / "benchmarks")
    return page
