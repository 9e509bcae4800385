"""What torch Flight Recorder dumps say: ranks aligned per process group on collective
sequence numbers, the first desync, where each rank stood, and the gradient-sync rounds.

The dumps are read by ``syncscope.load.flight``. Alignment is torch's own: within a process
group every member numbers its collectives 1, 2, ... (``collective_seq_id``), so entry ``s``
of every member is the same collective, whatever else each rank did. The first sequence
number where members differ is the desync:

- ``collective-mismatch``: members issued different ops, sizes or dtypes at ``s`` (cause
  ``op``, ``size``, ``dtype``); the culprits are the ranks outside the largest agreeing set
  (with two ranks, the one that is not the lowest, as torch's analyzer names it). Cause
  ``skipped``: sizes agree but a rank's calls come from the *next* line the others called
  from, from ``s`` on, and it ends one collective short: it skipped the one at ``s``.
- ``hang``: some members issued ``s`` and others never did (cause ``missing-rank``: the
  culprits never issued it, the others wait in it), or every member started the last one and
  none completed it (``stuck-in-collective``, where the backend records states: NCCL).

Point-to-point ops are listed, not matched. Ranks with no dump are said to be missing and
left out of every comparison.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from syncscope.analysis.advice import SNIPPETS
from syncscope.model import (
    Collective,
    Finding,
    RankRun,
    Run,
    RunMeta,
    SourceLocation,
    Window,
    compress_ranks,
)
from syncscope.model.flight import FlightDump, FlightEntry, Frame

__all__ = ["FlightResult", "analyze_dumps", "merge_findings", "with_dump_notes"]

EVIDENCE_ROWS = 16  # distinct per-rank descriptions shown (ranks with equal ones merged)
STACK_FRAMES = 12
_LIBRARY = ("/torch/", "/site-packages/", "/dist-packages/", "<frozen ", "/lib/python3")
# syncscope's own frames (capture's kernel, attach running the script) are not the user's
_OWN = str(Path(__file__).resolve().parents[1]) + "/"
_FLOATS = {"Float", "Double", "Half", "BFloat16", "Float8_e4m3fn", "Float8_e5m2"}
NOT_SHOWN = (
    "Flight Recorder: a dump holds the collectives each rank issued (its last "
    "TORCH_FR_BUFFER_SIZE entries), not what ran between them: micro-batches, optimizer "
    "steps and gradient values are not in it, so windows, no_sync intent and rank divergence "
    "cannot be judged from a dump alone; profile the job with syncscope for those"
)
GLOO_STATES = (
    "Flight Recorder: the gloo backend leaves every entry 'scheduled' (no started/completed "
    "states, no durations); completion is read from each group's pg_status"
)


GroupKey = tuple[str, tuple[int, ...]]  # (group name, member ranks)


@dataclass(frozen=True)
class FlightResult:
    run: Run  # the dumps as a run of one incomplete window per rank
    findings: list[Finding]
    notes: tuple[str, ...]


def user_frames(frames: Sequence[Frame]) -> list[Frame]:
    return [
        f
        for f in frames
        if f.file and not f.file.startswith(_OWN) and not any(k in f.file for k in _LIBRARY)
    ]


def _site(entry: FlightEntry) -> SourceLocation | None:
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
    site = _site(entry)
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


def _streams(
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
class _Desync:
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


def _first_desync(
    key: GroupKey, by_rank: dict[int, dict[int, list[FlightEntry]]]
) -> _Desync | None:
    dumped = sorted(by_rank)
    used = [s for s in by_rank.values() if s]
    if len(dumped) < 2 or not used:
        return None
    lo = max(min(s) for s in used)  # the ring buffer may have dropped the start
    hi = max(max(s) for s in used)
    for seq in range(lo, hi + 1):
        at = {r: by_rank[r].get(seq) for r in dumped}
        present = {r: v for r, v in at.items() if v}
        if not present:
            continue
        missing = tuple(r for r in dumped if not at[r])
        if missing:
            return _Desync(key, seq, "hang", "missing-rank", missing, at)
        major = _majority(present)
        odd = tuple(r for r in dumped if _signature(present[r]) != major)
        if odd:
            ref = next(r for r in dumped if r not in odd)
            cause = _cause(_signature(present[odd[0]]), _signature(present[ref]))
            return _Desync(key, seq, "collective-mismatch", cause, odd, at)
    return _stuck(key, by_rank, hi)


def _stuck(
    key: GroupKey, by_rank: dict[int, dict[int, list[FlightEntry]]], hi: int
) -> _Desync | None:
    """Every member's last entry is ``hi``, started and none completed (NCCL records states)."""
    at = {r: s.get(hi) for r, s in by_rank.items()}
    states = {e.state for v in at.values() if v for e in v}
    if len(at) >= 2 and all(at.values()) and states == {"started"}:
        return _Desync(key, hi, "hang", "stuck-in-collective", (), dict(at))
    return None


def _skipped(desync: _Desync, by_rank: dict[int, dict[int, list[FlightEntry]]]) -> _Desync:
    """A rank that skipped a collective of the same size as the next: its calls come from the
    line the others call next, from some ``s`` before the desync (read from the stacks)."""
    if desync.cause != "missing-rank" or len(desync.culprits) >= len(by_rank):
        return desync
    others = [r for r in sorted(by_rank) if r not in desync.culprits]
    lo = max((min(s) for s in by_rank.values() if s), default=desync.seq)

    def site(rank: int, seq: int) -> SourceLocation | None:
        entries = by_rank[rank].get(seq)
        return _site(entries[0]) if entries else None

    for seq in range(lo, desync.seq):
        ref = site(others[0], seq)
        if ref is None:
            continue
        diverged = [c for c in desync.culprits if site(c, seq) not in (None, ref)]
        shifted = [
            c
            for c in diverged
            if all(site(c, s) == site(others[0], s + 1) for s in range(seq, desync.seq))
        ]
        if shifted:
            at = {r: by_rank[r].get(seq) for r in sorted(by_rank)}
            return _Desync(desync.key, seq, "collective-mismatch", "skipped", tuple(shifted), at)
    return desync


def _group_text(key: GroupKey, dumps: Sequence[FlightDump]) -> str:
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


def _merged(rows: dict[int, str]) -> dict[str, str]:
    """Ranks with the same text as one row ("0,2-999": ...), at most EVIDENCE_ROWS rows."""
    by_text: dict[str, list[int]] = {}
    for rank, text in sorted(rows.items()):
        by_text.setdefault(text, []).append(rank)
    merged = {compress_ranks(ranks): text for text, ranks in by_text.items()}
    shown = dict(list(merged.items())[:EVIDENCE_ROWS])
    if len(merged) > EVIDENCE_ROWS:
        shown["..."] = f"{len(merged) - EVIDENCE_ROWS} more distinct rows"
    return shown


def _what(desync: _Desync, rank: int, dump: FlightDump) -> str:
    entries = desync.at.get(rank)
    if entries:
        return "; ".join(_describe(e) for e in entries)
    last = _by_seq(dump, desync.key[0])
    earlier = [s for s in last if s < desync.seq]
    tail = f" (its last: {_describe(last[max(earlier)])})" if earlier else ""
    return f"never issued #{desync.seq}{tail}"


def _stack_rows(desync: _Desync, dumps: dict[int, FlightDump]) -> dict[str, str]:
    rows: dict[int, str] = {}
    for rank in desync.at:
        entries = desync.at[rank]
        if not entries:
            last = _by_seq(dumps[rank], desync.key[0])
            earlier = [s for s in last if s < desync.seq]
            entries = [last[max(earlier)]] if earlier else None
        if entries and entries[0].frames:
            rows[rank] = " <- ".join(_stack(entries[0]))
    return _merged(rows)


def _message(desync: _Desync, group: str, dumps: dict[int, FlightDump]) -> str:
    culprits = compress_ranks(desync.culprits)
    others = [r for r in desync.at if r not in desync.culprits]
    ref = others[0] if others else min(desync.at)
    if desync.cause == "missing-rank":
        return (
            f"rank(s) {culprits} never issued collective #{desync.seq} of group {group}; "
            f"rank(s) {compress_ranks(others)} wait in it: {_what(desync, ref, dumps[ref])}"
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


def _finding(desync: _Desync, dumps: dict[int, FlightDump]) -> Finding:
    ordered = [dumps[r] for r in sorted(dumps)]
    group = _group_text(desync.key, ordered)
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
        site = _site(entries[0]) if entries else None
        if site is not None and all(s != site for _, s in sites):
            sites.append((role, site))
    evidence: dict[str, object] = {
        "source": "flight recorder",
        "group": group,
        "collective_seq_id": desync.seq,
        "culprit_ranks": list(desync.culprits),
        "per_rank": _merged({r: _what(desync, r, dumps[r]) for r in desync.at}),
        "last_issued_started_completed": _merged(
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


def _is_backward(entry: FlightEntry) -> bool:
    return entry.thread_name.startswith("pt_autograd") or any(
        f.name == "_engine_run_backward" or "/torch/autograd/" in f.file for f in entry.frames
    )


def _issuer(entry: FlightEntry) -> str:
    files = " ".join(f.file for f in entry.frames)
    if "/torch/distributed/fsdp/" in files or "/_composable/fsdp/" in files:
        return "fsdp"
    if "/torch/nn/parallel/distributed.py" in files or "ddp_comm_hooks" in files:
        return "ddp"
    if _is_backward(entry) and not user_frames(entry.frames[:1]):
        return "ddp"  # the reducer, called by the autograd engine
    return "user" if user_frames(entry.frames[:3]) else "torch"


def is_grad_sync(entry: FlightEntry) -> bool:
    """A reduction of gradients, as far as a dump shows: an all-reduce or reduce-scatter of
    floating-point tensors issued from inside a backward pass (DDP's buckets, FSDP's
    reduce-scatters, a comm hook). A dump has no storage to compare, so a user's all-reduce
    of gradients after the backward is not told from a metric's."""
    return (
        entry.op in ("all_reduce", "reduce_scatter")
        and bool(set(entry.input_dtypes) & _FLOATS)
        and _is_backward(entry)
    )


def _is_step(entry: FlightEntry) -> bool:
    return any("/torch/optim/" in f.file and f.name == "step" for f in entry.frames)


def grad_sync_rounds(dump: FlightDump) -> list[dict[str, object]]:
    """The gradient-sync rounds one rank's buffer shows, in order: consecutive backward
    reductions from the same call site (one backward's buckets); a round ends where the
    bucket sizes start over, another collective comes between, or an optimizer step's
    collective shows in the frames (``window`` counts those steps; ``None``: no step seen)."""
    rounds: list[dict[str, object]] = []
    current: list[FlightEntry] = []
    steps_seen = 0
    any_step = any(_is_step(e) for e in dump.entries)

    def close() -> None:
        if current:
            site = _site(current[0])
            rounds.append(
                {
                    "first_seq": current[0].collective_seq_id,
                    "collectives": len(current),
                    "bytes": sum(e.bytes for e in current),
                    "issuer": _issuer(current[0]),
                    "site": str(site) if site else "",
                    "window": steps_seen if any_step else None,
                }
            )
            current.clear()

    for e in dump.entries:
        if e.is_p2p:
            continue
        if _is_step(e):
            close()
            steps_seen += 1
        if not is_grad_sync(e):
            close()
            continue
        if current and (_site(e) != _site(current[0]) or e.input_sizes == current[0].input_sizes):
            close()
        current.append(e)
    close()
    return rounds


def _collective(entry: FlightEntry, members: tuple[int, ...]) -> Collective:
    grad = is_grad_sync(entry)
    done = entry.time_completed_ns
    end = entry.time_created_ns + int((entry.duration_ms or 0) * 1e6)
    return Collective(
        seq=entry.collective_seq_id,
        op=entry.op,
        raw_op=entry.profiling_name,
        bytes=entry.bytes,
        dtype=entry.dtype,
        group_ranks=members or None,
        group_name=entry.pg_name,
        start_ns=entry.time_created_ns,
        end_ns=end,
        done_ns=done,
        phase="backward" if _is_backward(entry) else "other",
        micro_batch=0,
        grad_sync=grad,
        issuer=_issuer(entry),  # type: ignore[arg-type]
        site=_site(entry),
    )


def _rank_run(
    dump: FlightDump, members: dict[str, tuple[int, ...]], keep_windows: bool = False
) -> RankRun:
    """The rank as the model has it; its collectives form one incomplete window where
    ``keep_windows`` (left out of reports: a dump has no windows, and a table of one window
    with no micro-batches would only mislead)."""
    collectives = tuple(
        _collective(e, members.get(e.pg_name, ()))
        for e in (dump.entries if keep_windows else ())
        if not e.is_p2p
    )
    start = min((e.time_created_ns for e in dump.entries), default=0)
    end = max((e.time_created_ns for e in dump.entries), default=0)
    window = Window(
        index=0,
        complete=False,
        start_ns=start,
        end_ns=end,
        micro_batches=(),
        collectives=collectives,
    )
    backend = next((e.backend for e in dump.entries if e.backend), "")
    return RankRun(
        rank=dump.rank,
        windows=(window,) if collectives and keep_windows else (),
        host=dump.host,
        backend=backend,
        last_event_ns=end,
    )


def _range(seqs: Sequence[int]) -> str:
    return f"#{min(seqs)}-#{max(seqs)}" if seqs else "none"


def _summary(
    dumps: Sequence[FlightDump], streams: dict[GroupKey, dict[int, dict[int, list[FlightEntry]]]]
) -> Finding:
    groups = {
        _group_text(key, dumps): _merged({r: _range(list(s)) for r, s in by_rank.items()})
        for key, by_rank in streams.items()
    }
    rounds: dict[int, str] = {}
    for d in dumps:
        found = grad_sync_rounds(d)
        sizes = Counter(int(str(r["bytes"])) for r in found)
        common = ", ".join(f"{n} x {b} bytes" for b, n in sizes.most_common(3))
        issuers = ",".join(sorted({str(r["issuer"]) for r in found}))
        rounds[d.rank] = f"{len(found)} round(s) ({common}; {issuers})" if found else "none"
    backends = sorted({e.backend for d in dumps for e in d.entries if e.backend})
    versions = sorted({d.version for d in dumps})
    return Finding(
        kind="flight-recorder",
        severity="info",
        cause="dumps",
        message=f"Flight Recorder dumps of {len(dumps)} rank(s) ({', '.join(backends) or '?'}, "
        f"format {', '.join(versions)}): {len(streams)} process group(s), members aligned "
        "on collective sequence numbers",
        ranks=tuple(d.rank for d in dumps),
        windows=(),
        evidence={
            "source": "flight recorder",
            "files": _merged({d.rank: d.path for d in dumps}),
            "sequence_ranges": groups,
            "grad_sync_rounds": _merged(rounds),
        },
    )


def _notes(dumps: Sequence[FlightDump], members: dict[str, tuple[int, ...]]) -> tuple[str, ...]:
    notes = [NOT_SHOWN]
    if any(e.backend == "gloo" for d in dumps for e in d.entries):
        notes.append(GLOO_STATES)
        notes.append(
            "Flight Recorder: gloo records no group membership: a subgroup's members are the "
            "ranks whose dumps hold entries on it, the default group's every rank that dumped"
        )
    if not any(d.has_frames for d in dumps):
        notes.append(
            "Flight Recorder: no Python stacks in these dumps (the JSON variant, or stacks "
            "turned off): sites and gradient-sync rounds cannot be read"
        )
    if not any(d.entries for d in dumps):
        notes.append(
            "Flight Recorder: the dumps hold no entries: the recorder was off "
            "(TORCH_FR_BUFFER_SIZE unset or 0 in the ranks) or no collective ran"
        )
    dumped = {d.rank for d in dumps}
    absent = sorted({r for m in members.values() for r in m} - dumped)
    if absent:
        notes.append(
            f"Flight Recorder: no dump from rank(s) {compress_ranks(absent)}: they are left "
            "out of every comparison"
        )
    if any(len(d.entries) and min(e.collective_seq_id for e in d.entries) > 1 for d in dumps):
        notes.append(
            "Flight Recorder: the ring buffer had wrapped on some ranks: ranks are compared "
            "from the first sequence number every member still holds"
        )
    return tuple(notes)


def analyze_dumps(dumps: Sequence[FlightDump], label: str = "") -> FlightResult:
    """The findings the dumps support and a run made of them (one incomplete window per rank:
    windows cannot be told from a dump)."""
    streams = _streams(dumps)
    by_rank = {d.rank: d for d in dumps}
    members = {key[0]: key[1] for key in streams}
    findings: list[Finding] = []
    for key, group in streams.items():
        # members that dumped but issued nothing on the group still count (as missing)
        group = {**{r: {} for r in key[1] if r in by_rank}, **group}
        desync = _first_desync(key, group)
        if desync is not None:
            findings.append(_finding(_skipped(desync, group), by_rank))
    findings.append(_summary(dumps, streams))
    notes = _notes(dumps, members)
    world = max([len(m) for m in members.values()] + [max(by_rank, default=-1) + 1], default=1)
    meta = RunMeta(
        command=("flight-recorder", label) if label else ("flight-recorder",),
        world_size=world,
        source="trace",
        notes=notes,
    )
    run = Run(meta=meta, ranks=tuple(_rank_run(d, members) for d in dumps))
    return FlightResult(run=run, findings=findings, notes=notes)


def with_dump_notes(run: Run, result: FlightResult) -> Run:
    """A run read from elsewhere (run directories, Kineto traces) with the dumps' notes."""
    notes = (*run.meta.notes, *(n for n in result.notes if n != NOT_SHOWN))
    return dataclasses.replace(run, meta=dataclasses.replace(run.meta, notes=notes))


def merge_findings(findings: list[Finding], result: FlightResult) -> list[Finding]:
    """The run's findings with the dumps': a live run's ``hang`` (the launcher stopped it)
    gains each rank's stuck collective and stack from the dumps and stays one finding."""
    fr = list(result.findings)
    out: list[Finding] = []
    for f in findings:
        mismatch = next((x for x in fr if x.kind == "collective-mismatch"), None)
        if f.kind == "collective-mismatch" and mismatch is not None:
            # the same desync seen twice: the run's finding, with the dumps' culprits and stacks
            evidence = {**f.evidence, "flight_recorder": mismatch.message}
            for k in ("culprit_ranks", "stacks"):
                if k in mismatch.evidence:
                    evidence[k] = mismatch.evidence[k]
            f = dataclasses.replace(f, evidence=evidence, sites=mismatch.sites or f.sites)
            fr.remove(mismatch)
        elif f.kind == "hang" and f.cause == "no-progress":
            desync = next((x for x in fr if x.kind in ("hang", "collective-mismatch")), None)
            evidence = dict(f.evidence)
            if desync is not None:
                evidence["flight_recorder"] = desync.message
                for k in ("culprit_ranks", "last_issued_started_completed", "stacks"):
                    if k in desync.evidence:
                        evidence[k] = desync.evidence[k]
                f = dataclasses.replace(f, evidence=evidence, sites=desync.sites or f.sites)
                if desync.kind == "hang":
                    fr.remove(desync)
        out.append(f)
    return out + fr
