"""Diagnoses that compare ranks: diverged gradients, mismatched collectives, hangs, failures.

Pure functions of the ``Run``, for live runs and traces alike."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from syncscope.analysis import reductions
from syncscope.analysis.advice import SNIPPETS
from syncscope.model import (
    Finding,
    RankRun,
    Run,
    SourceLocation,
    Window,
    compress_ranks,
    rank_failed,
)

# Ops whose byte count must agree across the members of a group.
SIZED_OPS = frozenset({"all_reduce", "broadcast", "reduce_scatter", "all_gather", "barrier"})


def rank_divergence(run: Run, findings: Sequence[Finding]) -> list[Finding]:
    tainted = {w.index for r in run.ranks for w in r.windows if w.records_dropped}
    windows = sorted(
        {
            w.index
            for r in run.ranks
            for w in r.windows
            if w.fingerprint_match is False and w.index not in tainted
        }
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
            sites=missing[0].sites if missing else (),
            fix=missing[0].fix if missing else None,
        )
    ]


# What the members of a group must agree on at one position: (op, bytes).
Entry = tuple[str, int]
# A group: its name (the process group's identity: two groups of the same members, the
# default group and a ``new_group([0, 1])`` of a 2-rank job, are two streams) with its global
# ranks when known, else its name alone (traces without record_param_comms name none: their
# collectives form one group, "default").
GroupKey = tuple[str, tuple[int, ...]] | str


def _describe(entry: Entry | None) -> str:
    if entry is None:
        return "nothing (sequence ended)"
    op, nbytes = entry
    return f"{op} of {nbytes} bytes"


def _agreed(entry: Entry | None) -> tuple[str, int] | None:
    """What must be equal across members: the op, and its bytes for SIZED_OPS."""
    return None if entry is None else (entry[0], entry[1] if entry[0] in SIZED_OPS else 0)


def _streams(run: Run, per_window: bool) -> dict[GroupKey, dict[int, dict[int, list[Entry]]]]:
    """group -> rank -> segment -> entries in issue order; a segment is a window's index
    (``per_window``) or 0, the whole run. Point-to-point and unknown ops are left out: ranks
    legitimately differ there. Equal entries are one shared tuple (a pointer a collective).

    A trace that names no process group (old-style ``record_param_comms``) lumps every group
    into one stream, where collectives of different groups (pipelined all-to-alls beside the
    gradient all-reduces) interleave differently on each rank without any fault: there each
    op is its own stream, and only the order within an op is compared."""
    out: dict[GroupKey, dict[int, dict[int, list[Entry]]]] = defaultdict(dict)
    shared: dict[Entry, Entry] = {}
    # a group's rank tuple is hashed once per distinct object, not once per collective (a
    # tuple does not keep its hash: at 16k ranks each hash reads 16k entries); readers share
    # one tuple per group, so this is one hash per group
    by_id: dict[tuple[str, int], dict[int, dict[int, list[Entry]]]] = {}
    # a rank's record with a line dropped is incomplete from that window on: every rank's
    # sequence is compared up to the first such window only (a dropped collective is no
    # mismatch)
    cut = min((w.index for r in run.ranks for w in r.windows if w.records_dropped), default=None)
    for r in run.ranks:
        for w in r.windows:
            if cut is not None and w.index >= cut:
                break
            segment = w.index if per_window else 0
            for c in w.collectives:
                if c.op in ("send", "recv", "other"):
                    continue
                ranks = c.group_ranks
                ident = (c.group_name, id(ranks))
                members = by_id.get(ident) if ranks is not None else None
                if members is None:
                    key: GroupKey = (
                        (c.group_name, ranks)
                        if ranks is not None
                        else c.group_name or _unnamed(c.op, per_window)
                    )
                    members = out[key]
                    if ranks is not None:
                        by_id[ident] = members
                entry = (c.op, c.bytes)
                by_segment = members.setdefault(r.rank, {})
                by_segment.setdefault(segment, []).append(shared.setdefault(entry, entry))
    return out


def _unnamed(op: str, per_window: bool) -> str:
    """The stream of a collective whose group is not recorded: one per op in traces."""
    return f"{op}s of unnamed groups" if per_window else "default"


def _first_difference(
    seqs: dict[int, list[Entry]], stopped: set[int]
) -> tuple[int, dict[int, Entry | None]] | None:
    """(position, what each member issued there) where members first differ.

    A member that stopped (crashed, killed) and whose sequence ended is left out from there:
    its truncated tail is the run-failed finding's business, not a mismatch.
    """
    longest = max((len(s) for s in seqs.values()), default=0)
    for i in range(longest):
        at = {
            m: (s[i] if i < len(s) else None)
            for m, s in seqs.items()
            if i < len(s) or m not in stopped
        }
        if len(at) >= 2 and len({_agreed(e) for e in at.values()}) > 1:
            return i, at
    return None


@dataclass(frozen=True)
class _Mismatch:
    group: str  # shown: compressed ranks ("0-1") or the group's name
    window: int | None  # None: matched over the whole run
    position: int
    at: dict[int, Entry | None]
    seqs: dict[int, list[Entry]]
    members: tuple[int, ...]  # the group's ranks in the run
    sites: dict[int, SourceLocation] = field(default_factory=dict)  # each rank's call there


def _sites_at(run: Run, key: GroupKey, position: int, ranks: list[int]) -> dict[int, Any]:
    """The call site of the ``position``-th collective of group ``key`` (as ``_streams``
    counts it over a live run) on each of ``ranks``, where the rank recorded one."""
    found: dict[int, Any] = {}
    by_rank = {r.rank: r for r in run.ranks}
    for rank in ranks:
        count = 0
        run_of = by_rank.get(rank)
        collectives = (c for w in run_of.windows for c in w.collectives) if run_of else ()
        for c in collectives:
            if c.op in ("send", "recv", "other") or _key_of(c) != key:
                continue
            if count == position:
                if c.site is not None:
                    found[rank] = c.site
                break
            count += 1
    return found


def _short(site: SourceLocation) -> str:
    return f"{site.file.replace(chr(92), '/').rsplit('/', 1)[-1]}:{site.line}"


def _key_of(c: Any) -> GroupKey:
    ranks = c.group_ranks
    return (c.group_name, ranks) if ranks is not None else c.group_name or "default"


EVIDENCE_RANKS = 16  # rows of a mismatch's evidence, beyond the ranks that differ


def _evidence_ranks(ref: int, odd: list[int], at: dict[int, Entry | None]) -> list[int]:
    """The ranks a mismatch's evidence lists, in rank order: the reference, every rank that
    differs from it (up to ``EVIDENCE_RANKS``), then agreeing ranks up to that many rows."""
    chosen = {ref, *odd[: EVIDENCE_RANKS - 1]}
    for r in sorted(at):
        if len(chosen) >= EVIDENCE_RANKS:
            break
        chosen.add(r)
    return sorted(chosen)


def _mismatch_finding(m: _Mismatch, windows_compared: int) -> Finding:
    ref = min(m.at)
    odd = [r for r in sorted(m.at) if _agreed(m.at[r]) != _agreed(m.at[ref])]
    entries = list(m.at.values())
    if any(e is None for e in entries):
        cause = "count"
    elif len({e[0] for e in entries if e}) > 1:
        cause = "op"
    else:
        cause = "size"
    where = f" in window {m.window}" if m.window is not None else ""
    evidence: dict[str, object] = {"group": m.group}
    if m.window is not None:
        evidence["window"] = m.window
    evidence["collective"] = m.position + 1  # counted from 1, as the hang and the recorder
    shown = _evidence_ranks(ref, odd, m.at)
    # the file's name and line (the sources hold the whole path, shown as the terminal does)
    at = {r: f" at {_short(m.sites[r])}" if r in m.sites else "" for r in m.at}
    evidence["per_rank"] = {str(r): _describe(m.at[r]) + at[r] for r in shown}
    evidence["counts"] = {str(r): len(m.seqs[r]) for r in shown if r in m.seqs}
    if m.window is not None:
        evidence["windows_compared"] = windows_compared
    return Finding(
        kind="collective-mismatch",
        severity="error",
        cause=cause,
        message=f"ranks issued different collectives on group [{m.group}]{where} at collective "
        f"#{m.position + 1}: rank {ref} issued {_describe(m.at[ref])}{at[ref]}, rank(s) "
        f"{compress_ranks(odd)} issued {_describe(m.at[odd[0]])}{at[odd[0]]}; the precursor "
        "of a hang",
        # a live run names every member (all of them hang); a trace, which sees a span of
        # the job, the lowest member and those that differ from it
        ranks=m.members if m.window is None else (ref, *odd),
        windows=() if m.window is None else (m.window,),
        evidence=evidence,
        cost={},
        sites=tuple((f"rank {r}", m.sites[r]) for r in (ref, *odd[:1]) if r in m.sites),
        fix=SNIPPETS["same-sequence"],
    )


def collective_mismatch(run: Run) -> list[Finding]:
    """Members of a process group must issue the same collectives in the same order.

    Live runs are matched over the whole run (capture sees every collective from the
    start). Traces are matched window by window, over the windows in which every member
    issued on the group: a profiler covers a span of the job, not all of it, so the
    first and last windows it saw may be cut at different collectives on different ranks.
    The first divergence of each group is reported; later ones follow from it.
    """
    per_window = run.meta.source == "trace"
    present = {r.rank for r in run.ranks}
    # In a hang every rank is stopped by the launcher and the mismatch is the cause: keep it.
    stopped = set() if run.meta.hung else {r.rank for r in run.ranks if rank_failed(r)}
    findings: list[Finding] = []
    streams = _streams(run, per_window)
    shared = _shared_members(streams)
    for key, by_rank in streams.items():
        if isinstance(key, tuple) and not per_window:
            members = [m for m in key[1] if m in present]  # one that issued nothing: "count"
        else:
            members = sorted(by_rank)
        if len(members) < 2:
            continue
        segments = [0]
        if per_window:
            segments = sorted(set.intersection(*(set(by_rank[m]) for m in members)))
        group = key if isinstance(key, str) else compress_ranks(key[1])
        if isinstance(key, tuple) and key[1] in shared:  # say which of those groups
            group += f" (process group {key[0] or '?'})"
        for segment in segments:
            seqs = {m: by_rank.get(m, {}).get(segment, []) for m in members}
            found = _first_difference(seqs, stopped)
            if found is not None:
                window = segment if per_window else None
                ref = min(found[1])
                odd = [
                    r for r in sorted(found[1]) if _agreed(found[1][r]) != _agreed(found[1][ref])
                ]
                sites = {} if per_window else _sites_at(run, key, found[0], [ref, *odd[:1]])
                mismatch = _Mismatch(group, window, found[0], found[1], seqs, tuple(members), sites)
                findings.append(_mismatch_finding(mismatch, len(segments)))
                break
    return findings


def _shared_members(streams: dict[GroupKey, Any]) -> set[tuple[int, ...]]:
    """Member lists that more than one process group has."""
    seen = Counter(key[1] for key in streams if isinstance(key, tuple))
    return {ranks for ranks, n in seen.items() if n > 1}


def _window_words(r: RankRun) -> tuple[Window | None, int]:
    """The window the rank was in when it stopped (None: between windows) and its index."""
    if r.windows and not r.windows[-1].complete:
        return r.windows[-1], r.windows[-1].index
    return None, (r.windows[-1].index + 1 if r.windows else 0)


def last_seen(r: RankRun) -> str:
    """Where the rank was when it stopped, in the report's terms (0-based, as elsewhere)."""
    window, index = _window_words(r)
    done = len(window.micro_batches) if window is not None else 0
    if r.in_progress in ("forward", "backward"):
        where = f"in {r.in_progress} of micro-batch {done} of window {index}"
    elif r.in_progress == "optimizer.step":
        where = f"in optimizer.step() of window {index}"
    elif done:
        where = f"after micro-batch {done - 1} of window {index}, before its optimizer step"
    elif r.windows and index > 0:
        where = f"after the optimizer step of window {index - 1}"
    elif r.windows:
        where = "before the first micro-batch of window 0"
    else:
        where = "before the first micro-batch"
    if r.pending:
        p = r.pending[-1]
        where += f", blocked in {p.op} #{p.seq + 1}"
    return where


def _how(r: RankRun) -> str:
    if not r.finished:
        return "no exit record (killed with SIGKILL, crashed hard or lost)"
    if r.exit_status is None:
        return f"exit status unknown ({r.exit_reason or 'no reason recorded'})"
    reason = r.exit_reason if r.exit_reason not in ("", "finished", "exit") else ""
    return f"exit status {r.exit_status}" + (f": {reason}" if reason else "")


def _stopped_by_others(r: RankRun) -> bool:
    """Killed by the launcher (SIGTERM/SIGINT/SIGHUP) because another rank failed first."""
    launcher_signals = (129, 130, 143)  # 128 + SIGHUP, SIGINT, SIGTERM
    return (
        r.finished
        and r.exit_reason.startswith("killed by signal")
        and r.exit_status in launcher_signals
    )


PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "Broken pipe")


def _left_early(run: Run, first: RankRun) -> list[int]:
    """Ranks that ended their script normally before ``first`` failed on a broken connection
    to a peer (gloo's "Connection closed by peer"): the peers it waited for had left."""
    if not any(text in first.exit_reason for text in PEER_GONE):
        return []
    return [
        r.rank
        for r in run.ranks
        if r is not first
        and r.finished
        and r.exit_status == 0
        and r.last_event_ns <= (first.last_event_ns or 0)
    ]


# torch's own errors where a release cannot run a feature on CPU ranks (gloo): the job failed
# in torch; the run-failed message says so (docs/torch-versions.md)
RELEASE_LIMITS = (
    (
        "'Stream' object has no attribute 'record_event'",
        "torch 2.6 cannot run FSDP2 (fully_shard) on CPU ranks (its CPU stream has no "
        "record_event): use torch 2.7 or newer, or CUDA ranks",
    ),
    (
        "Cannot use ReduceOp.AVG with Gloo",
        "gloo has no ReduceOp.AVG before torch 2.8 (HSDP's replicate all-reduce uses it, as "
        "may a hand all-reduce): use torch 2.8 or newer, or ReduceOp.SUM then a division",
    ),
)


def run_failed(run: Run) -> list[Finding]:
    """The script did not end normally on some rank: the run failed, whatever was measured.

    A hang has its own finding (the launcher killed every rank), so it is not repeated here.
    A process that dies after every rank wrote a normal exit record lost nothing and is not a
    failure of the run (``syncscope profile`` warns about it).
    """
    if run.meta.hung:
        return []
    failed = [r for r in run.ranks if rank_failed(r)]
    if not failed:
        return []
    own = [r for r in failed if not _stopped_by_others(r)] or failed
    first = min(own, key=lambda r: (r.last_event_ns or 0, r.rank))
    # what was still measured (complete windows on how many ranks) is the evidence here and
    # said once by each summary (the verdict line, the page's banner), not in this message
    low = min(sum(1 for w in r.windows if w.complete) for r in run.ranks)
    others = [r.rank for r in failed if r not in own]
    if len(own) == 1:
        message = f"the run failed: rank {first.rank} stopped ({_how(first)}) {last_seen(first)}"
    else:
        message = (
            f"the run failed on ranks {compress_ranks([r.rank for r in own])}: rank "
            f"{first.rank} first ({_how(first)}) {last_seen(first)}"
        )
    if others:
        message += f"; rank(s) {compress_ranks(others)} were then stopped by the launcher"
    left = _left_early(run, first)
    if left:
        message += (
            f"; rank(s) {compress_ranks(left)} had ended the script (exit status 0) while it "
            "still waited for them in a collective: they left early"
        )
    per_rank = {
        str(r.rank): f"{_how(r)}; last seen {last_seen(r)}"
        for r in sorted(failed, key=lambda r: r.rank)[:16]
    }
    cause = (
        "no-exit-record"
        if not first.finished
        else "signal"
        if first.exit_reason.startswith("killed by signal")
        else "exit-status"
    )
    fix = None
    if left:
        cause, fix = "left-early", SNIPPETS["same-sequence"]
    if reductions.static_graph_failure(first):
        cause, fix = reductions.STATIC_FAILED_CAUSE, reductions.SNIPPETS["static-graph"]
        message += (
            "; DDP(static_graph=True) failed on a backward under no_sync(): its first "
            "backward must sync"
        )
    message += "".join(f"; {why}" for error, why in RELEASE_LIMITS if error in first.exit_reason)
    return [
        Finding(
            kind="run-failed",
            severity="error",
            cause=cause,
            message=message,
            ranks=tuple(left) or tuple(r.rank for r in own),
            windows=(),
            evidence={
                **({"left_early": left} if left else {}),
                "first_failed_rank": first.rank,
                "exit_status": first.exit_status if first.finished else None,
                "exit_reason": first.exit_reason,
                "last_seen": last_seen(first),
                "complete_windows": low,
                "ranks_captured": len(run.ranks),
                "per_rank": per_rank,
            },
            cost={},
            fix=fix,
        )
    ]
