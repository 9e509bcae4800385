"""Capture under faults, in process: a failing disk stops capture, never the script."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from syncscope.capture import writer as writer_module
from syncscope.capture.writer import EventWriter
from syncscope.load.runs import load_run
from syncscope.rundir import rank_events_path, read_events
from tests.helpers import hostile as h


def _enospc_after(n: int) -> object:
    count = 0

    def write(fd: int, data: bytes) -> int:
        nonlocal count
        count += 1
        if count > n:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return os.write(fd, data)

    return write


def test_disk_full_stops_capture_and_keeps_what_was_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run = h.write_run(tmp_path, ranks=2)
    path = rank_events_path(run, 1)
    path.unlink()
    events = h.run_events(1)
    monkeypatch.setattr(writer_module, "_os_write", _enospc_after(10))
    writer = EventWriter(path)
    for event in events:
        writer.write(event)  # never raises
    writer.close()
    assert writer.stopped == f"cannot write {path}: No space left on device"
    assert [e["type"] for e in read_events(path)] == [e["type"] for e in events[:10]]
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("syncscope: capture stopped on rank 1: cannot write ")
    assert err.rstrip().endswith("No space left on device; the script continues")
    loaded = load_run(run)
    assert any(
        n.startswith("capture stopped early on rank 1 (cannot write") for n in loaded.meta.notes
    )
    rank1 = next(r for r in loaded.ranks if r.rank == 1)
    assert not rank1.finished
    assert rank1.exit_reason.startswith("capture stopped: cannot write")


def test_fault_seam_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(writer_module.FAULT_ENV, "3")
    writer = EventWriter(tmp_path / "ranks" / "rank-00000.jsonl")
    for i in range(5):
        writer.write({"type": "x", "t": i})
    assert "No space left on device" in writer.stopped
    assert len(list(read_events(writer.path))) == 2


def test_directory_removed_during_capture(tmp_path: Path) -> None:
    writer = EventWriter(tmp_path / "ranks" / "rank-00000.jsonl")
    writer.write({"type": "x", "t": 0})
    os.close(writer._fd or -1)  # the descriptor is gone, as on a forced unmount
    writer.write({"type": "x", "t": 1})
    assert writer.stopped.endswith("Bad file descriptor")
    writer.write({"type": "x", "t": 2})  # inert from now on


def test_forked_child_writes_nothing_into_the_rank_file(tmp_path: Path) -> None:
    writer = EventWriter(tmp_path / "ranks" / "rank-00000.jsonl")
    writer.write({"type": "parent", "t": 0})
    pid = os.fork()
    if pid == 0:  # the child: as a multiprocessing fork worker would
        writer.write({"type": "child", "t": 1})
        writer.close()
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert status == 0
    writer.write({"type": "parent", "t": 2})
    assert [e["type"] for e in read_events(writer.path)] == ["parent", "parent"]


def test_assert_syncs_without_stats_or_expectation() -> None:
    from syncscope.testing import assert_syncs
    from syncscope.testing.track import Stats

    with pytest.raises(TypeError, match=r"needs the stats of a track\(\) block .*not NoneType"):
        assert_syncs(None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="needs an expectation: per_window="):
        assert_syncs(Stats(None, 0, 1))


def _hung_rank(rank: int) -> list[dict[str, object]]:
    events = h.run_events(rank)
    exit_event = events.pop()
    t = int(exit_event["t"]) + 1_000_000  # type: ignore[call-overload]
    events.append({"type": "fwd", "depth": 0, "wrapper": "ddp", "t": t})
    events.append({"type": "bwd", "t": t + 10, "sync": {"ddp:Net#0": True}})
    events.append({"type": "coll", "seq": 99, "op": "all_reduce", "bytes": 64, "issuer": "ddp",
                   "phase": "backward", "t": t + 20, "group": [0, 1]})  # fmt: skip
    stop = t + 30 * 10**9  # the hang: 30 s without progress, then syncscope stops the job
    events.append({"type": "done", "seq": 99, "t": stop})  # the stop ends it with an error
    events.append({"type": "exit", "t": stop + 1000, "status": 143,
                   "reason": "killed by signal SIGTERM"})  # fmt: skip
    return events


def test_hang_card_names_the_collective_the_stop_released(tmp_path: Path) -> None:
    from syncscope.analysis.hangs import hang

    run = h.write_run(tmp_path, meta_data=h.meta(hung=True, hang_timeout_s=30.0), events=_hung_rank)
    per_rank = hang(load_run(run))[0].evidence["per_rank"]
    # numbered from 1 on the card (seq 99 is the 100th), as torch's Flight Recorder numbers
    assert per_rank["1"]["blocked_in"].startswith("all_reduce #100 (64 bytes)")
    assert per_rank["1"]["last_completed"].startswith("all_reduce #3 ")
    assert per_rank["1"]["blocked_in"] != "exited"


def test_string_command_in_meta_is_shown_as_given(tmp_path: Path) -> None:
    run = h.write_run(tmp_path, meta_data=h.meta(command="python train.py --lr 3"))
    assert load_run(run).meta.command == ("python train.py --lr 3",)


def test_huge_world_size_writes_the_missing_ranks_as_one_run(tmp_path: Path) -> None:
    run = h.write_run(tmp_path, meta_data=h.meta(world_size=10**12))
    notes = [n for n in load_run(run).meta.notes if n.startswith("no events from rank(s)")]
    assert notes == [
        "no events from rank(s) 2-999999999999 of 1000000000000; if they ran "
        "on other nodes, merge their directories: syncscope analyze DIR DIR ..."
    ]
