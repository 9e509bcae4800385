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
diagnoses them. Pickles are loaded with an unpickler that refuses every class and function,
so a file is read as data only (a dump holds dicts, lists, tuples, strings and numbers).
"""

from __future__ import annotations

import functools
import json
import pickle
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from syncscope.errors import SyncscopeError
from syncscope.model import normalize_op
from syncscope.model.flight import FlightDump, FlightEntry, Frame

__all__ = [
    "FlightDump",
    "FlightEntry",
    "Frame",
    "find_dumps",
    "is_dump_file",
    "read_dump",
    "read_dumps",
]

MAX_DUMP_BYTES = 2 * 1024**3  # a 20,000-entry buffer with stacks is tens of MB
_RANK_IN_NAME = re.compile(r"(\d+)$")


class BadDump(SyncscopeError):
    """A file that is not a readable Flight Recorder dump."""


class _DataOnly(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refused to load {module}.{name}: a dump holds data only")


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
    return bool(_sniff(head)) and _rank_of(path) is not None


def _rank_of(path: Path) -> int | None:
    name = path.name
    for suffix in (".json", ".pkl", ".pickle"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    m = _RANK_IN_NAME.search(name)
    return int(m.group(1)) if m else None


def _host_of(path: Path) -> str:
    """``nccl_trace_host-a_3`` -> ``host-a``: the word before the rank, where the name has one
    that is not a fixed prefix word (trace, rank, fr, dump)."""
    stem = re.sub(r"(\.json|\.pkl|\.pickle)$", "", path.name)
    words = [w for w in re.split(r"[_.]", _RANK_IN_NAME.sub("", stem)) if w]
    fixed = {"nccl", "trace", "rank", "fr", "dump", "json", "gloo", "debug", "info", "flight"}
    rest = [w for w in words if w.lower() not in fixed]
    return rest[-1] if rest else ""


def _load(path: Path) -> tuple[dict[str, Any], bool]:
    """The dump's dict and whether it was a pickle."""
    try:
        size = path.stat().st_size
        if size > MAX_DUMP_BYTES:
            raise BadDump(f"{path}: {size} bytes, over the {MAX_DUMP_BYTES} a dump may have")
        data = path.read_bytes()
    except OSError as exc:
        raise BadDump(f"{path}: cannot read ({exc.strerror or exc})") from None
    kind = _sniff(data[:4096])
    try:
        if kind == "pickle":
            import io

            loaded = _DataOnly(io.BytesIO(data)).load()
        elif kind == "json":
            loaded = json.loads(data)
        else:
            raise BadDump(f"{path}: not a Flight Recorder dump (neither its pickle nor its JSON)")
    except BadDump:
        raise
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError) as exc:
        what = "pickle" if kind == "pickle" else "JSON"
        raise BadDump(f"{path}: truncated or corrupt Flight Recorder {what} ({exc})") from None
    if not isinstance(loaded, dict) or not isinstance(loaded.get("entries"), list):
        raise BadDump(f"{path}: not a Flight Recorder dump (no 'entries' list)")
    return loaded, kind == "pickle"


def _ranks(value: object) -> tuple[int, ...]:
    """A group's ranks: ``"[0, 1]"`` (the recorder's string), a list, or a dict's "ranks"."""
    if isinstance(value, dict):
        value = value.get("ranks", ())
    if isinstance(value, str):
        return _parse_ranks(value)
    if isinstance(value, list | tuple) and all(isinstance(r, int) for r in value):
        return tuple(int(r) for r in value)
    return ()


@functools.lru_cache(maxsize=64)
def _parse_ranks(text: str) -> tuple[int, ...]:
    """``"[0, 1, 2]"``, once per distinct string (every rank of a job repeats each group's)."""
    try:
        value = json.loads(text.strip() or "[]")
    except ValueError:
        import ast

        try:
            value = ast.literal_eval(text.strip())
        except (ValueError, SyntaxError):
            return ()
    if isinstance(value, list) and all(isinstance(r, int) for r in value):
        return tuple(value)
    return ()


def _groups(config: object) -> dict[str, tuple[str, tuple[int, ...]]]:
    out: dict[str, tuple[str, tuple[int, ...]]] = {}
    if not isinstance(config, dict):
        return out
    for key, value in config.items():
        name = str(value.get("name", key)) if isinstance(value, dict) else str(key)
        desc = str(value.get("desc", "")) if isinstance(value, dict) else ""
        out[name] = (desc, _ranks(value))
    return out


def _sizes(value: object) -> tuple[tuple[int, ...], ...]:
    if not isinstance(value, list | tuple):
        return ()
    return tuple(tuple(int(d) for d in s) for s in value if isinstance(s, list | tuple))


def _int(value: object, default: int = 0) -> int:
    if type(value) is int:  # the usual case, first: called ~20 times an entry
        return value
    if isinstance(value, str):  # the JSON variant writes pg_status's numbers as strings
        text = value.strip()
        return int(text) if text.lstrip("-").isdigit() else default
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else default


def _opt_ns(value: object) -> int | None:
    """A discovered-at time: None, or 0 in the JSON variant, when never seen."""
    n = _int(value, 0)
    return n or None


_FRAMES: dict[object, object] = {}  # frames and stacks seen, shared: every rank repeats them


def _frames(value: object) -> tuple[Frame, ...]:
    if not isinstance(value, list):
        return ()
    if len(_FRAMES) > 1_000_000:
        _FRAMES.clear()
    out = []
    for f in value:
        if not isinstance(f, dict):
            continue
        key = (f.get("name"), f.get("filename"), f.get("line"))
        frame = _FRAMES.get(key)
        if frame is None:
            frame = Frame(str(key[0] or ""), str(key[1] or ""), _int(key[2]))
            _FRAMES[key] = frame
        out.append(frame)
    stack = tuple(out)
    return _FRAMES.setdefault(stack, stack)  # type: ignore[return-value]


def _entry(raw: dict[str, Any]) -> FlightEntry:
    pg = raw.get("process_group") or ("", "")
    pg_name, pg_desc = (str(pg[0]), str(pg[1])) if len(pg) >= 2 else (str(pg), "")
    profiling = str(raw.get("profiling_name") or "")
    backend, _, name = profiling.partition(":")
    if not name:
        backend, name = "", backend
    base = name.split(" ", 1)[0]
    seq = raw.get("collective_seq_id", raw.get("seq_id", 0))
    duration = raw.get("duration_ms")
    return FlightEntry(
        record_id=_int(raw.get("record_id")),
        pg_name=pg_name,
        pg_desc=pg_desc,
        pg_id=_int(raw.get("pg_id")),
        collective_seq_id=_int(seq),
        p2p_seq_id=_int(raw.get("p2p_seq_id")),
        op_id=_int(raw.get("op_id")),
        profiling_name=profiling,
        backend=backend,
        name=base,
        op=normalize_op(base),
        is_p2p=bool(raw.get("is_p2p", base in ("send", "recv"))),
        input_sizes=_sizes(raw.get("input_sizes")),
        input_dtypes=tuple(str(d) for d in raw.get("input_dtypes") or ()),
        output_sizes=_sizes(raw.get("output_sizes")),
        output_dtypes=tuple(str(d) for d in raw.get("output_dtypes") or ()),
        state=str(raw.get("state") or "scheduled"),
        time_created_ns=_int(raw.get("time_created_ns")),
        time_started_ns=_opt_ns(raw.get("time_discovered_started_ns")),
        time_completed_ns=_opt_ns(raw.get("time_discovered_completed_ns")),
        duration_ms=float(duration) if isinstance(duration, int | float) else None,
        retired=bool(raw.get("retired", False)),
        timeout_ms=_int(raw.get("timeout_ms")) or None,
        thread_name=str(raw.get("thread_name") or ""),
        frames=_frames(raw.get("frames")),
    )


def read_dump(path: Path) -> FlightDump:
    """One rank's dump; ``BadDump`` (one line) when it is not one or cannot be read."""
    rank = _rank_of(path)
    if rank is None:
        raise BadDump(
            f"{path}: no rank at the end of the file name (torch names dumps PREFIX<rank>)"
        )
    data, pickled = _load(path)
    try:
        entries = tuple(_entry(e) for e in data.get("entries") or () if isinstance(e, dict))
    except (TypeError, ValueError, AttributeError) as exc:
        raise BadDump(f"{path}: malformed Flight Recorder entry ({exc})") from None
    status = data.get("pg_status")
    return FlightDump(
        rank=rank,
        path=str(path),
        version=str(data.get("version", "")),
        groups=_groups(data.get("pg_config")),
        status={
            str(k): {str(a): _int(b, -1) for a, b in v.items()}
            for k, v in (status.items() if isinstance(status, dict) else ())
            if isinstance(v, dict)
        },
        entries=entries,
        has_frames=pickled and any(e.frames for e in entries),
        host=_host_of(path),
    )


def find_dumps(paths: Iterable[Path]) -> list[Path]:
    """The dump files among ``paths`` and, for directories, in them (not recursing into a
    syncscope run's other folders: a run keeps its dumps in ``flight/``)."""
    found: list[Path] = []
    for path in paths:
        if path.is_dir():
            candidates = sorted(p for p in path.iterdir() if p.is_file())
            flight = path / "flight"
            if flight.is_dir():
                candidates += sorted(p for p in flight.iterdir() if p.is_file())
            found.extend(p for p in candidates if is_dump_file(p))
        elif path.is_file() and is_dump_file(path):
            found.append(path)
    return found


def read_dumps(paths: Sequence[Path], skipped: list[str] | None = None) -> list[FlightDump]:
    """Every rank's dump; one per rank (a rank dumped twice, pickle beside JSON, keeps the
    pickle: it has the stacks). With ``skipped``, an unreadable dump is listed there
    (``path: why``) instead of raising."""
    by_rank: dict[int, FlightDump] = {}
    for path in paths:
        try:
            dump = read_dump(path)
        except BadDump as exc:
            if skipped is None:
                raise
            skipped.append(str(exc))
            continue
        old = by_rank.get(dump.rank)
        if old is None or (dump.has_frames and not old.has_frames):
            by_rank[dump.rank] = dump
        elif old.has_frames == dump.has_frames and Path(old.path).suffix == Path(path).suffix:
            raise BadDump(f"{path}: rank {dump.rank} dumped twice (also {old.path})")
    return [by_rank[r] for r in sorted(by_rank)]
