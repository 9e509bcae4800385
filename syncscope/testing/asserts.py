"""``assert_syncs``: a readable AssertionError when grad syncs per window are not as expected."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from syncscope.track import Stats


def _as_list(value: int | Sequence[int], count: int) -> list[int]:
    return [value] * count if isinstance(value, int) else list(value)


def explain(stats: Stats, problems: list[str]) -> str:
    lines = ["syncscope: " + "; ".join(problems)]
    windows = [w for w in stats.windows if w["complete"]]
    for w in windows[:12]:
        n = w["micro_batches"]
        lines.append(
            f"  window {w['index']}: {n} micro-batches, {w['grad_syncs']} grad sync(s) "
            f"on micro-batch(es) {w['grad_sync_micro_batches'] or 'none'} "
            f"(expected 1, on micro-batch {n - 1})"
        )
    if len(windows) > 12:
        lines.append(f"  ... {len(windows) - 12} more windows")
    for f in stats.findings:
        lines.append(f"  finding: {f.severity} {f.kind} ({f.cause}): {f.message}")
        for role, site in f.sources:
            lines.append(f"    {role}: {site}")
        if f.fix is not None:
            lines.append(f"    fix: {f.fix.summary}")
            lines.extend("      " + line for line in f.fix.snippet.splitlines())
    return "\n".join(lines)


def check(
    stats: Stats,
    per_window: int | Sequence[int] | None = None,
    max_per_window: int | None = None,
    at_micro_batch: int | Sequence[int] | None = None,
) -> list[str]:
    """The broken expectations, as short sentences (empty when all hold)."""
    windows = [w for w in stats.windows if w["complete"]]
    seen = [w["grad_syncs"] for w in windows]
    problems: list[str] = []
    if not windows and (per_window is not None or at_micro_batch is not None):
        problems.append("no complete window (no optimizer step) was recorded")
    if per_window is not None:
        expected = _as_list(per_window, len(seen))
        if seen != expected:
            problems.append(f"expected grad syncs per window {expected}, saw {seen}")
    if max_per_window is not None:
        over = [i for i, s in enumerate(seen) if s > max_per_window]
        if over:
            problems.append(
                f"expected at most {max_per_window} grad sync(s) per window, saw {seen} "
                f"(windows {over})"
            )
    if at_micro_batch is not None:
        for w in windows:
            wanted = [at_micro_batch] if isinstance(at_micro_batch, int) else list(at_micro_batch)
            n = w["micro_batches"]
            resolved = sorted(p + n if p < 0 else p for p in wanted)
            if w["grad_sync_micro_batches"] != resolved:
                problems.append(
                    f"window {w['index']}: grad syncs on micro-batches "
                    f"{w['grad_sync_micro_batches']}, expected {resolved}"
                )
                break
    return problems


def assert_syncs(
    stats: Stats,
    per_window: int | Sequence[int] | None = None,
    max_per_window: int | None = None,
    at_micro_batch: int | Sequence[int] | None = None,
) -> None:
    """Raise AssertionError, with where the syncs landed and the fix, if expectations fail.

    ``per_window``: an int for every complete window, or the exact list.
    ``max_per_window``: an upper bound per window.
    ``at_micro_batch``: the 0-based micro-batch position(s) syncs must land on in every
    window; negative counts from the end (``-1`` is the last micro-batch).
    """
    problems = check(stats, per_window, max_per_window, at_micro_batch)
    if problems:
        raise AssertionError(explain(stats, problems))


__all__: list[Any] = ["assert_syncs", "check", "explain"]
