"""``assert_syncs``: a readable AssertionError when grad syncs per window are not as expected.

The message says what was expected and what happened in every window, where the syncs
landed (0-based micro-batch positions), and the diagnoses of the run with their fixes::

    syncscope: gradient syncs are not as expected
      expected grad syncs per window [1, 1], saw [4, 4]
      window 0: grad syncs on micro-batches [0, 1, 2, 3], expected [3]
    windows (rank 0):
      window 0: 4 micro-batches, 4 grad syncs on micro-batches [0, 1, 2, 3]; expected 1 on [3]
      ...
    finding: warning redundant-sync (no-no_sync): ...
      fix: Put forward and backward inside no_sync() ...
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from syncscope.model import FAILED_KINDS
from syncscope.render.summary import plain_text

if TYPE_CHECKING:
    from syncscope.testing.track import Stats

MAX_WINDOWS_SHOWN = 12


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def validate(
    per_window: int | Sequence[int] | None,
    max_per_window: int | None,
    at_micro_batch: int | Sequence[int] | None,
) -> None:
    """Raise TypeError/ValueError for expectations that cannot be checked."""
    for name, value in (("per_window", per_window), ("at_micro_batch", at_micro_batch)):
        if value is None or _is_int(value):
            continue
        if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
            raise TypeError(f"{name} must be an int or a sequence of ints, not {value!r}")
        if not all(_is_int(v) for v in value):
            raise TypeError(f"{name} must be an int or a sequence of ints, not {value!r}")
    if max_per_window is not None and not _is_int(max_per_window):
        raise TypeError(f"max_per_window must be an int, not {max_per_window!r}")
    counts: list[int] = []
    if isinstance(per_window, int):
        counts.append(per_window)
    elif per_window is not None:
        counts.extend(per_window)
    if max_per_window is not None:
        counts.append(max_per_window)
    if any(c < 0 for c in counts):
        raise ValueError("grad sync counts cannot be negative")


def _positions(at_micro_batch: int | Sequence[int], micro_batches: int) -> list[int]:
    wanted = [at_micro_batch] if isinstance(at_micro_batch, int) else list(at_micro_batch)
    return sorted({p + micro_batches if p < 0 else p for p in wanted})


def _expected_count(per_window: int | Sequence[int] | None, i: int) -> int | None:
    if per_window is None:
        return None
    if isinstance(per_window, int):
        return per_window
    return per_window[i] if i < len(per_window) else None


def check(
    stats: Stats,
    per_window: int | Sequence[int] | None = None,
    max_per_window: int | None = None,
    at_micro_batch: int | Sequence[int] | None = None,
    allow_errors: bool = False,
) -> list[str]:
    """The broken expectations, as short sentences (empty when all hold).

    A run with an error finding (verdict ``errors``, e.g. ``grad-reset-mid-window``) fails
    too, whatever its counts, unless ``allow_errors``: right counts do not make it correct.

    Any expectation needs at least one complete window (an optimizer step): a block that
    recorded none fails instead of passing vacuously (the training ran in another process,
    or never stepped). A run that failed (a rank crashed, was killed or hung) fails every
    expectation, with the failure as the reason.
    """
    validate(per_window, max_per_window, at_micro_batch)
    if per_window is None and max_per_window is None and at_micro_batch is None:
        return []
    failures = [f for f in stats.findings if f.kind in FAILED_KINDS]
    if failures:
        # counts from a run that stopped early prove nothing: fail, naming the failure
        return [f"{f.message} ({f.kind})" for f in failures]
    windows = [w for w in stats.windows if w["complete"]]
    if not windows:
        return [
            "no complete window was recorded (no optimizer.step() inside the tracked block, "
            "or the training ran in another process)"
        ]
    seen = [w["grad_syncs"] for w in windows]
    problems: list[str] = []
    if not allow_errors:
        problems.extend(
            f"error finding {f.kind}: {plain_text(f.message)} (allow_errors=True to accept it)"
            for f in stats.findings
            if f.severity == "error"
        )
    if per_window is not None:
        expected = [per_window] * len(seen) if isinstance(per_window, int) else list(per_window)
        if seen != expected:
            problems.append(f"expected grad syncs per window {expected}, saw {seen}")
    if max_per_window is not None:
        over = [w["index"] for w in windows if w["grad_syncs"] > max_per_window]
        if over:
            problems.append(
                f"expected at most {max_per_window} grad sync(s) per window, saw {seen} "
                f"(over the limit: window(s) {over})"
            )
    if at_micro_batch is not None:
        for w in windows:
            n = w["micro_batches"]
            resolved = _positions(at_micro_batch, n)
            outside = [p for p in resolved if not 0 <= p < n]
            if outside:
                problems.append(
                    f"window {w['index']} has {n} micro-batch(es) (0..{n - 1}, or -{n}..-1): "
                    f"at_micro_batch={at_micro_batch!r} names none of them"
                )
                break
            if w["grad_sync_micro_batches"] != resolved:
                problems.append(
                    f"window {w['index']}: grad syncs on micro-batches "
                    f"{w['grad_sync_micro_batches']}, expected {resolved}"
                )
                break
    return problems


def _window_line(
    i: int,
    w: dict[str, Any],
    per_window: int | Sequence[int] | None,
    max_per_window: int | None,
    at_micro_batch: int | Sequence[int] | None,
) -> str:
    n = w["micro_batches"]
    line = (
        f"  window {w['index']}: {n} micro-batch{'es' if n != 1 else ''}, "
        f"{w['grad_syncs']} grad sync{'s' if w['grad_syncs'] != 1 else ''} on micro-batches "
        f"{w['grad_sync_micro_batches']}"
    )
    wanted: list[str] = []
    count = _expected_count(per_window, i)
    if count is not None:
        wanted.append(str(count))
    if max_per_window is not None:
        wanted.append(f"at most {max_per_window}")
    if at_micro_batch is not None:
        wanted.append(f"on {_positions(at_micro_batch, n)}")
    if wanted:
        line += "; expected " + " ".join(wanted)
    return line


def explain(
    stats: Stats,
    problems: list[str],
    per_window: int | Sequence[int] | None = None,
    max_per_window: int | None = None,
    at_micro_batch: int | Sequence[int] | None = None,
) -> str:
    """The full failure message: problems, every window (expected vs actual), findings."""
    failed = any(f.kind in FAILED_KINDS for f in stats.findings)
    lines = [
        "syncscope: the run failed, so its gradient syncs prove nothing"
        if failed
        else "syncscope: gradient syncs are not as expected"
    ]
    lines.extend(f"  {p}" for p in problems)
    windows = [w for w in stats.windows if w["complete"]]
    if windows:
        lines.append(f"windows (rank {stats.rank}, micro-batches counted from 0):")
        for i, w in enumerate(windows[:MAX_WINDOWS_SHOWN]):
            lines.append(_window_line(i, w, per_window, max_per_window, at_micro_batch))
        if len(windows) > MAX_WINDOWS_SHOWN:
            lines.append(f"  ... {len(windows) - MAX_WINDOWS_SHOWN} more windows")
    for f in stats.findings:
        lines.append(f"finding: {f.severity} {f.kind} ({f.cause}): {f.message}")
        for role, site in f.sites:
            lines.append(f"  {role}: {site}")
        if f.fix is not None:
            lines.append(f"  fix: {plain_text(f.fix.summary)}")
            lines.extend(("    " + line).rstrip() for line in f.fix.snippet.splitlines())
    return "\n".join(lines)


def assert_syncs(
    stats: Stats,
    per_window: int | Sequence[int] | None = None,
    max_per_window: int | None = None,
    at_micro_batch: int | Sequence[int] | None = None,
    allow_errors: bool = False,
) -> None:
    """Raise AssertionError, with where the syncs landed and the fix, if expectations fail.

    ``per_window``: an int for every complete window, or the exact list.
    ``max_per_window``: an upper bound per window.
    ``at_micro_batch``: the 0-based micro-batch position(s) syncs must land on in every
    window; negative counts from the end (``-1`` is the last micro-batch).
    ``allow_errors``: pass a run with error findings (verdict ``errors``) when its counts
    hold; by default an error finding fails the assertion.

    Only complete windows (ended by an optimizer step) are checked, and at least one is
    required. Bad arguments raise TypeError or ValueError, not AssertionError.
    """
    __tracebackhide__ = True  # pytest shows the caller's line, not this helper's body
    from syncscope.testing.track import Stats

    if not isinstance(stats, Stats):
        raise TypeError(
            f"assert_syncs needs the stats of a track() block (with track() as stats: ...), "
            f"not {type(stats).__name__}"
        )
    if per_window is None and max_per_window is None and at_micro_batch is None:
        raise TypeError(
            "assert_syncs needs an expectation: per_window=, max_per_window= or at_micro_batch="
        )
    problems = check(stats, per_window, max_per_window, at_micro_batch, allow_errors)
    if problems:
        raise AssertionError(explain(stats, problems, per_window, max_per_window, at_micro_batch))


__all__ = ["assert_syncs", "check", "explain", "validate"]
