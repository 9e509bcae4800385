"""Traces of two jobs of the same shape in one directory are told apart.

Same world size, backend and process groups: no header tells the two runs apart, and their
ranks were compared as one job's (a collective-mismatch error invented from rank 0 of one
run against rank 1 of another). The traces' own times tell them apart (syncscope/load/trace/jobs.py).
"""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path
from typing import Any

import orjson
import pytest

from syncscope import cli
from syncscope.errors import BadTrace
from syncscope.load.traces import load_traces

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"
EVERY = SAMPLES / "syncscope-gloo-ddp-every"  # recorded 13 s before NO_SYNC, same host
NO_SYNC = SAMPLES / "syncscope-gloo-ddp-no_sync"


def _copy(src: Path, dst: Path, **header: Any) -> None:
    """``src`` to ``dst``, with ``header`` keys of the trace replaced."""
    if not header:
        shutil.copy(src, dst)
        return
    doc = orjson.loads(gzip.decompress(src.read_bytes()))
    doc.update(header)
    dst.write_bytes(gzip.compress(orjson.dumps(doc)))


def test_one_rank_of_each_of_two_runs_is_refused_naming_both(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """GIVEN rank 0 of one 2-rank run and rank 1 of another, same shape, same host WHEN
    analyzed THEN exit 2, one line naming each job's files and how to analyze one; no
    finding drawn from the mix."""
    _copy(EVERY / "rank-0.json.gz", tmp_path / "rank-0.json.gz")
    _copy(NO_SYNC / "rank-1.json.gz", tmp_path / "rank-1.json.gz")
    out = tmp_path / "out"
    assert cli.main(["analyze", "--quiet", "--out", str(out), str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert f"{tmp_path} holds traces of 2 jobs" in err
    assert "job 1: rank-0.json.gz [rank(s) 0 of 2, gloo, on vm, started 2026-" in err
    assert "job 2: rank-1.json.gz [rank(s) 1 of 2" in err
    assert "analyze one job at a time" in err
    assert not (out / "report.json").exists()


def test_two_whole_runs_are_two_jobs_and_skip_bad_keeps_one(tmp_path: Path) -> None:
    """GIVEN both ranks of two runs of one job WHEN loaded THEN two jobs, not 'rank 0
    appears twice'; with --skip-bad the newest job alone, the other named in the notes."""
    for r in (0, 1):
        _copy(EVERY / f"rank-{r}.json.gz", tmp_path / f"every-rank-{r}.json.gz")
        _copy(NO_SYNC / f"rank-{r}.json.gz", tmp_path / f"no_sync-rank-{r}.json.gz")
    with pytest.raises(BadTrace, match="holds traces of 2 jobs") as caught:
        load_traces([tmp_path])
    assert "every-rank-0.json.gz, every-rank-1.json.gz [rank(s) 0-1 of 2" in str(caught.value)
    files: dict[int, Path] = {}
    run = load_traces([tmp_path], skip_bad=True, files_out=files)
    assert [r.rank for r in run.ranks] == [0, 1]
    assert {p.name for p in files.values()} == {"no_sync-rank-0.json.gz", "no_sync-rank-1.json.gz"}
    [note] = [n for n in run.meta.notes if n.startswith("skipped ")]
    assert "every-rank-0.json.gz, every-rank-1.json.gz" in note and "different job" in note


def test_clock_skew_between_hosts_is_not_two_jobs(tmp_path: Path) -> None:
    """GIVEN one job's ranks on two hosts whose spans are 13 s apart (clock skew) WHEN
    loaded THEN one job; 2 h apart (beyond any skew) THEN two jobs."""
    _copy(EVERY / "rank-0.json.gz", tmp_path / "rank-0.json.gz", host_name="node-a")
    _copy(NO_SYNC / "rank-1.json.gz", tmp_path / "rank-1.json.gz", host_name="node-b")
    run = load_traces([tmp_path])
    assert [r.rank for r in run.ranks] == [0, 1]
    base = 1790857026000000000 + 2 * 3600 * 10**9
    _copy(
        NO_SYNC / "rank-1.json.gz",
        tmp_path / "rank-1.json.gz",
        host_name="node-b",
        baseTimeNanoseconds=base,
    )
    with pytest.raises(BadTrace, match="holds traces of 2 jobs"):
        load_traces([tmp_path])


def test_one_job_on_one_host_is_one_job(tmp_path: Path) -> None:
    """The ranks of one recorded job (spans overlapping) load as before."""
    for r in (0, 1):
        _copy(NO_SYNC / f"rank-{r}.json.gz", tmp_path / f"rank-{r}.json.gz")
    run = load_traces([tmp_path])
    assert [r.rank for r in run.ranks] == [0, 1]
    assert not any(n.startswith("skipped") for n in run.meta.notes)


def test_a_trace_without_process_groups_fits_its_job(tmp_path: Path) -> None:
    """GIVEN one job's rank 1 recorded without ``pg_config`` WHEN loaded THEN one job, as
    before (a header naming no groups fits any of its world size and backend)."""
    _copy(NO_SYNC / "rank-0.json.gz", tmp_path / "rank-0.json.gz")
    info = {"backend": "gloo", "rank": 1, "world_size": 2}
    _copy(NO_SYNC / "rank-1.json.gz", tmp_path / "rank-1.json.gz", distributedInfo=info)
    run = load_traces([tmp_path])
    assert [r.rank for r in run.ranks] == [0, 1]
