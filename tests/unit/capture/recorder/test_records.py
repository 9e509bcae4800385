"""Compact records (what hot hooks hold) become the same events a dict would have been."""

from __future__ import annotations

from pathlib import Path

from syncscope.capture.fingerprint import PendingFingerprint
from syncscope.capture.recorder.core import MemorySink, Recorder
from syncscope.capture.recorder.records import FIELDS, event_of
from syncscope.capture.writer import EventWriter
from syncscope.rundir import read_events

SITE = {"file": "/job/train.py", "line": 12, "function": "main"}


def test_a_record_becomes_its_event_with_keys_in_order() -> None:
    record = ("toggle", 5, "no_sync", False, "ddp:Net#0", SITE)
    event = event_of(record)
    assert list(event) == list(FIELDS["toggle"])
    assert event == {
        "type": "toggle",
        "t": 5,
        "how": "no_sync",
        "value": False,
        "module": "ddp:Net#0",
        "site": SITE,
    }


def test_further_fields_follow_the_fixed_ones() -> None:
    # GIVEN a forward with Accelerate's state, a step with a CPU fingerprint, one without
    fwd = event_of(("fwd", 1, "ddp", "ddp:Net#0", True, 0, SITE, {"accelerate": {"n": 2}}))
    fp = PendingFingerprint([0.25], None, False, 7, (1, 2))
    step = event_of(("step", 2, "SGD", SITE, 4096, 0, fp))
    bare = event_of(("step", 3, "SGD", SITE, 4096, 0, None))
    # THEN the further fields come last, as the dict-built events had them
    assert list(fwd)[-1] == "accelerate" and fwd["sync"] is True
    assert list(step)[len(FIELDS["step"]) :] == ["fp_sharded", "fp_count", "fp_part", "fp"]
    assert (step["fp"], step["fp_count"], step["fp_part"]) == ([0.25], 7, [1, 2])
    assert "fp" not in bare and list(bare) == list(FIELDS["step"])


def test_every_kind_is_named_as_its_fields_say() -> None:
    """Each kind's event is written out by a maker of its own (``_MAKERS``): the same dict
    as naming the record's items by ``FIELDS``, for every kind, a shorter record included."""
    for kind, names in FIELDS.items():
        record = (kind, *(f"v{i}" for i in range(1, len(names))))
        event = event_of(record)
        assert list(event.items()) == list(zip(names, record, strict=True)), kind
        short = event_of(record[:2])
        assert short == dict(zip(names, record[:2], strict=False)), kind
        assert event_of((*record, None)) == event, kind  # no further fields
        assert event_of((*record, {"x": 1}))["x"] == 1, kind


def test_an_event_passes_through() -> None:
    event = {"type": "warning", "t": 1, "message": "x"}
    assert event_of(event) is event


def test_the_recorder_holds_records_and_the_file_has_events(tmp_path: Path) -> None:
    path = tmp_path / "rank.jsonl"
    writer = EventWriter(path, flush_interval=60.0)
    rec = Recorder(writer, rank=0, world_size=1)
    rec.on_backward_end(rec.on_backward_begin())
    held = list(writer._held)
    assert [type(item) for item in held] == [tuple, tuple]  # no dict built on the hook path
    rec.footer(0, "finished")
    writer.close()
    events = list(read_events(path))
    assert [e["type"] for e in events] == ["bwd", "bwd_end", "exit"]
    assert events[0]["sync"] == {} and events[1]["t"] >= events[0]["t"]


def test_the_memory_sink_reads_records_as_events() -> None:
    sink = MemorySink()
    rec = Recorder(sink, rank=0, world_size=1)
    rec.on_grad_reset("optimizer.zero_grad", True)
    rec.emit({"type": "warning", "t": 1, "message": "x"})
    assert [e["type"] for e in sink.events] == ["reset", "warning"]
    assert sink.events[0]["how"] == "optimizer.zero_grad"
    assert sink.events[0]["set_to_none"] is True


def test_a_steps_memory_is_read_off_the_training_thread(tmp_path: Path) -> None:
    """The step hook holds no RSS reading: the writer reads it once per drain (the memory
    sink, once per read), and every step event carries it."""
    import torch

    from syncscope.capture.recorder.records import MEM_AT_WRITE

    param = torch.nn.Parameter(torch.zeros(4))
    param.grad = torch.ones(4)
    opt = torch.optim.SGD([param], lr=0.1)
    path = tmp_path / "rank.jsonl"
    writer = EventWriter(path, flush_interval=60.0)
    sink = MemorySink()
    for target in (writer, sink):
        rec = Recorder(target, rank=0, world_size=1)
        for _ in range(2):
            rec.on_step_begin(opt)
            rec.on_step_end()
        if target is writer:
            held = [item for item in writer._held if item[0] == "step"]
            assert [item[4] for item in held] == [MEM_AT_WRITE, MEM_AT_WRITE]
            rec.footer(0, "finished")
            writer.close()
    for events in (list(read_events(path)), sink.events):
        steps = [e for e in events if e["type"] == "step"]
        assert len(steps) == 2 and all(type(e["mem"]) is int and e["mem"] > 0 for e in steps)
