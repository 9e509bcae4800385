"""Packed rows read back as the same objects, and views behave as the tuples they replace."""

from __future__ import annotations

import pickle
import sys

import pytest

from syncscope.load.trace import packed as packed_module
from syncscope.load.trace.packed import Packed, Rows
from syncscope.model import Collective, MicroBatch, SourceLocation, Window


def _collective(i: int) -> Collective:
    return Collective(
        seq=i,
        op="all_reduce" if i % 3 else "broadcast",
        raw_op="c10d::allreduce_",
        bytes=[4, 1 << 20, 0][i % 3],
        dtype="float",
        group_ranks=(0, 1) if i % 2 else None,
        group_name="0",
        start_ns=1_700_000_000_000_000_000 + i * 1000,
        end_ns=1_700_000_000_000_000_500 + i * 1000,
        done_ns=None if i % 4 == 0 else 1_700_000_000_000_000_900 + i * 1000,
        phase="backward",
        micro_batch=i % 4,
        grad_sync=bool(i % 2),
        issuer="ddp",
        bucket=None if i % 5 else i,
        site=SourceLocation("train.py", i) if i == 7 else None,
    )


ROWS = [_collective(i) for i in range(300)]  # > 255 distinct values in some columns


def test_rows_read_back_equal_field_for_field() -> None:
    packed = Packed.of(Collective, ROWS)
    view = packed.view()
    assert len(view) == len(ROWS)
    assert list(view) == ROWS
    assert [view[i] for i in range(len(ROWS))] == ROWS  # one row at a time, too
    assert view[-1] == ROWS[-1]
    # None, False and 0 stay apart: the bool column keeps bools, the int columns keep None
    assert view[0].done_ns is None and view[0].grad_sync is False and view[0].micro_batch == 0
    assert view[7].site == SourceLocation("train.py", 7)


def test_view_is_a_tuple_in_all_but_name() -> None:
    packed = Packed.of(Collective, ROWS)
    view = packed.view(10, 20)
    expected = tuple(ROWS[10:20])
    assert view == expected and expected == view  # both directions
    assert hash(view) == hash(expected)
    assert tuple(view[2:5]) == expected[2:5] and isinstance(view[2:5], Rows)
    assert view[::2] == expected[::2]
    assert list(reversed(view)) == list(reversed(expected))
    assert view[3] in view and view.index(view[3]) == 3
    with pytest.raises(IndexError):
        view[10]
    assert packed.view(5, 5) == () and not packed.view(5, 5)


def test_windows_with_views_equal_windows_with_tuples() -> None:
    packed = Packed.of(Collective, ROWS)
    micro = [MicroBatch(k, k * 10, k * 10 + 5, "ddp", None, None) for k in range(4)]
    packed_micro = Packed.of(MicroBatch, micro)
    a = Window(0, True, 0, 100, tuple(micro), tuple(ROWS[:50]))
    b = Window(0, True, 0, 100, packed_micro.view(), packed.view(0, 50))
    assert a == b and hash(a) == hash(b)
    assert a.grad_syncs == b.grad_syncs and a.grad_sync_bytes == b.grad_sync_bytes


def test_pickle_round_trip_keeps_one_store() -> None:
    packed = Packed.of(Collective, ROWS)
    views = [packed.view(0, 100), packed.view(100, 300)]
    back = pickle.loads(pickle.dumps(views, protocol=pickle.HIGHEST_PROTOCOL))
    assert back == views
    assert back[0].packed is back[1].packed  # one store, not one per window


def test_packed_is_a_fraction_of_the_objects() -> None:
    packed = Packed.of(Collective, ROWS)
    as_objects = sum(
        sys.getsizeof(c) + sys.getsizeof(c.start_ns) * 3 for c in ROWS
    )  # the object and its three timestamps
    as_columns = sum(sys.getsizeof(values) for values, _, _ in packed.columns)
    assert as_columns * 3 < as_objects


def test_empty() -> None:
    packed = Packed.of(Collective, [])
    assert len(packed) == 0 and packed.view() == () and list(packed.view()) == []


def test_each_window_s_rows_are_made_once_while_they_fit(monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN two ranks' packed collectives, read window by window in several passes (as the
    # analysis and the reports read them), with room for 150 rows made
    monkeypatch.setattr(packed_module, "_MADE_MAX_ROWS", 150)
    monkeypatch.setattr(packed_module, "_made", {})
    monkeypatch.setattr(packed_module, "_made_rows", 0)
    made: list[int] = []
    real = Collective.__init__

    def counting(self: Collective, *args: object, **kwargs: object) -> None:
        made.append(1)
        real(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Collective, "__init__", counting)
    ranks = [Packed.of(Collective, ROWS[:100]), Packed.of(Collective, ROWS[100:200])]
    made.clear()
    windows = [(p, lo) for p in ranks for lo in (0, 50)]  # 4 windows of 50 rows

    def read(p: Packed[Collective], lo: int) -> None:
        assert list(p.view(lo, lo + 50)) == ROWS[ranks.index(p) * 100 + lo :][:50]

    # WHEN three windows are read three times over
    for _ in range(3):
        for p, lo in windows[:3]:
            read(p, lo)
    # THEN each was made once
    assert len(made) == 150
    # WHEN all four are read in turn, three times over (more than there is room for)
    made.clear()
    for _ in range(3):
        for p, lo in windows:
            read(p, lo)
            read(p, lo)  # (read again at once: kept)
    # THEN the first two stay kept for every pass, the last two take turns in the room left
    # (made in each pass after the first, which found three kept): a cache that let the
    # least recently read go would make all four in every pass (600 rows)
    assert len(made) == 50 + 2 * 100
    assert packed_module._made_rows <= 150


def test_reading_a_trace_keeps_no_rows_it_made() -> None:
    # GIVEN a real trace read into its rank (building it reads windows' collectives)
    from pathlib import Path

    from syncscope.load.trace.rankfile import read_rank

    root = Path(__file__).resolve().parents[4]
    result = read_rank(root / "sample_traces" / "nccl_parser_config" / "nccl_data.json.gz")
    # THEN the rank is whole and no row made meanwhile is kept (a worker reads thousands of
    # files: what it keeps would hold each file's store alive)
    assert result.rank_run is not None and result.rank_run.windows
    assert not packed_module._made and packed_module._made_rows == 0
