"""Diagnoses that compare ranks: diverged gradients, mismatched collectives, hangs."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from syncscope.analysis.advice import SNIPPETS
from syncscope.model import Finding, PendingCollective, Run, compress_ranks

# Ops whose byte count must agree across the members of a group.
SIZED_OPS = frozenset({"all_reduce", "broadcast", "reduce_scatter", "all_gather", "barrier"})


def rank_divergence(run: Run, findings: Sequence[Finding]) -> list[Finding]:
    windows = sorted(
        {w.index for r in run.ranks for w in r.windows if w.fingerprint_match is False}
    )
    if not windows:
        return []
    missing = [f for f in findings if f.kind == "missing-sync"]
    cause = "missing-sync" if missing else "unknown"
    first = windows[0]
    values = {
        r.rank: list(r.windows[first].fingerprint or ())
        for r in run.ranks[:8]
        if first < len(r.windows)
    }
    return [
        Finding(
            kind="rank-divergence",
            severity="error",
            cause=cause,
            message="gradient fingerprints differ across ranks at optimizer.step(): "
            "ranks are training different models",
            ranks=tuple(r.rank for r in run.ranks),
            windows=tuple(windows),
            evidence={"first_window": first, "fingerprints": values},
            cost={"windows_affected": len(windows)},
            sources=missing[0].sources if missing else (),
            fix=missing[0].fix if missing else None,
        )
    ]


def _describe(entry: tuple[str, int, tuple[int, ...] | None] | None) -> str:
    if entry is None:
        return "nothing (sequence ended)"
    op, nbytes, _ = entry
    return f"{op} of {nbytes} bytes"


def collective_mismatch(run: Run) -> list[Finding]:
    """Members of a process group must issue the same collectives in the same order."""
    by_group: dict[tuple[int, ...], dict[int, list[tuple[str, int, tuple[int, ...] | None]]]] = (
        defaultdict(dict)
    )
    present = {r.rank for r in run.ranks}
    for r in run.ranks:
        for entry in r.collective_sequence:
            group = entry[2]
            if group is None or entry[0] in ("send", "recv", "other"):
                continue
            by_group[group].setdefault(r.rank, []).append(entry)
    findings: list[Finding] = []
    for group, sequences in by_group.items():
        members = [m for m in group if m in present]
        if len(members) < 2:
            continue
        seqs = {m: sequences.get(m, []) for m in members}
        longest = max(len(s) for s in seqs.values())
        for i in range(longest):
            at = {m: (s[i] if i < len(s) else None) for m, s in seqs.items()}
            kinds = {(e[0], e[1] if e[0] in SIZED_OPS else 0) if e else None for e in at.values()}
            if len(kinds) == 1:
                continue
            if any(e is None for e in at.values()):
                cause = "count"
            elif len({e[0] for e in at.values() if e}) > 1:
                cause = "op"
            else:
                cause = "size"
            shown = dict(list(at.items())[:16])
            findings.append(
                Finding(
                    kind="collective-mismatch",
                    severity="error",
                    cause=cause,
                    message=f"ranks issued different collectives on group "
                    f"[{compress_ranks(group)}] at position {i}: the precursor of a hang",
                    ranks=tuple(members),
                    windows=(),
                    evidence={
                        "group": compress_ranks(group),
                        "position": i,
                        "per_rank": {str(m): _describe(e) for m, e in shown.items()},
                        "counts": {str(m): len(s) for m, s in list(seqs.items())[:16]},
                    },
                    cost={},
                    fix=SNIPPETS["same-sequence"],
                )
            )
            break
    return findings


def _pending_text(p: PendingCollective | None) -> str:
    if p is None:
        return "none"
    return (
        f"{p.op} #{p.seq} ({p.bytes} bytes) in window {p.window}, "
        f"micro-batch {p.micro_batch}, {p.phase}"
    )


def hang(run: Run) -> list[Finding]:
    if not run.meta.hung:
        return []
    per_rank = {}
    for r in run.ranks:
        blocked = r.pending[-1] if r.pending else None
        per_rank[str(r.rank)] = {
            "last_completed": _pending_text(r.last_completed),
            "blocked_in": _pending_text(blocked)
            if blocked
            else ("exited" if r.finished else "no collective in flight"),
        }
    return [
        Finding(
            kind="hang",
            severity="error",
            cause="no-progress",
            message=f"no progress for {run.meta.hang_timeout_s:g} s: syncscope stopped the job",
            ranks=tuple(r.rank for r in run.ranks),
            windows=(),
            evidence={"per_rank": per_rank},
            cost={"hang_timeout_s": run.meta.hang_timeout_s or 0},
            fix=SNIPPETS["same-sequence"],
        )
    ]
