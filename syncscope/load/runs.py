"""Assemble ranks into a run: ``load_run(RUN_DIR)`` reads a run directory (one per node, merged
into one job), keeps each rank file's last attempt and its records in order, builds each rank
(``load.captured.rank_from_events``) and ``assemble(meta, ranks)`` compares the ranks'
gradient fingerprints and notes what is missing. ``build_run`` does the same from in-memory
events (the ``track()`` API). Pure apart from reading the files.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from syncscope.atomic import NotRegularFile
from syncscope.errors import BadRunDirectory
from syncscope.fields import (
    bad,
    check_event,
    check_sequence,
    field_float,
    field_int,
    field_of,
    field_str,
)
from syncscope.load.captured import rank_from_events
from syncscope.model import RankRun, Run, RunMeta, compress_ranks, missing_ranks_text
from syncscope.model.per_model import wrapped_models
from syncscope.model.replicas import local_sgd
from syncscope.rundir import (
    DROPPED,
    EVENTS_FORMAT_VERSION,
    is_run_dir,
    rank_files,
    read_events,
    read_meta,
    stopped_reason,
)


def _fingerprints_match(values: list[tuple[float, ...]]) -> bool:
    first = values[0]
    return all(
        len(v) == len(first)
        and all(
            math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-12) for a, b in zip(v, first, strict=True)
        )
        for v in values[1:]
    )


def _match_among(ranks: Sequence[RankRun], i: int) -> bool | None:
    values = [
        r.windows[i].fingerprint
        for r in ranks
        if i < len(r.windows) and r.windows[i].complete and not r.windows[i].fingerprint_sharded
    ]
    present = [v for v in values if v is not None]
    return _fingerprints_match(present) if len(present) >= 2 else None


def compare_fingerprints(ranks: Sequence[RankRun], world: int = 0) -> tuple[RankRun, ...]:
    """Fill ``Window.fingerprint_match``: do all ranks hold the same gradients at step i?
    Under local SGD (``syncscope.model.replicas``), in the windows that reduce inside
    subgroups: do the ranks of each reduction group hold the same ones?"""
    if len(ranks) < 2:
        return tuple(ranks)
    count = max((len(r.windows) for r in ranks), default=0)
    local = local_sgd(ranks, world or len(ranks))
    verdicts: dict[int, bool | None] = {}
    for i in range(count):
        groups = local.groups.get(i) if local is not None else None
        if groups is None:
            verdicts[i] = _match_among(ranks, i)
            continue
        each = [_match_among([r for r in ranks if r.rank in g], i) for g in groups]
        known = [v for v in each if v is not None]
        verdicts[i] = all(known) if known else None
    return tuple(
        dataclasses.replace(
            r,
            windows=tuple(
                dataclasses.replace(w, fingerprint_match=verdicts.get(i))
                for i, w in enumerate(r.windows)
            ),
        )
        for r in ranks
    )


def _judged_per_model(rank: RankRun) -> bool:
    """The rank steps several wrapped models and its backwards say whose gradients they made."""
    return bool(wrapped_models(rank)) and any(
        mb.grads_of is not None for w in rank.windows for mb in w.micro_batches
    )


def assemble(meta: RunMeta, ranks: Iterable[RankRun]) -> Run:
    ordered = sorted(ranks, key=lambda r: r.rank)
    notes = list(meta.notes)
    if len(ordered) == 1 and not ordered[0].dist_initialized:
        notes.append("torch.distributed was never initialised: the script ran as world size 1")
    missing, _ = missing_ranks_text((r.rank for r in ordered), meta.world_size)
    if missing:
        notes.append(
            f"no events from rank(s) {missing} of {meta.world_size}; "
            "if they ran on other nodes, merge their directories: syncscope analyze DIR DIR ..."
        )
    models = {r.rank: len(wrapped_models(r)) for r in ordered if _judged_per_model(r)}
    if models:
        notes.append(
            f"rank(s) {compress_ranks(list(models))} step {max(models.values())} wrapped models: "
            "each model's grad syncs are counted and judged on its own micro-batches "
            "(report.json windows[].models); a window's grad syncs count every model's"
        )
    unfinished = [r.rank for r in ordered if not r.finished]
    if unfinished:
        notes.append(
            f"rank(s) {compress_ranks(unfinished)} stopped without an exit record "
            "(killed, crashed hard or hung, or capture could not write, e.g. a full disk): "
            "their events up to then are reported"
        )
    return Run(
        meta=dataclasses.replace(meta, notes=tuple(notes)),
        ranks=compare_fingerprints(ordered, meta.world_size),
    )


def _meta_from(
    data: dict[str, Any], headers: list[dict[str, Any]], file: object = "meta.json"
) -> RunMeta:
    planned = field_int(data, "world_size", file, min=0, default=0)
    world, formed_note = _formed_world(planned, headers, data.get("launcher"))
    first = headers[0] if headers else {}
    command = field_of(data, "command", file, (list, str))
    if isinstance(command, str):
        command = [command]  # one string: shown as given, not split into characters
    command = command or [first.get("target", ""), *first.get("argv", [])]
    launcher = field_of(data, "launcher", file, dict, default={})
    hang = field_of(data, "hang", file, dict, default={})
    at = "hang.start_up"
    return RunMeta(
        command=tuple(str(c) for c in command if c != ""),
        script=field_str(data, "script", file, default=""),
        script_sha256=field_str(data, "script_sha256", file, default=""),
        world_size=max(world, 1),
        created=field_str(data, "created", file, default=""),
        syncscope_version=str(data.get("syncscope_version", first.get("syncscope", ""))),
        torch_version=str(data.get("torch_version", first.get("torch", ""))),
        launcher={str(k): str(v) for k, v in launcher.items()},
        nodes=tuple(sorted({str(h.get("host", "")) for h in headers})),
        source="live",
        hang_timeout_s=field_float(data, "hang_timeout_s", file, min=0, default=None),
        hung=bool(field_of(data, "hung", file, bool, default=False)),
        hang_start_up=bool(field_of(hang, "start_up", file, bool, default=False, label=at)),
        main_threads=_main_threads(hang, file),
        waits=tuple(w for w in field_of(data, "waits", file, list, default=[]) if _wait(w)),
        notes=tuple(str(n) for n in field_of(data, "notes", file, list, default=[])) + formed_note,
    )


def _formed_world(
    planned: int, headers: list[dict[str, Any]], launcher: object
) -> tuple[int, tuple[str, ...]]:
    """The job's world size: what formed, as the ranks' own headers say (torch's rendezvous
    set their ``WORLD_SIZE``). ``meta.json`` holds what was planned, ``nproc x nodes``, and an
    elastic range (``--nnodes 1:2``) plans its largest: a job that formed on fewer nodes is
    not missing ranks. Without a header that says, the plan (or the largest header) holds."""
    sizes = [h["world_size"] for h in headers if isinstance(h.get("world_size"), int)]
    nnodes = str(launcher.get("nnodes", "")) if isinstance(launcher, dict) else ""
    if sizes and ":" in nnodes and max(sizes) < planned:
        formed = max(sizes)
        note = (
            f"world size {formed} as the job formed (--nnodes {nnodes} allowed up to "
            f"{planned} ranks)"
        )
        return formed, (note,)
    return max([planned, *sizes, 1]), ()


def _main_threads(hang: dict[str, Any], file: object) -> dict[str, str]:
    """``hang.main_threads``: each rank's number to what its main thread did, in words (the
    hang card's headline says them as they are)."""
    label = "hang.main_threads"
    threads = field_of(hang, "main_threads", file, dict, default={}, label=label)
    for rank, said in threads.items():
        if not rank.isdigit() or not isinstance(said, str):
            shown = repr(said) if len(repr(said)) <= 40 else repr(said)[:37] + "..."
            bad(file, label, f"must map rank numbers to words, not {rank[:20]!r} to {shown}")
    return dict(threads)


def _wait(entry: object) -> bool:
    """A well-formed entry of meta.json's ``waits`` (others are left out, not fatal)."""
    if not isinstance(entry, dict):
        return False
    ranks = entry.get("for")
    seconds = entry.get("seconds")
    return (
        isinstance(entry.get("rank"), int)
        and entry["rank"] >= 0
        and isinstance(ranks, list)
        and bool(ranks)
        and all(isinstance(r, int) and r >= 0 for r in ranks)
        and isinstance(seconds, (int, float))
        and math.isfinite(seconds)
        and isinstance(entry.get("waiting", ""), str)
        and isinstance(entry.get("running", {}), dict)
    )


def load_run(path: Path | Sequence[Path]) -> Run:
    """Read one run directory, or several (one per node) merged into one job."""
    paths = [path] if isinstance(path, Path) else list(path)
    ranks: dict[int, RankRun] = {}
    headers: list[dict[str, Any]] = []
    meta_data: dict[str, Any] = {}
    meta_file: Path | None = None
    stops: list[str] = []  # notes: stopped captures, skipped files, records set right
    for run_dir in paths:
        if not run_dir.is_dir():
            raise BadRunDirectory(f"{run_dir}: no such run directory")
        if not is_run_dir(run_dir):
            raise BadRunDirectory(
                f"{run_dir}: not a syncscope run directory (no meta.json or ranks/)"
            )
        data = read_meta(run_dir)
        meta_data = {**data, **meta_data} if meta_data else data
        meta_file = meta_file or run_dir / "meta.json"
        for file in rank_files(run_dir):
            try:
                events = list(read_events(file))
            except NotRegularFile as exc:
                stops.append(f"{exc}: skipped (a rank file is a regular file)")
                continue
            if not events:
                continue
            if all(e.get("type") == DROPPED for e in events):  # garbage: no event, no rank
                _note_dropped(events, file, stops)
                stops.append(f"{file.name}: no readable event: the file is left out")
                continue
            for number, event in enumerate(events, 1):
                check_event(event, file, number)
            _note_dropped(events, file, stops)
            events = _last_attempt(events, file, stops)
            events, notes = check_sequence(events, file.name)
            stops.extend(notes)
            if events[0].get("type") == "header":
                version = events[0].get("version", 1)
                if not isinstance(version, int) or version > EVENTS_FORMAT_VERSION:
                    raise BadRunDirectory(
                        f"{file}: event format version {version!r} is newer than this "
                        f"syncscope reads ({EVENTS_FORMAT_VERSION}); upgrade syncscope"
                    )
                headers.append(events[0])
            rank_run = rank_from_events(events, _rank_in_name(file))
            stopped = stopped_reason(file)
            if stopped:
                rank_run = dataclasses.replace(rank_run, exit_reason=f"capture stopped: {stopped}")
                stops.append(
                    f"capture stopped early on rank {rank_run.rank} ({stopped}): its events "
                    "after that point are missing; the script went on"
                )
            if rank_run.rank in ranks:
                raise BadRunDirectory(f"{file}: rank {rank_run.rank} appears twice")
            ranks[rank_run.rank] = rank_run
    if not ranks:  # nothing captured is not a clean run: there is nothing to report
        raise BadRunDirectory(
            f"{paths[0]}: the run holds no rank events (no ranks/rank-*.jsonl with events): "
            "nothing to report"
        )
    meta = _meta_from(meta_data, headers, meta_file or paths[0])
    meta = dataclasses.replace(meta, notes=(*meta.notes, *stops))
    return assemble(meta, ranks.values())


def _rank_in_name(file: Path) -> int | None:
    """``rank-00003.jsonl`` -> 3: the rank of a file whose header was lost."""
    digits = file.name.removeprefix("rank-").removesuffix(".jsonl")
    return int(digits) if digits.isdigit() and len(digits) <= 9 else None


def _note_dropped(events: list[dict[str, Any]], file: Path, notes: list[str]) -> None:
    """Lines of a rank file that were no event: counted, named, and said once per file."""
    dropped = [e for e in events if e.get("type") == DROPPED]
    if dropped:
        lines = ", ".join(str(e.get("line")) for e in dropped[:5])
        more = f" and {len(dropped) - 5} more" if len(dropped) > 5 else ""
        notes.append(
            f"{file.name}: {len(dropped)} line(s) could not be read and were dropped (line "
            f"{lines}{more}: {dropped[0].get('why')}); no finding is drawn from the windows "
            "that held them"
        )


def _last_attempt(
    events: list[dict[str, Any]], file: Path, notes: list[str]
) -> list[dict[str, Any]]:
    """A file with several headers holds several runs of the rank's script, one after the
    other (torchrun's ``--max-restarts``: every attempt appends to the same file): the last
    attempt is the job's outcome and is reported alone, with a note; windows of attempts
    that failed would otherwise read as extra, mismatched windows."""
    starts = [i for i, e in enumerate(events) if e.get("type") == "header"]
    if len(starts) < 2:
        return events
    notes.append(
        f"{file.name}: {len(starts)} attempts of the script (the launcher restarted it); "
        f"the last is reported, the {len(starts) - 1} before it are left out"
    )
    return events[starts[-1] :]


def build_run(meta: RunMeta, events_by_rank: dict[int, list[dict[str, Any]]]) -> Run:
    """Build a run from in-memory events (the ``track()`` API)."""
    return assemble(
        meta, (rank_from_events(events, rank) for rank, events in events_by_rank.items())
    )
