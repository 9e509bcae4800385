"""Findings only traces can give: exposed communication, and collectives matched across ranks.

Pure functions of the ``Run``: no I/O, no printing.

- ``exposed-communication``: per window, collective time not overlapped with compute
  (``Window.exposed_comm_ns``) and its share of the window.
- ``collective-mismatch``: ranks of one process group must issue the same collectives in
  the same order. Collectives are matched per process group by order of issue within each
  window (profilers on all ranks cover the same windows).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from syncscope.model import Collective, Finding, Run, Severity, compress_ranks

EXPOSED_WARNING_SHARE = 0.10  # exposed communication above this share of a window warns
_SIZE_MUST_MATCH = frozenset({"all_reduce", "broadcast", "reduce_scatter", "all_gather"})


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


def _group_key(c: Collective) -> str:
    if c.group_ranks is not None:
        return ",".join(str(r) for r in c.group_ranks)
    return c.group_name or "default"


def _streams(run: Run) -> dict[str, dict[int, dict[tuple[int, int], Collective]]]:
    """group -> rank -> (window, position) -> collective."""
    out: dict[str, dict[int, dict[tuple[int, int], Collective]]] = defaultdict(dict)
    for r in run.ranks:
        counters: dict[tuple[str, int], int] = defaultdict(int)
        for w in r.windows:
            for c in w.collectives:
                key = _group_key(c)
                pos = counters[(key, w.index)]
                counters[(key, w.index)] += 1
                out[key].setdefault(r.rank, {})[(w.index, pos)] = c
    return out


def _describe(c: Collective | None) -> str:
    return "nothing" if c is None else f"{c.op} of {c.bytes} bytes ({c.phase})"


def collective_mismatch(run: Run) -> list[Finding]:
    findings: list[Finding] = []
    for group, by_rank in _streams(run).items():
        if len(by_rank) < 2:
            continue
        ranks = sorted(by_rank)
        ref = ranks[0]
        windows = {k[0] for r in ranks for k in by_rank[r]}
        common = set.intersection(*({k[0] for k in by_rank[r]} for r in ranks))
        for key in sorted(k for k in set().union(*by_rank.values()) if k[0] in common):
            base = by_rank[ref].get(key)
            odd = [r for r in ranks[1:] if not _same(base, by_rank[r].get(key))]
            if not odd:
                continue
            other = by_rank[odd[0]].get(key)
            findings.append(
                Finding(
                    kind="collective-mismatch",
                    severity="error",
                    cause=_mismatch_cause(base, other),
                    message=(
                        f"process group [{group}], window {key[0]}, collective #{key[1]}: "
                        f"rank {ref} issued {_describe(base)}, rank(s) "
                        f"{compress_ranks(odd)} issued {_describe(other)}; the job hangs or "
                        "reduces the wrong tensors"
                    ),
                    ranks=(ref, *odd),
                    windows=(key[0],),
                    evidence={
                        "group": group,
                        "window": key[0],
                        "position": key[1],
                        f"rank {ref}": _describe(base),
                        f"rank {odd[0]}": _describe(other),
                        "windows_compared": len(common),
                        "windows_seen": len(windows),
                    },
                )
            )
            break  # the first divergence per group; later ones follow from it
    return findings


def _same(a: Collective | None, b: Collective | None) -> bool:
    if a is None or b is None:
        return a is b
    if a.op != b.op:
        return False
    return a.op not in _SIZE_MUST_MATCH or a.bytes == b.bytes


def trace_findings(run: Run, hta: dict[str, Any] | None = None) -> list[Finding]:
    return exposed_communication(run, hta) + collective_mismatch(run)


def _mismatch_cause(base: Collective | None, other: Collective | None) -> str:
    """The same vocabulary as the live diagnosis: ``count``, ``op`` or ``size``."""
    if base is None or other is None:
        return "count"
    return "op" if base.op != other.op else "size"
