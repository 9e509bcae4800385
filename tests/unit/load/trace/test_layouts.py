"""Recipes read from hand-built torch.profiler traces (the events a CPU/gloo trace holds, see
tests/integration/test_traced_recipes.py for real ones): GradScaler's skipped steps, and two
models stepped in one loop, whose reductions a trace can count by size but not name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from syncscope.analysis.diagnose import diagnose
from syncscope.errors import BadTrace
from syncscope.load.traces import load_traces


class _Trace:
    """One rank's trace, written event by event on a clock in microseconds."""

    def __init__(self, rank: int) -> None:
        self.rank, self.t = rank, 0.0
        self.events: list[dict[str, Any]] = []

    def x(self, name: str, dur: float = 5.0, cat: str = "user_annotation", **args: Any) -> None:
        self.events.append(
            {"ph": "X", "cat": cat, "name": name, "ts": self.t, "dur": dur, "pid": 1, "tid": 1}
            | ({"args": args} if args else {})
        )
        self.t += dur + 1

    def micro_batch(self, reduce: int | None) -> None:
        """A DDP forward, a backward, and a bucket all-reduce of ``reduce`` elements in it."""
        self.x("DistributedDataParallel.forward")
        start = self.t
        self.x("autograd::engine::evaluate_function: AddmmBackward0", 20, "cpu_op")
        if reduce is not None:
            self.t = start + 5
            self.x("c10d::allreduce_", 2, "cpu_op", **{"Input Dims": [[[reduce]]]})
            self.t = start + 22
        self.t += 2

    def write(self, path: Path) -> None:
        info = {"rank": self.rank, "world_size": 2, "backend": "gloo"}
        doc = {"distributedInfo": info, "traceEvents": self.events}
        path.write_bytes(orjson.dumps(doc))


def _job(tmp: Path, build: Any) -> Any:
    for rank in (0, 1):
        trace = _Trace(rank)
        build(trace)
        trace.write(tmp / f"rank-{rank}.json")
    return load_traces([tmp])


def _amp(trace: _Trace, skipped: tuple[bool, ...] = (True, True, False, False)) -> None:
    for skip in skipped:
        for micro in range(4):
            trace.micro_batch(256 if micro == 3 else None)
        trace.x("aten::_amp_foreach_non_finite_check_and_unscale_", 2, "cpu_op")
        if not skip:
            trace.x("Optimizer.step#SGD.step")
        trace.x("aten::_amp_update_scale_", 2, "cpu_op")
        trace.x("Optimizer.zero_grad#SGD.zero_grad")


def test_a_skipped_grad_scaler_step_ends_its_window_in_a_trace(tmp_path: Path) -> None:
    run = _job(tmp_path, _amp)
    windows = [w for w in run.ranks[0].windows if w.complete]
    assert [(len(w.micro_batches), w.grad_syncs) for w in windows] == [(4, 1)] * 4
    assert [w.step_skipped for w in windows] == [True, True, False, False]
    found = {(f.kind, f.severity): f for f in diagnose(run)}
    assert found[("skipped-step", "info")].windows == (0, 1)
    assert not [k for k, _ in found if k in ("grad-reset-mid-window", "irregular-window")]


def test_a_trace_of_taken_steps_only_has_no_skipped_window(tmp_path: Path) -> None:
    run = _job(tmp_path, lambda t: _amp(t, (False, False, False)))
    assert [w.step_skipped for w in run.ranks[0].windows if w.complete] == [False] * 3


def _gan(trace: _Trace, d_every: bool = False) -> None:
    for _ in range(4):
        for micro in range(4):
            last = micro == 3
            trace.micro_batch(289 if last or d_every else None)  # D's buckets
            trace.micro_batch(416 if last else None)  # G's
        trace.x("Optimizer.step#Adam.step")
        trace.x("Optimizer.step#Adam.step")
        trace.x("Optimizer.zero_grad#Adam.zero_grad")


def test_two_models_in_a_trace_are_told_apart_by_their_reductions(tmp_path: Path) -> None:
    # GIVEN a GAN's trace: D's and G's backwards alternate, each model reduced once per
    # window after its last backward (a trace names neither model)
    run = _job(tmp_path, _gan)
    (note,) = [n for n in run.meta.notes if "distinct gradient reductions" in n]
    assert "1.1 KiB reduced 1x per window; 1.6 KiB reduced 1x per window" in note
    assert "2 wrapped models, judged each on its own" in note
    # THEN each reduction layout is a model, and neither is redundant
    labels = [w.label for w in run.ranks[0].wrappers]
    assert labels == ["the model reducing 1.1 KiB", "the model reducing 1.6 KiB"]
    steady = [w for w in run.ranks[0].windows if w.complete][1:]
    assert all(w.grad_syncs == 2 for w in steady)
    assert not [f for f in diagnose(run) if f.kind in ("redundant-sync", "missing-sync")]


def test_a_model_of_two_reducing_every_micro_batch_in_a_trace_is_named(tmp_path: Path) -> None:
    # GIVEN the same GAN whose D reduces on every backward, G once per window
    run = _job(tmp_path, lambda t: _gan(t, d_every=True))
    (note,) = [n for n in run.meta.notes if "distinct gradient reductions" in n]
    assert "1.1 KiB reduced 4x per window; 1.6 KiB reduced 1x per window" in note
    # THEN the redundant syncs are D's, G's gate stands
    redundant = [f for f in diagnose(run) if f.kind == "redundant-sync"]
    assert redundant and all(
        f.evidence.get("model") == "the model reducing 1.1 KiB" for f in redundant
    )


def test_one_model_in_a_trace_draws_no_several_models_note(tmp_path: Path) -> None:
    run = _job(tmp_path, lambda t: _amp(t, (False,) * 4))
    assert not [n for n in run.meta.notes if "distinct gradient reductions" in n]


def test_scale_updates_without_any_optimizer_step_make_no_skipped_windows(tmp_path: Path) -> None:
    """Every step skipped is not what a trace with no ``Optimizer.step#`` at all says: its
    optimizer may be one torch does not annotate. No window is made up from the updates:
    the trace reads as one without optimizer steps."""
    with pytest.raises(BadTrace, match="no optimizer steps"):
        _job(tmp_path, lambda t: _amp(t, (True,) * 3))
