"""A step GradScaler skipped (found inf/NaN: ``scaler.step`` does not call
``optimizer.step()``, the loop then calls ``zero_grad()``) ends its window as a skipped
step, on hand-built event streams as capture writes them (a ``step_skip`` event)."""

from __future__ import annotations

from syncscope.analysis.diagnose import diagnose
from tests.helpers.events import Rank, run_of


def _rank(rank: int, skipped: tuple[int, ...] = (0, 1)) -> Rank:
    r = Rank(rank)
    for w in range(4):
        for micro in range(4):
            r.micro_batch(fwd_sync=micro == 3, bwd_sync=micro == 3, syncs=int(micro == 3))
        if w in skipped:
            r.add("step_skip", optimizer="SGD", site={"file": "/u/train.py", "line": 13})
        else:
            r.step()
        r.add("reset", how="optimizer.zero_grad", set_to_none=True, site=None)
    return r.finish()


def test_a_skipped_step_ends_its_window_and_reads_as_info() -> None:
    run = run_of(_rank(0), _rank(1))
    windows = run.ranks[0].windows
    assert [(len(w.micro_batches), w.grad_syncs, w.step_skipped) for w in windows] == [
        (4, 1, True),
        (4, 1, True),
        (4, 1, False),
        (4, 1, False),
    ]
    (finding,) = diagnose(run)
    assert (finding.kind, finding.cause, finding.severity) == (
        "skipped-step",
        "grad-scaler-found-inf",
        "info",
    )
    assert finding.windows == (0, 1) and finding.ranks == (0, 1)


def test_no_skipped_step_no_finding() -> None:
    assert diagnose(run_of(_rank(0, ()), _rank(1, ()))) == []
