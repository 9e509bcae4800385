"""The streaming reader: real traces, and every kind of bad input as one clear error."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import orjson
import pytest

from syncscope.errors import BadTrace
from syncscope.load.trace import read
from syncscope.load.trace.read import read_trace

ROOT = Path(__file__).resolve().parents[4]
SAMPLES = ROOT / "sample_traces"
NCCL = SAMPLES / "nccl_parser_config" / "nccl_data.json.gz"


def _read(path: Path) -> tuple[list[dict[str, object]], dict[str, object]]:
    events: list[dict[str, object]] = []
    meta = read_trace(path, events.extend)
    return events, meta


def test_streamed_events_equal_a_whole_parse(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a real trace, read in tiny chunks so every event boundary path is used
    monkeypatch.setattr(read, "CHUNK_BYTES", 4096)
    whole = orjson.loads(gzip.decompress(NCCL.read_bytes()))
    # WHEN it is streamed
    events, meta = _read(NCCL)
    # THEN the events and the keys around them are the same as a whole-file parse
    assert events == whole["traceEvents"]
    assert meta["distributedInfo"] == whole["distributedInfo"]
    assert "traceEvents" not in meta


@pytest.mark.parametrize("layout", ["compact", "indented", "keys-after"])
def test_layouts(tmp_path: Path, layout: str) -> None:
    events = [
        {"ph": "X", "name": f"e{i}", "args": {"grid": [1, 2], "s": "}, {"}} for i in range(50)
    ]
    doc: dict[str, object] = {"schemaVersion": 1, "traceEvents": events}
    if layout == "keys-after":
        doc = {"traceEvents": events, "deviceProperties": [{"id": 0}, {"id": 1}], "x": 1}
    option = orjson.OPT_INDENT_2 if layout == "indented" else 0
    path = tmp_path / "t.json"
    path.write_bytes(orjson.dumps(doc, option=option))
    got, meta = _read(path)
    assert got == events
    assert meta.get("x", 1) == 1


def _bad(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


@pytest.mark.parametrize(
    ("name", "make", "message"),
    [
        ("empty.json", lambda: b"", "empty file (0 bytes)"),
        ("bad.json", lambda: b'{"traceEvents": [{"ph": "X",', "invalid JSON"),
        ("garbage.json", lambda: b"not json at all", "invalid JSON"),
        ("noevents.json", lambda: b'{"schemaVersion": 1}', "without 'traceEvents'"),
        ("list.json", lambda: b"[1, 2]", "not a Kineto trace"),
        ("corrupt.json.gz", lambda: b"\x1f\x8b" + b"\x00" * 100, "corrupt gzip"),
    ],
)
def test_bad_input_is_one_line_naming_the_file(
    tmp_path: Path, name: str, make: object, message: str
) -> None:
    path = _bad(tmp_path, name, make())  # type: ignore[operator]
    with pytest.raises(BadTrace) as info:
        _read(path)
    text = str(info.value)
    assert str(path) in text and message in text
    assert "\n" not in text


def test_truncated_real_trace(tmp_path: Path) -> None:
    path = tmp_path / "cut.json.gz"
    shutil.copy(NCCL, path)
    path.write_bytes(path.read_bytes()[:300_000])
    with pytest.raises(BadTrace, match="truncated gzip"):
        _read(path)
