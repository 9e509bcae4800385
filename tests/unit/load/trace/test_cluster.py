"""``analyze --scheduler``'s pieces that need no cluster: batches, URLs, the missing extra."""

from __future__ import annotations

from pathlib import Path

import pytest

from syncscope.errors import BadTrace, SyncscopeError
from syncscope.load.trace import cluster
from syncscope.load.trace.cluster import MAX_BATCH_BYTES, MAX_BATCH_FILES, TASKS_PER_THREAD, batches
from syncscope.load.traces import load_traces
from tests.helpers.synth_traces import Shape, write_job


def test_batches_cover_every_file_once_in_order() -> None:
    # GIVEN 1,000 small files and 4 worker threads
    groups = batches([1000] * 1000, threads=4)
    # THEN every file is in one batch, in file order, about TASKS_PER_THREAD tasks per thread
    assert [i for g in groups for i in g] == list(range(1000))
    assert len(groups) == 4 * TASKS_PER_THREAD
    # AND a 16k-rank job on a big cluster is cut no coarser than MAX_BATCH_FILES
    assert max(len(g) for g in batches([1] * 16384, threads=1)) == MAX_BATCH_FILES


def test_batches_hold_at_most_max_batch_bytes_bar_one_big_file() -> None:
    sizes = [MAX_BATCH_BYTES // 3] * 7 + [MAX_BATCH_BYTES * 2, 10]
    groups = batches(sizes, threads=1)
    assert [i for g in groups for i in g] == list(range(len(sizes)))
    for g in groups:
        assert len(g) == 1 or sum(sizes[i] for i in g) <= MAX_BATCH_BYTES
    assert [7] in groups  # the big file alone


def test_a_url_without_a_scheduler_is_refused(tmp_path: Path) -> None:
    with pytest.raises(BadTrace, match="a URL is read by Dask workers: give --scheduler"):
        load_traces([tmp_path.as_uri() + "/x"])


def test_url_listing_and_reading_match_the_local_files(tmp_path: Path) -> None:
    pytest.importorskip("fsspec", reason="URLs need fsspec (syncscope[dask])")
    paths = write_job(tmp_path / "t", 2, 50_000, Shape(ops_per_forward=4))
    listed = cluster.url_files((tmp_path / "t").as_uri())
    assert [u for u, _ in listed] == [p.as_uri() for p in paths]
    assert [s for _, s in listed] == [p.stat().st_size for p in paths]
    # a worker's read of a URL is the local read, naming the URL
    (local, remote) = (cluster.read_batch([paths[1]])[0], cluster.read_batch([listed[1][0]])[0])
    assert remote.path == paths[1].as_uri() and remote.rank_run == local.rank_run
    with pytest.raises(BadTrace, match="no such file or directory"):
        cluster.url_files((tmp_path / "missing").as_uri())


def test_without_dask_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "distributed", None)  # import fails as if not installed
    with pytest.raises(SyncscopeError, match=r"pip install 'syncscope\[dask\]'"):
        cluster._dask()
