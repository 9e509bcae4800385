"""The finding only traces can give: exposed communication.

A pure function of the ``Run``: no I/O, no printing. ``exposed-communication``: per window,
collective time not overlapped with compute (``Window.exposed_comm_ns``) and its share of the
window. (Collectives matched across ranks, for traces too: ``syncscope.analysis.crossrank``.)
"""

from __future__ import annotations

from typing import Any

from syncscope.model import Finding, Run, Severity, figures
from syncscope.text import human_ns

EXPOSED_WARNING_SHARE = 0.10  # exposed communication above this share of a window warns


def exposed_communication(run: Run, hta: dict[str, Any] | None = None) -> list[Finding]:
    """Exposed communication over the steady traced windows (syncscope.model.figures): medians of
    exposed, communication and window time, exposed <= communication in every window, and the
    share computed from the figures shown."""
    steady = figures.steady_windows(run)
    rows: list[dict[str, Any]] = []
    for rank, w in figures.traced_windows(run, steady):
        mine = figures.exposed_ns(w) or 0
        rows.append(
            {
                "rank": rank,
                "window": w.index,
                "comm_ns": figures.comm_ns(w),
                "exposed_ns": mine,
                "window_ns": w.duration_ns,
                "share": round(mine / w.duration_ns, 4) if w.duration_ns else 0.0,
            }
        )
    if not rows:
        return []
    exposed = figures.median(row["exposed_ns"] for row in rows)
    comm = figures.median(row["comm_ns"] for row in rows)
    window = figures.median(row["window_ns"] for row in rows)
    share = figures.exposed_share(run, steady) or 0.0  # exposed / window, as shown
    worst = max(rows, key=lambda row: row["share"])
    on_gpu = any(r.device != "cpu" for r in run.ranks)
    evidence: dict[str, Any] = {
        "measured_on": "GPU kernels" if on_gpu else "CPU ops",
        "windows_measured": len(rows),  # the medians over them are the cost's figures
        "worst_rank": worst["rank"],
        "worst_window": worst["window"],
        "worst_share": worst["share"],
    }
    if hta is not None:
        evidence["hta"] = hta
    severity: Severity = "warning" if share >= EXPOSED_WARNING_SHARE else "info"
    return [
        Finding(
            kind="exposed-communication",
            severity=severity,
            cause="not-overlapped",
            message=(
                f"{human_ns(exposed)} of the {human_ns(comm)} of communication per window is "
                f"not overlapped with compute ({100 * share:.1f}% of the {human_ns(window)} "
                f"window; worst: rank {worst['rank']} window {worst['window']}, "
                f"{100 * worst['share']:.1f}%)"
            ),
            ranks=tuple(sorted({row["rank"] for row in rows})),
            windows=tuple(sorted({row["window"] for row in rows})),
            evidence=evidence,
            cost={
                "exposed_ns_per_window": int(exposed),
                "comm_ns_per_window": int(comm),
                "window_ns": int(window),
                "exposed_share": round(share, 4),
            },
        )
    ]
