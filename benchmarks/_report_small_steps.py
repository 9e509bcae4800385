"""docs/benchmarks.md's small-step figures (benchmarks/small_steps.py's results), rendered:
one table per method (one after another, side by side), each saying when and how it ran."""

from __future__ import annotations

from typing import Any

from _harness import interval_text, verdict

_SHAPE_TEXT = {
    "transformer": "a nanoGPT-shaped DDP loop (`workloads/small_transformer.py`: 2 blocks, "
    "64 wide)",
    "mlp": "a DDP MLP (`workloads/small_mlp.py`: 4 x Linear(512, 512) + ReLU, batch 16, AdamW)",
    "large": "the capture-cost loop above (examples/ddp_no_sync.py: 6 x Linear(1024), batch 32)",
}


def small_steps_section(results: dict[str, Any]) -> list[str]:
    """The small-step section: one ``small_steps.py`` result, or a list of them (one per
    method: one after another, side by side), each with its own table."""
    small = results.get("small_steps")
    if not small:
        return []
    runs = small if isinstance(small, list) else [small]
    first = runs[0]
    shapes_seen = list(
        dict.fromkeys(s for run in runs for s in (run.get("shapes") or {"transformer": run}))
    )
    shapes_seen = [s for s in shapes_seen if s in _SHAPE_TEXT]
    lines = [
        "### Small steps",
        "",
        "`benchmarks/small_steps.py`: small optimizer steps (and the large shape where named), "
        "each with 4 "
        f"micro-batches under `no_sync()` on 2 gloo ranks of one thread, {_modes(runs, first)}, "
        "plain torchrun against `syncscope profile`: "
        + "; ".join(_SHAPE_TEXT[s] for s in shapes_seen)
        + ". Medians over repetitions, min-max in parentheses; *paired*: each profiled run "
        "over the plain run of its repetition; *thread*: CPU time of the training thread "
        "alone. *One after another*: the runs in a rotated order, as a user would compare "
        "them; *side by side*: each plain job and its profiled twin at once, their windows "
        "timed over the same seconds (the cores shared: read the CPU-time ratios). "
        "Each paired ratio is judged against the limit by the median's interval: the "
        "narrowest pair of order statistics that holds the true median with at least 90% "
        "probability, whatever the noise's distribution (the whole range where there are too "
        "few repetitions, with the coverage it has): *within the limit* when all of it is at "
        "or under, *above* when all of it is over, else *not resolved at this noise*. "
        "`benchmarks/internals/hook_time.py` gives the time inside the recorder per window, which "
        "noise does not blur.",
        "",
    ]
    for run in runs:
        lines += _small_steps_run(run, len(runs) > 1)
    return lines


def _modes(runs: list[dict[str, Any]], first: dict[str, Any]) -> str:
    """Which of eager and ``torch.compile``d the runs measured, in words."""
    seen = {m for run in runs for f in (run.get("shapes") or {"": run}).values()
            for m in ("eager", "compiled") if m in f}  # fmt: skip
    compiled = f"`torch.compile`d (backend {first['backend']})"
    if seen == {"eager"}:
        return "eager"
    return compiled if seen == {"compiled"} else f"eager and {compiled}"


def _small_steps_run(small: dict[str, Any], titled: bool) -> list[str]:
    limit = float(small.get("limit", 1.03))
    # results written before the MLP shape was added hold the transformer's figures alone
    shapes = small.get("shapes") or {"transformer": small}
    method = small.get("method", "one after another")
    # several runs are told apart by their shapes, kernel and when they ran (a title each)
    told = [", ".join(shapes)]
    if small.get("kernel"):
        told.append(f"{str(small['kernel']).split()[0]} kernel")
    if small.get("measured"):
        told.append(str(small["measured"]))
    lines = [f"#### {method.capitalize()}: {'; '.join(told)}", ""] if titled else []
    if small.get("measured"):
        kernel = small.get("kernel")
        lines += [
            f"`benchmarks/small_steps.py`, measured {small['measured']}, {method}"
            + (f", collective kernel: {kernel}" if kernel else "")
            + f" (load average at the end {', '.join(str(x) for x in small['load'])}), "
            + (
                f"by `{small['command']}`."
                if small.get("command")
                else "apart from the other sections."
            ),
            "",
        ]
    lines += [
        "| shape | launch | window ms | CPU ms | thread CPU ms |",
        "|---|---|---:|---:|---:|",
    ]
    for shape, figures in shapes.items():
        for name, f in figures["configs"].items():
            w, c, t = f["window"], f["cpu"], f.get("thread")
            lines.append(
                f"| {shape} | {name} | {w['median'] * 1e3:.2f} "
                f"({w['low'] * 1e3:.2f}-{w['high'] * 1e3:.2f}) | {c['median'] * 1e3:.2f} | "
                + (f"{t['median'] * 1e3:.2f} |" if t else "- |")
            )
    lines.append("")
    for shape, figures in shapes.items():
        for mode in (m for m in ("eager", "compiled") if m in figures):
            r, p = figures[mode], figures[mode]["paired"]
            pc, pt = r.get("paired_cpu"), r.get("paired_thread")
            lines.append(
                f"- {shape}, {mode}: wall x{r['ratio']:.3f} of plain (medians), paired "
                f"x{p['median']:.3f} ({p['low']:.3f}-{p['high']:.3f}); CPU time paired "
                + (f"x{pc['median']:.3f} ({pc['low']:.3f}-{pc['high']:.3f})" if pc else "-")
                + "; training thread paired "
                + (f"x{pt['median']:.3f} ({pt['low']:.3f}-{pt['high']:.3f})" if pt else "-")
            )
            if p.get("ci_low") is not None:  # results kept before the interval was
                lines[-1] += (
                    f". Against the limit x{limit:.2f}: wall, {interval_text(p)}, "
                    f"**{verdict(p, limit)}**"
                    + (
                        f"; training thread, {interval_text(pt)}, {verdict(pt, limit)}"
                        if pt
                        else ""
                    )
                )
    return [*lines, ""]
