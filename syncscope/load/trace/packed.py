"""Column-packed rows of a frozen dataclass: the memory-lean form of a rank's collectives.

A trace of a long job gives every rank thousands of collectives and micro-batches, and a
``Run`` holds every rank's. As objects, one ``Collective`` costs about 280 bytes (the object
and its three timestamps); packed into columns it costs about 40: integers go into
``array('q')``, every other field into a small code that indexes a table of its distinct
values (op names, groups, phases: a handful per rank).

``Packed.of(rows)`` packs a list of dataclass instances; ``packed[lo:hi]`` is a ``Rows``
view, an immutable ``Sequence`` of the original type that makes each row when it is read.
``Window.collectives`` and ``Window.micro_batches`` hold either a tuple (live captures) or
such a view (traces): readers see a sequence of the same objects either way, and views
compare and hash as the tuples they stand for.
"""

from __future__ import annotations

import dataclasses
from array import array
from collections.abc import Iterator, Sequence
from typing import Any, Generic, TypeVar, overload

T = TypeVar("T")

_NONE = -(2**63)  # stands for None in an integer column

# Rows made, by (packed, lo, hi): the analysis and the reports read every window's
# collectives a dozen times over (counts, bytes, rounds, streams, tables), so each window's
# are made once while they fit here. Bounded by rows (~280 bytes each, 70 MiB in all). Past
# it, rows made later replace only the last ones kept: the analysis reads every window in
# turn, pass after pass, and a cache that let the oldest go would keep none of them by the
# time a pass came back, where this one keeps the same ones for every pass.
_MADE_MAX_ROWS = 1 << 18
_made: dict[tuple[int, int, int], tuple[Packed[Any], list[Any]]] = {}
_made_rows = 0


def _recall(key: tuple[int, int, int]) -> list[Any] | None:
    hit = _made.get(key)
    return None if hit is None else hit[1]


def forget_made() -> None:
    """Let go of every row made (reading a trace makes some as it builds a rank; they are of
    no use to the analysis that comes after, and would keep the rank's store alive)."""
    global _made_rows
    _made.clear()
    _made_rows = 0


def _remember(key: tuple[int, int, int], packed: Packed[Any], made: list[Any]) -> None:
    """Keep ``made`` (the packed kept alive while its id is in a key). Without a lock (no
    ``threading`` import for analyze): another thread can at worst make rows twice."""
    global _made_rows
    if len(made) > _MADE_MAX_ROWS or key in _made:
        return
    while _made_rows + len(made) > _MADE_MAX_ROWS:
        try:
            _, (_, gone) = _made.popitem()  # the last kept
        except KeyError:  # emptied by another thread
            _made_rows = 0
            break
        _made_rows -= len(gone)
    _made[key] = (packed, made)
    _made_rows += len(made)


def _is_int(value: object) -> bool:
    return value is None or (type(value) is int and value != _NONE)


def _int_column(values: list[Any]) -> tuple[array[int], bool]:
    """Integers in the smallest signed array type that holds them (None: 'q' and _NONE)."""
    if any(v is None for v in values):
        return array("q", [_NONE if v is None else v for v in values]), True
    lo, hi = (min(values), max(values)) if values else (0, 0)
    for typecode, bits in (("b", 8), ("h", 16), ("i", 32)):
        if -(2 ** (bits - 1)) <= lo and hi < 2 ** (bits - 1):
            return array(typecode, values), False
    return array("q", values), False


def _coded_column(values: list[Any]) -> tuple[array[int], list[Any]]:
    codes: dict[Any, int] = {}
    table: list[Any] = []
    out: list[int] = []
    for v in values:
        key = (type(v), v)  # True and 1 stay apart
        code = codes.get(key)
        if code is None:
            code = codes[key] = len(table)
            table.append(v)
        out.append(code)
    typecode = "B" if len(table) <= 0xFF else "H" if len(table) <= 0xFFFF else "I"
    return array(typecode, out), table


def _few(values: list[Any], limit: int = 0xFF) -> bool:
    """At most ``limit`` distinct values: a one-byte code beats the integers themselves."""
    seen: set[Any] = set()
    for v in values:
        seen.add((type(v), v))
        if len(seen) > limit:
            return False
    return True


class Packed(Generic[T]):
    """All rows of one dataclass type, column by column (see the module docstring)."""

    __slots__ = ("columns", "count", "kind")

    def __init__(
        self,
        kind: type[T],
        count: int,
        columns: tuple[tuple[array[int], list[Any] | None, bool], ...],
    ) -> None:
        self.kind = kind
        self.count = count
        # per field: (values or codes, table of values for coded fields, None in ints)
        self.columns = columns

    @classmethod
    def of(cls, kind: type[T], rows: Sequence[T]) -> Packed[T]:
        columns: list[tuple[array[int], list[Any] | None, bool]] = []
        for f in dataclasses.fields(kind):  # type: ignore[arg-type]
            values = [getattr(r, f.name) for r in rows]
            if all(_is_int(v) for v in values) and not _few(values):
                ints, has_none = _int_column(values)
                columns.append((ints, None, has_none))
            else:
                codes, table = _coded_column(values)
                columns.append((codes, table, False))
        return cls(kind, len(rows), tuple(columns))

    def row(self, i: int) -> T:
        args: list[Any] = []
        for values, table, has_none in self.columns:
            v = values[i]
            if table is not None:
                args.append(table[v])
            elif has_none and v == _NONE:
                args.append(None)
            else:
                args.append(v)
        return self.kind(*args)

    def rows(self, lo: int, hi: int) -> list[T]:
        """Rows ``lo`` to ``hi``: one pass per column, faster than ``row`` per row."""
        if lo >= hi:
            return []
        key = (id(self), lo, hi)
        recalled = _recall(key)
        if recalled is not None:
            return recalled
        fields: list[list[Any]] = []
        for values, table, has_none in self.columns:
            part = values[lo:hi]
            if table is not None:
                fields.append([table[c] for c in part])
            elif has_none:
                fields.append([None if v == _NONE else v for v in part])
            else:
                fields.append(part.tolist())
        kind = self.kind
        made = [kind(*args) for args in zip(*fields, strict=True)]
        _remember(key, self, made)
        return made

    def view(self, lo: int = 0, hi: int | None = None) -> Rows[T]:
        return Rows(self, lo, self.count if hi is None else hi)

    def __len__(self) -> int:
        return self.count

    def __reduce__(self) -> tuple[Any, ...]:
        return (Packed, (self.kind, self.count, self.columns))


class Rows(Sequence[T]):
    """Rows ``lo`` to ``hi`` of a ``Packed``: an immutable sequence, equal to its tuple."""

    __slots__ = ("hi", "lo", "packed")

    def __init__(self, packed: Packed[T], lo: int, hi: int) -> None:
        self.packed, self.lo, self.hi = packed, lo, max(lo, hi)

    def __len__(self) -> int:
        return self.hi - self.lo

    @overload
    def __getitem__(self, index: int) -> T: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[T]: ...

    def __getitem__(self, index: int | slice) -> T | Sequence[T]:
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if step == 1:
                return Rows(self.packed, self.lo + start, self.lo + max(start, stop))
            return tuple(self)[index]
        n = len(self)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError("Rows index out of range")
        return self.packed.row(self.lo + index)

    def __iter__(self) -> Iterator[T]:
        return iter(self.packed.rows(self.lo, self.hi))  # a shared list: never hand it out

    def __reversed__(self) -> Iterator[T]:
        return reversed(self.packed.rows(self.lo, self.hi))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Rows | tuple):
            return len(self) == len(other) and tuple(self) == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return repr(tuple(self))

    def __reduce__(self) -> tuple[Any, ...]:
        return (Rows, (self.packed, self.lo, self.hi))
