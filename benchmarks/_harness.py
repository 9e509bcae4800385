"""Launching the benchmark workloads and reading back what they measured.

Every launch is a fresh ``torchrun`` (``python -m torch.distributed.run``) or ``syncscope
profile`` process tree with ``OMP_NUM_THREADS=1``, on one node (2 ranks) or as 2 "nodes" x
1 rank: two launcher processes meeting through the c10d rendezvous on 127.0.0.1. The
workloads print one ``SYNCSCOPE_BENCH {json}`` line from rank 0; ``Launch.run`` returns it.

A workload is named by its configuration (``workload``): the loops examples/ already has
are those example scripts, unchanged, started through workloads/run_example.py (which hands
their ``common`` helpers to workloads/_bench.py's ``ExampleBench``); the others are
benchmarks/workloads/NAME.py.
"""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parents[1]
WORKLOADS = Path(__file__).resolve().parent / "workloads"
EXAMPLES = ROOT / "examples"
sys.path.insert(0, str(WORKLOADS))  # the gate's two ends are one module (no torch in it)

from _gate import GATE_ENV, TAG_ENV, ready_file  # noqa: E402

# configuration -> the example that is its loop (workloads/_bench.py's EXAMPLE_CONFIGS)
EXAMPLE_WORKLOADS = {
    "sync_every_microbatch": "ddp_sync_every_step.py",
    "no_sync_backward_only": "ddp_no_sync_backward_only.py",
    "no_sync": "ddp_no_sync.py",
    "accelerate_accumulate": "accelerate_accumulate.py",
    "fsdp2_every_microbatch": "fsdp2_no_toggle.py",
    "fsdp2_last_only": "fsdp2_toggle.py",
}

MARK = "SYNCSCOPE_BENCH "
TIMEOUT_S = 240


TEARDOWN_ABORT = "terminate called without an active exception"
_T = TypeVar("_T")


class LaunchFailed(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = "1"  # one thread per rank on every launcher alike
    env["PYTHONWARNINGS"] = "ignore"
    paths = (str(ROOT), str(WORKLOADS), env.get("PYTHONPATH"))  # WORKLOADS: _bench, _gate
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    return env


def script_argv(script: Path) -> list[str]:
    """The command line's script part: an example (a script beside examples' ``common.py``, or
    a copy of one beside a copy of it) is started through workloads/run_example.py."""
    if script.parent != WORKLOADS and (script.parent / "common.py").is_file():
        return [str(WORKLOADS / "run_example.py"), str(script)]
    return [str(script)]


def workload(name: str) -> Path:
    """The script of configuration ``name`` (``.py`` optional): the example that is its
    loop, or benchmarks/workloads/NAME.py."""
    name = name.removesuffix(".py")
    if name in EXAMPLE_WORKLOADS:
        return EXAMPLES / EXAMPLE_WORKLOADS[name]
    return WORKLOADS / f"{name}.py"


@dataclass(frozen=True)
class Launch:
    """One way of starting a script: the launcher, its capture mode and the topology."""

    launcher: str  # "torchrun" or "profile"
    nodes: int = 1  # 1: one node x 2 ranks; 2: two "nodes" x 1 rank on loopback
    trace: bool = False  # syncscope profile --trace
    extra: tuple[str, ...] = field(default=())
    nproc: int = 2  # ranks per node when nodes == 1
    env: tuple[tuple[str, str], ...] = field(default=())  # set in the launcher's environment

    def _rdzv(self, run_id: str, port: int, node: int) -> list[str]:
        if self.nodes == 1:
            return ["--nproc-per-node", str(self.nproc)] + (
                ["--standalone"] if self.launcher == "torchrun" else []
            )
        return [
            "--nnodes", "2", "--node-rank", str(node), "--nproc-per-node", "1",
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
            "--rdzv-id", run_id,
        ]  # fmt: skip

    def argv(self, script: Path, args: Sequence[str], out: Path, node: int, run_id: str,
             port: int) -> list[str]:  # fmt: skip
        rdzv = self._rdzv(run_id, port, node)
        if self.launcher == "torchrun":
            return [sys.executable, "-m", "torch.distributed.run", *rdzv, *script_argv(script),
                    *args]  # fmt: skip
        node_out = out if self.nodes == 1 else out / f"node{node}"
        return [
            sys.executable, "-m", "syncscope", "profile", "--quiet", "--fail-on", "never",
            "--out", str(node_out), *(["--trace"] if self.trace else []), *self.extra, *rdzv,
            *script_argv(script), *args,
        ]  # fmt: skip

    def run(self, script: Path, args: Sequence[str], workdir: Path) -> dict[str, Any]:
        """Start the job, wait for it, return rank 0's measurement (raises LaunchFailed).

        A job that torch's gloo teardown aborted (``terminate called without an active
        exception`` at ``destroy_process_group``: about 1 plain torchrun run in 12 on this
        machine, 2026-11-24, more often compiled, syncscope not involved) after it printed
        its measurement keeps that measurement (every window was timed before the teardown);
        one aborted before is run again, up to 3 times in all."""
        return _again_after_teardown_abort(
            lambda: self.start(script, args, workdir).collect(), f"[{self}] {script.name}"
        )

    def start(
        self,
        script: Path,
        args: Sequence[str],
        workdir: Path,
        env: dict[str, str] | None = None,
    ) -> Started:
        """Start the job (``env``: more environment variables) without waiting for it."""
        run_id = f"bench-{uuid.uuid4().hex[:10]}"
        out = workdir / run_id
        port = free_port()
        if self.launcher == "profile" and self.nodes > 1:
            out.mkdir(parents=True)  # each node's run directory goes under it
        procs = [
            subprocess.Popen(
                self.argv(script, args, out, node, run_id, port),
                cwd=workdir,
                env={**_env(), **dict(self.env), **(env or {})},
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
            )
            for node in range(self.nodes)
        ]
        return Started(self, script, out, procs)

    @property
    def label(self) -> str:
        if self.launcher == "torchrun":
            return "torchrun"
        return "syncscope profile --trace" if self.trace else "syncscope profile"


@dataclass
class Started:
    """A job started by ``Launch.start``: ``collect`` waits for it, ``stop`` ends it."""

    launch: Launch
    script: Path
    out: Path
    procs: list[subprocess.Popen[str]]

    def collect(self) -> dict[str, Any]:
        """Wait for the job; rank 0's measurement (raises LaunchFailed)."""
        launch, script, out, procs = self.launch, self.script, self.out, self.procs
        outputs = [_wait(p) for p in procs]
        measured = any(line.startswith(MARK) for t in outputs for line in t.splitlines())
        for proc, text in zip(procs, outputs, strict=True):
            if proc.returncode != 0 and not (measured and TEARDOWN_ABORT in text):
                tail = "\n".join(text.strip().splitlines()[-8:])
                if TEARDOWN_ABORT in text:
                    tail += f"\n({TEARDOWN_ABORT})"
                raise LaunchFailed(f"{launch} on {script.name} exited {proc.returncode}:\n{tail}")
        for text in outputs:
            for line in text.splitlines():
                if line.startswith(MARK):
                    record: dict[str, Any] = json.loads(line[len(MARK) :])
                    record["run_dir"] = str(out)
                    return record
        raise LaunchFailed(f"{launch} on {script.name}: no {MARK.strip()} line")

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)  # our own launcher's process group only
                proc.communicate()


def side_by_side(
    jobs: Sequence[tuple[Launch, Path, Sequence[str]]], workdir: Path
) -> list[dict[str, Any]]:
    """Run the jobs at once, their timed windows over the same seconds: each job's rank 0
    says when its warm-up windows are done, and every job starts timing when all have (the
    workloads' ``Clock`` waits at the gate). Machine noise that comes and goes over seconds
    (another tenant of the host) then hits every job alike, where runs one after another
    meet it apart: ratios between jobs run side by side are paired in time. Each job's
    measurement, in the order given (raises LaunchFailed; a job that failed stops the rest;
    all run again where torch's teardown aborted one, as ``Launch.run``)."""
    return _again_after_teardown_abort(
        lambda: _side_by_side_once(jobs, workdir), f"side by side: {jobs[0][1].name}"
    )


def _side_by_side_once(
    jobs: Sequence[tuple[Launch, Path, Sequence[str]]], workdir: Path
) -> list[dict[str, Any]]:
    gate = workdir / f"gate-{uuid.uuid4().hex[:10]}"
    started: list[Started] = []
    try:
        for i, (launch, script, args) in enumerate(jobs):
            env = {GATE_ENV: str(gate), TAG_ENV: str(i)}
            started.append(launch.start(script, args, workdir, env))
        ready = [ready_file(gate, i) for i in range(len(jobs))]
        deadline = time.monotonic() + TIMEOUT_S
        while not all(r.exists() for r in ready):
            failed = [s for s in started if any(p.poll() is not None for p in s.procs)]
            if failed:
                failed[0].collect()  # raises: it ended before its gate
            if failed or time.monotonic() > deadline:
                raise LaunchFailed(f"side by side: not every job reached its gate ({gate.name})")
            time.sleep(0.01)
        gate.touch()
        return [s.collect() for s in started]
    finally:
        for s in started:
            s.stop()


def _again_after_teardown_abort(call: Callable[[], _T], what: str) -> _T:
    """``call()``, again (up to 3 times in all) where it raised LaunchFailed because torch's
    gloo teardown aborted a job before it printed its measurement (see ``Launch.run``)."""
    for attempt in range(3):
        try:
            return call()
        except LaunchFailed as exc:
            if TEARDOWN_ABORT not in str(exc) or attempt == 2:
                raise
            print(f"{what}: torch's teardown aborted; again", file=sys.stderr)
    raise AssertionError("unreachable")


def _wait(proc: subprocess.Popen[str]) -> str:
    try:
        text, _ = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # our own launcher's process group only
        text, _ = proc.communicate()
        return text + f"\n(killed after {TIMEOUT_S} s)"
    return text


LEVEL = 0.90  # the coverage asked of a median's interval (Spread.of)
MIN_LEVEL = 0.75  # verdict: an interval of less coverage (under 3 values) tells nothing


def median_interval(values: Sequence[float], level: float = LEVEL) -> tuple[float, float, float]:
    """A distribution-free interval for the median of ``values``: the narrowest pair of
    order statistics (k-th lowest, k-th highest) whose coverage, ``1 - 2 P(Bin(n, 1/2) < k)``,
    is at least ``level``; below about 5 values none is, and the whole range is returned
    with the coverage it has (n=4: 0.875). Returns (low, high, coverage)."""
    ordered = sorted(values)
    n = len(ordered)
    if n == 0:
        raise ValueError("no values")

    def coverage(k: int) -> float:  # of [ordered[k-1], ordered[n-k]]
        return 1 - 2 * sum(math.comb(n, i) for i in range(k)) / 2**n

    k = 1
    while k + 1 <= (n + 1) // 2 and coverage(k + 1) >= level:
        k += 1
    return ordered[k - 1], ordered[n - k], coverage(k)


@dataclass(frozen=True)
class Spread:
    """A figure over repetitions: the median, the min-max, and the median's interval
    (``median_interval``: ``ci_low``-``ci_high`` at coverage ``ci_level``; None where read
    back from results written before it was kept)."""

    median: float
    low: float
    high: float
    n: int
    ci_low: float | None = None
    ci_high: float | None = None
    ci_level: float | None = None

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        lo, hi, level = median_interval(values)
        return cls(statistics.median(values), min(values), max(values), len(values), lo, hi, level)

    def contains(self, value: float) -> bool:
        return self.low <= value <= self.high


def _fields(spread: dict[str, Any] | Spread) -> dict[str, Any]:
    """A spread's fields: as kept in results (a dict) or as measured (a ``Spread``)."""
    return spread if isinstance(spread, dict) else spread.__dict__


def verdict(spread: dict[str, Any] | Spread, limit: float) -> str:
    """How a ratio's median stands against ``limit``, told by the median's interval: within
    it (the whole interval at or under), above it (the whole interval over), or not resolved
    at this noise (the limit inside the interval). Without an interval, by the median."""
    s = _fields(spread)
    lo, hi = s.get("ci_low"), s.get("ci_high")
    if lo is None or hi is None:
        return "within the limit" if s["median"] <= limit else "ABOVE the limit"
    if s["ci_level"] < MIN_LEVEL:
        return "not resolved (too few repetitions for an interval)"
    if hi <= limit:
        return "within the limit"
    if lo > limit:
        return "ABOVE the limit"
    return "not resolved at this noise (the limit lies inside the median's interval)"


def interval_text(spread: dict[str, Any] | Spread) -> str:
    """``the median's 90% interval 0.981-1.032`` (empty without one)."""
    s = _fields(spread)
    if s.get("ci_low") is None:
        return ""
    return f"the median's {s['ci_level'] * 100:.0f}% interval {s['ci_low']:.3f}-{s['ci_high']:.3f}"


def per_micro_batch(record: dict[str, Any]) -> float:
    """A run's figure: its median timed window divided by the micro-batches per window."""
    return float(statistics.median(record["window_s"])) / int(record["accum"])


def rotated(items: Sequence[Any], by: int) -> list[Any]:
    """ABCD, BCDA, CDAB, ...: every item meets every position across repetitions."""
    k = by % len(items)
    return [*items[k:], *items[:k]]
