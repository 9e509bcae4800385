"""The side-by-side gate, both of its ends (no torch here: the harness imports it too).

Jobs started together (``benchmarks/_harness.py``'s ``side_by_side``) time their windows
over the same seconds. After its warm-up windows each job's rank 0 writes ``GATE.ready-TAG``
(``ready_file``), and every rank waits for ``GATE`` itself (``wait_at_gate``), which the
harness writes once every job is ready.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

GATE_ENV, TAG_ENV = "SYNCSCOPE_BENCH_GATE", "SYNCSCOPE_BENCH_TAG"
GATE_TIMEOUT_S = 300


def ready_file(gate: Path, tag: object) -> Path:
    """The file a job's rank 0 writes once its warm-up windows are done."""
    return Path(f"{gate}.ready-{tag}")


def wait_at_gate(rank: int) -> None:
    """Say this job is ready (rank 0) and wait for the gate (every rank; at most
    ``GATE_TIMEOUT_S``: a harness that is gone does not hang the job)."""
    gate = Path(os.environ[GATE_ENV])
    if rank == 0:
        ready_file(gate, os.environ.get(TAG_ENV, os.getpid())).touch()
    deadline = time.monotonic() + GATE_TIMEOUT_S
    while not gate.exists() and time.monotonic() < deadline:
        time.sleep(0.002)
