"""``--verify``: profile the original and the fixed script and compare them side by side.

Both runs go through ``python -m syncscope profile`` with the same launcher options and
parameter fingerprints on (``SYNCSCOPE_PARAM_FINGERPRINTS=1``). The fixed copy is written next
to the original (so its relative imports work) and removed afterwards. The fixed run must
reach the minimum (one grad sync per window on every rank); its parameters, window by window
on every rank, must match the original's (``syncscope.fixes.training``) when the original was
only wasteful, and are expected to change when a correctness bug was fixed. The losses the
script prints (lines like ``loss 0.1234``) are shown beside, as information: they decide
nothing (a script may print a loss scaled otherwise, or its ranks' lines in any order).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from syncscope.errors import SyncscopeError
from syncscope.fixes.training import (
    RTOL,
    RankTraining,
    TrainingComparison,
    compare,
    training_of,
)
from syncscope.model import figures
from syncscope.model.figures import Stat, within_noise

LOSS = re.compile(r"\bloss[\s=:]+([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|nan|inf)\b")
CORRECTNESS_CODES = frozenset({"SYN104", "SYN105", "SYN106", "SYN107", "SYN108"})
CORRECTNESS_KINDS = frozenset({"missing-sync", "grad-reset-mid-window", "rank-divergence"})


@dataclass(frozen=True)
class Projected:
    """The speed-up a report projected for the fix (report.json ``figures.projection``)."""

    speedup: Stat | None  # None: not projected (``omitted`` says why)
    floor: bool = False  # the range is read as a floor
    omitted: str = ""


@dataclass(frozen=True)
class Profiled:
    grad_syncs: tuple[int, ...]  # per complete window, worst rank
    window_ms: float | None  # the report's window time: median over ranks and steady windows
    losses: tuple[float, ...] | None
    kinds: frozenset[str]
    window_spread: Stat | None = None  # the same windows' median, low and high (ms)
    training: tuple[RankTraining, ...] = ()  # each rank's parameter fingerprints
    windows_ns: tuple[float, ...] = ()  # the durations the window time is figured over
    projected: Projected | None = None  # None: the report projected no speed-up


@dataclass(frozen=True)
class Verification:
    """What ``--verify`` found; ``render`` writes its verdict lines from it."""

    original: Profiled
    fixed: Profiled
    minimum: bool  # the fixed run syncs once per window on every rank
    training: TrainingComparison | None  # the parameters compared (None: not compared)
    correctness_fix: bool  # the original was wrong: training is expected to change

    @property
    def ok(self) -> bool:
        """Accepted: the minimum reached and, where the original was only wasteful, the
        same training (nothing to compare is no difference)."""
        differ = self.training is not None and self.training.status == "differ"
        return self.minimum and (self.correctness_fix or not differ)

    @property
    def speedup(self) -> Stat | None:
        """The measured speed-up, with its noise range (``figures.measured_speedup``)."""
        return figures.measured_speedup(self.original.windows_ns, self.fixed.windows_ns)


def _summarize(report: dict[str, Any], stdout: str) -> Profiled:
    """Grad syncs per complete window (worst rank), and the report's own window time: the
    median over ranks and steady windows, warm-up windows apart (the first; one holding a
    one-time cost such as DDP's bucket rebuild, which a fixed loop moves to window 1), the
    figure the report, ``diff`` and the projection use (``syncscope.model.figures``)."""
    per_window: dict[int, int] = {}
    for rank in report.get("ranks") or []:
        for window in rank.get("windows") or []:
            if not window.get("complete"):
                continue
            index = int(window["index"])
            per_window[index] = max(per_window.get(index, 0), int(window.get("grad_syncs", 0)))
    losses = tuple(float(x) for x in LOSS.findall(stdout))
    spread = _window_time(report)
    return Profiled(
        tuple(per_window[i] for i in sorted(per_window)),
        spread.median if spread else None,
        losses or None,
        frozenset(str(f.get("kind")) for f in report.get("findings") or []),
        spread,
        projected=_projected(report),
    )


def _projected(report: dict[str, Any]) -> Projected | None:
    """report.json's ``figures.projection``: the speed-up range shown, or why none is."""
    figure = (report.get("figures") or {}).get("projection")
    if not isinstance(figure, dict):
        return None
    s = figure.get("speedup")
    try:
        speedup = (
            Stat(float(s["median"]), float(s["low"]), float(s["high"]), int(s["n"]))
            if isinstance(s, dict)
            else None
        )
    except (KeyError, TypeError, ValueError):
        speedup = None
    return Projected(speedup, bool(figure.get("floor")), str(figure.get("omitted") or ""))


def _window_time(report: dict[str, Any]) -> Stat | None:
    """report.json's ``figures.window_time_ns``, in milliseconds."""
    figure = (report.get("figures") or {}).get("window_time_ns")
    if not isinstance(figure, dict):
        return None
    try:
        return Stat(
            float(figure["median"]) / 1e6,
            float(figure["low"]) / 1e6,
            float(figure["high"]) / 1e6,
            int(figure["n"]),
        )
    except (KeyError, TypeError, ValueError):
        return None


def _window_cell(p: Profiled) -> str:
    s = p.window_spread
    if s is None:
        return "n/a"
    return f"{s.median:.1f}" if s.low == s.high else f"{s.median:.1f} ({s.low:.1f}-{s.high:.1f})"


def window_change(original: Profiled, fixed: Profiled) -> str:
    """The window-time comparison, with the windows' spread as the noise band."""
    a, b = original.window_spread, fixed.window_spread
    if a is None or b is None or not b.median:
        return "window time: not compared (no complete window)"
    if within_noise(a, b):
        return "window time: within noise (each run's median inside the other's window range)"
    ratio = a.median / b.median
    return f"window time: {ratio:.2f}x {'faster' if ratio > 1 else 'slower'}, beyond the noise"


def _profile(script: Path, out: Path, launcher: Sequence[str], args: Sequence[str]) -> Profiled:
    from syncscope.load.runs import load_run
    from syncscope.rundir import PARAM_FINGERPRINTS_ENV, SEED_ENV

    command = [sys.executable, "-m", "syncscope", "profile", "--quiet", "--fail-on", "never"]
    command += ["--out", str(out), *launcher, str(script), *args]
    command[-1 - len(args)] = str(script.resolve())  # works whatever the cwd: see cwd below
    # the ranks record their parameters' fingerprints, their random generators seeded alike
    env = dict(os.environ, **{PARAM_FINGERPRINTS_ENV: "1", SEED_ENV: "0"})
    done = subprocess.run(
        command, capture_output=True, text=True, cwd=script.resolve().parent, check=False, env=env
    )
    report_path = out / "report.json"
    if done.returncode != 0 or not report_path.is_file():
        lines = done.stderr.strip().splitlines()
        # why it failed: syncscope's last word before the run-directory line, else the last
        said = [ln for ln in lines if ln.startswith("syncscope:") and "run directory" not in ln]
        last = (said or lines or ["no output"])[-1]
        raise SyncscopeError(f"profiling {script.name} failed (exit {done.returncode}): {last}")
    report = json.loads(report_path.read_text(encoding="utf-8"))
    summary = _summarize(report, done.stdout)
    try:
        run = load_run(out)
        training = training_of(run)
    except SyncscopeError:  # unreadable rank files: the parameters are not compared
        return summary
    windows = tuple(figures.window_durations(run))
    return dataclasses.replace(summary, training=training, windows_ns=windows)


def verify(
    script: Path,
    fixed_source: str,
    codes: Sequence[str],
    launcher: Sequence[str] = ("--nproc-per-node", "2"),
    args: Sequence[str] = (),
    encoding: str = "utf-8",
) -> Verification:
    """Profile ``script`` and ``fixed_source`` (run as a sibling file, written in the
    script's ``encoding``) and compare."""
    import signal

    from syncscope.atomic import fresh_name

    script = script.resolve()
    copy: Path | None = None

    def on_signal(signum: int, frame: object) -> None:
        raise KeyboardInterrupt  # unwinds through the finally blocks below: both cleaned up

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        with tempfile.TemporaryDirectory(prefix="syncscope-verify-") as tmp:
            original = _profile(script, Path(tmp) / "original", launcher, args)
            try:
                name = fresh_name(script.with_name(f"_syncscope_fixed_{script.name}"))
                with open(name, "x", encoding=encoding) as out:  # never over a user's file
                    copy = name
                    out.write(fixed_source)
                fixed = _profile(copy, Path(tmp) / "fixed", launcher, args)
            finally:
                if copy is not None:
                    copy.unlink(missing_ok=True)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    minimum = bool(fixed.grad_syncs) and all(n == 1 for n in fixed.grad_syncs)
    correctness = bool(set(codes) & CORRECTNESS_CODES) or bool(original.kinds & CORRECTNESS_KINDS)
    training = compare(original.training, fixed.training)
    return Verification(original, fixed, minimum, training, correctness)


def _cell(values: Sequence[float] | None, digits: int = 4) -> str:
    if not values:
        return "n/a"
    shown = ", ".join(f"{v:.{digits}g}" for v in values[:6])
    return shown + (", ..." if len(values) > 6 else "")


def render(result: Verification) -> list[str]:
    """The side-by-side table and the verdict, as lines of text (from the data alone)."""
    o, f = result.original, result.fixed
    rows = [
        ("", "original", "fixed"),
        ("grad syncs per window", _cell(o.grad_syncs), _cell(f.grad_syncs)),
        ("window time (ms)", _window_cell(o), _window_cell(f)),
        ("printed losses", _cell(o.losses), _cell(f.losses)),
    ]
    width = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = ["  ".join(c.ljust(width[i]) for i, c in enumerate(r)).rstrip() for r in rows]
    lines.append(
        "minimum reached: one grad sync per window"
        if result.minimum
        else "minimum NOT reached: the fixed script still syncs more or less than once per window"
    )
    lines.append(window_change(o, f))
    lines.append(speedup_line(result.speedup, o.projected))
    lines.append(training_line(result.training, result.correctness_fix))
    return lines


AGREEMENT = {
    "inside": "inside the projected range",
    "within noise": "{side} the projected {what}, its noise range reaching it",
    "below": "BELOW the projected {what}, its noise range too",
    "above": "above the projected range, its noise range too",
}


def speedup_line(measured: Stat | None, projected: Projected | None) -> str:
    """The measured speed-up with its noise range, against the original's projection
    (``figures.judge``: inside, within noise, below or above; above a floor is inside)."""
    if measured is None:
        return "speed-up: not measured (a run without a complete window)"
    said = (
        f"speed-up: measured {measured.median:.2f}x (noise {measured.low:.2f}-"
        f"{measured.high:.2f}x: each run's window-time quartiles)"
    )
    if projected is None:
        return said
    p = projected.speedup
    if p is None:
        return f"{said}; not projected: {projected.omitted or 'no steady window'}"
    span = f"{p.low:.2f}-{p.high:.2f}x" if round(p.high, 2) > round(p.low, 2) else f"{p.low:.2f}x"
    agreement = figures.judge(measured, p, projected.floor)
    if projected.floor and agreement == "inside":
        verdict = "at or above the projected floor"
    else:
        side = "below" if round(measured.median, 2) < round(p.low, 2) else "above"
        what = "floor" if projected.floor else "range"
        verdict = AGREEMENT[agreement].format(side=side, what=what)
    return f"{said}; projected {span}{', read as a floor' if projected.floor else ''}: {verdict}"


def training_line(training: TrainingComparison | None, correctness_fix: bool) -> str:
    """The verdict on training: the parameters compared, window by window."""
    if correctness_fix:
        said = (
            "training changes because a correctness bug is fixed (missing sync or wiped gradients)"
        )
        where = _where(training) if training is not None else ""
        return said + (f"; parameters first differ {where}" if where else "")
    if training is None or training.status == "not compared":
        reason = training.reason if training is not None else "not recorded"
        return f"training not compared: {reason} (printed losses are information only)"
    if training.status == "match":
        n = training.windows
        steps = f"each of {n} optimizer steps" if n > 1 else "its optimizer step"
        return (
            f"training matches: every parameter equal on every rank after {steps} "
            f"(largest difference {training.largest:.1e} of its scale, tolerance {RTOL:.0e})"
        )
    return f"training DIFFERS although the original was only wasteful: {_where(training)}"


def refusal(result: Verification) -> str:
    """Why a fix that did not check out is refused, in one line."""
    why = []
    if not result.minimum:
        why.append("the fixed script does not sync once per window")
    training = result.training
    if not result.correctness_fix and training is not None and training.status == "differ":
        why.append(f"training differs {_where(training)}")
    return "verification failed: " + "; ".join(why or ["see above"]) + "; the fix was not applied"


def _where(training: TrainingComparison) -> str:
    """Where training first differs, with both values."""
    if training.steps is not None:
        original, fixed = training.steps
        return f"in optimizer steps: the original made {original}, the fixed {fixed}"
    d = training.difference
    if d is None:
        return ""
    when = (
        "before the first optimizer step (the runs did not start from the same parameters)"
        if d.window is None
        else f"after window {d.window}'s optimizer step"
    )
    return (
        f"{when}, rank {d.rank}, parameter {d.name}: original {d.original:.9g}, "
        f"fixed {d.fixed:.9g} (fingerprints; allowed difference {d.allowed:.2g})"
    )
