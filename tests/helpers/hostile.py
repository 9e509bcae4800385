"""Builders of hostile inputs for the fault suite: traces, run directories, reports."""

from __future__ import annotations

import copy
import functools
import gzip
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "sample_traces" / "syncscope-gloo-ddp-no_sync"

Doc = dict[str, Any]


def tree_env() -> dict[str, str]:
    """The environment with this checkout first on PYTHONPATH: ranks import the tree's code."""
    return dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))


def profile_script(
    tmp_path: Path, name: str, source: str, *options: str
) -> tuple[subprocess.CompletedProcess[str], Path]:
    """``syncscope profile -q --nproc-per-node 2 OPTIONS --out TMP/run TMP/NAME`` on
    ``source``: the finished process and the run directory."""
    script = tmp_path / name
    script.write_text(source)
    out = tmp_path / "run"
    command = [sys.executable, "-m", "syncscope", "profile", "-q", "--nproc-per-node", "2"]
    done = subprocess.run(
        [*command, *options, "--out", str(out), str(script)],
        env=tree_env(),
        capture_output=True,
        text=True,
        timeout=240,
    )
    return done, out


@functools.cache
def _sample(rank: int) -> bytes:
    return gzip.decompress((SAMPLE / f"rank-{rank}.json.gz").read_bytes())


def trace_doc(rank: int = 0) -> Doc:
    doc: Doc = orjson.loads(_sample(rank))
    return doc


def write_traces(tmp: Path, edit: Callable[[Doc], Any], both: bool = True) -> Path:
    """A directory of the sample job's traces, each passed through ``edit`` first."""
    out = tmp / "traces"
    out.mkdir()
    for rank in (0, 1) if both else (0,):
        doc = trace_doc(rank)
        edit(doc)
        (out / f"rank-{rank}.json").write_bytes(orjson.dumps(doc))
    return out


def set_info(**values: Any) -> Callable[[Doc], None]:
    def edit(doc: Doc) -> None:
        doc["distributedInfo"].update(values)

    return edit


def set_key(key: str, value: Any) -> Callable[[Doc], None]:
    def edit(doc: Doc) -> None:
        doc[key] = value

    return edit


def edit_events(change: Callable[[list[Any]], list[Any]]) -> Callable[[Doc], None]:
    def edit(doc: Doc) -> None:
        doc["traceEvents"] = change(doc["traceEvents"])

    return edit


def first_cpu_op(events: list[Any], **values: Any) -> list[Any]:
    for e in events:
        if e.get("cat") == "cpu_op" and str(e.get("name", "")).startswith("c10d::"):
            e.update(values)
            break
    return events


# -- run directories -----------------------------------------------------------------------
T0 = 1_700_000_000_000_000_000


def run_events(rank: int = 0, world: int = 2, windows: int = 2) -> list[dict[str, Any]]:
    """A small, valid rank event file: DDP, two micro-batches per window, one sync each."""
    t = T0
    seq = 0
    ev: list[dict[str, Any]] = [
        {"type": "header", "format": "syncscope-events", "version": 1, "rank": rank,
         "local_rank": rank, "world_size": world, "host": "h", "pid": 100 + rank, "t": t,
         "target": "train.py", "argv": []},
        {"type": "wrapper", "kind": "ddp", "label": "ddp:Net#0", "params": 2, "param_bytes": 64,
         "t": t},
        {"type": "dist", "t": t},
    ]  # fmt: skip
    for w in range(windows):
        for mb in range(2):
            t += 1000
            ev.append({"type": "fwd", "depth": 0, "wrapper": "ddp", "sync": mb == 1, "t": t})
            t += 1000
            ev.append({"type": "bwd", "t": t, "sync": {"ddp:Net#0": mb == 1}})
            if mb == 1:
                seq += 1
                ev.append({"type": "coll", "seq": seq, "op": "all_reduce", "bytes": 64,
                           "issuer": "ddp", "phase": "backward", "t": t + 10, "t_end": t + 20,
                           "group": list(range(world)), "bucket": 0})  # fmt: skip
                ev.append({"type": "done", "seq": seq, "t": t + 30})
            t += 1000
            ev.append({"type": "bwd_end", "t": t})
        t += 1000
        ev.append({"type": "step", "t": t, "fp": [1.0, 2.0]})
        ev.append({"type": "step_end", "t": t + 10, "window": w})
    ev.append({"type": "exit", "t": t + 100, "status": 0, "reason": "finished",
               "dist_initialized": True, "backend": "gloo"})  # fmt: skip
    del w
    return ev


def meta(world: int = 2, **extra: Any) -> dict[str, Any]:
    data = {"format": "syncscope-run", "format_version": 1, "command": ["train.py"],
            "script": "/x/train.py", "world_size": world, "hung": False}  # fmt: skip
    data.update(extra)
    return data


def write_run(
    tmp: Path,
    name: str = "run",
    meta_data: Any = None,
    events: Callable[[int], list[Any]] | None = None,
    ranks: int = 2,
    raw: dict[int, bytes] | None = None,
) -> Path:
    run = tmp / name
    (run / "ranks").mkdir(parents=True)
    (run / "meta.json").write_text(json.dumps(meta(ranks) if meta_data is None else meta_data))
    for r in range(ranks):
        path = run / "ranks" / f"rank-{r:05d}.jsonl"
        if raw is not None and r in raw:
            path.write_bytes(raw[r])
            continue
        evs = events(r) if events is not None else run_events(r, ranks)
        path.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in evs))
    return run


def with_event(kind: str, **values: Any) -> Callable[[int], list[Any]]:
    """Rank events where the first event of ``kind`` has ``values`` (None: key removed)."""

    def events(rank: int) -> list[Any]:
        evs = copy.deepcopy(run_events(rank))
        for e in evs:
            if e["type"] == kind:
                for k, v in values.items():
                    if v is None:
                        e.pop(k, None)
                    else:
                        e[k] = v
                break
        return evs

    return events


def aten_without_ts(events: list[Any]) -> list[Any]:
    for e in events:
        if e.get("cat") == "cpu_op" and str(e.get("name", "")).startswith("aten::"):
            del e["ts"]
            break
    return events


def write_text(tmp: Path, name: str, text: str) -> Path:
    path = tmp / name
    path.write_text(text)
    return path


def spaced_trace(tmp: Path) -> Path:
    """Valid JSON laid out oddly: newlines and spaces between every event and key."""
    out = tmp / "spaced"
    out.mkdir()
    for rank in (0, 1):
        doc = trace_doc(rank)
        body = ",\n\n   ".join(orjson.dumps(e).decode() for e in doc.pop("traceEvents"))
        head = orjson.dumps(doc).decode()[1:-1]
        (out / f"rank-{rank}.json").write_text(
            "{\n  " + head + ' ,\n "traceEvents" :  [\n\n  ' + body + "\n ]\n}\n"
        )
    return out


def huge_string_trace(tmp: Path, size: int = 40 << 20) -> Path:
    """A valid trace holding one 40 MB string (an event's argument)."""
    out = tmp / "huge"
    out.mkdir()
    for rank in (0, 1):
        doc = trace_doc(rank)
        doc["traceEvents"].insert(1, {"ph": "i", "name": "note", "args": {"s": "x" * size}})
        (out / f"rank-{rank}.json").write_bytes(orjson.dumps(doc))
    return out


def broken_meta(tmp: Path, data: bytes) -> Path:
    run = write_run(tmp)
    (run / "meta.json").write_bytes(data)
    return run
