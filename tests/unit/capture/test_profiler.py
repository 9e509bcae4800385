"""ProfilerTrace in-process with a tiny model: the trace it writes reads back as windows."""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any

import orjson
import pytest
import torch

from syncscope.capture.profiler import ProfilerTrace
from syncscope.load.traces import load_traces


def _train(trace: ProfilerTrace, windows: int, accum: int, twice: bool = False) -> None:
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for w in range(windows):
        trace.window_begin(w)
        for k in range(accum):
            trace.micro_batch_begin(w, k)
            loss = model(torch.randn(4, 8)).sum()
            if twice:  # as the recorder does: at the forward, and again at the backward
                trace.micro_batch_begin(w, k)
            loss.backward()
            if k == accum - 1:
                trace.grad_sync("all_reduce", 288)
            trace.micro_batch_end(w, k)
        opt.step()
        opt.zero_grad()
        trace.window_end(w)
    trace.close()


def test_range_is_traced_and_annotated(tmp_path: Path) -> None:
    trace = ProfilerTrace(tmp_path, 0, (1, 3))
    _train(trace, windows=4, accum=2)
    assert trace.error is None and not trace.active
    path = tmp_path / "traces" / "rank-0.json.gz"
    names = {e.get("name") for e in orjson.loads(gzip.decompress(path.read_bytes()))["traceEvents"]}
    assert {"syncscope.window#1", "syncscope.window#2", "syncscope.micro_batch#2.1"} <= names
    assert "syncscope.window#0" not in names and "syncscope.window#3" not in names
    assert "syncscope.grad_sync#all_reduce#288" in names
    run = load_traces([tmp_path / "traces"])
    (rank,) = run.ranks
    assert [w.index for w in rank.windows] == [1, 2]
    assert all(len(w.micro_batches) == 2 and w.steps == 1 for w in rank.windows)


def test_close_exports_an_open_range(tmp_path: Path) -> None:
    trace = ProfilerTrace(tmp_path, 3, None)
    _train(trace, windows=1, accum=1)
    assert (tmp_path / "traces" / "rank-3.json.gz").is_file()


def test_bad_range() -> None:
    with pytest.raises(ValueError, match="bad window range"):
        ProfilerTrace(Path("."), 0, (3, 3))


def test_a_micro_batch_begun_at_forward_and_backward_is_one_range(tmp_path: Path) -> None:
    trace = ProfilerTrace(tmp_path, 0, None)
    _train(trace, windows=2, accum=3, twice=True)
    path = tmp_path / "traces" / "rank-0.json.gz"
    events = orjson.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    marks = [e for e in events if str(e.get("name")).startswith("syncscope.micro_batch#")]
    assert sorted(e["name"] for e in marks) == sorted(
        f"syncscope.micro_batch#{w}.{k}" for w in range(2) for k in range(3)
    )
    backward = [e for e in events if str(e.get("name")).startswith("autograd::engine")]
    for mark in marks:  # each range holds its micro-batch's backward
        start, end = mark["ts"], mark["ts"] + mark["dur"]
        assert any(start <= b["ts"] <= end for b in backward)
    (rank,) = load_traces([tmp_path / "traces"]).ranks
    assert [len(w.micro_batches) for w in rank.windows] == [3, 3]


def test_traces_marking_a_micro_batch_twice_count_it_once(tmp_path: Path) -> None:
    # syncscope 0.1.0 wrote two ranges of one name per micro-batch (forward, backward)
    trace = ProfilerTrace(tmp_path, 0, None)
    _train(trace, windows=2, accum=3)
    path = tmp_path / "traces" / "rank-0.json.gz"
    data = orjson.loads(gzip.decompress(path.read_bytes()))
    doubled = []
    for e in data["traceEvents"]:
        doubled.append(e)
        if str(e.get("name")).startswith("syncscope.micro_batch#"):
            half = e["dur"] / 2
            doubled[-1] = {**e, "dur": half}
            doubled.append({**e, "ts": e["ts"] + half, "dur": half})
    data["traceEvents"] = doubled
    path.write_bytes(gzip.compress(orjson.dumps(data)))
    (rank,) = load_traces([tmp_path / "traces"]).ranks
    assert [len(w.micro_batches) for w in rank.windows] == [3, 3]


def test_kineto_usdt_lines_are_kept_off_stderr_and_other_output_kept(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    # GIVEN: a trace of window 0, and something else written to fd 2 while it starts
    import os

    from syncscope.capture.profiler import without_usdt_lines

    trace = ProfilerTrace(tmp_path, 0, (0, 1))
    with without_usdt_lines():
        os.write(
            2, b"USDT:2026-11-25 04:56:56 1:1 SyncActivityProfilerHandler.cpp:52] profiler_start\n"
        )
        os.write(2, b"the user's own line\n")
    trace.window_begin(0)
    torch.ones(4).sum()
    trace.window_end(0)
    # THEN: the trace was written, no USDT line reached stderr, the user's line did
    assert trace.error is None and trace.path.is_file()
    err = capfd.readouterr().err
    assert "USDT" not in err and "profiler_start" not in err
    assert "the user's own line" in err


@pytest.mark.parametrize(
    ("op", "issuer", "phase", "floating", "marked"),
    [
        ("reduce_scatter", "fsdp", "backward", True, True),
        ("all_reduce", "ddp", "backward", True, True),
        ("all_reduce", "fsdp", "after-backward", True, True),  # a pipelining schedule
        # FSDP all-gathers parameters again in backward: the --trace mark took them for
        # grad syncs (it tested issuer and phase, not the op)
        ("all_gather", "fsdp", "backward", True, False),
        ("all_gather", "deepspeed", "backward", True, False),
        ("all_reduce", "ddp", "backward", False, False),  # find_unused_parameters' int map
        ("all_reduce", "ddp", "forward", True, False),
    ],
)
def test_trace_marks_and_the_run_model_count_the_same_grad_syncs(
    op: str, issuer: str, phase: str, floating: bool, marked: bool
) -> None:
    """One rule (``model.reduces_gradients``) for the recorder's ``--trace`` marks and for
    the run model's grad syncs (``is_grad_sync`` on the event the recorder writes)."""
    from syncscope.load.captured import is_grad_sync
    from syncscope.model import reduces_gradients

    assert reduces_gradients(op, issuer, phase, floating, False, False) is marked
    event = {
        "op": op,
        "issuer": issuer,
        "phase": phase,
        "dtype": "float32" if floating else "int64",
    }
    assert is_grad_sync({**event, "grad_content": False}) is marked


@pytest.mark.parametrize(
    ("opname", "marked"), [("c10d::allgather_", False), ("c10d::reduce_scatter_", True)]
)
def test_the_recorder_marks_an_fsdp_collective_in_backward_by_its_op(
    monkeypatch: pytest.MonkeyPatch, opname: str, marked: bool
) -> None:
    """FSDP all-gathers parameters again in backward; ``--trace`` marked them as grad syncs
    in the Kineto trace (a rule apart from the run model's, blind to the op)."""
    from syncscope.capture import sites
    from syncscope.capture.recorder.core import MemorySink, Recorder

    marks: list[tuple[str, int]] = []

    class Trace:
        def grad_sync(self, op: str, nbytes: int) -> None:
            marks.append((op, nbytes))

        def __getattr__(self, name: str) -> Any:
            return lambda *args, **kwargs: None

    monkeypatch.setattr(sites, "issuer_of_collective", lambda skip=1: ("fsdp", None, ""))
    rec = Recorder(MemorySink(), rank=0, world_size=1, trace=Trace())  # type: ignore[arg-type]
    rec.bwd_depth = 1  # in backward
    grads = torch.ones(8)
    rec.on_collective(opname, (), None, None, 0, 1, tensors=[grads])
    assert bool(marks) is marked
