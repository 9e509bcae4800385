"""docs/benchmarks.md's section 6, predicted vs measured (benchmarks/bench_prediction.py's
results), rendered."""

from __future__ import annotations

from typing import Any


def _prediction_table(p: dict[str, Any], claimed: bool) -> list[str]:
    lines = [
        "| configuration | buggy | predicted | measured | error | old error | noise | "
        "reps spread |" + (" claimed |" if claimed else ""),
        "|---|---:|---:|---:|---:|---:|---:|---:|" + ("---:|" if claimed else ""),
    ]
    for r in p["rows"]:
        lines.append(
            f"| {r['label']} | {r['buggy_ns'] / 1e6:.1f} ms | {r['predicted_ns'] / 1e6:.1f} ms | "
            f"{r['measured_ns'] / 1e6:.1f} ms | **{r['error']:+.0%}** | {r['old_error']:+.0%} | "
            f"{r['noise_iqr']:.0%} | {r['noise_reps']:.0%} |"
            + (f" {r['claimed']}/{r['reps']} |" if claimed else "")
        )
    within = [r["label"] for r in p["rows"] if abs(r["error"]) <= max(r["noise_iqr"], 0.05)]
    beyond = [r["label"] for r in p["rows"] if abs(r["error"]) > max(r["noise_iqr"], 0.05)]
    return [
        *lines,
        "",
        f"**Median absolute error: {p['median_abs_error']:.0%}** (summed-durations model: "
        f"{p['old_median_abs_error']:.0%}). Error within the noise (or 5%): "
        f"{'; '.join(within) or 'none'}. Beyond it: {'; '.join(beyond) or 'none'}.",
        "",
    ]


def prediction_section(results: dict[str, Any], made_by: list[str]) -> list[str]:
    """Section 6: the cost model's projected window time against the fixed loop's, measured."""
    pred = results.get("prediction")
    if not pred:
        return []
    lines = [
        "## 6. Predicted vs measured",
        "",
        *made_by,
        "How right is the speed-up the report projects? `benchmarks/bench_prediction.py` "
        "profiles the buggy loop, takes the window time its report projects after the fix "
        "(window time minus the exposed sync time of every micro-batch but the last, "
        "[concepts.md](concepts.md#figures)), and measures the fixed loop's window time (median "
        "over ranks and steady windows), accumulate 4, all under `syncscope profile` so the "
        "capture cost is on both sides. Error = (predicted - measured) / measured. *Old* is the "
        "summed-durations model (window minus the sum of the early collectives' durations) on the same "
        "runs. *Noise*: the fixed loop's window-time interquartile range over ranks and steady "
        "windows, relative to the measured time; *reps spread*: the range of its medians across "
        "repetitions.",
        "",
        "The report's range reaches further on CPU ranks (gloo's reductions share the cores of "
        "the backward they overlap): up to the early syncs' whole time in flight "
        "([concepts.md](concepts.md#figures)). The bundled examples, projected and then "
        "measured as `fix --verify` measures them, repetition by repetition: "
        "[benchmarks/prediction-examples.md](benchmarks/prediction-examples.md).",
        "",
    ]
    same = pred.get("same_process")
    if same:
        lines += [
            f"### Same process ({same['reps']} repetitions, {same['windows']} buggy and "
            f"{same['windows']} fixed windows each)",
            "",
            "`workloads/alternating.py` runs the buggy loop on even optimizer steps and the fixed "
            "loop on odd ones, so prediction and measurement see the same machine load within "
            "a second: this isolates the model's error from drift in the load of a shared "
            "machine. Predicted from the buggy windows, measured on the fixed ones.",
            "",
            *_prediction_table(same, claimed=False),
        ]
    separate = pred.get("separate")
    if separate:
        lines += [
            f"### Separate runs ({separate['reps']} interleaved repetitions, "
            f"{separate['windows']} timed windows after 1 warm-up)",
            "",
            "What a user does: profile the buggy script, fix it, profile the fixed script. Jobs "
            "are interleaved (every repetition runs every job once, order rotated). *Claimed* "
            "counts the buggy runs whose report showed the gain rather than omitting it.",
            "",
            *_prediction_table(separate, claimed=True),
        ]
    if pred.get("notes"):
        lines += [pred["notes"], ""]
    return lines
