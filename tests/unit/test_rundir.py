"""The run directory format: crash-safe event files and versioned metadata."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from syncscope.capture.writer import EventWriter
from syncscope.errors import BadRunDirectory
from syncscope.load.runs import load_run
from syncscope.model import Run
from syncscope.rundir import rank_events_path, read_events, write_meta
from tests.helpers.events import Rank


def write_rank(run_dir: Path, rank: Rank) -> Path:
    path = rank_events_path(run_dir, rank.rank)
    writer = EventWriter(path)
    for event in rank.events:
        writer.write(event)
    writer.close()
    return path


def test_torn_last_line_is_skipped(tmp_path: Path) -> None:
    # GIVEN a rank killed in the middle of writing an event
    path = write_rank(tmp_path, Rank(0).window([3]).window([3]))
    with path.open("ab") as fh:
        fh.write(b'{"type": "coll", "seq": 9, "t": 1')
    # THEN every complete event is read, and the run still builds
    events = list(read_events(path))
    assert events[-1]["type"] == "step_end"
    write_meta(tmp_path, {"world_size": 1})
    run = load_run(tmp_path)
    assert [w.grad_syncs for w in run.ranks[0].windows] == [1, 1]
    assert run.ranks[0].finished is False
    assert any("without an exit record" in note for note in run.meta.notes)


def test_newer_meta_format_is_refused(tmp_path: Path) -> None:
    (tmp_path / "ranks").mkdir()
    (tmp_path / "meta.json").write_text(
        json.dumps({"format": "syncscope-run", "format_version": 99})
    )
    with pytest.raises(BadRunDirectory, match="newer than this syncscope reads"):
        load_run(tmp_path)


def test_newer_event_format_is_refused(tmp_path: Path) -> None:
    rank = Rank(0).window([3]).finish()
    rank.events[0]["version"] = 7
    write_rank(tmp_path, rank)
    with pytest.raises(BadRunDirectory, match="event format version 7"):
        load_run(tmp_path)


def test_not_a_run_directory(tmp_path: Path) -> None:
    with pytest.raises(BadRunDirectory, match="not a syncscope run directory"):
        load_run(tmp_path)
    with pytest.raises(BadRunDirectory, match="no such run directory"):
        load_run(tmp_path / "missing")


def test_rank_appearing_twice_across_node_directories(tmp_path: Path) -> None:
    for node in ("a", "b"):
        write_rank(tmp_path / node, Rank(0).window([3]).finish())
    with pytest.raises(BadRunDirectory, match="rank 0 appears twice"):
        load_run([tmp_path / "a", tmp_path / "b"])


def test_node_directories_merge_into_one_job(tmp_path: Path) -> None:
    write_rank(tmp_path / "a", Rank(0).window([3]).finish())
    write_rank(tmp_path / "b", Rank(1).window([3]).finish())
    run = load_run([tmp_path / "a", tmp_path / "b"])
    assert [r.rank for r in run.ranks] == [0, 1]
    assert run.ranks[0].windows[0].fingerprint_match is True


def _wait_for(predicate: object, timeout: float = 5.0) -> bool:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(0.01)
    return False


def test_held_events_reach_the_file_without_another_write(tmp_path: Path) -> None:
    # GIVEN a writer holding events (the hook path: no serialization, no system call)
    path = tmp_path / "rank.jsonl"
    writer = EventWriter(path, flush_interval=0.02)
    writer.write({"type": "header"})
    writer.buffer({"type": "coll", "seq": 0})
    writer.buffer({"type": "step_end", "t": 1})
    # THEN the flusher puts them on disk on its own, in order (a rank that then hangs or is
    # killed outright has them), and close() stops it
    assert _wait_for(lambda: len(list(read_events(path))) == 3)
    assert [e["type"] for e in read_events(path)] == ["header", "coll", "step_end"]
    flusher = writer._flusher
    assert flusher is not None and flusher.is_alive()
    writer.close()
    assert not flusher.is_alive()


def test_flusher_ends_with_a_writer_that_was_never_closed(tmp_path: Path) -> None:
    import gc

    writer = EventWriter(tmp_path / "rank.jsonl", flush_interval=0.02)
    writer.buffer({"type": "fwd"})
    flusher = writer._flusher
    assert flusher is not None
    del writer
    gc.collect()
    assert _wait_for(lambda: not flusher.is_alive())


def test_write_puts_held_events_first_in_one_call(tmp_path: Path) -> None:
    path = tmp_path / "rank.jsonl"
    writer = EventWriter(path, flush_interval=60.0)  # the flusher never fires here
    writer.buffer({"type": "fwd"})
    writer.buffer({"type": "bwd"})
    assert list(read_events(path)) == []
    writer.write({"type": "exit"})
    assert [e["type"] for e in read_events(path)] == ["fwd", "bwd", "exit"]
    writer.close()


def test_the_recorder_writes_only_rare_events_at_once(tmp_path: Path) -> None:
    """The training thread's hook path holds per-step events (collectives, window ends);
    the header and the exit record go to disk at once."""
    from syncscope.capture.recorder.core import Recorder

    path = tmp_path / "rank.jsonl"
    writer = EventWriter(path, flush_interval=60.0)  # no flush by time within the test
    rec = Recorder(writer, rank=0, world_size=1)
    rec.header({})
    assert [e["type"] for e in read_events(path)] == ["header"]
    rec.emit({"type": "coll", "seq": 0, "t": 1})
    rec.emit({"type": "step_end", "t": 2})
    assert [e["type"] for e in read_events(path)] == ["header"]  # held: no write yet
    rec.footer(0, "finished")
    assert [e["type"] for e in read_events(path)] == ["header", "coll", "step_end", "exit"]
    writer.close()


@pytest.mark.usefixtures("process_group")
def test_only_blocking_collectives_flush_held_events(tmp_path: Path) -> None:
    """A collective that may hang in its call (``dist.all_reduce`` as written, a barrier)
    puts held events on disk first, its own record with them, before the call (``call``: a
    backend may abort the process inside the call), in one flush; an asynchronous one does
    neither, DDP's bucket all-reduce included (its reducer leaves ``async_op`` out, which
    defaults to true)."""
    import torch
    import torch.distributed as dist

    from syncscope.capture.hooks import install as instrument
    from syncscope.capture.recorder.core import Recorder

    path = tmp_path / "rank.jsonl"
    writer = EventWriter(path, flush_interval=60.0)  # no flush by time within the test
    rec = Recorder(writer, rank=0, world_size=1)
    flushed: list[int] = []
    sink_flush = writer.flush

    def counting_flush() -> None:
        flushed.append(len(flushed))
        sink_flush()

    writer.flush = counting_flush  # type: ignore[method-assign]
    undo = instrument.install(rec)
    try:
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4))
        model(torch.ones(2, 4)).sum().backward()
        model(torch.ones(2, 4)).sum().backward()  # buckets built: one all-reduce each
        after_ddp = len(flushed)
        dist.all_reduce(torch.ones(3), async_op=True).wait()
        after_async = len(flushed)
        dist.all_reduce(torch.ones(3))
        after_sync = len(flushed)
        dist.barrier()
        after_barrier = len(flushed)
    finally:
        undo()
        writer.close()
    events = list(read_events(path))
    ops = [(e["op"], e["phase"]) for e in events if e["type"] == "coll"]
    assert ops.count(("all_reduce", "backward")) == 2  # DDP's buckets were seen
    calls = {e["seq"]: e["op"] for e in events if e["type"] == "call"}
    returned = [e for e in events if e["type"] == "coll" and e["seq"] in calls]
    if "async_op" not in str(torch.ops.c10d.allreduce_.default._schema):
        # torch 2.6 and 2.7: c10d's ops take no async_op (each returns its Work, and Python
        # waits on it after): none can be told asynchronous, so each one is told before its
        # call, DDP's too
        assert after_ddp > 0
        assert (after_async - after_ddp, after_sync - after_async) == (1, 1)
        assert after_barrier - after_sync == 1
        assert len(returned) == len(calls) > 0  # each told before its call, then returned
        return
    assert (after_ddp, after_async, after_sync, after_barrier) == (0, 0, 1, 2)
    # the blocking ones, and only they, were told before their call, then when it returned
    assert sorted(calls.values()) == ["all_reduce", "barrier"], calls
    assert [e["op"] for e in returned] == ["all_reduce", "barrier"]


def test_a_writer_that_cannot_write_or_is_closed_holds_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a failed write (a full disk) capture stops for good on the rank: what the hooks
    hand the writer afterwards is dropped, not held in memory for the rest of an hours-long
    job; the same after close()."""
    from syncscope.capture import writer as writer_module

    monkeypatch.setenv(writer_module.FAULT_ENV, "2")  # the second write fails (ENOSPC)
    path = tmp_path / "rank.jsonl"
    writer = EventWriter(path, flush_interval=60.0)
    writer.write({"type": "header"})
    writer.buffer({"type": "fwd"})
    writer.flush()  # the failing write
    assert writer.stopped and "cannot write" in writer.stopped
    for i in range(1000):
        writer.buffer({"type": "coll", "seq": i})
    assert len(writer._held) == 0
    writer.close()
    assert [e["type"] for e in read_events(path)] == ["header"]

    monkeypatch.delenv(writer_module.FAULT_ENV)
    closed = EventWriter(tmp_path / "closed.jsonl", flush_interval=60.0)
    closed.buffer({"type": "fwd"})
    closed.close()
    closed.buffer({"type": "bwd"})
    assert len(closed._held) == 0
    assert [e["type"] for e in read_events(tmp_path / "closed.jsonl")] == ["fwd"]


def _groups_once(rank: Rank) -> Rank:
    """The same events in format version 2: each group's ranks in one ``pg`` event."""
    out: list[dict[str, object]] = []
    seen: set[str] = set()
    for ev in rank.events:
        if ev["type"] == "coll":
            ev = dict(ev)
            group = ev.pop("group")
            if ev["pg"] not in seen:
                seen.add(str(ev["pg"]))
                out.append({"type": "pg", "t": ev["t"], "pg": ev["pg"], "group": group})
        out.append(ev)
    rank.events = out
    return rank


def test_group_ranks_written_once_read_as_on_every_collective(tmp_path: Path) -> None:
    # GIVEN the same 3-rank job in format 1 (ranks on every collective) and 2 (once per group)
    group = (0, 1, 2)
    for name, convert in (("v1", lambda r: r), ("v2", _groups_once)):
        for r in range(3):
            rank = Rank(r, world_size=3).window([3]).window([3]).finish()
            for ev in rank.events:
                if ev["type"] == "coll":
                    ev["group"] = list(group)
            write_rank(tmp_path / name, convert(rank))
    v1, v2 = load_run(tmp_path / "v1"), load_run(tmp_path / "v2")
    v2_events = list(read_events(rank_events_path(tmp_path / "v2", 0)))
    assert [ev["type"] for ev in v2_events].count("pg") == 1
    assert not any("group" in ev for ev in v2_events if ev["type"] == "coll")
    # THEN both read as the same run
    assert v1.ranks == v2.ranks
    # AND every collective of every rank holds one shared tuple of the group's ranks
    colls = [c for run in (v1, v2) for r in run.ranks for w in r.windows for c in w.collectives]
    assert len(colls) >= 6 * 2 and all(c.group_ranks == group for c in colls)
    assert len({id(c.group_ranks) for c in colls}) == 1


def test_prepare_run_dir_creates_missing_parents(tmp_path: Path) -> None:
    from syncscope.rundir import prepare_run_dir

    prepare_run_dir(tmp_path / "runs" / "before")  # `--out runs/before` with no runs/
    assert (tmp_path / "runs" / "before" / "ranks").is_dir()
    (tmp_path / "file").write_text("")
    with pytest.raises(BadRunDirectory, match=r"cannot create \(.*file is not a directory\)"):
        prepare_run_dir(tmp_path / "file" / "sub" / "r")


def test_pid_alive_the_one_check_sees_running_ended_and_zombie_processes() -> None:
    """``pid_alive`` is the package's one liveness check (lock holders, the launcher's ranks,
    a rank's ``syncscope profile``): a zombie has ended, an id nobody holds is gone."""
    import os

    from syncscope.rundir import pid_alive

    assert pid_alive(os.getpid())
    child = os.fork()
    if child == 0:
        os._exit(0)
    import time

    deadline = time.monotonic() + 10
    while pid_alive(child) and time.monotonic() < deadline:  # exited, not yet reaped: a zombie
        time.sleep(0.01)
    assert not pid_alive(child)
    os.waitpid(child, 0)
    assert not pid_alive(child)  # reaped: no such process


def _elastic_run(tmp_path: Path, nnodes: str, ranks: int) -> Run:
    """A run whose meta.json planned 2 ranks per node up to the range's largest node count
    (what ``profile --nnodes`` writes), of which ``ranks`` formed and wrote their files."""
    planned = 2 * int(nnodes.split(":")[-1])
    for r in range(ranks):
        write_rank(tmp_path, Rank(r, world_size=ranks).window([3]).finish())
    write_meta(
        tmp_path,
        {"world_size": planned, "launcher": {"nnodes": nnodes, "nproc_per_node": "2"}},
    )
    return load_run(tmp_path)


def test_an_elastic_range_formed_on_one_node_is_the_world_that_formed(tmp_path: Path) -> None:
    from syncscope.analysis.diagnose import diagnose

    run = _elastic_run(tmp_path, "1:2", 2)
    assert run.world_size == 2
    assert any("as the job formed (--nnodes 1:2" in n for n in run.meta.notes)
    assert [f.kind for f in diagnose(run)] == []


def test_a_fixed_node_count_still_misses_the_other_node(tmp_path: Path) -> None:
    from syncscope.analysis.diagnose import diagnose

    for r in range(2):
        write_rank(tmp_path, Rank(r, world_size=4).window([3]).finish())
    write_meta(tmp_path, {"world_size": 4, "launcher": {"nnodes": "2", "nproc_per_node": "2"}})
    run = load_run(tmp_path)
    assert run.world_size == 4
    assert "ranks-missing" in [f.kind for f in diagnose(run)]
