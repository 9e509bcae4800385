"""``--verify``: profile the original and the fixed script and compare them side by side.

Both runs go through ``python -m syncscope profile`` with the same launcher options. The
fixed copy is written next to the original (so its relative imports work) and removed
afterwards. The fixed run must reach the minimum (one grad sync per window on every rank);
losses, read from lines like ``loss 0.1234`` the script prints, must match when the original
was only wasteful, and are expected to change when a correctness bug was fixed.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from syncscope.errors import SyncscopeError
from syncscope.model.figures import Stat, within_noise

LOSS = re.compile(r"\bloss[\s=:]+([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|nan|inf)\b")
CORRECTNESS_CODES = frozenset({"SYN104", "SYN105", "SYN106", "SYN107", "SYN108"})
CORRECTNESS_KINDS = frozenset({"missing-sync", "grad-reset-mid-window", "rank-divergence"})


@dataclass(frozen=True)
class Profiled:
    grad_syncs: tuple[int, ...]  # per complete window, worst rank
    window_ms: float | None  # median complete-window duration on rank 0, warm-up window 0 apart
    losses: tuple[float, ...] | None
    kinds: frozenset[str]
    window_spread: Stat | None = None  # the same windows' median, low and high (ms)


@dataclass(frozen=True)
class Verification:
    original: Profiled
    fixed: Profiled
    minimum: bool
    losses_match: bool | None  # None: losses not available
    correctness_fix: bool

    @property
    def ok(self) -> bool:
        return self.minimum and (self.correctness_fix or self.losses_match is not False)


def _summarize(report: dict[str, Any], stdout: str) -> Profiled:
    per_window: dict[int, int] = {}
    durations: dict[int, int] = {}
    for rank in report.get("ranks") or []:
        for window in rank.get("windows") or []:
            if not window.get("complete"):
                continue
            index = int(window["index"])
            per_window[index] = max(per_window.get(index, 0), int(window.get("grad_syncs", 0)))
            if rank.get("rank") == 0:
                durations[index] = int(window.get("duration_ns", 0))
    losses = tuple(float(x) for x in LOSS.findall(stdout))
    steady = [d / 1e6 for i, d in durations.items() if i != 0] or [
        d / 1e6 for d in durations.values()
    ]
    spread = Stat.of(steady)
    return Profiled(
        tuple(per_window[i] for i in sorted(per_window)),
        spread.median if spread else None,
        losses or None,
        frozenset(str(f.get("kind")) for f in report.get("findings") or []),
        spread,
    )


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
    command = [sys.executable, "-m", "syncscope", "profile", "--quiet", "--fail-on", "never"]
    command += ["--out", str(out), *launcher, str(script), *args]
    command[-1 - len(args)] = str(script.resolve())  # works whatever the cwd: see cwd below
    done = subprocess.run(
        command, capture_output=True, text=True, cwd=script.resolve().parent, check=False
    )
    report_path = out / "report.json"
    if done.returncode != 0 or not report_path.is_file():
        lines = done.stderr.strip().splitlines()
        # why it failed: syncscope's last word before the run-directory line, else the last
        said = [ln for ln in lines if ln.startswith("syncscope:") and "run directory" not in ln]
        last = (said or lines or ["no output"])[-1]
        raise SyncscopeError(f"profiling {script.name} failed (exit {done.returncode}): {last}")
    report = json.loads(report_path.read_text(encoding="utf-8"))
    return _summarize(report, done.stdout)


def _close(a: Sequence[float], b: Sequence[float]) -> bool:
    return len(a) == len(b) and all(
        math.isclose(x, y, rel_tol=1e-5, abs_tol=1e-6) for x, y in zip(a, b, strict=True)
    )


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

    from syncscope.files import fresh_name

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
    losses_match = None
    if original.losses is not None and fixed.losses is not None:
        losses_match = _close(original.losses, fixed.losses)
    return Verification(original, fixed, minimum, losses_match, correctness)


def _cell(values: Sequence[float] | None, digits: int = 4) -> str:
    if not values:
        return "n/a"
    shown = ", ".join(f"{v:.{digits}g}" for v in values[:6])
    return shown + (", ..." if len(values) > 6 else "")


def render(result: Verification) -> list[str]:
    """The side-by-side table and the verdict, as lines of text."""
    o, f = result.original, result.fixed
    rows = [
        ("", "original", "fixed"),
        ("grad syncs per window", _cell(o.grad_syncs), _cell(f.grad_syncs)),
        ("window time (ms)", _window_cell(o), _window_cell(f)),
        ("losses", _cell(o.losses), _cell(f.losses)),
    ]
    width = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = ["  ".join(c.ljust(width[i]) for i, c in enumerate(r)).rstrip() for r in rows]
    lines.append(
        "minimum reached: one grad sync per window"
        if result.minimum
        else "minimum NOT reached: the fixed script still syncs more or less than once per window"
    )
    lines.append(window_change(o, f))
    if result.correctness_fix:
        lines.append(
            "losses change because a correctness bug is fixed (missing sync or wiped gradients)"
        )
    elif result.losses_match is None:
        lines.append("losses not available: the script prints no 'loss <value>' lines")
    elif result.losses_match:
        lines.append("losses match within floating-point tolerance")
    else:
        lines.append("losses DIFFER although the original was only wasteful")
    return lines
