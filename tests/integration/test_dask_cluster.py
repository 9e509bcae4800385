"""``analyze --scheduler``: trace reads on a real Dask cluster (a ``dask scheduler`` and two
``dask worker`` processes on 127.0.0.1), against the built-in pool's reports."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers.synth_traces import Shape, write_job

pytestmark = pytest.mark.slow
distributed = pytest.importorskip("distributed", reason="needs syncscope[dask]")

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 60
RUN_TIMEOUT_S = 180


def _env() -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return dict(os.environ, PYTHONPATH=path, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")


@dataclass
class Cluster:
    scheduler_file: Path
    address: str
    workers: list[subprocess.Popen[bytes]]


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    """Workers first, then the scheduler (a scheduler stopped first leaves its workers
    retrying it): SIGTERM, and SIGKILL after 5 s."""
    for proc in reversed(procs):
        if proc.poll() is None:
            proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    """A scheduler and two single-thread workers (no nanny: a worker's pid is the process
    that runs its tasks), all on loopback; every process is stopped at the end."""
    sched_file = tmp_path / "scheduler.json"
    dask = [sys.executable, "-m", "dask"]
    procs: list[subprocess.Popen[bytes]] = []
    log = (tmp_path / "cluster.log").open("wb")
    try:
        procs.append(
            subprocess.Popen(
                [*dask, "scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
                 "--scheduler-file", str(sched_file)],
                env=_env(), stdout=log, stderr=log,
            )
        )  # fmt: skip
        deadline = time.monotonic() + START_TIMEOUT_S
        while not sched_file.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert sched_file.exists(), (tmp_path / "cluster.log").read_text()
        workers = [
            subprocess.Popen(
                [
                    *dask,
                    "worker",
                    "--scheduler-file",
                    str(sched_file),
                    "--nthreads",
                    "1",
                    "--no-nanny",
                    "--host",
                    "127.0.0.1",
                    "--no-dashboard",
                    "--name",
                    f"w{i}",
                ],
                env=_env(),
                stdout=log,
                stderr=log,
            )
            for i in range(2)
        ]
        procs.extend(workers)
        with distributed.Client(scheduler_file=str(sched_file), timeout=START_TIMEOUT_S) as c:
            c.wait_for_workers(2, timeout=START_TIMEOUT_S)
            address = c.scheduler.address
        yield Cluster(sched_file, address, workers)
    finally:
        _stop(procs)
        log.close()


def _analyze(out: Path, *args: str, **env: str) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "syncscope", "analyze", "-q", "--fail-on", "never"]
    return subprocess.Popen(
        [*cmd, "--out", str(out), *args],
        env={**_env(), **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(proc: subprocess.Popen[str]) -> tuple[int, str]:
    try:
        _, err = proc.communicate(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
    return proc.returncode, err


def _reports(out: Path) -> tuple[bytes, bytes]:
    return (out / "report.json").read_bytes(), (out / "report.html").read_bytes()


def _pool_reports(tmp_path: Path, traces: Path) -> tuple[bytes, bytes]:
    status, err = _finish(_analyze(tmp_path / "pool", str(traces), SYNCSCOPE_TRACE_WORKERS="2"))
    assert status == 0, err
    return _reports(tmp_path / "pool")


def test_reports_on_the_cluster_equal_the_pools(tmp_path: Path, cluster: Cluster) -> None:
    # GIVEN a 6-rank job where rank 4 issues a broadcast in place of a bucket
    traces = tmp_path / "traces"
    write_job(traces, 6, 300_000, Shape(mismatch_rank=4, ops_per_forward=10))
    expected = _pool_reports(tmp_path, traces)
    assert b"collective-mismatch" in expected[0]
    # WHEN the reads run on the cluster, named by its address, its scheduler file, or as
    # URLs read by the workers
    for name, args in (
        ("address", ("--scheduler", cluster.address, str(traces))),
        ("file", ("--scheduler", str(cluster.scheduler_file), str(traces))),
        ("url", ("--scheduler", cluster.address, traces.resolve().as_uri())),
    ):
        status, err = _finish(_analyze(tmp_path / name, *args))
        # THEN the reports are the pool's, byte for byte
        assert status == 0, err
        assert _reports(tmp_path / name) == expected, name


def _busy(client: distributed.Client, name: str) -> bool:
    """Whether the worker called ``name`` has a task."""
    workers = client.scheduler_info()["workers"]
    addr = next((a for a, w in workers.items() if str(w.get("name")) == name), None)
    return addr is not None and bool(client.processing().get(addr))


def test_a_worker_killed_mid_run_loses_nothing(tmp_path: Path, cluster: Cluster) -> None:
    # GIVEN a job of enough files that each worker reads several
    traces = tmp_path / "traces"
    write_job(traces, 16, 3 << 20, Shape(ops_per_forward=10))
    expected = _pool_reports(tmp_path, traces)
    # WHEN worker w0 is killed while it is reading
    proc = _analyze(tmp_path / "killed", "--scheduler", cluster.address, str(traces))
    killed = False
    try:
        with distributed.Client(cluster.address, timeout=START_TIMEOUT_S) as client:
            deadline = time.monotonic() + RUN_TIMEOUT_S
            while proc.poll() is None and time.monotonic() < deadline:
                if _busy(client, "w0"):
                    cluster.workers[0].send_signal(signal.SIGKILL)
                    killed = True
                    break
                time.sleep(0.02)
        status, err = _finish(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    # THEN its task ran again on the other worker and the reports are the pool's
    assert killed, "the run ended before w0 was given a task"
    assert cluster.workers[0].wait(timeout=10) == -signal.SIGKILL
    assert status == 0, err
    assert _reports(tmp_path / "killed") == expected


def test_an_unreachable_scheduler_is_one_line_and_exit_2(tmp_path: Path) -> None:
    traces = tmp_path / "traces"
    write_job(traces, 2, 50_000, Shape(ops_per_forward=4))
    with socket.socket() as s:  # a loopback port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    started = time.monotonic()
    status, err = _finish(
        _analyze(tmp_path / "out", "--scheduler", f"tcp://127.0.0.1:{port}", str(traces))
    )
    assert status == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "syncscope: error: cannot reach the Dask scheduler"
    )
    assert f"127.0.0.1:{port}" in lines[0] and "Traceback" not in err
    assert time.monotonic() - started < 60
    assert not (tmp_path / "out").exists()  # nothing written
