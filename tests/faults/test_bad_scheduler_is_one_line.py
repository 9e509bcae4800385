"""``analyze --scheduler`` on a bad scheduler, a lost one, and hostile URLs.

Each ends in one line on stderr and exit 2, never a traceback from Dask or syncscope, and
never a hang: a scheduler file of invalid JSON or one that does not exist, a scheduler with
no worker, a scheduler killed mid-run, ``file:///dev/zero`` and an endless object behind a
URL (read with the local reader's bounds, streamed, never copied to disk), and fsspec globs
(expanded as the shell expands a local one).
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from syncscope import cli
from syncscope.errors import BadTrace
from tests.helpers import hostile as h
from tests.helpers.synth_traces import Shape, write_job

distributed = pytest.importorskip("distributed", reason="needs syncscope[dask]")
fsspec = pytest.importorskip("fsspec", reason="URLs need fsspec (syncscope[dask])")

START_TIMEOUT_S = 60
SERVED_LIMIT = 96 << 20  # the endless object fails the read past this (the old copy got there)


def one_line(err: str) -> str:
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err.strip()


@pytest.fixture
def traces(tmp_path: Path) -> Path:
    write_job(tmp_path / "traces", 2, 50_000, Shape(ops_per_forward=4))
    return tmp_path / "traces"


def _analyze(tmp_path: Path, scheduler: str, *paths: str) -> list[str]:
    return ["analyze", "-q", "--out", str(tmp_path / "out"), "--scheduler", scheduler, *paths]


def test_a_scheduler_file_of_invalid_json_is_one_line(
    tmp_path: Path, traces: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Was: Dask's AssertionError traceback (``assert ip is not None``), exit 1."""
    bad = h.write_text(tmp_path, "scheduler.json", "not json {")
    assert cli.main(_analyze(tmp_path, str(bad), str(traces))) == 2
    assert one_line(capsys.readouterr().err) == (
        f"syncscope: error: {bad}: not a Dask scheduler file (invalid JSON)"
    )
    assert not (tmp_path / "out").exists()


def test_a_missing_scheduler_file_says_so(
    tmp_path: Path, traces: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Was: "missing port number in address 'scheduler.json'"."""
    missing = tmp_path / "scheduler.json"
    assert cli.main(_analyze(tmp_path, str(missing), str(traces))) == 2
    assert one_line(capsys.readouterr().err) == (
        f"syncscope: error: {missing}: no such scheduler file "
        "(nor a scheduler address: tcp://HOST:PORT)"
    )


def _popen(*args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, *args],
        env=dict(h.tree_env(), OMP_NUM_THREADS="1"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in reversed(procs):
        if proc.poll() is None:
            proc.kill()
        proc.wait()


@pytest.fixture
def scheduler(tmp_path: Path) -> Iterator[tuple[Path, list[subprocess.Popen[bytes]]]]:
    """A ``dask scheduler`` on loopback with no worker (its file, and the processes to stop:
    a test adds its workers); every process is killed at the end."""
    sched_file = tmp_path / "scheduler.json"
    procs = [
        _popen("-m", "dask", "scheduler", "--host", "127.0.0.1", "--port", "0",
               "--no-dashboard", "--scheduler-file", str(sched_file))
    ]  # fmt: skip
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not (sched_file.exists() and sched_file.stat().st_size) and procs[0].poll() is None:
            assert time.monotonic() < deadline, "the scheduler did not start"
            time.sleep(0.1)
        time.sleep(0.2)  # the file is written whole by now
        yield sched_file, procs
    finally:
        _stop(procs)


def _cli(tmp_path: Path, *args: str, **env: str) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "syncscope", "analyze", "-q", "--out", str(tmp_path / "out")]
    return subprocess.Popen(
        [*cmd, *args],
        env={**h.tree_env(), **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(proc: subprocess.Popen[str], timeout: float) -> tuple[int, str]:
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        return -1, err + "\n(killed: still running after the test's timeout)"
    return proc.returncode, err


@pytest.mark.slow  # a Dask scheduler and worker processes
def test_a_scheduler_without_workers_waits_a_bounded_time(
    tmp_path: Path, traces: Path, scheduler: tuple[Path, list[subprocess.Popen[bytes]]]
) -> None:
    """Was: waited forever, printing nothing."""
    sched_file, _ = scheduler
    started = time.monotonic()
    proc = _cli(
        tmp_path, "--scheduler", str(sched_file), str(traces), SYNCSCOPE_DASK_WORKER_WAIT="1.5"
    )
    status, err = _finish(proc, 40)
    assert (status, one_line(err)) == (
        2,
        f"syncscope: error: no Dask worker joined the scheduler {sched_file} in 1.5 s",
    )
    assert time.monotonic() - started < 30


def test_a_bad_worker_wait_is_one_line(
    tmp_path: Path, traces: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    monkeypatch.setenv("SYNCSCOPE_DASK_WORKER_WAIT", "nan")
    assert cli.main(_analyze(tmp_path, "tcp://127.0.0.1:1", str(traces))) == 2
    assert one_line(capsys.readouterr().err) == (
        "syncscope: error: SYNCSCOPE_DASK_WORKER_WAIT='nan': not a number of seconds above 0"
    )


def _run_reading(
    tmp_path: Path, sched_file: Path, procs: list[subprocess.Popen[bytes]], **env: str
) -> subprocess.Popen[str]:
    """``analyze`` of 16 x 3 MB traces on the scheduler's one worker (``procs[1]``),
    returned once that worker is reading."""
    big = tmp_path / "big"
    write_job(big, 16, 3 << 20, Shape(ops_per_forward=10))
    procs.append(
        _popen("-m", "dask", "worker", "--scheduler-file", str(sched_file), "--nthreads", "1",
               "--no-nanny", "--host", "127.0.0.1", "--no-dashboard")
    )  # fmt: skip
    with distributed.Client(scheduler_file=str(sched_file), timeout=START_TIMEOUT_S) as c:
        c.wait_for_workers(1, timeout=START_TIMEOUT_S)
        proc = _cli(tmp_path, "--scheduler", str(sched_file), str(big), **env)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not any(c.processing().values()) and proc.poll() is None:
            assert time.monotonic() < deadline, "no read started"
            time.sleep(0.02)
    return proc


@pytest.mark.slow  # a Dask scheduler and worker processes
def test_a_scheduler_killed_mid_run_is_one_line(
    tmp_path: Path, scheduler: tuple[Path, list[subprocess.Popen[bytes]]]
) -> None:
    """Was: Dask's "Failed to reconnect" log line, then an error of two lines."""
    sched_file, procs = scheduler
    proc = _run_reading(tmp_path, sched_file, procs)
    procs[0].kill()  # the scheduler, while the worker reads
    status, err = _finish(proc, 60)
    assert (status, one_line(err)) == (
        2,
        f"syncscope: error: lost the Dask scheduler {sched_file} mid-run "
        "(scheduler-connection-lost)",
    )


@pytest.mark.slow  # a Dask scheduler and worker processes
def test_every_worker_gone_mid_run_is_one_line_in_bounded_time(
    tmp_path: Path, scheduler: tuple[Path, list[subprocess.Popen[bytes]]]
) -> None:
    """Was: the tasks waited for a worker for ever, printing nothing."""
    sched_file, procs = scheduler
    proc = _run_reading(tmp_path, sched_file, procs, SYNCSCOPE_DASK_WORKER_WAIT="1.5")
    procs[1].kill()  # the only worker, while it reads
    status, err = _finish(proc, 40)
    assert status == 2
    assert one_line(err).startswith(
        f"syncscope: error: no Dask worker left on the scheduler {sched_file} for 1.5 s, "
    )


def test_file_url_of_dev_zero_is_refused_before_any_read(traces: Path) -> None:
    """Was: listed as a file of size 0; a worker then copied it to its temporary directory
    without end (2 GB in 20 s)."""
    from syncscope.load.traces import load_traces

    started = time.monotonic()
    with pytest.raises(BadTrace) as caught:  # a scheduler never reached: refused before it
        load_traces(["file:///dev/zero", str(traces)], scheduler="tcp://127.0.0.1:1")
    assert str(caught.value) == "file:///dev/zero: not a regular file (other): not a trace file"
    assert time.monotonic() - started < 5


class _Endless(io.RawIOBase):
    """An object of zeros without end (fails the read past SERVED_LIMIT), not seekable."""

    served = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if _Endless.served > SERVED_LIMIT:
            raise OSError(f"served more than {SERVED_LIMIT >> 20} MiB")
        view = memoryview(buffer).cast("B")
        view[:] = bytes(len(view))
        _Endless.served += len(view)
        return len(view)


_FileSystem: Any = fsspec.AbstractFileSystem


class _EndlessFS(_FileSystem):  # type: ignore[misc]
    protocol = "endless"

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        return {"name": path, "size": 0, "type": "file"}  # a size the store does not know

    def _open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        return io.BufferedReader(_Endless())


@pytest.mark.slow  # seconds of CPU: in the slow loop (.ci/run)
def test_an_endless_url_object_is_refused_at_the_local_readers_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Was: copied whole to the worker's temporary directory before any read."""
    from syncscope.load.trace import cluster
    from syncscope.load.trace.read import _MAX_UNSPLIT_BYTES, CHUNK_BYTES

    fsspec.register_implementation("endless", _EndlessFS, clobber=True)
    monkeypatch.setattr(_Endless, "served", 0)
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # nothing may be written there
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    # WHEN a worker reads the object (read_batch is the task a worker runs)
    (result,) = cluster.read_batch(["endless://bucket/rank-0.json"])
    # THEN it stops where a local file of zeros stops, and names the URL
    assert result.error == (
        "endless://bucket/rank-0.json: no 'traceEvents' array: not a Kineto trace"
    )
    assert _Endless.served <= _MAX_UNSPLIT_BYTES + 2 * CHUNK_BYTES + (1 << 20)
    assert os.listdir(tmp_path) == []
    # AND a local file of the same zeros says the same
    zeros = tmp_path / "rank-0.json"
    zeros.write_bytes(bytes(_MAX_UNSPLIT_BYTES + (1 << 20)))
    assert cluster.read_batch([zeros])[0].error == f"{zeros}: {result.error.split(': ', 1)[1]}"


def test_fsspec_globs_are_expanded(tmp_path: Path) -> None:
    """Was: a glob was looked up as one name ("no such file or directory")."""
    from syncscope.load.trace import cluster

    paths = write_job(tmp_path / "t", 3, 50_000, Shape(ops_per_forward=4))
    pattern = (tmp_path / "t").as_uri() + "/rank-[02].json"
    assert [u for u, _ in cluster.url_files(pattern)] == [paths[0].as_uri(), paths[2].as_uri()]
    memory = fsspec.filesystem("memory")
    for p in paths:
        memory.pipe(f"/syncscope-glob/{p.name}", p.read_bytes())
    try:
        listed = cluster.url_files("memory://syncscope-glob/*.json")
        assert [u for u, _ in listed] == [f"memory:///syncscope-glob/{p.name}" for p in paths]
        # a directory the pattern matches is read as a directory named alone
        assert cluster.url_files("memory://syncscope-g*") == listed
        with pytest.raises(BadTrace, match=r"^memory://nowhere/\*\.json: no file matches this"):
            cluster.url_files("memory://nowhere/*.json")
    finally:
        memory.rm("/syncscope-glob", recursive=True)


class _Impostor:
    """A loopback TCP service that is no Dask scheduler: ``banner`` (bytes it sends on
    connect, as sshd does) or None (it reads and never answers, as an HTTP server waiting
    for a request does). Stops within a fraction of a second of ``close``."""

    def __init__(self, banner: bytes | None) -> None:
        import socket
        import threading

        self.banner = banner
        self.server = socket.create_server(("127.0.0.1", 0))
        self.server.settimeout(0.1)
        self.port = self.server.getsockname()[1]
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        held = []
        while not self.stop.is_set():
            try:
                conn, _ = self.server.accept()
            except TimeoutError:
                continue
            held.append(conn)
            if self.banner is not None:
                conn.sendall(self.banner)
        for conn in held:
            conn.close()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=5)
        self.server.close()


def _analyze_in_thread(args: list[str], limit_s: float) -> tuple[int | None, float]:
    """``cli.main(args)`` in a thread: (its status, seconds), None when still running after
    ``limit_s`` (the thread is a daemon: the test process does not wait for it)."""
    import threading

    status: list[int] = []
    started = time.monotonic()
    thread = threading.Thread(target=lambda: status.append(cli.main(args)), daemon=True)
    thread.start()
    thread.join(timeout=limit_s)
    return (status[0] if status else None), time.monotonic() - started


def test_a_port_that_says_nothing_is_no_scheduler_in_bounded_time(
    tmp_path: Path, traces: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    """Was: waited silently for ever at an HTTP port (the dashboard's)."""
    from syncscope.load.trace import cluster

    monkeypatch.setattr(cluster, "CONNECT_TIMEOUT_S", 1.0)
    quiet = _Impostor(banner=None)
    try:
        address = f"tcp://127.0.0.1:{quiet.port}"
        status, took = _analyze_in_thread(_analyze(tmp_path, address, str(traces)), 30)
    finally:
        quiet.close()
    assert status == 2, f"still waiting after {took:.0f} s" if status is None else status
    assert one_line(capsys.readouterr().err) == (
        f"syncscope: error: {address}: not a Dask scheduler at {address}: it sent nothing "
        "in 1 s (an HTTP port, such as the dashboard's?)"
    )
    assert took < 15
    assert not (tmp_path / "out").exists()


def test_a_service_that_speaks_first_is_no_scheduler(
    tmp_path: Path, traces: Path, capsys: Any
) -> None:
    """Was: Dask read the banner's first 8 bytes as a length: "Unable to allocate 2.82 EiB",
    a traceback, exit 1."""
    sshd = _Impostor(banner=b"SSH-2.0-OpenSSH_9.6p1 Ubuntu-3ubuntu13.5\r\n")
    try:
        address = f"127.0.0.1:{sshd.port}"  # host:port, as a scheduler file may also hold it
        status, took = _analyze_in_thread(_analyze(tmp_path, address, str(traces)), 30)
    finally:
        sshd.close()
    assert status == 2
    assert one_line(capsys.readouterr().err) == (
        f"syncscope: error: {address}: not a Dask scheduler at {address}: it opened with "
        "'SSH-2.0-OpenSSH_', not a Dask handshake"
    )
    assert took < 15
