"""Stream one Kineto trace file (``.json`` or ``.json.gz``) without holding it whole.

Kineto writes ``{"schemaVersion": 1, ..., "traceEvents": [ {...}, {...} ], ...}``. We read
the file in chunks, cut the ``traceEvents`` array at event boundaries, parse each piece (with
orjson into dicts, or with the caller's ``decode``) and hand the events on in batches; the
keys around the array (``distributedInfo``, ``baseTimeNanoseconds``, ...) are parsed at the
end. Memory stays at a few chunks plus
whatever the consumer keeps, whatever the size of the file.

Every problem is a ``BadTrace`` naming the file: truncated or corrupt gzip, invalid JSON,
JSON without ``traceEvents``, an empty file.
"""

from __future__ import annotations

import gc
import gzip
import re
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import orjson

from syncscope.errors import BadTrace

# 32 KiB: ~250 events parsed at a time. Larger pieces parse no faster and hold more dicts at
# once: reading a 50 MB file peaks 14.5 MiB above the imports with 256 KiB pieces, 11.8 MiB
# with 64 KiB and 10.9 MiB with 32 KiB, at the same speed (16 KiB: slower).
CHUNK_BYTES = 1 << 15
_MAX_UNSPLIT_BYTES = 32 << 20  # this much without an event boundary: the JSON is invalid
_ARRAY_START = re.compile(rb'"traceEvents"\s*:\s*\[')
_BOUNDARY = re.compile(rb"\}\s*,\s*\{")
_GZIP_MAGIC = b"\x1f\x8b"

EventBatch = list[Any]
Consumer = Callable[[EventBatch], None]
# a JSON array's bytes to its entries; ValueError where the JSON is invalid
Decoder = Callable[[bytes], EventBatch]
Opener = Callable[[], IO[bytes]]


def is_trace_file(path: Path) -> bool:
    name = path.name
    return name.endswith((".json", ".json.gz")) and name != "meta.json"


def _open(path: Path, opener: Opener | None = None) -> tuple[IO[bytes], IO[bytes]]:
    """(the stream of uncompressed bytes, the file under it). ``opener``: opens the bytes
    of ``path`` (an fsspec URL's object, streamed as a local file is: never copied whole)."""
    try:
        reopen = opener if opener is not None else lambda: path.open("rb")
        raw = reopen()
        try:
            magic = raw.read(2)
        except BaseException:
            raw.close()
            raise
        if not _rewind(raw):  # a stream that cannot go back: opened again
            raw.close()
            raw = reopen()
        if not magic:
            raw.close()
            raise BadTrace(f"{path}: empty file (0 bytes)")
        if magic == _GZIP_MAGIC:
            return gzip.GzipFile(fileobj=raw, mode="rb"), raw  # type: ignore[return-value]
        return raw, raw
    except OSError as exc:
        raise BadTrace(f"{path}: cannot read: {exc.strerror or exc}") from exc


def _rewind(file: IO[bytes]) -> bool:
    try:
        file.seek(0)
    except (OSError, ValueError):
        return False
    return True


class _Reader:
    """Chunks of uncompressed bytes, with gzip problems turned into one-line errors."""

    def __init__(
        self, path: Path, on_bytes: Callable[[int], None] | None, opener: Opener | None = None
    ) -> None:
        self.path = path
        self.file, self.raw = _open(path, opener)
        self.offset = 0  # uncompressed bytes read so far
        self.on_bytes = on_bytes
        self._raw_pos = 0

    def read(self) -> bytes:
        try:
            data = self.file.read(CHUNK_BYTES)
        except EOFError as exc:
            raise BadTrace(f"{self.path}: truncated gzip file (ends mid-stream)") from exc
        except (gzip.BadGzipFile, zlib.error) as exc:
            raise BadTrace(f"{self.path}: corrupt gzip data ({exc})") from exc
        except OSError as exc:
            raise BadTrace(f"{self.path}: cannot read: {exc}") from exc
        self.offset += len(data)
        if self.on_bytes is not None:
            raw = self._compressed_pos()
            self.on_bytes(raw - self._raw_pos)
            self._raw_pos = raw
        return data

    def _compressed_pos(self) -> int:
        inner = getattr(self.file, "fileobj", None)
        if inner is not None:  # gzip: progress in compressed bytes, as the file size is
            try:
                return int(inner.tell())
            except (OSError, ValueError):
                return self._raw_pos
        return self.offset

    def close(self) -> None:
        self.file.close()
        self.raw.close()  # a GzipFile does not close the file it was given


def _invalid(path: Path, exc: Exception, where: int) -> BadTrace:
    detail = str(exc).split(":", 1)[0] if str(exc) else type(exc).__name__
    return BadTrace(f"{path}: invalid JSON near byte {where} ({detail})")


def _split(buf: bytearray, decode: Decoder, since: int = 0) -> tuple[EventBatch | None, int]:
    """Parse the longest run of whole events at the front of ``buf``: (events, bytes used).

    ``buf[0]`` is ``[``, then the events; the byte after the last whole event (a comma or
    white space) is made ``]`` while the piece is copied out, so a piece is copied once
    (into the bytes the events are parsed from, which ``msgspec.Raw`` values go on using).
    ``since``: boundaries before this offset were tried already (a prefix that did not
    parse never will), so a long event costs linear time, not quadratic. The bytes used end
    just before the ``{`` that opens the next event (its separator becomes the next ``[``).
    """
    # the last three boundaries, looked for in the last 4 KiB first (a 32 KiB chunk holds
    # a few hundred: finding them all costs more than parsing), then in the last 64 KiB
    base = max(1, len(buf) - (1 << 12))
    matches = list(_BOUNDARY.finditer(buf, base))
    if len(matches) < 3:
        base = max(1, len(buf) - (1 << 16))
        matches = list(_BOUNDARY.finditer(buf, base))
    if not matches and since < base:
        matches = list(_BOUNDARY.finditer(buf, max(1, since)))
    for m in reversed(matches[-3:]):
        end = m.start() + 1
        kept = buf[end]
        buf[end] = 0x5D  # ]
        with memoryview(buf) as view:
            piece = bytes(view[: end + 1])
        buf[end] = kept
        try:
            events = decode(piece)
        except ValueError:
            continue
        return events, m.end() - 2
    return None, 0


def _finish(path: Path, buf: bytes, offset: int, decode: Decoder) -> tuple[EventBatch, bytes]:
    """The last events and the bytes after the array's closing bracket.

    The closing bracket is the first ``]`` after which the rest of the file reads as the
    rest of the top-level object (a wrong ``]`` inside an event fails within that event,
    so each try is cheap) and before which the events parse.
    """
    error: Exception | None = None
    for m in re.finditer(rb"\]", buf):
        if not _closes_object(buf, m.end()):
            continue
        trailer = buf[m.end() :]
        try:
            events = decode(b"[" + buf[: m.start()] + b"]")
        except ValueError as exc:
            error = error or exc
            continue
        return events, trailer
    raise _invalid(path, error or ValueError("the traceEvents array never ends"), offset)


def _closes_object(buf: bytes, start: int) -> bool:
    """Does ``buf[start:]`` read as the rest of an object (judged on its first 4 KiB)?"""
    probe = b'{"traceEvents": []' + buf[start : start + 4096]
    try:
        orjson.loads(probe)
    except orjson.JSONDecodeError as exc:
        return len(buf) - start > 4096 and exc.pos >= len(probe) - 1
    return True


def read_trace(
    path: Path,
    consume: Consumer,
    on_bytes: Callable[[int], None] | None = None,
    opener: Opener | None = None,
    decode: Decoder = orjson.loads,
) -> dict[str, Any]:
    """Stream the events of ``path`` into ``consume`` in batches; return the other keys.
    ``opener``: where the bytes come from instead of the file ``path`` (which messages name).
    ``decode``: how a piece of the array is parsed (default: into dicts)."""
    reader = _Reader(path, on_bytes, opener)
    try:
        with collector_paused():
            return _read(path, reader, consume, decode)
    finally:
        reader.close()


@contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cycle collector off, then back as it was: reading traces makes millions of
    small objects without cycles, which the collector would only walk again and again (the
    more so as the ranks already read pile up)."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


def _array_start(path: Path, reader: _Reader) -> tuple[bytes, bytes]:
    """(the bytes before ``"traceEvents": [``, those after it read so far). Each chunk is
    searched once (from the last ``"traceEvents"`` that may still open the array), so a file
    without one is refused after _MAX_UNSPLIT_BYTES in linear time."""
    buf = bytearray()
    while True:
        chunk = reader.read()
        seen = len(buf)
        buf += chunk
        start = buf.rfind(b'"traceEvents"', 0, seen)
        m = _ARRAY_START.search(buf, start if start >= 0 else max(0, seen - 16))
        if m is not None:
            return bytes(buf[: m.start()]), bytes(buf[m.end() :])
        if not chunk:
            _no_events(path, bytes(buf))
        if len(buf) > _MAX_UNSPLIT_BYTES:
            _no_events(path, b"")


def _read(path: Path, reader: _Reader, consume: Consumer, decode: Decoder) -> dict[str, Any]:
    head, rest = _array_start(path, reader)
    consumed = reader.offset - len(rest)
    unsplit = 0
    buf = bytearray(b"[" + rest)  # appends in place: a long event is linear
    while True:
        chunk = reader.read()
        if not chunk:
            break
        since = len(buf) - 16 if unsplit else 0
        buf += chunk
        events, used = _split(buf, decode, since)
        if events is None:
            unsplit += 1
            if unsplit * CHUNK_BYTES > _MAX_UNSPLIT_BYTES:
                raise BadTrace(
                    f"{path}: an event near byte {consumed} is larger than "
                    f"{_MAX_UNSPLIT_BYTES >> 20} MiB (or the JSON is invalid there): "
                    "syncscope reads trace events up to that size"
                )
            continue
        unsplit = 0
        consume(events)
        consumed += used
        del buf[:used]  # (cheap: a bytearray drops its front without moving the rest)
        buf[0] = 0x5B  # [
    events, used = _split(buf, decode)
    if events is not None:
        consume(events)
        consumed += used
        del buf[:used]
    events, trailer = _finish(path, bytes(buf[1:]), consumed, decode)
    if events:
        consume(events)
    try:
        meta = orjson.loads(head + b'"traceEvents": []' + trailer)
    except orjson.JSONDecodeError as exc:
        raise _invalid(path, exc, reader.offset) from exc
    if not isinstance(meta, dict):
        raise BadTrace(f"{path}: not a Kineto trace (top level is not an object)")
    meta.pop("traceEvents", None)
    return meta


def _no_events(path: Path, data: bytes) -> None:
    if data.strip():
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise _invalid(path, exc, len(data)) from exc
        if isinstance(obj, dict):
            raise BadTrace(f"{path}: JSON without 'traceEvents': not a Kineto trace")
        raise BadTrace(f"{path}: not a Kineto trace (top level is not an object)")
    raise BadTrace(f"{path}: no 'traceEvents' array: not a Kineto trace")
