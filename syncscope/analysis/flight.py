"""What torch Flight Recorder dumps say: the first desync of each process group and where
each rank stood (``flight_desync``), the gradient-sync rounds, a run made of the dumps, and
the dumps' findings merged with a live run's.

The dumps are read by ``syncscope.load.flight``. Ranks of the job with no readable dump (none
written, an empty or unreadable one, one left out by ``--skip-bad``) are left out of every
comparison and said to be missing: a ``ranks-missing`` finding (verdict ``incomplete``, never
``clean``: the missing rank is often the hung one), a note where the dumps come with a live
run (whose own events cover every rank).
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from syncscope.analysis.flight_desync import (
    GroupKey,
    desync_finding,
    first_desync,
    group_streams,
    group_text,
    merged_rows,
    skipped_desync,
    user_frames,
    user_site,
)
from syncscope.model import (
    Collective,
    Finding,
    RankRun,
    Run,
    RunMeta,
    Window,
    compress_ranks,
    missing_rank_runs,
    missing_ranks_text,
)
from syncscope.model.flight import FlightDump, FlightEntry

__all__ = ["FlightResult", "analyze_dumps", "merge_findings", "with_dump_notes"]

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


@dataclass(frozen=True)
class FlightResult:
    run: Run  # the dumps as a run of one incomplete window per rank
    findings: list[Finding]
    notes: tuple[str, ...]
    missing: Finding | None = None  # ranks-missing: in ``findings`` too


LISTED_MISSING = 64  # the ranks without a dump a finding lists one by one


def _without_dump(
    dumps: Sequence[FlightDump], members: dict[str, tuple[int, ...]], unreadable: Sequence[int]
) -> tuple[list[int], int, int]:
    """(the first ranks with no readable dump, how many, the job's size as the dumps tell
    it): every group's members, the ranks whose dumps could not be read, and every rank
    below the highest seen (ranks are numbered from 0)."""
    dumped = {d.rank for d in dumps}
    known = {r for m in members.values() for r in m} | dumped | set(unreadable)
    world = max(known, default=-1) + 1
    runs, count = missing_rank_runs(dumped, world)
    every = (r for first, last in runs for r in range(first, last + 1))
    listed = list(itertools.islice(every, LISTED_MISSING))  # bounded: a world may say 10**12
    return listed, count, world


def _missing_finding(
    dumps: Sequence[FlightDump], members: dict[str, tuple[int, ...]], unreadable: Sequence[int]
) -> Finding | None:
    listed, count, world = _without_dump(dumps, members, unreadable)
    if not count:
        return None
    shown, _ = missing_ranks_text({d.rank for d in dumps}, world)
    bad = sorted(set(unreadable) - {d.rank for d in dumps})
    return Finding(
        kind="ranks-missing",
        severity="warning",
        cause="no-dump",
        message=(
            f"no readable Flight Recorder dump from {count} rank(s) of {world} ({shown}): "
            "their collectives were not compared, so a desync or hang they are part of cannot "
            "be seen (a hung rank often leaves no dump, or a cut-short one)"
        ),
        ranks=tuple(listed) if count == len(listed) else (),
        windows=(),
        evidence={
            "source": "flight recorder",
            "world_size": world,
            "ranks_with_dump": len(dumps),
            "ranks_without_dump": shown,
            **({"unreadable_dumps": compress_ranks(bad)} if bad else {}),
        },
        cost={},
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
            site = user_site(current[0])
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
        if current and (
            user_site(e) != user_site(current[0]) or e.input_sizes == current[0].input_sizes
        ):
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
        site=user_site(entry),
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
        group_text(key, dumps): merged_rows({r: _range(list(s)) for r, s in by_rank.items()})
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
            "files": merged_rows({d.rank: d.path for d in dumps}),
            "sequence_ranges": groups,
            "grad_sync_rounds": merged_rows(rounds),
        },
    )


def _nccl_only(dump: FlightDump) -> bool:
    """A dump in a format older than 2.9 (torch 2.6 and 2.7 write 2.4): its recorder
    recorded NCCL collectives only (gloo's from torch 2.8, format 2.9)."""
    found = re.match(r"(\d+)\.(\d+)", dump.version)
    return found is not None and (int(found[1]), int(found[2])) < (2, 9)


def _notes(
    dumps: Sequence[FlightDump], members: dict[str, tuple[int, ...]], unreadable: Sequence[int]
) -> tuple[str, ...]:
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
    if not any(d.entries for d in dumps) and dumps and all(_nccl_only(d) for d in dumps):
        notes.append(
            "Flight Recorder: the dumps hold no entries, and their format is torch 2.7's or "
            "older, whose recorder records NCCL collectives only: a gloo job's are never in it"
        )
    elif not any(d.entries for d in dumps):
        notes.append(
            "Flight Recorder: the dumps hold no entries: the recorder was off "
            "(TORCH_FR_BUFFER_SIZE unset or 0 in the ranks) or no collective ran"
        )
    absent, count, _ = _without_dump(dumps, members, unreadable)
    if count:
        more = ", ..." if count > len(absent) else ""
        notes.append(
            f"Flight Recorder: no readable dump from rank(s) {compress_ranks(absent)}{more}: "
            "they are left out of every comparison"
        )
    if any(len(d.entries) and min(e.collective_seq_id for e in d.entries) > 1 for d in dumps):
        notes.append(
            "Flight Recorder: the ring buffer had wrapped on some ranks: ranks are compared "
            "from the first sequence number every member still holds"
        )
    return tuple(notes)


def analyze_dumps(
    dumps: Sequence[FlightDump], label: str = "", unreadable: Sequence[int] = ()
) -> FlightResult:
    """The findings the dumps support and a run made of them (one incomplete window per rank:
    windows cannot be told from a dump). ``unreadable``: the ranks whose dump files could not
    be read (skipped): missing, as a rank with no file."""
    streams = group_streams(dumps)
    by_rank = {d.rank: d for d in dumps}
    members = {key[0]: key[1] for key in streams}
    findings: list[Finding] = []
    for key, group in streams.items():
        # members that dumped but issued nothing on the group still count (as missing)
        group = {**{r: {} for r in key[1] if r in by_rank}, **group}
        desync = first_desync(key, group)
        if desync is not None:
            findings.append(desync_finding(skipped_desync(desync, group), by_rank))
    missing = _missing_finding(dumps, members, unreadable)
    if missing is not None:
        findings.append(missing)
    findings.append(_summary(dumps, streams))
    notes = _notes(dumps, members, unreadable)
    world = max([len(m) for m in members.values()] + [max(by_rank, default=-1) + 1], default=1)
    meta = RunMeta(
        command=("flight-recorder", label) if label else ("flight-recorder",),
        world_size=world,
        source="trace",
        notes=notes,
    )
    run = Run(meta=meta, ranks=tuple(_rank_run(d, members) for d in dumps))
    return FlightResult(run=run, findings=findings, notes=notes, missing=missing)


def with_dump_notes(run: Run, result: FlightResult) -> Run:
    """A run read from elsewhere (run directories, Kineto traces) with the dumps' notes."""
    notes = (*run.meta.notes, *(n for n in result.notes if n != NOT_SHOWN))
    return dataclasses.replace(run, meta=dataclasses.replace(run.meta, notes=notes))


def merge_findings(
    findings: list[Finding], result: FlightResult, live: bool = False
) -> list[Finding]:
    """The run's findings with the dumps': a live run's ``hang`` (the launcher stopped it)
    gains each rank's stuck collective and stack from the dumps and stays one finding.
    ``live``: the run's own events cover every rank, so ranks without a dump are a note
    (``with_dump_notes``), not a ``ranks-missing``."""
    fr = [f for f in result.findings if not (live and f is result.missing)]
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
                fr.remove(desync)  # the hang's cause, on its card: never a second error
        out.append(f)
    return out + fr
