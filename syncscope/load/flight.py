"""torch Flight Recorder dumps: one file per rank, pickle or JSON, as torch 2.4-2.13 write them.

The Flight Recorder (``TORCH_FR_BUFFER_SIZE``, formerly ``TORCH_NCCL_TRACE_BUFFER_SIZE``)
keeps a ring buffer of every collective a rank issued; ``ProcessGroupNCCL``'s watchdog dumps
it on a timeout to ``<TORCH_FR_DUMP_TEMP_FILE><rank>`` (formerly
``TORCH_NCCL_DEBUG_INFO_TEMP_FILE``), and ``torch._C._distributed_c10d._dump_fr_trace()`` /
``_dump_fr_trace_json()`` return it on request (gloo included). A dump is a dict: ``version``
("2.2" ... "2.10"), ``pg_config`` (group name -> name, desc, ranks as a string),
``pg_status`` (group id -> last enqueued/started/completed collective), ``entries`` (one per
collective: ``process_group`` (name, desc), ``collective_seq_id``, ``p2p_seq_id``,
``op_id``, ``profiling_name`` like ``nccl:all_reduce``, sizes and dtypes, ``state``,
``frames`` (pickle only), ...). The file names carry the rank, as the last digits of the
name (``fr_3``, ``nccl_trace_rank_3``, ``host-a_3.json``): a dump holds no rank of its own.

This module reads the files into plain records; ``syncscope.analysis.flight`` aligns and
diagnoses them. A file is a copy from a cluster, so every input is bounded
(``syncscope.load.flight_decode`` for the bytes, ``flight_fields`` for the values): a file
that breaks a bound is one ``BadDump`` line, never a traceback, and never a partial read:
an entry that cannot be read refuses the whole dump rather than dropping the entry (a dropped
entry would read as a collective the rank never issued).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from syncscope.errors import SyncscopeError
from syncscope.load.flight_decode import decode_json, decode_pickle
from syncscope.load.flight_fields import (
    MAX_RANK,
    Bad,
    Budget,
    check_sequences,
    read_entry,
    read_groups,
    read_status,
)
from syncscope.model.flight import FlightDump, FlightEntry, Frame

__all__ = [
    "MAX_DUMP_BYTES",
    "BadDump",
    "FlightDump",
    "FlightEntry",
    "Frame",
    "find_dumps",
    "is_dump_file",
    "read_dump",
    "read_dumps",
]

MAX_DUMP_BYTES = 256 * 1024**2  # a 20,000-entry buffer with stacks is 3 to 30 MB
_RANK_IN_NAME = re.compile(r"(\d+)$")
_SUFFIXES = (".json", ".pkl", ".pickle")


class BadDump(SyncscopeError):
    """A file that is not a readable Flight Recorder dump (``rank``: the one its name says)."""

    def __init__(self, message: str, rank: int | None = None) -> None:
        super().__init__(message)
        self.rank = rank


_KINETO_KEYS = (b'"traceEvents"', b'"schemaVersion"', b'"distributedInfo"', b'"deviceProperties"')


def _sniff(head: bytes) -> str:
    """ "pickle", "json" or "" from a file's first bytes."""
    if head[:1] == b"\x80":
        known = b"pg_config" in head or b"entries" in head or b"version" in head[:64]
        return "pickle" if known else ""  # torch writes "version" first
    text = head.lstrip()[:4096]
    if text[:1] != b"{" or any(k in text for k in _KINETO_KEYS):
        return ""  # a Kineto trace carries "pg_config" too, in its distributedInfo
    return "json" if any(k in text for k in (b'"comm_lib_version"', b'"entries"')) else ""


def is_dump_file(path: Path) -> bool:
    """A Flight Recorder dump by its content (pickle or JSON with the recorder's keys)."""
    try:
        with path.open("rb") as fh:
            head = fh.read(4096)
    except OSError:
        return False
    return bool(_sniff(head)) and _name_parts(path) is not None


def _name_parts(path: Path) -> tuple[str, str, str] | None:
    """``fr_json_3.json`` -> ``("fr_json_", "3", ".json")``: (prefix, rank digits, suffix)."""
    name, suffix = path.name, ""
    for known in _SUFFIXES:
        if name.endswith(known):
            name, suffix = name[: -len(known)], known
    m = _RANK_IN_NAME.search(name)
    return (name[: m.start()], m.group(1), suffix) if m else None


def _rank_of(path: Path) -> int:
    parts = _name_parts(path)
    if parts is None:
        raise Bad("no rank at the end of the file name (torch names dumps PREFIX<rank>)")
    digits = parts[1].lstrip("0") or "0"
    if len(digits) > len(str(MAX_RANK)) or int(digits) > MAX_RANK:
        raise Bad(
            f"the rank in the file name ({len(digits)} digits) is beyond any job's "
            f"(ranks go up to {MAX_RANK})"
        )
    return int(digits)


def _host_of(path: Path) -> str:
    """``nccl_trace_host-a_3`` -> ``host-a``: the word before the rank, where the name has one
    that is not a fixed prefix word (trace, rank, fr, dump)."""
    stem = re.sub(r"(\.json|\.pkl|\.pickle)$", "", path.name)
    words = [w for w in re.split(r"[_.]", _RANK_IN_NAME.sub("", stem)) if w]
    fixed = {"nccl", "trace", "rank", "fr", "dump", "json", "gloo", "debug", "info", "flight"}
    rest = [w for w in words if w.lower() not in fixed]
    return rest[-1] if rest else ""


def _load(path: Path) -> tuple[dict[str, Any], bool, int]:
    """The dump's dict, whether it was a pickle, and its size in bytes."""
    try:
        size = path.stat().st_size
        if size > MAX_DUMP_BYTES:
            raise Bad(f"{size} bytes, over the {MAX_DUMP_BYTES} a dump may have")
        data = path.read_bytes()
    except OSError as exc:
        raise Bad(f"cannot read ({exc.strerror or exc})") from None
    if not data.strip():
        raise Bad(f"empty ({len(data)} bytes): the rank's dump was not written")
    kind = _sniff(data[:4096])
    if not kind:  # a file named like its job's other dumps, cut short or garbled
        kind = "pickle" if data[:1] == b"\x80" else "json" if data.lstrip()[:1] == b"{" else ""
    what = "pickle" if kind == "pickle" else "JSON"
    try:
        if not kind:
            raise Bad("not a Flight Recorder dump (neither its pickle nor its JSON)")
        loaded = decode_pickle(data) if kind == "pickle" else decode_json(data)
    except ValueError as exc:
        raise Bad(f"truncated or corrupt Flight Recorder {what} ({exc})") from None
    if not isinstance(loaded, dict) or not isinstance(loaded.get("entries"), list):
        raise Bad("not a Flight Recorder dump (no 'entries' list)")
    return loaded, kind == "pickle", len(data)


def read_dump(path: Path) -> FlightDump:
    """One rank's dump; ``BadDump`` (one line) when it is not one, cannot be read, or breaks
    a bound (docs/trace-analysis.md, "Bounds")."""
    try:
        rank = _rank_of(path)
    except Bad as exc:
        raise BadDump(f"{path}: {exc}") from None
    try:
        data, pickled, size = _load(path)
        budget = Budget(size)
        raw_entries: list[Any] = data["entries"]
        budget.take(len(raw_entries))
        entries = tuple(read_entry(e, i, budget) for i, e in enumerate(raw_entries))
        check_sequences(entries)
        groups = read_groups(data.get("pg_config"), budget)
        status = read_status(data.get("pg_status"), budget)
        version = data.get("version", "")
        if not isinstance(version, str | int | float) or len(str(version)) > 64:
            raise Bad("'version' is not a format version")
    except Bad as exc:
        raise BadDump(f"{path}: {exc}", rank) from None
    return FlightDump(
        rank=rank,
        path=str(path),
        version=str(version),
        groups=groups,
        status=status,
        entries=entries,
        has_frames=pickled and any(e.frames for e in entries),
        host=_host_of(path),
    )


def _siblings(found: Sequence[Path], others: Iterable[Path]) -> list[Path]:
    """The files among ``others`` named as the dumps in ``found`` are (the same folder,
    prefix and suffix, another rank) but unreadable as dumps: the job's dumps that came out
    empty, cut short or garbled. They are read (and refused, or skipped and named) rather
    than passed over, so a rank's missing dump is never silent."""
    patterns = set()
    for p in found:
        parts = _name_parts(p)
        if parts is not None:
            patterns.add((p.parent, parts[0], parts[2]))
    out = []
    for p in others:
        parts = _name_parts(p)
        named_so = parts is not None and (p.parent, parts[0], parts[2]) in patterns
        if p not in found and named_so and not _is_kineto(p):  # a trace is still a trace
            out.append(p)
    return out


def _is_kineto(path: Path) -> bool:
    try:
        with path.open("rb") as fh:
            head = fh.read(4096).lstrip()
    except OSError:
        return False
    return head[:1] == b"{" and any(k in head for k in _KINETO_KEYS)


def find_dumps(paths: Iterable[Path]) -> list[Path]:
    """The dump files among ``paths`` and, for directories, in them (not recursing into a
    syncscope run's other folders: a run keeps its dumps in ``flight/``), with the files named
    like them that did not read as dumps (``_siblings``)."""
    found: list[Path] = []
    for path in paths:
        if path.is_dir():
            candidates = sorted(p for p in path.iterdir() if p.is_file())
            flight = path / "flight"
            if flight.is_dir():
                candidates += sorted(p for p in flight.iterdir() if p.is_file())
            dumps = [p for p in candidates if is_dump_file(p)]
            found.extend(sorted(dumps + _siblings(dumps, candidates)))
        elif path.is_file() and is_dump_file(path):
            found.append(path)
    return found


def dumps_among(paths: Sequence[Path]) -> list[Path]:
    """The files of ``paths`` that are dumps, or named as those are (``_siblings``)."""
    dumps = [p for p in paths if is_dump_file(p)]
    return [p for p in paths if p in dumps or p in _siblings(dumps, paths)]


def read_dumps(
    paths: Sequence[Path], skipped: list[str] | None = None, skipped_ranks: list[int] | None = None
) -> list[FlightDump]:
    """Every rank's dump; one per rank (a rank dumped twice, pickle beside JSON, keeps the
    pickle: it has the stacks). With ``skipped``, an unreadable dump is listed there
    (``path: why``) instead of raising, and its rank (where its name has one) in
    ``skipped_ranks``."""
    by_rank: dict[int, FlightDump] = {}
    for path in paths:
        try:
            dump = read_dump(path)
        except BadDump as exc:
            if skipped is None:
                raise
            skipped.append(str(exc))
            if skipped_ranks is not None and exc.rank is not None:
                skipped_ranks.append(exc.rank)
            continue
        old = by_rank.get(dump.rank)
        if old is None or (dump.has_frames and not old.has_frames):
            by_rank[dump.rank] = dump
        elif old.has_frames == dump.has_frames and Path(old.path).suffix == Path(path).suffix:
            raise BadDump(f"{path}: rank {dump.rank} dumped twice (also {old.path})")
    return [by_rank[r] for r in sorted(by_rank)]
