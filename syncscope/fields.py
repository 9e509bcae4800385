"""Typed getters for the files syncscope reads: one line naming file, field and problem.

Every value read from a run directory, an event file, ``meta.json``, a Kineto trace or a
``report.json`` passes through one of these where it is parsed, so a malformed input is a
``SyncscopeError`` (exit status 2) naming what was wrong, never a traceback. Counts that
would size an allocation (world size, ranks) are only ever compared with what the files
hold (``missing_rank_runs``), never used to allocate.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

from syncscope.errors import SyncscopeError

# the largest number a run directory's field may hold: what a writer offers beyond it (a
# ``--hang-timeout`` of 1e308) would make its own run unreadable
SANE_MAX = 1e18
_MISSING: Any = object()
# Nanosecond timestamps and byte counts beyond this are not from any real run (year 2262)
MAX_INT = 2**63 - 1


def _where(file: object, field: str) -> str:
    return f"{file}: {field}"


def bad(file: object, field: str, what: str, error: type[SyncscopeError] = SyncscopeError) -> Any:
    """Raise the one-line error for ``field`` of ``file``."""
    raise error(f"{_where(file, field)} {what}")


def _type_name(value: object) -> str:
    return "null" if value is None else type(value).__name__


def field_int(
    obj: dict[str, Any],
    key: str,
    file: object,
    *,
    min: int | None = 0,  # reads as the field's range
    max: int = MAX_INT,
    default: Any = _MISSING,
    label: str = "",
    error: type[SyncscopeError] = SyncscopeError,
) -> Any:
    """``obj[key]`` as an int in [min, max]; ``default`` when absent or null (if given)."""
    name = label or key
    value = obj.get(key, _MISSING) if isinstance(obj, dict) else _MISSING
    if value is _MISSING or value is None:
        if default is _MISSING:
            bad(file, name, "is missing", error)
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer() and abs(value) <= MAX_INT:
            value = int(value)
        else:
            bad(file, name, f"must be an integer, not {_type_name(value)} {_short(value)}", error)
    if min is not None and value < min:
        bad(file, name, f"must be at least {min}, not {value}", error)
    if value > max:
        bad(file, name, f"must be at most {max}, not {value}", error)
    return value


def field_float(
    obj: dict[str, Any],
    key: str,
    file: object,
    *,
    min: float | None = None,
    default: Any = _MISSING,
    label: str = "",
    error: type[SyncscopeError] = SyncscopeError,
) -> Any:
    """``obj[key]`` as a finite number (>= min)."""
    name = label or key
    value = obj.get(key, _MISSING) if isinstance(obj, dict) else _MISSING
    if value is _MISSING or value is None:
        if default is _MISSING:
            bad(file, name, "is missing", error)
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        bad(file, name, f"must be a number, not {_type_name(value)} {_short(value)}", error)
    if not math.isfinite(value) or abs(value) > SANE_MAX:
        bad(file, name, f"must be a finite number of sane size, not {value!r}", error)
    if min is not None and value < min:
        bad(file, name, f"must be at least {min}, not {value}", error)
    return float(value)


def field_str(
    obj: dict[str, Any],
    key: str,
    file: object,
    *,
    default: Any = _MISSING,
    label: str = "",
    error: type[SyncscopeError] = SyncscopeError,
) -> Any:
    name = label or key
    value = obj.get(key, _MISSING) if isinstance(obj, dict) else _MISSING
    if value is _MISSING or value is None:
        if default is _MISSING:
            bad(file, name, "is missing", error)
        return default
    if not isinstance(value, str):
        bad(file, name, f"must be a string, not {_type_name(value)} {_short(value)}", error)
    return value


def field_of(
    obj: dict[str, Any],
    key: str,
    file: object,
    kind: type | tuple[type, ...],
    *,
    default: Any = None,
    label: str = "",
    error: type[SyncscopeError] = SyncscopeError,
) -> Any:
    """``obj[key]`` when it is a ``kind`` (dict, list, bool...); ``default`` when absent/null."""
    value = obj.get(key) if isinstance(obj, dict) else None
    if value is None:
        return default
    if not isinstance(value, kind):
        names = " or ".join(
            _KIND_NAMES.get(k, k.__name__) for k in (kind if isinstance(kind, tuple) else (kind,))
        )
        bad(file, label or key, f"must be {names}, not {_type_name(value)} {_short(value)}", error)
    return value


def list_of(
    values: list[Any],
    file: object,
    field: str,
    kind: type | tuple[type, ...],
    error: type[SyncscopeError] = SyncscopeError,
) -> list[Any]:
    """Every item of ``values`` is a ``kind`` (bools are not numbers)."""
    kinds = set(kind) if isinstance(kind, tuple) else {kind}
    if set(map(type, values)) <= kinds - {bool, float}:  # at C speed: a 16k-rank group list
        return values
    for i, item in enumerate(values):
        if isinstance(item, bool) or not isinstance(item, kind):
            names = _KIND_NAMES.get(kind, getattr(kind, "__name__", "number"))
            bad(file, f"{field}[{i}]", f"must be {names}, not {_type_name(item)}", error)
        if isinstance(item, float) and not math.isfinite(item):
            bad(file, f"{field}[{i}]", f"must be finite, not {item!r}", error)
    return values


_KIND_NAMES: dict[Any, str] = {
    dict: "an object",
    list: "a list",
    str: "a string",
    int: "an integer",
    bool: "true or false",
    float: "a number",
    (int, float): "a number",
}


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


# -- rank event files (ranks/rank-NNNNN.jsonl) ----------------------------------------------
_EVENT_INTS = frozenset(
    {"t", "seq", "bytes", "t_end", "mem", "cuda_peak", "params", "param_bytes", "window"}
    | {"pid", "local_rank", "rank", "shard_world", "bucket_cap_bytes", "windows"}
)
_EVENT_ANY_INTS = frozenset({"depth", "status", "bucket"})
_EVENT_DICTS = frozenset({"site", "accelerate"})
_EVENT_STRS = frozenset({"type", "host"})
_REQUIRED: dict[str, tuple[str, ...]] = {"done": ("seq", "t"), "coll": ("seq", "t")}
_REQUIRED["call"] = ("seq", "t")
_REQUIRED.update({"bwd": ("t",), "fp": ("window", "fp")})


def check_event(ev: dict[str, Any], file: object, number: int) -> None:
    """Check the fields of event ``number`` (1-based) of a rank's event file."""
    where = f"{file}: event {number}"
    for key, value in ev.items():
        if key in _EVENT_INTS:
            if value is None and key != "t":
                continue
            field_int(ev, key, where)
        elif key in _EVENT_ANY_INTS:
            field_int(ev, key, where, min=None, max=MAX_INT, default=None)
        elif key == "version":  # the header's format version; a framework's is its package's
            if ev.get("type") == "framework":
                field_str(ev, key, where, default=None)
            else:
                field_int(ev, key, where, min=None, max=MAX_INT, default=None)
        elif key == "world_size":
            field_int(ev, key, where, min=1, default=None)
        elif key in _EVENT_STRS:
            field_str(ev, key, where, default=None)
        elif key in _EVENT_DICTS:
            site = field_of(ev, key, where, dict)
            if key == "site" and site is not None:
                field_int(site, "line", where, default=0, label="site.line")
        elif key == "sync" and ev.get("type") == "bwd":
            field_of(ev, key, where, dict)
        elif key == "fp":
            if value is not None:
                list_of(field_of(ev, key, where, list), where, key, (int, float))
        elif key == "group":
            if value is not None:
                list_of(field_of(ev, key, where, list), where, key, int)
        elif key == "argv":
            list_of(field_of(ev, key, where, list, default=[]), where, key, str)
    for key in _REQUIRED.get(ev.get("type", ""), ()):
        if ev.get(key) is None:
            bad(where, key, f"is missing (a {ev.get('type')!r} event needs it)")


def check_bounds(
    windows: str | None,
    skip_windows: str | None,
    then: str | None,
    names: tuple[str, str, str] = ("--windows", "--skip-windows", "--then"),
) -> tuple[int | None, int, str]:
    """Validate bounded-capture values: (windows or None, skip_windows, then), for
    ``profile``'s options and a rank's environment alike (syncscope/launch/attach.py).

    Raises ValueError with a one-line message naming the option (or variable) at fault."""

    def count(name: str, value: str, least: int) -> int:
        text = value.strip()
        if not text.isdigit() or int(text) < least:
            kind = "a positive integer" if least else "a non-negative integer"
            raise ValueError(f"{name} must be {kind}, not {value!r}")
        return int(text)

    n = None if windows is None else count(names[0], windows, 1)
    w = 0 if skip_windows is None else count(names[1], skip_windows, 0)
    t = "run" if then is None else then.strip()
    if t not in ("run", "stop"):
        raise ValueError(f"{names[2]} must be run or stop, not {then!r}")
    if t == "stop" and n is None:
        raise ValueError(f"{names[2]} stop needs {names[0]} N (the windows to capture first)")
    return n, w, t


def _calls_read(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each ``call`` record as its collective's ``coll`` where no ``coll`` of its ``seq``
    follows it (the call never returned), else left out (the ``coll`` has the call's times)."""
    if not any(ev.get("type") == "call" for ev in events):
        return events  # a file from before ``call`` records, or of no blocking collective
    returned = {ev["seq"] for ev in events if ev.get("type") == "coll"}
    out = []
    for ev in events:
        if ev.get("type") == "call":
            if ev["seq"] in returned:
                continue
            ev = {**ev, "type": "coll"}
        out.append(ev)
    return out


def check_sequence(
    events: list[dict[str, Any]], name: str
) -> tuple[list[dict[str, Any]], list[str]]:
    """A rank file's ``coll`` and ``done`` records made one per ``seq`` and read in ``seq``
    order, with a note for each thing set right (``name``: the file, for the notes).

    - A ``coll`` repeating an earlier one's ``seq`` (the same record written twice) is left
      out: counted twice it would be a collective the rank never issued, a false mismatch
      with every other rank. A repeated ``done``: the first (the earliest completion) is kept.
    - ``coll`` records out of ``seq`` order (``seq`` is the order of issue on the rank): the
      places ``coll`` records hold in the file take them in ``seq`` order, so every other
      event, and the window each place is in, stays where it was written.
    - A ``call`` (a blocking collective's record, written before its call) is read as its
      ``coll`` where that never came (the process ended inside the call), else left out.
    """
    events = _calls_read(events)
    colls = [ev["seq"] for ev in events if ev.get("type") == "coll"]
    dones = [ev["seq"] for ev in events if ev.get("type") == "done"]
    in_order = all(a < b for a, b in itertools.pairwise(colls))
    if in_order and len(set(dones)) == len(dones):
        return events, []  # the usual file: nothing to set right, nothing copied
    kept: list[dict[str, Any]] = []
    places: list[int] = []
    seen: tuple[set[int], set[int]] = (set(), set())
    repeats = [0, 0]
    for ev in events:
        kind = ev.get("type")
        if kind in ("coll", "done"):
            which = 0 if kind == "coll" else 1
            if ev["seq"] in seen[which]:
                repeats[which] += 1
                continue
            seen[which].add(ev["seq"])
            if which == 0:
                places.append(len(kept))
        kept.append(ev)
    notes: list[str] = []
    if repeats[0] or repeats[1]:
        notes.append(
            f"{name}: {repeats[0]} collective and {repeats[1]} completion record(s) repeat an "
            "earlier record's seq (written twice): each is counted once"
        )
    issued = [kept[i] for i in places]
    ordered = sorted(issued, key=lambda ev: int(ev["seq"]))
    moved = sum(a is not b for a, b in zip(issued, ordered, strict=True))
    if moved:
        for place, ev in zip(places, ordered, strict=True):
            kept[place] = ev
        notes.append(
            f"{name}: {moved} collective record(s) written out of seq order: read in seq "
            "order (the order the rank issued them)"
        )
    return kept, notes
