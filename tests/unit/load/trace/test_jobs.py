"""torch.profiler's ``schedule(..., repeat=N)`` writes a file per rank per cycle: files of one
process (host, pid) that follow each other in time are one job traced in cycles
(syncscope.load.trace.jobs); two runs are different processes, a copied file overlaps its
original. Hand-made spans; the real files: tests/integration/test_torch_recipes.py."""

from __future__ import annotations

from pathlib import Path

from syncscope.load.trace.jobs import TraceSpan, cycles_of, split_jobs
from syncscope.load.trace.rankfile import Job

JOB = Job(world_size=2, backend="gloo", groups=(("0", 2),))
S = 1_000_000_000


def _span(rank: int, pid: int, start_s: float, name: str) -> TraceSpan:
    start = int(1_800_000_000 * S + start_s * S)
    return TraceSpan(Path(name), rank, JOB, "vm", start, start + S // 2, pid)


def test_cycles_of_one_process_after_a_pause_are_one_job() -> None:
    spans = [_span(0, 11, 0, "a0"), _span(1, 12, 0, "a1"), _span(0, 11, 5, "b0")]
    spans.append(_span(1, 12, 5, "b1"))
    (job,) = split_jobs(spans)
    assert len(job) == 4
    assert cycles_of([s for s in job if s.rank == 0])


def test_two_runs_are_two_jobs_and_a_copy_is_no_cycle() -> None:
    first = [_span(0, 11, 0, "a0"), _span(1, 12, 0, "a1")]
    second = [_span(0, 21, 5, "b0"), _span(1, 22, 5, "b1")]
    assert len(split_jobs(first + second)) == 2
    original = _span(0, 11, 0, "a0")
    assert not cycles_of([original, _span(0, 11, 0, "copy")])
