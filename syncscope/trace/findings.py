"""The finding only traces can give: exposed communication.

A pure function of the ``Run``: no I/O, no printing. ``exposed-communication``: per window,
collective time not overlapped with compute (``Window.exposed_comm_ns``) and its share of the
window. (Collectives matched across ranks, for traces too: ``syncscope.analysis.crossrank``.)
"""

from __future__ import annotations

from typing import Any

from syncscope.model import Finding, Run, Severity

EXPOSED_WARNING_SHARE = 0.10  # exposed communication above this share of a window warns


def _ms(ns: int) -> float:
    return round(ns / 1e6, 3)


def exposed_communication(run: Run, hta: dict[str, Any] | None = None) -> list[Finding]:
    rows: list[dict[str, Any]] = []
    for r in run.ranks:
        for w in r.windows:
            if not w.complete or w.exposed_comm_ns is None or not w.comm_ns:
                continue
            share = w.exposed_comm_ns / w.duration_ns if w.duration_ns else 0.0
            rows.append(
                {
                    "rank": r.rank,
                    "window": w.index,
                    "comm_ms": _ms(w.comm_ns),
                    "exposed_ms": _ms(w.exposed_comm_ns),
                    "compute_ms": _ms(w.compute_ns or 0),
                    "window_ms": _ms(w.duration_ns),
                    "share": round(share, 4),
                }
            )
    if not rows:
        return []
    mean_exposed = sum(row["exposed_ms"] for row in rows) / len(rows)
    mean_share = sum(row["share"] for row in rows) / len(rows)
    worst = max(rows, key=lambda row: row["share"])
    on_gpu = any(r.device != "cpu" for r in run.ranks)
    evidence: dict[str, Any] = {
        "measured_on": "GPU kernels" if on_gpu else "CPU ops",
        "windows_measured": len(rows),
        "mean_comm_ms": round(sum(row["comm_ms"] for row in rows) / len(rows), 3),
        "mean_exposed_ms": round(mean_exposed, 3),
        "worst_rank": worst["rank"],
        "worst_window": worst["window"],
        "worst_share": worst["share"],
    }
    if hta is not None:
        evidence["hta"] = hta
    severity: Severity = "warning" if mean_share >= EXPOSED_WARNING_SHARE else "info"
    ranks = tuple(sorted({row["rank"] for row in rows}))
    return [
        Finding(
            kind="exposed-communication",
            severity=severity,
            cause="not-overlapped",
            message=(
                f"{mean_exposed:.2f} ms of collective time per window is not overlapped with "
                f"compute ({100 * mean_share:.1f}% of the window; worst: rank {worst['rank']} "
                f"window {worst['window']}, {100 * worst['share']:.1f}%)"
            ),
            ranks=ranks,
            windows=tuple(sorted({row["window"] for row in rows})),
            evidence=evidence,
            cost={
                "exposed_ns_per_window": int(mean_exposed * 1e6),
                "exposed_share": round(mean_share, 4),
            },
        )
    ]
