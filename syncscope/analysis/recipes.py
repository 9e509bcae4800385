"""What torch's own recipes do on purpose, said as what it is (info), never as a misuse.

- ``skipped-step``: ``GradScaler.step(optimizer)`` found inf/NaN gradients and did not call
  ``optimizer.step()`` (fp16 loss scaling calibrating, usual in an AMP run's first steps).
  Each such window is recorded as skipped (``Window.step_skipped``): it ends at the skipped
  step, so the ``zero_grad()`` after it is no reset mid-window and the next window does not
  take in its micro-batches. Many skips after the first windows mean gradients keep
  overflowing.

- ``local-sgd``: gradients reduced inside subgroups only, and the parameters averaged over a
  larger group every few steps (``post_localSGD_hook`` + ``PeriodicModelAverager``, read from
  the run by ``syncscope.model.replicas``): replicas differ across subgroups between
  averagings by design, so the gradients are compared inside each subgroup (a divergence
  there is still ``rank-divergence``).

Pure: ``Run -> list[Finding]``.
"""

from __future__ import annotations

import itertools

from syncscope.model import Finding, Fix, Run
from syncscope.model.replicas import local_sgd

SKIPPED_FIX = Fix(
    style="grad-scaler",
    summary=(
        "Nothing to fix while the scale calibrates: GradScaler halves it after each skipped "
        "step and grows it again after `growth_interval` good ones. Skips all through "
        "training mean the gradients overflow fp16 at any scale: look for a loss spike, or "
        "train in bfloat16, which needs no scaler."
    ),
    snippet=(
        "scaler.scale(loss).backward()\n"
        "scaler.step(optimizer)  # skipped when the unscaled gradients hold inf/NaN\n"
        "scaler.update()  # the scale shrinks after a skip\n"
        "optimizer.zero_grad()"
    ),
)


def skipped_steps(run: Run) -> list[Finding]:
    """One info finding for the windows whose optimizer step GradScaler skipped."""
    ranks: set[int] = set()
    windows: set[int] = set()
    site = None
    for rank in run.ranks:
        for window in rank.windows:
            if not window.complete:
                continue
            if window.step_skipped:
                ranks.add(rank.rank)
                windows.add(window.index)
                site = site or window.step_site
    if not windows:
        return []
    return [
        Finding(
            kind="skipped-step",
            severity="info",
            cause="grad-scaler-found-inf",
            message=(
                "GradScaler skipped optimizer.step(): inf/NaN in the scaled gradients, no "
                "update in these windows (grad-scaler-found-inf)"
            ),
            ranks=tuple(sorted(ranks)),
            windows=tuple(sorted(windows)),
            evidence={
                "skipped_windows": len(windows),
                "first_skipped_window": min(windows),
                "last_skipped_window": max(windows),
            },
            cost={"windows_affected": len(windows)},
            sites=(("step", site),) if site is not None else (),
            fix=SKIPPED_FIX,
        )
    ]


def _period(windows: tuple[int, ...]) -> int | None:
    """The steps between averagings, when they are evenly spaced."""
    gaps = {b - a for a, b in itertools.pairwise(windows)}
    return gaps.pop() if len(gaps) == 1 else None


def local_sgd_finding(run: Run) -> list[Finding]:
    """One info finding for a local-SGD run: reduction groups, averagings, their period."""
    local = local_sgd(run.ranks, run.world_size)
    if local is None:
        return []
    first = max(run.ranks, key=lambda r: len(r.windows))
    windows = tuple(sorted(first.windows[i].index for i in local.groups))
    groups = sorted({g for gs in local.groups.values() for g in gs})
    period = _period(local.averaging_windows)
    every = f"every {period} steps" if period else "in some steps"
    evidence: dict[str, object] = {
        "reduction_groups": [list(g) for g in groups][:16],
        "local_windows": len(windows),
        "first_local_window": windows[0],
        "averaging_windows": list(local.averaging_windows)[:32],
        "averaging_group_sizes": list(local.averaging_group_sizes),
    }
    if period:
        evidence["averaging_period"] = period
    return [
        Finding(
            kind="local-sgd",
            severity="info",
            cause="subgroup-reduction",
            message=(
                f"local SGD: gradients reduced inside {len(groups)} subgroups, parameters "
                f"averaged {every}; replicas compared inside each subgroup (subgroup-reduction)"
            ),
            ranks=tuple(sorted(r.rank for r in run.ranks)),
            windows=windows,
            evidence=evidence,
            cost={"windows_affected": len(windows)},
        )
    ]
