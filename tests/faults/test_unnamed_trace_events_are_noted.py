"""Trace events whose name is not a string: they were dropped with no
note, so a collective among them was missing from its rank and read as a false
collective-mismatch. Now they are counted in a note and the window that held one draws no
finding."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import orjson

from syncscope.analysis.findings import findings_for
from syncscope.load.traces import load_traces

SAMPLE = Path(__file__).parent.parent.parent / "sample_traces" / "syncscope-gloo-ddp-every"


def _unname_one_allreduce(src: Path, dst: Path) -> None:
    trace = orjson.loads(gzip.decompress(src.read_bytes()))
    for e in trace["traceEvents"]:
        if isinstance(e, dict) and e.get("name") == "c10d::allreduce_":
            e["name"] = 12345  # a name that is no string
            break
    else:  # pragma: no cover - the sample changed
        raise AssertionError("no c10d::allreduce_ in the sample")
    dst.write_bytes(gzip.compress(orjson.dumps(trace)))


def test_an_unnamed_collective_is_noted_and_draws_no_false_mismatch(tmp_path: Path) -> None:
    shutil.copy(SAMPLE / "rank-0.json.gz", tmp_path / "rank-0.json.gz")
    _unname_one_allreduce(SAMPLE / "rank-1.json.gz", tmp_path / "rank-1.json.gz")
    run = load_traces([tmp_path])
    findings = findings_for(run)
    assert not [f for f in findings if f.kind == "collective-mismatch"], [
        (f.kind, f.message) for f in findings
    ]
    assert any("whose name is not a string were dropped" in n for n in run.meta.notes)
    dropped = [w.index for w in run.ranks[1].windows if w.records_dropped]
    assert len(dropped) == 1
