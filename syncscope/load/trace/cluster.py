"""Read trace files on a Dask distributed cluster (``analyze --scheduler``).

The per-rank read (``read_rank``) is the whole cost of a large trace set and needs nothing
from the other files, so it runs on the cluster's workers: files go out in batches (a task
reads several files, so a job of 16k small files is not 16k tasks), each task sends back its
files' ``RankResult`` (a reduced rank, ~0.4 KB per window; the events stay on the worker),
and the client yields them in file order, where ``load_traces`` merges and checks them as it
does the built-in pool's. The diagnosis and reports run here, on the client.

A worker that dies mid-task loses nothing: the scheduler runs its task again elsewhere (up to
``RETRIES`` more times for a task that raised). Files may be fsspec URLs (``s3://``,
``gs://``, ``file://``, where fsspec and the backend are installed), and fsspec globs
(``s3://bucket/job/*.json``): a worker streams one object through the same reader as a local
file, with the same bounds (nothing is copied to its disk).

Nothing from Dask reaches the terminal: its loggers are silenced while the client runs, and a
scheduler that cannot be reached, has no worker within ``worker_wait()`` seconds, or goes
away mid-run is one ``SyncscopeError`` line. Before Dask connects to a ``tcp://`` address,
``probe_scheduler`` checks that what listens there opens as a Dask scheduler does (its
handshake, within ``CONNECT_TIMEOUT_S``): Dask itself waits for ever on a port that says
nothing (an HTTP server: the dashboard's port) and sizes a buffer from the first 8 bytes of a
service that speaks first (an SSH banner asked for 2.82 EiB).

Dask is imported only here, and this module only with ``--scheduler``.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import socket
import struct
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import CancelledError
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from syncscope.atomic import NotRegularFile, read_regular
from syncscope.errors import BadTrace, SyncscopeError
from syncscope.load.trace.rankfile import RankResult, read_rank
from syncscope.load.trace.read import is_trace_file
from syncscope.text import visible

CONNECT_TIMEOUT_S = 10.0
RETRIES = 2  # a task whose read raised (a worker's disk, network) is tried this many more times
TASKS_PER_THREAD = 4  # batches per worker thread: balance against per-task overhead
MAX_BATCH_BYTES = 2 << 30  # a batch reads at most this much (one file may exceed it alone)
MAX_BATCH_FILES = 256
WORKER_WAIT_S = 60.0  # a scheduler with no worker: how long to wait for one to join
WORKER_WAIT_ENV = "SYNCSCOPE_DASK_WORKER_WAIT"  # seconds, instead of WORKER_WAIT_S
SCHEDULER_FILE_MAX_BYTES = 1 << 20  # a scheduler file is an address and a few ids
MAX_HANDSHAKE_BYTES = 1 << 20  # a scheduler's first message: ~60 bytes (its handshake)
MAX_HANDSHAKE_FRAMES = 64
_ADDRESS = re.compile(r"[A-Za-z0-9_.-]+:\d+|\[[0-9A-Fa-f:.]+\]:\d+")  # host:port, [v6]:port
_URL_STAND_IN = Path("/syncscope-url")  # the path a URL's read names, replaced by the URL

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
    """The trace files (URL, size) at ``url``: a file, a directory holding them, or an fsspec
    glob (each match a file or such a directory, as the shell expands a local one)."""
    fsspec = _fsspec()
    try:
        fs, root = fsspec.core.url_to_fs(url)
        if not fsspec.core.has_magic(root):
            return _url_entry(fs, url, root)
        matches = sorted(fs.glob(root))
        if not matches:
            raise BadTrace(f"{url}: no file matches this pattern")
        files = [
            found
            for name in matches
            for found in _url_entry(fs, fs.unstrip_protocol(name), name, in_glob=True)
        ]
        if not files:
            raise BadTrace(f"{url}: no trace files (*.json, *.json.gz) where this pattern matches")
        return files
    except (OSError, ValueError, ImportError) as exc:
        raise BadTrace(f"{url}: cannot list ({exc})") from None


def _url_entry(fs: Any, url: str, root: str, in_glob: bool = False) -> list[tuple[str, int]]:
    """The trace files at one listed path: the file itself, or a directory's trace files."""
    if not fs.exists(root):
        raise BadTrace(f"{url}: no such file or directory")
    if fs.isdir(root):
        for where in (root, root.rstrip("/") + "/traces"):
            entries = fs.ls(where, detail=True) if fs.isdir(where) else []
            found = sorted(
                (str(e["name"]), int(e.get("size") or 0))
                for e in entries
                if e.get("type") == "file" and is_trace_file(Path(str(e["name"])))
            )
            if found:
                return [(fs.unstrip_protocol(name), size) for name, size in found]
        if in_glob:
            return []  # a directory the pattern also matched, holding no traces
        raise BadTrace(f"{url}: no trace files (*.json, *.json.gz) in this directory")
    info = fs.info(root)
    if info.get("type") not in ("file", None):  # a device (file:///dev/zero), a FIFO
        raise BadTrace(f"{url}: not a regular file ({info.get('type')}): not a trace file")
    return [(url, int(info.get("size") or 0))]


def _read_url(url: str) -> RankResult:
    """Read one URL's object, streamed through the reader as a local file is (the same
    bounds: an endless object is refused as an endless file is); messages name the URL."""
    fsspec = _fsspec()
    stand_in = _URL_STAND_IN / url.rstrip("/").rsplit("/", 1)[-1]
    result = read_rank(stand_in, opener=lambda: fsspec.open(url, "rb").open())
    result.error = result.error.replace(str(stand_in), url)
    result.rank_notes = [n.replace(str(stand_in), url) for n in result.rank_notes]
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


def worker_wait() -> float:
    """Seconds to wait for a first worker: ``SYNCSCOPE_DASK_WORKER_WAIT``, else WORKER_WAIT_S."""
    text = os.environ.get(WORKER_WAIT_ENV, "").strip()
    if not text:
        return WORKER_WAIT_S
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise SyncscopeError(f"{WORKER_WAIT_ENV}={text!r}: not a number of seconds above 0")
    return value


def scheduler_address(scheduler: str) -> str:
    """The address ``--scheduler`` names: itself (``tcp://host:8786``, ``host:8786``), or
    the ``address`` of the scheduler file it names (as ``dask scheduler --scheduler-file``
    writes it)."""
    if not os.path.exists(scheduler) and ("://" in scheduler or _ADDRESS.fullmatch(scheduler)):
        return scheduler
    try:
        data = json.loads(read_regular(Path(scheduler), SCHEDULER_FILE_MAX_BYTES))
    except FileNotFoundError:
        raise SyncscopeError(
            f"{scheduler}: no such scheduler file (nor a scheduler address: tcp://HOST:PORT)"
        ) from None
    except (NotRegularFile, IsADirectoryError) as exc:
        raise SyncscopeError(f"{scheduler}: not a Dask scheduler file ({exc})") from None
    except OSError as exc:
        raise SyncscopeError(f"cannot read {scheduler}: {exc.strerror or exc}") from None
    except (ValueError, RecursionError) as exc:  # invalid JSON, not UTF-8, too large
        reason = "invalid JSON" if isinstance(exc, json.JSONDecodeError) else str(exc)
        raise SyncscopeError(f"{scheduler}: not a Dask scheduler file ({reason})") from None
    address = data.get("address") if isinstance(data, dict) else None
    if not isinstance(address, str) or not address:
        raise SyncscopeError(f"{scheduler}: not a Dask scheduler file (no 'address' in it)")
    return address


def _host_port(address: str) -> tuple[str, int] | None:
    """``tcp://host:port``, ``host:port`` or ``[v6]:port`` -> (host, port); None for
    another protocol (tls://, ws://, ucx://: not probed) or no port."""
    scheme, _, loc = address.rpartition("://")
    if scheme not in ("", "tcp"):
        return None
    host, _, port = loc.rpartition(":")
    if not port.isdigit() or not host or int(port) > 65535:
        return None
    return host.strip("[]"), int(port)


def _opening(sock: socket.socket, size: int, timeout: float) -> tuple[bytes, bool]:
    """The first ``size`` bytes the peer sends within ``timeout`` seconds (fewer: it went
    quiet, or closed: then True)."""
    data = b""
    deadline = time.monotonic() + timeout
    while len(data) < size:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        sock.settimeout(left)
        try:
            chunk = sock.recv(size - len(data))
        except TimeoutError:
            break
        if not chunk:
            return data, True
        data += chunk
    return data, False


def probe_scheduler(address: str, scheduler: str, timeout: float | None = None) -> None:
    """A ``SyncscopeError`` line unless what listens at ``address`` opens as a Dask
    scheduler: on connect it sends its handshake, a message whose first 16 bytes are its
    length and frame count (little-endian 64-bit), both small. A port that sends nothing
    in ``timeout`` seconds, closes, or opens with anything else is no Dask scheduler; an
    address that refuses the connection is left to Dask (it retries until its timeout)."""
    where = _host_port(address)
    if where is None:
        return
    wait = CONNECT_TIMEOUT_S if timeout is None else timeout
    try:
        with socket.create_connection(where, timeout=wait) as sock:
            head, closed = _opening(sock, 16, wait)
    except OSError:
        return  # refused or unreachable: Dask says so, in its own words
    nbytes, frames = struct.unpack("<QQ", head) if len(head) == 16 else (0, 0)
    if 16 <= nbytes <= MAX_HANDSHAKE_BYTES and 1 <= frames <= MAX_HANDSHAKE_FRAMES:
        return
    if not head:
        why = (
            "it closed the connection without a word"
            if closed
            else f"it sent nothing in {wait:g} s (an HTTP port, such as the dashboard's?)"
        )
    else:
        shown = head.decode("latin-1")
        why = f"it opened with {visible(shown)!r}, not a Dask handshake"
    raise SyncscopeError(f"{scheduler}: not a Dask scheduler at {address}: {why}")


@contextmanager
def _quiet() -> Iterator[None]:
    """No log record (Dask's, tornado's, asyncio's tracebacks of a lost connection) reaches
    the terminal while the client runs: its failures end as one SyncscopeError line."""
    previous = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    try:
        yield
    finally:
        logging.disable(previous)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _reason(exc: BaseException) -> str:
    """Why Dask cancelled the reads (``scheduler-connection-lost``), else the first line."""
    groups = getattr(exc, "error_groups", None) or [exc]  # FuturesCancelledError: groups
    reason = getattr(groups[0], "reason", None)
    return reason if isinstance(reason, str) and reason else _first_line(exc)


def _client(scheduler: str, stack: ExitStack) -> Any:
    """A client of ``scheduler`` with at least one worker: ``local`` (a LocalCluster here),
    a scheduler file or an address (``scheduler_address``)."""
    distributed = _dask()
    wait = worker_wait()
    try:
        if scheduler == "local":
            cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 2
            cluster = distributed.LocalCluster(
                n_workers=max(1, cores), threads_per_worker=1, processes=True,
                dashboard_address=None, silence_logs=logging.CRITICAL,
            )  # fmt: skip
            stack.callback(cluster.close)
            client = distributed.Client(cluster, timeout=CONNECT_TIMEOUT_S)
        else:
            address = scheduler_address(scheduler)
            probe_scheduler(address, scheduler)
            client = distributed.Client(address, timeout=CONNECT_TIMEOUT_S)
    except (OSError, TimeoutError, ValueError) as exc:
        raise SyncscopeError(
            f"cannot reach the Dask scheduler {scheduler}: {_first_line(exc)}"
        ) from None
    stack.callback(client.close)
    try:
        client.wait_for_workers(1, timeout=wait)
    except OSError as exc:  # TimeoutError is one
        if isinstance(exc, TimeoutError):
            raise SyncscopeError(
                f"no Dask worker joined the scheduler {scheduler} in {wait:g} s"
            ) from None
        raise SyncscopeError(f"lost the Dask scheduler {scheduler}: {_first_line(exc)}") from None
    return client


def _completed(client: Any, futures: list[Any], scheduler: str) -> Iterator[Any]:
    """``futures`` as they finish; when the cluster has had no worker for ``worker_wait()``
    seconds (every worker gone mid-run), a SyncscopeError instead of waiting for ever."""
    distributed = _dask()
    wait = worker_wait()
    pending = set(futures)
    seen = time.monotonic()  # when the cluster last had a worker
    while pending:
        try:
            finished, pending = distributed.wait(
                pending, timeout=min(wait, 5.0), return_when="FIRST_COMPLETED"
            )
        except TimeoutError:
            now = time.monotonic()
            if client.nthreads():
                seen = now
            elif now - seen >= wait:
                raise SyncscopeError(
                    f"no Dask worker left on the scheduler {scheduler} for {wait:g} s, "
                    f"{len(pending)} read task(s) undone"
                ) from None
            continue
        yield from finished


def cluster_results(
    files: Sequence[Source],
    sizes: Sequence[int],
    scheduler: str,
    advance: Callable[[int], None] | None,
) -> Iterator[RankResult]:
    """Each file's ``RankResult``, read on the cluster, yielded in file order."""
    distributed = _dask()
    with _quiet(), ExitStack() as stack:
        client = _client(scheduler, stack)
        futures: list[Any] = []
        try:
            threads = sum(client.nthreads().values()) or 1
            groups = batches(sizes, threads)
            futures = [
                client.submit(read_batch, [files[i] for i in g], pure=False, retries=RETRIES)
                for g in groups
            ]
            index = {f.key: n for n, f in enumerate(futures)}
            done: dict[int, list[RankResult]] = {}
            following = 0
            for future in _completed(client, futures, scheduler):
                n = index[future.key]
                done[n] = future.result()
                if advance is not None:
                    advance(sum(sizes[i] for i in groups[n]))
                while following in done:
                    yield from done.pop(following)
                    following += 1
        except distributed.KilledWorker as exc:
            raise SyncscopeError(f"the Dask cluster lost a read: {_first_line(exc)}") from None
        except (CancelledError, OSError) as exc:  # Dask's Future(s)CancelledError are ones
            raise SyncscopeError(
                f"lost the Dask scheduler {scheduler} mid-run ({_reason(exc)})"
            ) from None
        finally:
            if futures and client.status == "running":
                client.cancel(futures)
