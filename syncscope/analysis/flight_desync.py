"""Flight Recorder dumps aligned: ranks per process group on collective sequence numbers,
the first desync and where each rank stood, as a finding (``desync_finding``).

Alignment is torch's own: within a process group every member numbers its collectives 1,
2, ... (``collective_seq_id``), so entry ``s`` of every member is the same collective,
whatever else each rank did. The first sequence number where members differ is the desync:

- ``collective-mismatch``: members issued different ops, sizes or dtypes at ``s`` (cause
  ``op``, ``size``, ``dtype``); the culprits are the ranks outside the largest agreeing set
  (with two ranks, the one that is not the lowest, as torch's analyzer names it). Cause
  ``skipped``: sizes agree but a rank's calls come from the *next* line the others called
  from, from ``s`` on, and it ends one collective short: it skipped the one at ``s``.
- ``hang``: some members issued ``s`` and others never did (cause ``missing-rank``: the
  culprits never issued it, the others wait in it); where the backend records states (NCCL),
  a trailing collective no member completed: every member started it
  (``stuck-in-collective``), or some only scheduled it (``not-started``: the culprits).

The work is linear in the entries whatever their sequence numbers (one entry numbered 10**12
is one step).

Point-to-point ops are listed, not matched.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from syncscope.analysis.advice import SNIPPETS
from syncscope.model import Finding, SourceLocation, compress_ranks
from syncscope.model.flight import FlightDump, FlightEntry, Frame

EVIDENCE_ROWS = 16  # distinct per-rank descriptions shown (ranks with equal ones merged)
STACK_FRAMES = 12
_LIBRARY = ("/torch/", "/site-packages/", "/dist-packages/", "<frozen ", "/lib/python3")
# syncscope's own frames (capture's kernel, attach running the script) are not the user's
_OWN = str(Path(__file__).resolve().parents[1]) + "/"

GroupKey = tuple[str, tuple[int, ...]]  # (group name, member ranks)


def user_frames(frames: Sequence[Frame]) -> list[Frame]:
    return [
        f
        for f in frames
        if f.file and not f.file.startswith(_OWN) and not any(k in f.file for k in _LIBRARY)
    ]


def user_site(entry: FlightEntry) -> SourceLocation | None:
    frames = user_frames(entry.frames)
    return SourceLocation(frames[0].file, frames[0].line, frames[0].name) if frames else None


def _short(frame: Frame) -> str:
    """A frame, library paths from their package on (``torch/autograd/graph.py:979``)."""
    file = frame.file
    for mark in ("/site-packages/", "/dist-packages/"):
        if mark in file:
            file = file.split(mark, 1)[1]
    return f"{file}:{frame.line} in {frame.name}"


def _stack(entry: FlightEntry) -> list[str]:
    """The entry's Python stack, innermost first: torch's innermost frame, then the user's."""
    frames = entry.frames
    users = user_frames(frames)
    inner = [f for f in frames if not f.file.startswith(_OWN)][:1]
    shown = ([inner[0]] if inner and inner[0] not in users else []) + users
    return [_short(f) for f in shown[:STACK_FRAMES]]


def _describe(entry: FlightEntry) -> str:
    sizes = ",".join("x".join(str(d) for d in s) or "scalar" for s in entry.input_sizes)
    text = f"#{entry.collective_seq_id} {entry.profiling_name}"
    text += f" [{sizes}] {entry.dtype}" if entry.input_sizes else " (no tensor)"
    if entry.state != "scheduled":
        text += f", {entry.state}"
    site = user_site(entry)
    return text + (f", from {site}" if site else "")


def _signature(entries: Sequence[FlightEntry]) -> tuple[object, ...]:
    """What members must agree on at one sequence number (a coalesced group: every op)."""
    out: list[object] = []
    for e in entries:
        sizes_free = e.name in ("all_to_all", "all_to_all_single", "all_to_all_v_single")
        inputs = () if sizes_free or e.name == "scatter" else e.input_sizes
        outputs = () if sizes_free or e.name == "gather" else e.output_sizes
        out.append((e.name, inputs, outputs, frozenset(e.input_dtypes + e.output_dtypes)))
    return tuple(out)


def _cause(a: tuple[object, ...], b: tuple[object, ...]) -> str:
    if len(a) != len(b) or any(x[0] != y[0] for x, y in zip(a, b, strict=False)):  # type: ignore[index]
        return "op"
    if any(x[1:3] != y[1:3] for x, y in zip(a, b, strict=True)):  # type: ignore[index]
        return "size"
    return "dtype"


def _members(dumps: Sequence[FlightDump], name: str, desc: str) -> tuple[int, ...]:
    """A group's global ranks from any dump's pg_config; gloo records the default group under
    the name "" (hence torch's own analyzer's KeyError), so the default group falls back to it
    and then to every rank that dumped."""
    for d in dumps:
        found = d.groups.get(name)
        if found and found[1]:
            return found[1]
    if desc == "default_pg" or name == "0":
        for d in dumps:
            found = d.groups.get("")
            if found and found[1]:
                return found[1]
        return tuple(sorted(d.rank for d in dumps))  # gloo may record "[]": every rank
    # gloo records no subgroup at all: its members are the ranks whose dumps hold entries on it
    return tuple(sorted(d.rank for d in dumps if any(e.pg_name == name for e in d.entries)))


def group_streams(
    dumps: Sequence[FlightDump],
) -> dict[GroupKey, dict[int, dict[int, list[FlightEntry]]]]:
    """group -> rank -> collective_seq_id -> its entries (several: a coalesced group)."""
    members: dict[tuple[str, str], tuple[int, ...]] = {}
    out: dict[GroupKey, dict[int, dict[int, list[FlightEntry]]]] = {}
    for d in dumps:
        for e in d.entries:
            if e.is_p2p or e.collective_seq_id <= 0:
                continue
            pg = (e.pg_name, e.pg_desc)
            if pg not in members:
                members[pg] = _members(dumps, *pg)
            key = (e.pg_name, members[pg])
            out.setdefault(key, {}).setdefault(d.rank, {}).setdefault(
                e.collective_seq_id, []
            ).append(e)
    return out


@dataclass(frozen=True)
class Desync:
    key: GroupKey
    seq: int
    kind: str  # "collective-mismatch" or "hang"
    cause: str
    culprits: tuple[int, ...]
    at: dict[int, list[FlightEntry] | None]  # every dumped member's entries at seq


def _majority(at: dict[int, list[FlightEntry]]) -> tuple[object, ...]:
    sigs = {r: _signature(v) for r, v in at.items()}
    counts = Counter(sigs.values())
    best = max(counts.values())
    # ties: the signature of the lowest rank among the most common (torch's reference rank)
    return next(sigs[r] for r in sorted(sigs) if counts[sigs[r]] == best)


def first_desync(key: GroupKey, by_rank: dict[int, dict[int, list[FlightEntry]]]) -> Desync | None:
    dumped = sorted(by_rank)
    used = [s for s in by_rank.values() if s]
    if len(dumped) < 2 or not used:
        return None
    lo = max(min(s) for s in used)  # the ring buffer may have dropped the start
    # the numbers some member holds, in order: the work is the entries', never the span's
    # (one entry numbered 10**12 is one step, not 10**12)
    seqs = sorted({seq for s in used for seq in s if seq >= lo})
    for seq in seqs:
        at = {r: by_rank[r].get(seq) for r in dumped}
        present = {r: v for r, v in at.items() if v}
        missing = tuple(r for r in dumped if not at[r])
        if missing:
            return Desync(key, seq, "hang", "missing-rank", missing, at)
        major = _majority(present)
        odd = tuple(r for r in dumped if _signature(present[r]) != major)
        if odd:
            ref = next(r for r in dumped if r not in odd)
            cause = _cause(_signature(present[odd[0]]), _signature(present[ref]))
            return Desync(key, seq, "collective-mismatch", cause, odd, at)
    return _stuck(key, by_rank, seqs)


def _stuck(
    key: GroupKey, by_rank: dict[int, dict[int, list[FlightEntry]]], seqs: list[int]
) -> Desync | None:
    """Where the backend records states (NCCL): the first of the trailing collectives no
    member completed that some member started. Every member started it: ``stuck-in-collective``;
    some only scheduled it (their stream never reached it): ``not-started``, those are the
    culprits, the others wait in it. Every member holds each of ``seqs`` here."""
    if len(by_rank) < 2:
        return None
    stuck = None
    for seq in reversed(seqs):
        states = {e.state for stream in by_rank.values() for e in stream[seq]}
        if "completed" in states:
            break
        if "started" in states:
            stuck = seq
    if stuck is None:
        return None
    at = {r: s.get(stuck) for r, s in by_rank.items()}
    waiting = tuple(
        r for r, v in sorted(at.items()) if v and all(e.state == "scheduled" for e in v)
    )
    if waiting:
        return Desync(key, stuck, "hang", "not-started", waiting, dict(at))
    return Desync(key, stuck, "hang", "stuck-in-collective", (), dict(at))


def skipped_desync(desync: Desync, by_rank: dict[int, dict[int, list[FlightEntry]]]) -> Desync:
    """A rank that skipped a collective of the same size as the next: its calls come from the
    line the others call next, from some ``s`` before the desync (read from the stacks).
    Linear in the entries: each culprit's last number that does not pair with the others'
    next is found once."""
    if desync.cause != "missing-rank" or len(desync.culprits) >= len(by_rank):
        return desync
    ref_rank = next(r for r in sorted(by_rank) if r not in desync.culprits)
    lo = max((min(s) for s in by_rank.values() if s), default=desync.seq)
    seqs = sorted({s for stream in by_rank.values() for s in stream if lo <= s < desync.seq})

    def site(rank: int, seq: int) -> SourceLocation | None:
        entries = by_rank[rank].get(seq)
        return user_site(entries[0]) if entries else None

    # elsewhere (no entry at s, none at s + 1) a culprit's call and the next pair trivially
    positions = sorted({*seqs, *(s - 1 for s in seqs if s - 1 >= lo)})
    last_unpaired = {
        c: max((s for s in positions if site(c, s) != site(ref_rank, s + 1)), default=lo - 1)
        for c in desync.culprits
    }
    for seq in seqs:
        ref = site(ref_rank, seq)
        if ref is None:
            continue
        diverged = [c for c in desync.culprits if site(c, seq) not in (None, ref)]
        shifted = [c for c in diverged if last_unpaired[c] < seq]
        if shifted:
            at = {r: by_rank[r].get(seq) for r in sorted(by_rank)}
            return Desync(desync.key, seq, "collective-mismatch", "skipped", tuple(shifted), at)
    return desync


def group_text(key: GroupKey, dumps: Sequence[FlightDump]) -> str:
    name, members = key
    desc = next((e.pg_desc for d in dumps for e in d.entries if e.pg_name == name), "")
    label = f"{name}:{desc}" if desc and desc != "undefined" else name or "default"
    return f"{label} (ranks {compress_ranks(members)})" if members else label


def _status(dump: FlightDump, key: GroupKey) -> dict[str, int]:
    ids = {e.pg_id for e in dump.entries if e.pg_name == key[0]}
    return next((dump.status[str(i)] for i in sorted(ids) if str(i) in dump.status), {})


def _by_seq(dump: FlightDump, name: str) -> dict[int, FlightEntry]:
    return {e.collective_seq_id: e for e in dump.entries if e.pg_name == name and not e.is_p2p}


def position(dump: FlightDump, key: GroupKey) -> dict[str, str]:
    """Where one rank stood on one group: the collective it last issued, started and
    completed (from the entries' states where the backend records them, else pg_status)."""
    entries = _by_seq(dump, key[0])
    if not entries:
        return {"issued": "nothing on this group in its buffer"}
    status = _status(dump, key)

    def text(seq: int | None) -> str:
        if seq is None or seq < 0:
            return "not recorded by this backend" if seq is not None else "none"
        return _describe(entries[seq]) if seq in entries else f"#{seq} (before the buffer)"

    stated = any(e.state != "scheduled" for e in entries.values())
    started = [s for s, e in entries.items() if e.state in ("started", "completed")]
    completed = [s for s, e in entries.items() if e.state == "completed"]
    if stated:
        last_started = max(started, default=None)
        last_completed = max(completed, default=None)
    else:
        last_started = status.get("last_started_collective", -1)
        last_completed = status.get("last_completed_collective")
    return {
        "issued": text(max(entries)),
        "started": text(last_started),
        "completed": text(last_completed),
    }


def merged_rows(rows: dict[int, str]) -> dict[str, str]:
    """Ranks with the same text as one row ("0,2-999": ...), at most EVIDENCE_ROWS rows."""
    by_text: dict[str, list[int]] = {}
    for rank, text in sorted(rows.items()):
        by_text.setdefault(text, []).append(rank)
    merged = {compress_ranks(ranks): text for text, ranks in by_text.items()}
    shown = dict(list(merged.items())[:EVIDENCE_ROWS])
    if len(merged) > EVIDENCE_ROWS:
        shown["..."] = f"{len(merged) - EVIDENCE_ROWS} more distinct rows"
    return shown


def _what(desync: Desync, rank: int, dump: FlightDump) -> str:
    entries = desync.at.get(rank)
    if entries:
        return "; ".join(_describe(e) for e in entries)
    last = _by_seq(dump, desync.key[0])
    earlier = [s for s in last if s < desync.seq]
    tail = f" (its last: {_describe(last[max(earlier)])})" if earlier else ""
    return f"never issued #{desync.seq}{tail}"


def _stack_rows(desync: Desync, dumps: dict[int, FlightDump]) -> dict[str, str]:
    rows: dict[int, str] = {}
    for rank in desync.at:
        entries = desync.at[rank]
        if not entries:
            last = _by_seq(dumps[rank], desync.key[0])
            earlier = [s for s in last if s < desync.seq]
            entries = [last[max(earlier)]] if earlier else None
        if entries and entries[0].frames:
            rows[rank] = " <- ".join(_stack(entries[0]))
    return merged_rows(rows)


def _message(desync: Desync, group: str, dumps: dict[int, FlightDump]) -> str:
    culprits = compress_ranks(desync.culprits)
    others = [r for r in desync.at if r not in desync.culprits]
    ref = others[0] if others else min(desync.at)
    if desync.cause == "missing-rank":
        return (
            f"rank(s) {culprits} never issued collective #{desync.seq} of group {group}; "
            f"rank(s) {compress_ranks(others)} wait in it: {_what(desync, ref, dumps[ref])}"
        )
    if desync.cause == "not-started":
        return (
            f"rank(s) {culprits} scheduled collective #{desync.seq} of group {group} and never "
            f"started it (their stream had not reached it); rank(s) {compress_ranks(others)} "
            f"started it and wait in it, and no rank completed it: {_what(desync, ref, dumps[ref])}"
        )
    if desync.cause == "stuck-in-collective":
        return (
            f"every rank of group {group} started collective #{desync.seq} and none completed "
            f"it: {_what(desync, ref, dumps[ref])}"
        )
    if desync.cause == "skipped":
        return (
            f"rank(s) {culprits} skipped collective #{desync.seq} of group {group} "
            f"({_what(desync, ref, dumps[ref])}): from there each of its calls pairs with the "
            "others' next one, and it ends one short"
        )
    odd = desync.culprits[0]
    return (
        f"ranks issued different collectives ({desync.cause}) at #{desync.seq} of group "
        f"{group}: rank(s) {compress_ranks(others)} {_what(desync, ref, dumps[ref])}, "
        f"rank(s) {culprits} {_what(desync, odd, dumps[odd])}"
    )


def desync_finding(desync: Desync, dumps: dict[int, FlightDump]) -> Finding:
    ordered = [dumps[r] for r in sorted(dumps)]
    group = group_text(desync.key, ordered)
    members = desync.key[1] or tuple(sorted(desync.at))
    sites: list[tuple[str, SourceLocation]] = []
    for rank in (*desync.culprits, *(r for r in desync.at if r not in desync.culprits)):
        entries = desync.at.get(rank)
        role = f"rank {rank}" + (" (culprit)" if rank in desync.culprits else "")
        if not entries:
            last = _by_seq(dumps[rank], desync.key[0])
            earlier = [s for s in last if s < desync.seq]
            entries = [last[max(earlier)]] if earlier else None
            role += ", its last collective"
        site = user_site(entries[0]) if entries else None
        if site is not None and all(s != site for _, s in sites):
            sites.append((role, site))
    evidence: dict[str, object] = {
        "source": "flight recorder",
        "group": group,
        "collective_seq_id": desync.seq,
        "culprit_ranks": list(desync.culprits),
        "per_rank": merged_rows({r: _what(desync, r, dumps[r]) for r in desync.at}),
        "last_issued_started_completed": merged_rows(
            {
                r: " | ".join(f"{k} {v}" for k, v in position(dumps[r], desync.key).items())
                for r in desync.at
            }
        ),
    }
    hosts = {str(r): dumps[r].host for r in desync.culprits if r in dumps and dumps[r].host}
    if hosts:
        evidence["culprit_hosts"] = hosts  # from the dump files' names
    stacks = _stack_rows(desync, dumps)
    if stacks:
        evidence["stacks"] = stacks
    undumped = [r for r in members if r not in dumps]
    if undumped:
        evidence["ranks_without_dump"] = compress_ranks(undumped)
    return Finding(
        kind=desync.kind,
        severity="error",
        cause=desync.cause,
        message=_message(desync, group, dumps),
        ranks=desync.culprits or tuple(sorted(desync.at)),
        windows=(),
        evidence=evidence,
        cost={},
        sites=tuple(sites[:8]),
        fix=SNIPPETS["same-sequence"],
    )
