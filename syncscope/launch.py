"""Launch a script on N ranks through torch's own launcher, watching it as it runs.

``syncscope profile`` builds a torchrun command line (every launcher option passes through
unchanged, multi-node rendezvous included), with ``-m syncscope.attach`` as the program so
each rank runs the user's script instrumented, and calls ``torch.distributed.run.run`` in
this process. A monitor thread reads the rank event files as they grow: it shows progress
and, when no rank has written anything for ``hang_timeout`` seconds, stops the workers so
the run can be reported instead of hanging forever.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from syncscope.rundir import rank_files

LAUNCHER_FLAGS = {
    # our option name -> torchrun flag
    "nproc_per_node": "--nproc-per-node",
    "nnodes": "--nnodes",
    "node_rank": "--node-rank",
    "rdzv_backend": "--rdzv-backend",
    "rdzv_endpoint": "--rdzv-endpoint",
    "rdzv_id": "--rdzv-id",
    "rdzv_conf": "--rdzv-conf",
    "master_addr": "--master-addr",
    "master_port": "--master-port",
    "max_restarts": "--max-restarts",
    "monitor_interval": "--monitor-interval",
    "start_method": "--start-method",
    "local_addr": "--local-addr",
    "log_dir": "--log-dir",
}


@dataclass
class LaunchOptions:
    values: dict[str, str] = field(default_factory=dict)  # set options only
    standalone: bool = False

    def torchrun_args(self) -> list[str]:
        args: list[str] = []
        single_node = self.values.get("nnodes", "1") in ("1", "1:1")
        rendezvous_given = any(
            k in self.values
            for k in ("rdzv_endpoint", "master_addr", "master_port", "rdzv_backend")
        )
        if self.standalone or (single_node and not rendezvous_given):
            args.append("--standalone")  # a free port on this host: runs never collide
        for key, flag in LAUNCHER_FLAGS.items():
            if key in self.values:
                args += [flag, self.values[key]]
        return args

    def as_dict(self) -> dict[str, str]:
        out = dict(self.values)
        if self.standalone:
            out["standalone"] = "true"
        return out


@dataclass
class LaunchResult:
    status: int  # 0, or the first failing rank's exit status
    failed_ranks: dict[int, int]  # every rank the launcher saw end badly
    first_failed: int | None
    hung: bool
    wall_s: float
    error: str = ""  # the launcher itself failed or was stopped (one line)


@contextlib.contextmanager
def _quiet_elastic() -> Iterator[None]:
    logger = logging.getLogger("torch.distributed.elastic")
    previous = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(previous)


class Monitor(threading.Thread):
    """Follows the rank files: progress for the user, and hang detection."""

    def __init__(
        self,
        run_dir: Path,
        hang_timeout: float,
        on_progress: Callable[[int, int, float], None] | None = None,
        poll_s: float = 0.25,
        on_captured: Callable[[], None] | None = None,
        expected_ranks: int = 1,
    ) -> None:
        super().__init__(name="syncscope-monitor", daemon=True)
        self.run_dir = run_dir
        self.hang_timeout = hang_timeout
        self.on_progress = on_progress
        self.poll_s = poll_s
        self.hung = False
        self.steps = 0
        self._stop_event = threading.Event()
        self._sizes: dict[Path, int] = {}
        self._offset = 0
        self._pids: dict[Path, int] = {}
        self._exited: set[Path] = set()
        # bounded capture: called once every rank has written its record (the job runs on)
        self.on_captured = on_captured
        self.expected_ranks = expected_ranks
        self._captured: set[Path] = set()

    def stop(self) -> None:
        self._stop_event.set()

    def _read_new(self) -> bool:
        changed = False
        for path in rank_files(self.run_dir):
            size = path.stat().st_size
            if size == self._sizes.get(path, 0):
                continue
            changed = True
            old = self._sizes.get(path, 0)
            self._sizes[path] = size
            with path.open("rb") as fh:
                fh.seek(old)
                chunk = fh.read(size - old)
            if path not in self._pids:
                first = chunk.split(b"\n", 1)[0]
                with contextlib.suppress(orjson.JSONDecodeError):
                    self._pids[path] = int(orjson.loads(first).get("pid", 0))
            if b'"type":"exit"' in chunk:
                self._exited.add(path)
                if b'"reason":"capture complete' in chunk:
                    self._captured.add(path)
            if path.name.endswith("00000.jsonl"):
                self.steps += chunk.count(b'"type":"step_end"')
        return changed

    def run(self) -> None:
        start = last_change = time.monotonic()
        while not self._stop_event.wait(self.poll_s):
            try:
                if self._read_new():
                    last_change = time.monotonic()
            except OSError:
                continue
            now = time.monotonic()
            if (
                self.on_captured is not None
                and len(self._sizes) >= self.expected_ranks
                and set(self._sizes) <= self._captured
            ):
                callback, self.on_captured = self.on_captured, None
                callback()
            if self.on_progress is not None:
                self.on_progress(self.steps, len(self._sizes), now - start)
            running = [p for p in self._pids if p not in self._exited]
            if self.hang_timeout > 0 and running and now - last_change > self.hang_timeout:
                self.hung = True
                self._stop_workers(running)
                return

    def _stop_workers(self, paths: list[Path]) -> None:
        pids = [self._pids[p] for p in paths if self._pids.get(p)]
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)
            deadline = time.monotonic() + 3.0
            while time.monotonic() < deadline and any(_alive(pid) for pid in pids):
                time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def launch(
    options: LaunchOptions,
    run_dir: Path,
    target: str,
    script_args: list[str],
    *,
    module: bool = False,
    hang_timeout: float = 300.0,
    trace_windows: str | None = None,
    on_progress: Callable[[int, int, float], None] | None = None,
    attach_options: list[str] | None = None,
    on_captured: Callable[[], None] | None = None,
    expected_ranks: int = 1,
) -> LaunchResult:
    """Run ``target`` on every rank under syncscope.attach; never raises for a rank's failure."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    program = (
        ["--out", str(run_dir), *(attach_options or [])]
        + (["-m", target] if module else [target])
        + script_args
    )
    argv = [*options.torchrun_args(), "-m", "syncscope.attach", *program]
    args = parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ["SYNCSCOPE_PROFILE_PID"] = str(os.getpid())  # ranks end when this process does
    if trace_windows is not None:
        os.environ["SYNCSCOPE_TRACE_WINDOWS"] = trace_windows
    monitor = Monitor(
        run_dir, hang_timeout, on_progress, on_captured=on_captured, expected_ranks=expected_ranks
    )
    monitor.start()
    started = time.monotonic()
    failed: dict[int, int] = {}
    first_failed: int | None = None
    status = 0
    error = ""
    try:
        with _quiet_elastic():
            run(args)
    except ChildFailedError as exc:
        for global_rank, failure in sorted(exc.failures.items()):
            code = failure.exitcode
            failed[global_rank] = 128 + (-code) if code < 0 else code
        # the root cause is the first rank to fail; the launcher then stops the others
        first_failed, _ = exc.get_first_failure()
        status = failed.get(first_failed, 1) or 1
    except SystemExit as exc:  # the launcher's own argument or rendezvous errors
        status = exc.code if isinstance(exc.code, int) else 1
    except KeyboardInterrupt:
        status, error = 130, "interrupted"
    except Exception as exc:  # rendezvous failures, a signal to the agent (SignalException)
        sigval = getattr(exc, "sigval", None)
        status = 128 + int(sigval) if sigval is not None else 1
        error = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
    finally:
        monitor.stop()
        monitor.join(timeout=5)
    if monitor.hung:
        status, failed, first_failed = 1, {}, None  # syncscope stopped the job itself
    sys.stdout.flush()
    return LaunchResult(
        status, failed, first_failed, monitor.hung, time.monotonic() - started, error
    )
