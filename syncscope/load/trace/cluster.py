"""Read trace files on a Dask distributed cluster (``analyze --scheduler``).

The per-rank read (``read_rank``) is the whole cost of a large trace set and needs nothing
from the other files, so it runs on the cluster's workers: files go out in batches (a task
reads several files, so a job of 16k small files is not 16k tasks), each task sends back its
files' ``RankResult`` (a reduced rank, ~0.4 KB per window; the events stay on the worker),
and the client yields them in file order, where ``load_traces`` merges and checks them as it
does the built-in pool's. The diagnosis and reports run here, on the client.

A worker that dies mid-task loses nothing: the scheduler runs its task again elsewhere (up to
``RETRIES`` more times for a task that raised). Files may be fsspec URLs (``s3://``,
``gs://``, ``file://``, where fsspec and the backend are installed): a worker copies one to
a local temporary file, reads it, deletes it.

Dask is imported only here, and this module only with ``--scheduler``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from syncscope.errors import BadTrace, SyncscopeError
from syncscope.load.trace.rankfile import RankResult, read_rank
from syncscope.load.trace.read import is_trace_file

CONNECT_TIMEOUT_S = 10.0
RETRIES = 2  # a task whose read raised (a worker's disk, network) is tried this many more times
TASKS_PER_THREAD = 4  # batches per worker thread: balance against per-task overhead
MAX_BATCH_BYTES = 2 << 30  # a batch reads at most this much (one file may exceed it alone)
MAX_BATCH_FILES = 256

Source = Path | str  # a local path, or an fsspec URL


def is_url(path: str) -> bool:
    return "://" in path


def _dask() -> Any:
    try:
        import distributed
    except ImportError:
        raise SyncscopeError(
            "--scheduler needs Dask distributed: pip install 'syncscope[dask]'"
        ) from None
    return distributed


def _fsspec() -> Any:
    try:
        import fsspec
    except ImportError:
        raise SyncscopeError(
            "trace URLs need fsspec (and its backend, s3fs or gcsfs): pip install fsspec"
        ) from None
    return fsspec


def url_files(url: str) -> list[tuple[str, int]]:
    """The trace files (URL, size) at ``url``: a file, or a directory holding them."""
    fsspec = _fsspec()
    try:
        fs, root = fsspec.core.url_to_fs(url)
        if not fs.exists(root):
            raise BadTrace(f"{url}: no such file or directory")
        if not fs.isdir(root):
            return [(url, int(fs.size(root) or 0))]
        for where in (root, root.rstrip("/") + "/traces"):
            entries = fs.ls(where, detail=True) if fs.isdir(where) else []
            found = sorted(
                (str(e["name"]), int(e.get("size") or 0))
                for e in entries
                if e.get("type") == "file" and is_trace_file(Path(str(e["name"])))
            )
            if found:
                return [(fs.unstrip_protocol(name), size) for name, size in found]
    except (OSError, ValueError, ImportError) as exc:
        raise BadTrace(f"{url}: cannot list ({exc})") from None
    raise BadTrace(f"{url}: no trace files (*.json, *.json.gz) in this directory")


def _read_url(url: str) -> RankResult:
    """Copy one URL's object to a local temporary file, read it, delete it; the result and
    its messages name the URL."""
    fsspec = _fsspec()
    name = url.rstrip("/").rsplit("/", 1)[-1]
    with tempfile.TemporaryDirectory(prefix="syncscope-") as tmp:
        local = Path(tmp) / name
        try:
            with fsspec.open(url, "rb") as src, local.open("wb") as dst:
                shutil.copyfileobj(src, dst, 8 << 20)
        except OSError as exc:
            return RankResult(url, error=f"{url}: cannot read ({exc})")
        result = read_rank(local)
    result.error = result.error.replace(str(local), url)
    result.rank_notes = [n.replace(str(local), url) for n in result.rank_notes]
    result.path = url
    return result


def read_batch(sources: list[Source]) -> list[RankResult]:
    """A task: read each file of a batch (on a worker)."""
    return [read_rank(s) if isinstance(s, Path) else _read_url(s) for s in sources]


def batches(sizes: Sequence[int], threads: int) -> list[list[int]]:
    """File indexes cut into consecutive batches: about ``TASKS_PER_THREAD`` per worker
    thread, each at most ``MAX_BATCH_FILES`` files and ``MAX_BATCH_BYTES`` (bar one big file)."""
    per = max(1, min(MAX_BATCH_FILES, -(-len(sizes) // max(1, threads * TASKS_PER_THREAD))))
    out: list[list[int]] = []
    current: list[int] = []
    held = 0
    for i, size in enumerate(sizes):
        if current and (len(current) >= per or held + size > MAX_BATCH_BYTES):
            out.append(current)
            current, held = [], 0
        current.append(i)
        held += size
    if current:
        out.append(current)
    return out


def _client(scheduler: str, stack: ExitStack) -> Any:
    """A client of ``scheduler``: ``local`` (a LocalCluster here), a scheduler file as
    ``dask scheduler --scheduler-file`` writes, or an address (``tcp://host:8786``)."""
    distributed = _dask()
    try:
        if scheduler == "local":
            cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 2
            cluster = distributed.LocalCluster(
                n_workers=max(1, cores), threads_per_worker=1, processes=True,
                dashboard_address=None,
            )  # fmt: skip
            stack.callback(cluster.close)
            client = distributed.Client(cluster, timeout=CONNECT_TIMEOUT_S)
        elif os.path.isfile(scheduler):
            client = distributed.Client(scheduler_file=scheduler, timeout=CONNECT_TIMEOUT_S)
        else:
            client = distributed.Client(scheduler, timeout=CONNECT_TIMEOUT_S)
    except (OSError, TimeoutError, ValueError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise SyncscopeError(f"cannot reach the Dask scheduler {scheduler}: {reason}") from None
    stack.callback(client.close)
    return client


def cluster_results(
    files: Sequence[Source],
    sizes: Sequence[int],
    scheduler: str,
    advance: Callable[[int], None] | None,
) -> Iterator[RankResult]:
    """Each file's ``RankResult``, read on the cluster, yielded in file order."""
    distributed = _dask()
    with ExitStack() as stack:
        client = _client(scheduler, stack)
        threads = sum(client.nthreads().values()) or 1
        groups = batches(sizes, threads)
        futures = [
            client.submit(read_batch, [files[i] for i in g], pure=False, retries=RETRIES)
            for g in groups
        ]
        index = {f.key: n for n, f in enumerate(futures)}
        done: dict[int, list[RankResult]] = {}
        following = 0
        try:
            for future in distributed.as_completed(futures):
                n = index[future.key]
                done[n] = future.result()
                if advance is not None:
                    advance(sum(sizes[i] for i in groups[n]))
                while following in done:
                    yield from done.pop(following)
                    following += 1
        except (distributed.KilledWorker, distributed.client.FutureCancelledError) as exc:
            raise SyncscopeError(f"the Dask cluster lost a read: {exc}") from None
        finally:
            client.cancel(futures)
