"""The projection where a new user meets it: every bundled example that ``syncscope fix``
rewrites, at its default size and at the README's (``--hidden 1024 --layers 8 --steps 6``),
run as ``fix --verify`` runs it (``syncscope profile --nproc-per-node 2``, 2 CPU ranks).

For each: the speed-up the original's report projects (range and median, and whether the
range is widened) against the one then measured as ``fix --verify`` measures it (the
report's window time: median over ranks and steady windows, original over fixed). The original and the fixed
script run back to back, in alternating order, ``--reps`` times, so that drift in the load
of a shared machine falls on both.

    python benchmarks/bench_prediction.py --mode examples [--reps 3] [--doc FILE] [--json FILE]
    python benchmarks/bench_prediction.py --mode examples --keep DIR --reanalyze FILE.json
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _harness import ROOT

from syncscope.load.runs import load_run
from syncscope.model import Run, figures


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# the bundled examples that ``syncscope fix`` rewrites (the others are already correct)
EXAMPLES_FIXED = ("ddp_sync_every_step.py", "ddp_no_sync_backward_only.py", "fsdp2_no_toggle.py")
EXAMPLE_SIZES = {"default": [], "readme": ["--hidden", "1024", "--layers", "8", "--steps", "6"]}


def _fixed_copy(example: str, work: Path) -> tuple[Path, Path]:
    """The example and its fixed form (``syncscope fix --apply`` on a copy), beside a copy of
    examples/common.py, in ``work``."""
    work.mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "examples" / "common.py", work / "common.py")
    original = work / example
    fixed = work / f"fixed_{example}"
    shutil.copy(ROOT / "examples" / example, original)
    shutil.copy(original, fixed)
    command = [sys.executable, "-m", "syncscope", "fix", "--apply", "--allow-outside", str(fixed)]
    subprocess.run(command, capture_output=True, check=True, env=_example_env())
    return original, fixed


def _example_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return env


def _profile_example(script: Path, args: list[str], out: Path) -> Run:
    command = [sys.executable, "-m", "syncscope", "profile", "--quiet", "--fail-on", "never",
               "--out", str(out), "--nproc-per-node", "2", str(script), *args]  # fmt: skip
    subprocess.run(command, capture_output=True, check=True, cwd=script.parent, env=_example_env())
    return load_run(out)


def verify_windows_ns(run: Run) -> list[float]:
    """What ``fix --verify`` measures a run by: the durations the report's window time is
    the median of (ranks and steady windows, warm-up windows apart)."""
    return figures.window_durations(run)


def examples(work: Path, reps: int, only: list[str] | None = None) -> dict[str, Any]:
    runs: list[dict[str, Any]] = []
    names = [e for e in EXAMPLES_FIXED if not only or e.removesuffix(".py") in only]
    for example in names:
        original, fixed = _fixed_copy(example, work / example.removesuffix(".py"))
        for size, args in EXAMPLE_SIZES.items():
            for rep in range(reps):
                order = ("original", "fixed") if rep % 2 == 0 else ("fixed", "original")
                for variant in order:
                    script = original if variant == "original" else fixed
                    _profile_example(script, args, _run_dir(work, example, size, rep, variant))
                row = _row(work, example, size, rep)
                runs.append(row)
                log(f"{example} {size} rep {rep}: {_example_line(row)}")
    return {"runs": runs, "reps": reps}


def _run_dir(work: Path, example: str, size: str, rep: int, variant: str) -> Path:
    return work / "runs" / f"{example}-{size}-{rep}-{variant}"


def _row(work: Path, example: str, size: str, rep: int) -> dict[str, Any]:
    """One repetition: the original's projection against the measured speed-up, judged as
    ``fix --verify`` judges it (``figures.judge``)."""
    original = load_run(_run_dir(work, example, size, rep, "original"))
    fixed = load_run(_run_dir(work, example, size, rep, "fixed"))
    p = figures.projection(original)
    measured = figures.measured_speedup(verify_windows_ns(original), verify_windows_ns(fixed))
    s = p.speedup if p.shown else None
    row = {
        "example": example, "size": size, "rep": rep,
        "measured": measured.median if measured else None,
        "measured_low": measured.low if measured else None,
        "measured_high": measured.high if measured else None,
        "low": s.low if s else None, "median": s.median if s else None,
        "high": s.high if s else None, "widened": p.widened, "omitted": p.omitted,
        "floor": p.floor,
    }  # fmt: skip
    row["agreement"] = figures.judge(measured, s, p.floor) if s and measured else None
    return row


def reanalyze(work: Path, saved: dict[str, Any]) -> dict[str, Any]:
    """The rows of a ``--json`` result again, projections recomputed with the current model
    from the run directories kept in ``work`` (``--keep``)."""
    rows = [_row(work, r["example"], r["size"], r["rep"]) for r in saved["runs"]]
    return {"runs": rows, "reps": saved["reps"]}


def _measured(row: dict[str, Any]) -> str:
    if not row["measured"]:
        return "n/a"
    return f"{row['measured']:.2f}x ({row['measured_low']:.2f}-{row['measured_high']:.2f}x)"


def _projected(row: dict[str, Any]) -> str:
    if row["low"] is None:
        return f"not projected ({row['omitted'].split(' (')[0]})"
    widened = f", {_widening(row)}" if row["widened"] else ""
    return f"{row['low']:.2f}-{row['high']:.2f}x (median {row['median']:.2f}x){widened}"


def _agreement(row: dict[str, Any]) -> str:
    """``figures.judge``'s word, a floor's "inside" said as "at or above"."""
    agreement = row.get("agreement")
    if agreement is None:
        return ""
    return "at or above (a floor)" if row["floor"] and agreement == "inside" else str(agreement)


def _example_line(row: dict[str, Any]) -> str:
    tail = f": {_agreement(row)}" if row.get("agreement") else ""
    said = _projected(row) if row["low"] is None else f"projected {_projected(row)}"
    return f"{said}; measured {_measured(row)}{tail}"


def examples_table(result: dict[str, Any]) -> str:
    head = f"{'example':<30} {'size':<8} {'rep':>3}  projection against measurement"
    lines = [head, "-" * 100]
    for r in result["runs"]:
        lines.append(f"{r['example']:<30} {r['size']:<8} {r['rep']:>3}  {_example_line(r)}")
    lines.append(_held(result["runs"]))
    for (example, size), mine in _grouped(result["runs"]).items():
        values = [r["measured"] for r in mine if r["measured"]]
        if len(values) > 1:
            lines.append(
                f"- {example} {size}: measured {min(values):.2f}-{max(values):.2f}x over "
                f"{len(values)} repetitions"
            )
    return "\n".join(lines)


def _held(runs: list[dict[str, Any]]) -> str:
    """How many projections the measurement bore out: inside, or outside within its noise."""
    claimed = [r for r in runs if r.get("agreement")]
    count = {a: sum(r["agreement"] == a for r in claimed) for a in ("inside", "within noise")}
    missed = [r["agreement"] for r in claimed if r["agreement"] not in count]
    return (
        f"projection held: {count['inside'] + count['within noise']} of {len(claimed)} "
        f"({count['inside']} inside the range, {count['within noise']} outside it but within "
        f"the measurement's noise; missed: {', '.join(missed) or 'none'}); "
        f"{len(runs) - len(claimed)} runs not projected (too few steady windows, or window "
        "time varying more than the predicted gain)"
    )


def _grouped(runs: list[dict[str, Any]]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    out: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in runs:
        out.setdefault((r["example"], r["size"]), []).append(r)
    return out


READING = [
    "How to read it. *projected*: the range the original's report prints, with its reasons "
    "in short (*low end: noise*: lowered for the window time's own noise in that run). "
    "*measured (noise)*: `fix --verify`'s speed-up, the original's window time over the "
    "fixed run's (steady windows on every rank, warm-up windows apart), with its noise range "
    "(each run off by a quartile of its windows, opposite ways). *measurement against "
    "projection*: what `fix --verify` says (the same judge, as printed to 0.01x): inside the "
    "range (at or above, for a floor), within noise (outside it, the measured noise range "
    "reaching it), or below / above it (the noise range too).",
    "",
    "*default*: the examples' own sizes (6 steps, windows of a few milliseconds): their "
    "window time varies by tens of percent from window to window on shared cores, so the low "
    "end often falls under 1x; the report says to read the range as a floor (each sync's "
    "fixed cost of a call, gloo's and the capture's, weighs as much as its wait there, and no "
    "figure of the original run measures it), and where the windows vary more than the "
    "predicted gain it claims none. *readme*: `--hidden 1024 --layers 8 --steps 6`, the "
    "README's demo. A miss is a pair of runs whose load differed: another job on the same "
    "cores during one of them, which no figure of the original run can see. FSDP2 on CPU: "
    "removing the early reduce-scatters also made the all-gathers that stay faster, which no "
    "figure of the buggy run measures; where a range is shown the report says to read it as "
    "a floor.",
]


def _widening(row: dict[str, Any]) -> str:
    """What the report said beside the range, in two words each."""
    said = str(row["widened"])
    words = [
        "widened: CPU" if "range widened" in said else "",
        "a floor: FSDP" if "under FSDP" in said else "",
        "a floor: short windows" if "at windows of" in said else "",
        "low end: noise" if "own noise" in said else "",
    ]
    return "; ".join(w for w in words if w) or "widened"


def examples_markdown(result: dict[str, Any]) -> str:
    """The page docs/benchmarks/prediction-examples.md: one row per repetition."""
    lines = [
        "# Projected against measured, on the bundled examples",
        "",
        "Written by `python benchmarks/bench_prediction.py --mode examples --doc FILE` "
        f"({result['reps']} repetitions, 2 CPU ranks, a machine of 2 cores shared with other "
        "jobs): the speed-up each example's report projects, against the one `fix --verify` "
        "then measures (original and fixed run back to back, order alternating).",
        "",
        "| example | size | rep | projected | measured (noise) | measurement against projection |",
        "|---|---|---:|---|---|---|",
    ]
    for r in result["runs"]:
        agreement = _agreement(r)
        shown = f"**{agreement}**" if agreement in ("below", "above") else agreement
        lines.append(
            f"| {r['example']} | {r['size']} | {r['rep']} | {_projected(r)} | {_measured(r)} "
            f"| {shown} |"
        )
    lines += ["", *examples_table(result).splitlines()[-1 - len(_grouped(result["runs"])) :], ""]
    lines += READING
    return "\n".join(lines) + "\n"


def run_examples(
    reps: int,
    only: list[str] | None,
    keep: Path | None,
    out_json: Path | None,
    doc: Path | None,
    saved: Path | None = None,
) -> int:
    """``saved``: recompute a ``--json`` result from the run directories kept in ``keep``."""
    if saved is not None and keep is not None:
        found = reanalyze(keep, json.loads(saved.read_text()))
    else:
        with tempfile.TemporaryDirectory(prefix="syncscope-predict-") as tmp:
            found = examples(keep or Path(tmp), reps, only)
    print(examples_table(found))
    if out_json:
        out_json.write_text(json.dumps(found, indent=1))
    if doc:
        doc.write_text(examples_markdown(found))
    return 0
