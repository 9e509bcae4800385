"""The fields of a Flight Recorder dump, each checked for type and range as it is read.

A dump is data from a cluster, perhaps cut short, garbled or built to hurt, so each value is
taken only in the shape torch writes it, within these bounds (docs/trace-analysis.md):

- integers (sequence numbers, ids, times, sizes) within 64 bits, as torch's are: no NaN or
  infinity, no 5,000-digit number; a tensor of at most 2**63 elements;
- text (names, paths, states, dtypes) of at most ``MAX_TEXT`` characters;
- ranks from 0 to ``MAX_RANK``;
- what the fields hold in all (entries, frames, tensors, dimensions, dtypes, groups) at most
  one per byte of the file, plus 4,096 (``Budget``): a pickle's shared references can make a
  2 MB file hold a million entries of a million frames each, and that is refused before it
  is walked, so reading is linear in the file's size;
- every entry a dict, every collective numbered from 1 (``collective_seq_id``; 0 is a
  point-to-point op's or a coalesced group's); within one dump a group's numbers, in order,
  step by at most ``MAX_SEQ_STEP`` (torch numbers a group's collectives one by one and the
  ring buffer keeps the latest: a number far past the others is a garbled one, which would
  read as a collective every other rank never issued).

A value out of shape raises ``Bad`` (one line, naming the entry and field); the reader
refuses the whole dump with it.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

from syncscope.model import normalize_op
from syncscope.model.flight import FlightEntry, Frame

__all__ = [
    "MAX_RANK",
    "MAX_SEQ_STEP",
    "MAX_TEXT",
    "Bad",
    "Budget",
    "check_sequences",
    "read_entry",
    "read_groups",
    "read_status",
]

MAX_TEXT = 4096  # characters of one name, path, state or dtype (PATH_MAX is 4096)
MAX_RANK = 2**31 - 1  # torch's ranks are C ints
INT64 = 2**63
SLACK = 4096
MAX_SEQ_STEP = 1_000_000  # between a group's consecutive numbers in one dump


class Bad(ValueError):
    """A dump's value out of the shape torch writes (the message names where)."""


class Budget:
    """What reading one dump's fields may visit: one element per byte of the file, plus
    ``SLACK``. torch's pickle spends at least two bytes on each element (a frame is a
    memo reference, an entry dozens of bytes), JSON more."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.left = size + SLACK

    def take(self, count: int) -> None:
        self.left -= count
        if self.left < 0:
            raise Bad(
                f"holds more entries, frames and sizes than its {self.size} bytes can "
                "(shared references: a pickle built to blow up)"
            )


def _kind(value: object) -> str:
    return type(value).__name__


def _digits(value: int) -> str:
    return f"a number of about {int(value.bit_length() * 0.30103) + 1} digits"


def read_int(value: object, what: str, default: int = 0) -> int:
    """A 64-bit integer: an int, a digit string (the JSON variant's pg_status), a whole
    float; None (never recorded) is ``default``."""
    if type(value) is int:  # the usual case, first: read ~20 times an entry
        if -INT64 <= value < INT64:
            return value
        raise Bad(f"{what} is {_digits(value)}, beyond 64 bits")
    if value is None or isinstance(value, bool):
        return default
    if isinstance(value, str):
        text = value.strip()
        if not text.lstrip("-").isdigit():
            return default  # "", "N/A": not recorded
        if len(text) > 20:
            raise Bad(f"{what} is a number of {len(text)} digits, beyond 64 bits")
        return read_int(int(text), what, default)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise Bad(f"{what} is {value} (not a finite number)")
        if not -INT64 <= value < INT64:
            raise Bad(f"{what} is {value:.3g}, beyond 64 bits")
        return int(value)
    raise Bad(f"{what} is a {_kind(value)}, not a number")


def read_text(value: object, what: str, default: str = "") -> str:
    if isinstance(value, str):
        if len(value) > MAX_TEXT:
            raise Bad(f"{what} is {len(value)} characters long (at most {MAX_TEXT})")
        return value
    if value is None:
        return default
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(read_int(value, what) if isinstance(value, int) else value)
    raise Bad(f"{what} is a {_kind(value)}, not text")


def _flag(value: object, what: str, default: bool) -> bool:
    if value is None:
        return default
    if isinstance(value, bool | int):
        return bool(value)
    raise Bad(f"{what} is a {_kind(value)}, not true or false")


def _list(value: object, what: str, budget: Budget) -> list[Any] | tuple[Any, ...]:
    if value is None:
        return ()
    if not isinstance(value, list | tuple):
        raise Bad(f"{what} is a {_kind(value)}, not a list")
    budget.take(len(value))
    return value


def _sizes(value: object, what: str, budget: Budget) -> tuple[tuple[int, ...], ...]:
    out = []
    for shape in _list(value, what, budget):
        dims = tuple(read_int(d, what) for d in _list(shape, what, budget))
        numel = 1
        for d in dims:
            if d < 0:
                raise Bad(f"{what} holds a negative size ({d})")
            numel *= d
            if numel >= INT64:
                raise Bad(f"{what} holds a tensor of more than 2**63 elements")
        out.append(dims)
    return tuple(out)


_FRAMES: dict[object, Any] = {}  # frames and stacks seen, shared: every rank repeats them


def _frames(value: object, what: str, budget: Budget) -> tuple[Frame, ...]:
    if len(_FRAMES) > 1_000_000:
        _FRAMES.clear()
    out = []
    for f in _list(value, what, budget):
        if not isinstance(f, dict):
            raise Bad(f"{what} holds a {_kind(f)}, not a frame")
        key = (
            read_text(f.get("name"), what),
            read_text(f.get("filename"), what),
            read_int(f.get("line"), what),
        )
        frame = _FRAMES.get(key)
        if frame is None:
            frame = _FRAMES.setdefault(key, Frame(*key))
        out.append(frame)
    stack = tuple(out)
    return _FRAMES.setdefault(stack, stack)  # type: ignore[no-any-return]


def _process_group(value: object, what: str) -> tuple[str, str]:
    if isinstance(value, list | tuple):
        if len(value) >= 2:
            return read_text(value[0], what), read_text(value[1], what)
        return (read_text(value[0], what) if value else ""), ""
    return read_text(value, what), ""


def _duration(value: object, what: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, int | float) and not isinstance(value, bool):
        number = float(read_int(value, what)) if isinstance(value, int) else value
        if math.isfinite(number):
            return number
        raise Bad(f"{what} is {number} (not a finite number)")
    raise Bad(f"{what} is a {_kind(value)}, not a number")


def read_entry(raw: object, index: int, budget: Budget) -> FlightEntry:
    """Entry ``index`` of the dump's ``entries``."""
    where = f"entry {index}"
    if not isinstance(raw, dict):
        raise Bad(f"{where} is a {_kind(raw)}, not a dict")

    def text(key: str, default: str = "") -> str:
        return read_text(raw.get(key), f"{where}: {key}", default)

    def number(key: str, default: int = 0) -> int:
        return read_int(raw.get(key), f"{where}: {key}", default)

    pg_name, pg_desc = _process_group(raw.get("process_group"), f"{where}: process_group")
    profiling = text("profiling_name")
    backend, _, name = profiling.partition(":")
    if not name:
        backend, name = "", backend
    base = name.split(" ", 1)[0]
    is_p2p = _flag(raw.get("is_p2p"), f"{where}: is_p2p", base in ("send", "recv"))
    seq_key = "collective_seq_id" if "collective_seq_id" in raw else "seq_id"
    seq = number(seq_key)
    if seq < 0 or (seq == 0 and not is_p2p and base != "coalesced"):
        raise Bad(
            f"{where}: {seq_key} is {seq} on a collective (torch numbers each group's "
            "collectives from 1)"
        )
    dtypes_in = _list(raw.get("input_dtypes"), f"{where}: input_dtypes", budget)
    dtypes_out = _list(raw.get("output_dtypes"), f"{where}: output_dtypes", budget)
    return FlightEntry(
        record_id=number("record_id"),
        pg_name=pg_name,
        pg_desc=pg_desc,
        pg_id=number("pg_id"),
        collective_seq_id=seq,
        p2p_seq_id=number("p2p_seq_id"),
        op_id=number("op_id"),
        profiling_name=profiling,
        backend=backend,
        name=base,
        op=normalize_op(base),
        is_p2p=is_p2p,
        input_sizes=_sizes(raw.get("input_sizes"), f"{where}: input_sizes", budget),
        input_dtypes=tuple(read_text(d, f"{where}: input_dtypes") for d in dtypes_in),
        output_sizes=_sizes(raw.get("output_sizes"), f"{where}: output_sizes", budget),
        output_dtypes=tuple(read_text(d, f"{where}: output_dtypes") for d in dtypes_out),
        state=text("state") or "scheduled",
        time_created_ns=number("time_created_ns"),
        time_started_ns=number("time_discovered_started_ns") or None,  # 0 in JSON: never
        time_completed_ns=number("time_discovered_completed_ns") or None,
        duration_ms=_duration(raw.get("duration_ms"), f"{where}: duration_ms"),
        retired=_flag(raw.get("retired"), f"{where}: retired", False),
        timeout_ms=number("timeout_ms") or None,
        thread_name=text("thread_name"),
        frames=_frames(raw.get("frames"), f"{where}: frames", budget),
    )


def _parse_ranks(text: str, what: str) -> tuple[int, ...]:
    """``"[0, 1, 2]"`` (the recorder's string; ``"(0, 1)"`` reads the same); () where the
    string is no list of ranks (gloo writes ``"[]"``)."""
    body = text.strip()
    if len(body) < 2 or body[0] not in "[(" or body[-1] not in "])":
        return ()
    ranks = []
    for part in body[1:-1].split(","):
        word = part.strip()
        if not word:
            continue
        if not word.isdigit():
            return ()
        ranks.append(read_rank(int(word) if len(word) <= 10 else MAX_RANK + 1, what))
    return tuple(ranks)


def read_rank(value: int, what: str) -> int:
    if not 0 <= value <= MAX_RANK:
        shown = str(value) if abs(value) < INT64 else _digits(value)
        raise Bad(f"{what}: rank {shown} is not one of 0 to {MAX_RANK}")
    return value


def _ranks(value: object, what: str, budget: Budget) -> tuple[int, ...]:
    """A group's ranks: ``"[0, 1]"`` (the recorder's string), a list, or a dict's "ranks"."""
    if isinstance(value, dict):
        value = value.get("ranks", ())
    ranks: tuple[int, ...] = ()
    if isinstance(value, str):
        budget.take(value.count(","))
        ranks = _parse_ranks(value, what)
    elif isinstance(value, list | tuple):
        budget.take(len(value))
        if all(type(r) is int for r in value):
            ranks = tuple(read_rank(r, what) for r in value)
    if len(set(ranks)) != len(ranks):  # a member counted twice hides one that is missing
        twice = next(r for r in ranks if ranks.count(r) > 1)
        raise Bad(f"{what}: rank {twice} appears twice in its ranks")
    return ranks


def read_groups(config: object, budget: Budget) -> dict[str, tuple[str, tuple[int, ...]]]:
    """``pg_config``: group name -> (description, global ranks)."""
    out: dict[str, tuple[str, tuple[int, ...]]] = {}
    if config is not None and not isinstance(config, dict):
        raise Bad(f"pg_config is a {_kind(config)}, not a mapping of groups")
    if not isinstance(config, dict):
        return out
    budget.take(len(config))
    for key, value in config.items():
        what = f"pg_config: group {read_text(key, 'pg_config: a group')[:64]}"
        fields = value if isinstance(value, dict) else {}
        name = read_text(fields.get("name", key), what)
        out[name] = (read_text(fields.get("desc"), what), _ranks(value, what, budget))
    return out


def read_status(status: object, budget: Budget) -> dict[str, dict[str, int]]:
    """``pg_status``: group id -> last enqueued/started/completed collective (-1: none)."""
    if not isinstance(status, dict):
        return {}
    budget.take(len(status))
    out: dict[str, dict[str, int]] = {}
    for key, value in status.items():
        if not isinstance(value, dict):
            continue
        budget.take(len(value))
        group = read_text(key, "pg_status: a group")
        what = f"pg_status: group {group[:64]}"
        out[group] = {
            read_text(a, what): read_int(b, f"{what}: {str(a)[:64]}", -1) for a, b in value.items()
        }
    return out


def check_sequences(entries: tuple[FlightEntry, ...]) -> None:
    """Each group's collective numbers, in order, step by at most ``MAX_SEQ_STEP``."""
    by_group: dict[str, set[int]] = {}
    for e in entries:
        if not e.is_p2p and e.collective_seq_id > 0:
            by_group.setdefault(e.pg_name, set()).add(e.collective_seq_id)
    for group, numbers in by_group.items():
        ordered = sorted(numbers)
        for a, b in itertools.pairwise(ordered):
            if b - a > MAX_SEQ_STEP:
                raise Bad(
                    f"group {group[:64] or 'default'}: collective_seq_id steps from {a} to {b} "
                    f"(at most {MAX_SEQ_STEP} apart: torch numbers a group's collectives one "
                    "by one)"
                )
