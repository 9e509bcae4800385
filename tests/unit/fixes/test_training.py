"""``fix --verify``'s verdict on training: parameter fingerprints recorded, read and compared.

The comparison runs on hand-built runs (event streams as the ranks write them); capture is
checked in-process on one rank (the recorder's in-memory sink).
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from syncscope.fixes.training import RTOL, TrainingComparison, compare, training_of
from syncscope.fixes.verify import Profiled, Verification, refusal, render
from syncscope.model import Run
from tests.helpers.events import Rank, run_of

NAMES = ["0.weight", "0.bias", "2.weight"]


def _rank(
    rank: int,
    windows: list[list[float]],
    initial: list[float] | None = None,
    scale: float = 1.0,
    dtype: str = "float32",
) -> Rank:
    """A rank of len(windows) windows of 2 micro-batches, one sync each; after each step a
    ``pfp`` of the given values (scales all ``scale``), before the first the ``initial``."""
    r = Rank(rank)
    r.add("params", opt=0, optimizer="SGD", names=NAMES, dtypes=[dtype] * len(NAMES))
    start = initial if initial is not None else [0.5, 0.25, -0.125]
    r.events.append(
        {
            "type": "pfp",
            "window": 0,
            "opt": 0,
            "values": start,
            "scales": [scale] * 3,
            "initial": True,
        }
    )
    for index, values in enumerate(windows):
        r.micro_batch(syncs=0)
        r.micro_batch(syncs=1)
        r.step()
        r.events.append(
            {"type": "pfp", "window": index, "opt": 0, "values": values, "scales": [scale] * 3}
        )
    return r.finish()


def _run(windows: list[list[float]], ranks: int = 2, **kw: Any) -> Run:
    return run_of(*(_rank(i, windows, **kw) for i in range(ranks)))


TRAINED = [[0.4, 0.2, -0.1], [0.3, 0.15, -0.05], [0.2, 0.1, 0.0]]


def _verification(training: TrainingComparison, correctness: bool = False) -> Verification:
    profiled = Profiled((1, 1, 1), None, (0.55,), frozenset())
    return Verification(profiled, profiled, True, training, correctness)


def test_parameters_equal_within_reduction_order_noise_match() -> None:
    # GIVEN two runs whose parameters differ by float32 reduction-order noise (1e-8)
    noisy = [[v + 1e-8 for v in values] for values in TRAINED]
    # WHEN compared
    result = compare(training_of(_run(TRAINED)), training_of(_run(noisy)))
    # THEN every window matches, and the largest difference is said as information
    assert result.status == "match" and result.windows == 3
    assert result.largest == pytest.approx(1e-8, rel=0.01)
    line = render(_verification(result))[-1]
    assert line.startswith("training matches: every parameter equal on every rank after each of 3 ")
    assert "largest difference 1.0e-08" in line


def test_first_differing_window_rank_and_parameter_are_named_with_both_values() -> None:
    # GIVEN a fixed run whose rank 1 holds another 2.weight after window 1's step
    changed = [list(v) for v in TRAINED]
    changed[1][2] = -0.06  # 1e-2 of the scale: far beyond the tolerance
    original = run_of(_rank(0, TRAINED), _rank(1, TRAINED))
    fixed = run_of(_rank(0, TRAINED), _rank(1, changed))
    # WHEN compared
    result = compare(training_of(original), training_of(fixed))
    # THEN the first difference is window 1, rank 1, 2.weight, with both values
    assert result.status == "differ"
    d = result.difference
    assert d is not None
    assert (d.window, d.rank, d.name, d.original, d.fixed) == (1, 1, "2.weight", -0.05, -0.06)
    assert d.allowed == pytest.approx(RTOL)
    # AND the fix is refused, the verdict and the error naming them
    checked = _verification(result)
    assert not checked.ok
    line = render(checked)[-1]
    assert line == (
        "training DIFFERS although the original was only wasteful: after window 1's optimizer "
        "step, rank 1, parameter 2.weight: original -0.05, fixed -0.06 (fingerprints; allowed "
        "difference 0.0001)"
    )
    assert "training differs after window 1's optimizer step, rank 1, parameter 2.weight" in (
        refusal(checked)
    )


def test_a_correctness_fix_may_change_training() -> None:
    # GIVEN a fix of a missing sync, whose parameters differ from window 0 on
    changed = [[v * 1.1 for v in values] for values in TRAINED]
    result = compare(training_of(_run(TRAINED)), training_of(_run(changed)))
    # THEN it is accepted, saying why the numbers change and where they first do
    checked = _verification(result, correctness=True)
    assert checked.ok
    line = render(checked)[-1]
    assert line.startswith(
        "training changes because a correctness bug is fixed (missing sync or wiped gradients); "
        "parameters first differ after window 0's optimizer step, rank 0, parameter 0.weight"
    )


def test_printed_losses_decide_nothing() -> None:
    # GIVEN the same training, the fixed script printing its loss 4x larger
    result = compare(training_of(_run(TRAINED)), training_of(_run(TRAINED)))
    original = Profiled((4, 4, 4), None, (0.1375, 0.125), frozenset())
    fixed = Profiled((1, 1, 1), None, (0.55, 0.5), frozenset())
    checked = Verification(original, fixed, True, result, False)
    # THEN it is accepted; the losses are shown as printed
    assert checked.ok
    lines = render(checked)
    assert lines[3].split() == ["printed", "losses", "0.1375,", "0.125", "0.55,", "0.5"]


def test_runs_from_different_starting_parameters_are_not_called_equal() -> None:
    # GIVEN a fixed run that started from other parameters (an unseeded initialisation)
    result = compare(
        training_of(_run(TRAINED)), training_of(_run(TRAINED, initial=[0.6, 0.25, -0.125]))
    )
    # THEN the difference is before the first step
    assert result.difference is not None and result.difference.window is None
    assert (
        "before the first optimizer step (the runs did not start from the same"
        in (render(_verification(result))[-1])
    )


def test_another_number_of_optimizer_steps_is_a_difference() -> None:
    result = compare(training_of(_run(TRAINED)), training_of(_run(TRAINED[:2])))
    assert result.status == "differ" and result.steps == (3, 2)
    checked = _verification(result)
    assert render(checked)[-1].endswith("in optimizer steps: the original made 3, the fixed 2")
    assert "training differs in optimizer steps: the original made 3, the fixed 2" in (
        refusal(checked)
    )
    # AND a correctness fix is refused only for its grad syncs, never for its training
    fixed_a_bug = Verification(checked.original, checked.fixed, False, result, True)
    assert not fixed_a_bug.ok
    assert refusal(fixed_a_bug) == (
        "verification failed: the fixed script does not sync once per window; "
        "the fix was not applied"
    )


def test_no_recorded_fingerprints_is_said_and_decides_nothing() -> None:
    bare = run_of(Rank(0).window([3]).finish(), Rank(1).window([3]).finish())
    result = compare(training_of(bare), training_of(bare))
    assert result.status == "not compared"
    checked = _verification(result)
    assert checked.ok
    assert render(checked)[-1] == (
        "training not compared: no parameter fingerprints were recorded "
        "(printed losses are information only)"
    )


def test_half_precision_parameters_get_their_precision_as_tolerance() -> None:
    # GIVEN bfloat16 parameters one bfloat16 rounding apart (2^-9 of the scale)
    moved = [[v + 2.0**-9 for v in values] for values in TRAINED]
    # THEN they match as bfloat16, not as float32
    assert compare(
        training_of(_run(TRAINED, dtype="bfloat16")), training_of(_run(moved, dtype="bfloat16"))
    ).status == ("match")
    assert compare(training_of(_run(TRAINED)), training_of(_run(moved))).status == "differ"


def test_non_finite_fingerprints_match_only_each_other() -> None:
    # GIVEN parameters that became NaN (written as null) in one run, or in both
    broken = [list(v) for v in TRAINED]
    broken[2][0] = None  # type: ignore[call-overload]
    a, b = training_of(_run(TRAINED)), training_of(_run(broken))
    assert compare(a, b).status == "differ"
    assert compare(b, training_of(_run(broken))).status == "match"


def test_late_fingerprints_and_a_second_optimizer_land_in_their_window() -> None:
    # GIVEN a rank whose fingerprints follow its step_end (CUDA), and a second optimizer
    # whose step closes the same window
    r = Rank(0)
    r.add("params", opt=0, optimizer="SGD", names=["a"], dtypes=["float32"])
    r.add("params", opt=1, optimizer="Adam", names=["b"], dtypes=["float32"])
    r.micro_batch(syncs=1)
    r.step()
    r.step()  # the second optimizer: same window
    r.events.append({"type": "pfp", "window": 0, "opt": 0, "values": [1.0], "scales": [2.0]})
    r.events.append({"type": "pfp", "window": 0, "opt": 1, "values": [3.0], "scales": [4.0]})
    (rank,) = run_of(r.finish(), world_size=1).ranks
    (window,) = rank.windows
    # THEN the window holds both optimizers' parameters
    assert [(p.name, p.value, p.scale) for p in window.params] == [
        ("a", 1.0, 2.0),
        ("b", 3.0, 4.0),
    ]


def _train(steps: int = 3) -> tuple[torch.nn.Module, list[torch.Tensor]]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3000, 2), torch.nn.Linear(2, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(steps):
        model(torch.full((2, 3000), step / 10.0)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    return model, [p.detach().clone() for p in model.parameters()]


def test_capture_records_each_parameter_without_changing_training(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from syncscope.capture.session import CaptureSession
    from syncscope.load.runs import build_run
    from syncscope.model import RunMeta

    # GIVEN the same training run plainly and under capture with parameter fingerprints on
    _, plain = _train()
    monkeypatch.setenv("SYNCSCOPE_PARAM_FINGERPRINTS", "1")
    session, sink = CaptureSession.in_memory(rank=0, world_size=1)
    session.start()
    try:
        model, captured = _train()
    finally:
        session.close()
    # THEN training computed exactly the same parameters
    assert all(torch.equal(a, b) for a, b in zip(plain, captured, strict=True))
    # AND every parameter was named and fingerprinted before training and after each step
    events = sink.events
    (named,) = [e for e in events if e["type"] == "params"]
    assert named["names"] == ["param[0] (2x3000)", "param[1] (2)", "param[2] (1x2)", "param[3] (1)"]
    (rank,) = build_run(RunMeta(), {0: events}).ranks
    assert [len(w.params) for w in rank.windows] == [4, 4, 4]
    # AND the last fingerprint is the weighted sum of the final weights' strided sample
    weight = captured[0].reshape(-1)[:: 6000 // 1024].double()
    k = weight.numel()
    expected = weight * torch.arange(1, k + 1, dtype=torch.float64) / k
    last = rank.windows[-1].params[0]
    assert last.value == pytest.approx(float(expected.sum()), rel=1e-12)
    assert last.scale == pytest.approx(float(expected.norm()), rel=1e-12)
    assert not any(math.isnan(p.value) for w in rank.windows for p in w.params)
    del model


def test_capture_writes_no_parameter_fingerprints_unless_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from syncscope.capture.session import CaptureSession

    monkeypatch.delenv("SYNCSCOPE_PARAM_FINGERPRINTS", raising=False)
    session, sink = CaptureSession.in_memory(rank=0, world_size=1)
    session.start()
    try:
        _train(1)
    finally:
        session.close()
    assert not [e for e in sink.events if e["type"] in ("params", "pfp")]


def test_verify_runs_seed_the_random_generators_by_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    import random

    import numpy

    from syncscope.launch.attach import seed_generators

    python, np_state = random.getstate(), numpy.random.get_state()
    with torch.random.fork_rng():
        # GIVEN SYNCSCOPE_SEED=7 (what fix --verify sets) on rank 1
        monkeypatch.setenv("SYNCSCOPE_SEED", "7")
        seed_generators(1)
        drawn = (random.random(), float(numpy.random.rand()), float(torch.rand(1)))
        # THEN every generator starts from 8, as in any other run of that rank
        assert torch.initial_seed() == 8
        random.seed(8)
        numpy.random.seed(8)
        torch.manual_seed(8)
        assert drawn == (random.random(), float(numpy.random.rand()), float(torch.rand(1)))
        # AND without it nothing is seeded
        monkeypatch.delenv("SYNCSCOPE_SEED")
        torch.manual_seed(123)
        seed_generators(1)
        assert torch.initial_seed() == 123
    random.setstate(python)
    numpy.random.set_state(np_state)


class _OnDevice:
    """A parameter fingerprint whose device copy completes when told (a CUDA stand-in)."""

    def __init__(self) -> None:
        self.done = False

    def ready(self) -> bool:
        return self.done

    def fields(self) -> dict[str, Any]:
        return {"values": [1.0], "scales": [2.0]}


def test_device_fingerprints_are_written_once_their_copy_completes() -> None:
    from syncscope.capture.recorder.core import MemorySink, Recorder

    # GIVEN a recorder holding a device fingerprint of window 3 not yet copied
    sink = MemorySink()
    rec = Recorder(sink, rank=0, world_size=1)
    pending = _OnDevice()
    rec._pending_pfp.append(({"type": "pfp", "window": 3, "opt": 0}, pending))  # type: ignore[arg-type]
    # WHEN asked before it completes THEN nothing is written; after, its event
    rec._resolve_fingerprints(wait=False)
    assert not [e for e in sink.events if e["type"] == "pfp"]
    pending.done = True
    rec._resolve_fingerprints(wait=False)
    assert [e for e in sink.events if e["type"] == "pfp"] == [
        {"type": "pfp", "window": 3, "opt": 0, "values": [1.0], "scales": [2.0]}
    ]
    assert rec._pending_pfp == []
