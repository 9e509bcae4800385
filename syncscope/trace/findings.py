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


# What two ranks' collectives at one position must agree on, and what a finding shows.
Signature = tuple[str, int, str]  # op, bytes, phase


def _streams(run: Run) -> dict[str, dict[int, dict[int, list[Signature]]]]:
    """group -> rank -> window -> signatures in issue order.

    Equal signatures are one shared tuple, so the streams of every rank cost a pointer per
    collective, not a Collective each.
    """
    out: dict[str, dict[int, dict[int, list[Signature]]]] = defaultdict(dict)
    shared: dict[Signature, Signature] = {}
    for r in run.ranks:
        for w in r.windows:
            for c in w.collectives:
                sig = (c.op, c.bytes, c.phase)
                by_window = out[_group_key(c)].setdefault(r.rank, {})
                by_window.setdefault(w.index, []).append(shared.setdefault(sig, sig))
    return out


def _describe(c: Signature | None) -> str:
    return "nothing" if c is None else f"{c[0]} of {c[1]} bytes ({c[2]})"


def _first_difference(
    by_rank: dict[int, dict[int, list[Signature]]], ranks: list[int], common: set[int]
) -> tuple[int, int, list[int]] | None:
    """(window, position, odd ranks) of the first position where a rank differs from the
    lowest rank, in windows every rank has."""
    ref = by_rank[ranks[0]]
    for window in sorted(common):
        longest = max(len(by_rank[r][window]) for r in ranks)
        for pos in range(longest):
            base = _at(ref[window], pos)
            odd = [r for r in ranks[1:] if not _same(base, _at(by_rank[r][window], pos))]
            if odd:
                return window, pos, odd
    return None


def _at(signatures: list[Signature], pos: int) -> Signature | None:
    return signatures[pos] if pos < len(signatures) else None


def collective_mismatch(run: Run) -> list[Finding]:
    findings: list[Finding] = []
    for group, by_rank in _streams(run).items():
        if len(by_rank) < 2:
            continue
        ranks = sorted(by_rank)
        ref = ranks[0]
        windows = set().union(*(by_rank[r].keys() for r in ranks))
        common = set.intersection(*(set(by_rank[r]) for r in ranks))
        found = _first_difference(by_rank, ranks, common)
        if found is None:
            continue
        window, pos, odd = found
        base = _at(by_rank[ref][window], pos)
        other = _at(by_rank[odd[0]][window], pos)
        findings.append(
            Finding(
                kind="collective-mismatch",
                severity="error",
                cause=_mismatch_cause(base, other),
                message=(
                    f"process group [{group}], window {window}, collective #{pos}: "
                    f"rank {ref} issued {_describe(base)}, rank(s) "
                    f"{compress_ranks(odd)} issued {_describe(other)}; the job hangs or "
                    "reduces the wrong tensors"
                ),
                ranks=(ref, *odd),
                windows=(window,),
                evidence={
                    "group": group,
                    "window": window,
                    "position": pos,
                    f"rank {ref}": _describe(base),
                    f"rank {odd[0]}": _describe(other),
                    "windows_compared": len(common),
                    "windows_seen": len(windows),
                },
            )
        )  # the first divergence per group; later ones follow from it
    return findings


def _same(a: Signature | None, b: Signature | None) -> bool:
    if a is None or b is None:
        return a is b
    if a[0] != b[0]:
        return False
    return a[0] not in _SIZE_MUST_MATCH or a[1] == b[1]


def trace_findings(run: Run, hta: dict[str, Any] | None = None) -> list[Finding]:
    return exposed_communication(run, hta) + collective_mismatch(run)


def _mismatch_cause(base: Signature | None, other: Signature | None) -> str:
    """The same vocabulary as the live diagnosis: ``count``, ``op`` or ``size``."""
    if base is None or other is None:
        return "count"
    return "op" if base[0] != other[0] else "size"
