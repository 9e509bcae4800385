"""Flight Recorder dumps for the fault suite: good ones in torch's schema, and hostile ones
(pickles written opcode by opcode, where ``pickle.dumps`` would refuse or recurse)."""

from __future__ import annotations

import json
import pickle
import struct
from pathlib import Path
from typing import Any

Dump = dict[str, Any]


def entry(seq: int, name: str = "all_reduce", **kw: Any) -> dict[str, Any]:
    """One NCCL collective as FlightRecorder.hpp writes it (completed unless ``kw`` says)."""
    e: dict[str, Any] = {
        "record_id": seq - 1,
        "pg_id": 0,
        "process_group": ("0", "default_pg"),
        "collective_seq_id": seq,
        "p2p_seq_id": 0,
        "op_id": seq,
        "profiling_name": f"nccl:{name}",
        "time_created_ns": 1_000_000 * seq,
        "input_sizes": [[8]],
        "input_dtypes": ["Float"],
        "output_sizes": [[8]],
        "output_dtypes": ["Float"],
        "state": "completed",
        "time_discovered_started_ns": 1_000_000 * seq + 10,
        "time_discovered_completed_ns": 1_000_000 * seq + 20,
        "retired": True,
        "timeout_ms": 600000,
        "is_p2p": False,
        "thread_name": "python",
        "thread_id": "1",
        "frames": [{"name": "train", "filename": "/job/train.py", "line": 50}],
    }
    e.update(kw)
    return e


def dump(entries: list[Any], ranks: str = "[0, 1]") -> Dump:
    return {
        "version": "2.10",
        "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": ranks}},
        "pg_status": {
            "0": {
                "last_enqueued_collective": len(entries),
                "last_started_collective": -1,
                "last_completed_collective": -1,
            }
        },
        "comm_lib_version": "2.21.5",
        "entries": entries,
    }


def good(count: int = 3, ranks: str = "[0, 1]") -> Dump:
    return dump([entry(s) for s in range(1, count + 1)], ranks)


def pickle_of(data: Dump) -> bytes:
    return pickle.dumps(data, protocol=2)


def as_json(data: Dump) -> bytes:
    """The JSON variant (no frames; keys sorted, as torch writes them; NaN/Infinity as
    Python's json writes them)."""
    plain = {**data, "entries": [{k: v for k, v in e.items() if k != "frames"} for e in data["entries"]]}  # fmt: skip
    return json.dumps(plain, sort_keys=True).encode()


def write(directory: Path, files: dict[str, bytes | Dump]) -> Path:
    """``files``: name -> bytes, or a dump (pickled)."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        data = content if isinstance(content, bytes) else pickle.dumps(content, protocol=2)
        (directory / name).write_bytes(data)
    return directory


def _text(value: str) -> bytes:
    raw = value.encode()
    return b"X" + struct.pack("<I", len(raw)) + raw  # BINUNICODE


def with_top_level(data: Dump, key: str, value_ops: bytes) -> bytes:
    """``data`` pickled, then ``data[key]`` set to the value ``value_ops`` builds (opcodes)."""
    return pickle.dumps(data, protocol=2)[:-1] + _text(key) + value_ops + b"s."


def nested_list_ops(depth: int) -> bytes:
    """A list nested ``depth`` deep, built on the unpickler's stack (no recursion here)."""
    return b"]" * depth + b"a" * (depth - 1)


def deep_json(depth: int) -> bytes:
    """The JSON variant with one more key: a list nested ``depth`` deep."""
    nested = b"[" * depth + b"]" * depth
    return b'{"comm_lib_version": "", "entries": [], "x": ' + nested + b"}"


def deep_tuple_key(depth: int) -> bytes:
    """A good dump with one more key: a tuple nested ``depth`` deep (hashing it recursed
    in C past the stack: a segfault)."""
    key = b")" + b"\x85" * depth  # EMPTY_TUPLE, then TUPLE1 around it depth times
    return pickle.dumps(good(), protocol=2)[:-1] + key + b"K\x01s."


def memo_put(index: int) -> bytes:
    """A good dump, then a memo opcode (LONG_BINPUT) with ``index``: C's unpickler sizes
    its memo table by the index (2**24: 256 MB of pointers, 2**32 - 16: 64 GB)."""
    return pickle.dumps(good(), protocol=2)[:-1] + b"r" + struct.pack("<I", index) + b"."


def shared_entries(entries: int, frames: int) -> bytes:
    """One entry referenced ``entries`` times, its frames one frame referenced ``frames``
    times: two bytes a reference (memo gets), so ~2 MB for 500,000 x 500,000."""
    e = entry(1)
    e["frames"] = [{"name": "f", "filename": "/job/f.py", "line": 1}] * frames
    return pickle.dumps(dump([e] * entries), protocol=2)


def shared_state(levels: int) -> bytes:
    """Entry 1's state: a list of two references to the list below, ``levels`` deep (its
    text, 2**levels leaves, is what a reader that takes str() of it builds)."""
    value: Any = ["a" * 10]
    for _ in range(levels):
        value = [value, value]
    return pickle.dumps(dump([entry(1), entry(2, state=value)]), protocol=2)
