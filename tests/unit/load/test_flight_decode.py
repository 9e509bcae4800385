"""The data-only unpickler of Flight Recorder dumps reads what Python's pickle reads, for data,
at every protocol torch and Python write binary pickles in; it refuses the rest in one line."""

from __future__ import annotations

import pickle
from typing import Any

import pytest

from syncscope.load.flight_decode import decode_pickle
from tests.helpers import dumps as d


def _data() -> dict[str, Any]:
    shared = [1, 2]
    many = {f"k{n}": n for n in range(300)}  # past 256 memo entries: LONG_BINPUT / LONG_BINGET
    return {
        "numbers": [0, 1, -1, 255, 256, 65535, 65536, -(2**31), 2**31, 2**63, -(2**70)],
        "floats": [1.5, -0.0, float("inf")],
        "constants": [None, True, False],
        "text": ["", "é", "\ud800", "x" * 300],
        "tuples": [(), (1,), (1, 2), (1, 2, 3), (1, 2, 3, 4)],
        "nested": [[[]], {"k": {}}, {1: 2, None: 3, 1.5: 4}],
        "shared": [shared, shared],
        "many": [many, many],
        "dump": d.good(),
    }


@pytest.mark.parametrize("protocol", [1, 2, 3, 4, 5])
def test_data_reads_as_pickle_reads_it(protocol: int) -> None:
    data = _data()
    if protocol < 3:
        data["text"] = data["text"][:2] + data["text"][3:]  # no lone surrogate before 3
    raw = pickle.dumps(data, protocol=protocol)
    assert decode_pickle(raw) == pickle.loads(raw)


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        (b"", "cut short"),
        (b"\x80\x02}q\x00", "cut short"),
        (b"\x80\x02X\xff\xff\xff\x7fab.", "cut short: a string runs past the end"),
        (b"\x80\x02h\x05.", "memo entry 5 read before it was stored"),
        (b"\x80\x02cos\nsystem\n.", "refused to load os.system"),
        (b"\x80\x04\x8c\x02os\x8c\x06system\x93.", "refused to load os.system"),
        (b"\x80\x02N\x85R.", "refused opcode REDUCE"),
        (b"\x80\x02\x8f.", "refused opcode EMPTY_SET"),
        (b"\x80\x02\x8b\x01\x00\x00\x00\x01.", "refused opcode LONG4"),
        (pickle.dumps({"a": "b"}, protocol=0), "refused opcode"),
        (b"\x80\x09N.", "a pickle protocol above 5"),
        (b"\x80\x02}K\x01K\x02\x86K\x03s.", "refused a dict key of type tuple"),
        (b"\x80\x02]K\x01K\x02s.", "dict items set on a value that is not a dict"),
        (b"\x80\x02\xff.", "unknown opcode 0xff"),
    ],
)
def test_anything_but_data_is_one_line(raw: bytes, words: str) -> None:
    with pytest.raises(ValueError) as caught:
        decode_pickle(raw)
    assert words in str(caught.value) and "\n" not in str(caught.value)
