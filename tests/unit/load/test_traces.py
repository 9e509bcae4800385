"""Merging rank files into one job, bad sets of files, and the trace-only findings."""

from __future__ import annotations

import dataclasses
import gzip
import random
import shutil
from array import array
from pathlib import Path
from typing import Any

import orjson
import pytest

from syncscope.analysis.crossrank import collective_mismatch
from syncscope.analysis.exposed import exposed_communication
from syncscope.errors import BadTrace
from syncscope.load.trace import events, worker
from syncscope.load.trace.events import RankEvents, in_order
from syncscope.load.trace.overlap import measure_windows, merge, merge_pairs, subtract, total
from syncscope.load.traces import load_traces
from syncscope.model import figures
from tests.helpers.synth_traces import Shape, write_job, write_rank

ROOT = Path(__file__).resolve().parents[3]
SAMPLES = ROOT / "sample_traces"


@pytest.fixture(params=[None, 4, 6], ids=["whole", "parts of 4", "parts of 6"])
def parts(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Intervals and times read a part at a time (``events.PART`` values): small parts put
    part boundaries between intervals that touch, overlap or fall out of order."""
    if request.param is not None:
        monkeypatch.setattr(events, "PART", request.param)


def _rewrite(path: Path, **info: object) -> None:
    doc = orjson.loads(gzip.decompress(path.read_bytes()))
    doc["distributedInfo"].update(info)
    path.write_bytes(gzip.compress(orjson.dumps(doc)))


def test_one_directory_per_node_merges(tmp_path: Path) -> None:
    src = SAMPLES / "syncscope-gloo-ddp-no_sync"
    for r in (0, 1):
        (tmp_path / f"node{r}").mkdir()
        shutil.copy(src / f"rank-{r}.json.gz", tmp_path / f"node{r}")
    run = load_traces([tmp_path / "node0", tmp_path / "node1"])
    assert [r.rank for r in run.ranks] == [0, 1]
    assert not any("not seen" in n for n in run.meta.notes)


def test_duplicate_rank(tmp_path: Path) -> None:
    src = SAMPLES / "syncscope-gloo-ddp-no_sync" / "rank-0.json.gz"
    shutil.copy(src, tmp_path / "a.json.gz")
    shutil.copy(src, tmp_path / "b.json.gz")
    with pytest.raises(
        BadTrace, match=r"b\.json\.gz: rank 0 appears twice \(also in .*a\.json\.gz\)"
    ):
        load_traces([tmp_path])


def test_two_jobs_in_one_directory(tmp_path: Path) -> None:
    shutil.copy(SAMPLES / "syncscope-gloo-ddp-no_sync" / "rank-0.json.gz", tmp_path / "a.json.gz")
    shutil.copy(SAMPLES / "trace_filter" / "sampled_rank-1.json.gz", tmp_path / "b.json.gz")
    with pytest.raises(
        BadTrace, match=r"holds traces of 2 jobs \(job 1: a\.json\.gz \[.*; job 2: b"
    ):
        load_traces([tmp_path])
    run = load_traces([tmp_path], skip_bad=True)
    assert [r.rank for r in run.ranks] == [0]
    assert any(n.startswith("skipped ") and "different job" in n for n in run.meta.notes)


def test_empty_directory_and_missing_path(tmp_path: Path) -> None:
    with pytest.raises(BadTrace, match="no trace files"):
        load_traces([tmp_path])
    with pytest.raises(BadTrace, match="no such file"):
        load_traces([tmp_path / "nope"])


def test_no_optimizer_steps_and_skip_bad(tmp_path: Path) -> None:
    good = tmp_path / "rank-0.json.gz"
    shutil.copy(SAMPLES / "syncscope-gloo-ddp-no_sync" / "rank-0.json.gz", good)
    (tmp_path / "rank-1.json").write_bytes(
        orjson.dumps(
            {"distributedInfo": {"rank": 1, "world_size": 2, "backend": "gloo"}, "traceEvents": []}
        )
    )
    (tmp_path / "rank-2.json").write_bytes(b"")
    with pytest.raises(BadTrace, match=r"rank-1\.json: no optimizer steps"):
        load_traces([tmp_path])
    run = load_traces([tmp_path], skip_bad=True)
    skipped = [n for n in run.meta.notes if n.startswith("skipped")]
    assert len(skipped) == 2 and any("0 bytes" in n for n in skipped)


def test_interval_arithmetic() -> None:
    comm = merge([(0, 10), (5, 20), (30, 40)])
    assert comm == [(0, 20), (30, 40)]
    comp = merge([(2, 4), (8, 35)])
    assert subtract(comm, comp) == [(0, 2), (4, 8), (35, 40)]
    assert total(subtract(comm, comp)) == 11


@pytest.mark.usefixtures("parts")
def test_values_in_order_are_told_from_values_out_of_order_across_parts() -> None:
    rng = random.Random(17)
    for _ in range(200):
        values = sorted(rng.randint(0, 50) for _ in range(rng.randint(0, 30)))
        assert in_order(values) and in_order(array("q", values))
        if len(values) > 1:
            k = rng.randrange(1, len(values))
            values[k - 1], values[k] = values[k] + 1, values[k - 1]  # one step down
            assert not in_order(values) and not in_order(array("q", values))


@pytest.mark.usefixtures("parts")
def test_merging_flat_pairs_equals_merging_tuples() -> None:
    rng = random.Random(7)
    for _ in range(200):
        pairs = [(s, s + rng.randint(-3, 40)) for s in (rng.randint(0, 300) for _ in range(30))]
        if rng.random() < 0.5:
            pairs.sort()  # the usual case: already in start order
        flat = array("q", [v for pair in pairs for v in pair])
        assert merge_pairs(flat) == merge(pairs)
    assert merge_pairs(array("q")) == []


@pytest.mark.usefixtures("parts")
def test_intervals_that_touch_are_joined_as_merging_joins_them() -> None:
    """A thread's backward ops follow one another, each starting where the last ended or
    later: runs that touch are joined without the merging loop, to the same union; one
    overlap (or an empty interval) among them takes the loop, to the same union again."""
    for pairs in (
        [(0, 2), (2, 10), (5, 6)],  # (parts of 4 values: the third within the run before)
        [(0, 2), (2, 10), (10, 12), (11, 20)],
        [(0, 2), (3, 4), (4, 5), (1, 9)],  # out of order, in the next part
    ):
        assert merge_pairs(array("q", [v for pair in pairs for v in pair])) == merge(pairs)
    rng = random.Random(3)
    for _ in range(300):
        pairs, at = [], rng.randint(0, 50)
        for _ in range(rng.randint(1, 40)):
            at += rng.choice((0, 0, 0, 1, 5))  # mostly touching, some gaps
            end = at + rng.randint(1, 20)
            pairs.append((at, end))
            at = end
        if rng.random() < 0.3:
            k = rng.randrange(len(pairs))
            start, end = pairs[k]
            pairs[k] = (start, end + rng.choice((0, 3))) if rng.random() < 0.5 else (start, start)
        flat = array("q", [v for pair in pairs for v in pair])
        assert merge_pairs(flat) == merge(pairs)


@pytest.mark.usefixtures("parts")
def test_kernels_in_start_order_are_measured_as_in_any_order() -> None:
    """A window's kernels are those that start from its start to the next window's (the
    last: to its end); kernels in start order are cut into slices, others sorted first:
    the same figures either way."""
    rng = random.Random(11)
    for _ in range(100):
        spans = sorted((lo, lo + rng.randint(0, 60)) for lo in rng.sample(range(400), 4))
        kernels = sorted(
            (s, s + rng.randint(-2, 30), c)
            for c, s in enumerate(rng.randint(-20, 480) for _ in range(40))
        )
        shuffled = kernels[:]
        rng.shuffle(shuffled)

        def measures(
            order: list[tuple[int, int, int]], comm_first: bool, spans: list[tuple[int, int]]
        ) -> list[tuple[int, ...]]:
            ev = RankEvents()  # comm kernels: (start, end, correlation); compute: (start, end)
            every, odd = order, [k for k in order if k[2] % 2]
            comm, compute = (every, odd) if comm_first else (odd, every)
            ev.comm_kernels = array("q", [v for k in comm for v in k])
            ev.compute_kernels = array("q", [v for k in compute for v in k[:2]])
            got = measure_windows(ev, spans)
            assert got is not None
            return [(m.comm, m.compute, m.exposed) for m in got]

        for comm_first in (True, False):
            expected = measures(shuffled, comm_first, spans)
            assert measures(kernels, comm_first, spans) == expected
            if comm_first:  # by hand: the comm figure is the union of the window's kernels
                bounds = [lo for lo, _ in spans[1:]] + [spans[-1][1] + 1]
                for (lo, _), hi, figures_of in zip(spans, bounds, expected, strict=True):
                    mine = [(s, e) for s, e, _ in kernels if lo <= s < hi]
                    assert figures_of[0] == total(merge(mine))


@pytest.mark.usefixtures("parts")
def test_kernels_apart_are_measured_as_kernels_that_touch() -> None:
    """Kernels in start order, none overlapping the next (one stream, the usual case), are
    measured as slices of the arrays, including kernels that touch the next or take no
    time; with one overlap they go through the merging path: every time, the figures agree
    with a by-hand union."""
    rng = random.Random(5)
    for _ in range(50):
        spans = sorted((lo, lo + rng.randint(0, 90)) for lo in rng.sample(range(500), 3))
        starts = sorted(rng.sample(range(-20, 520, 4), 60))
        kernels = [(s, s + rng.randint(1, 3)) for s in starts]  # apart: gaps of 4, up to 3
        for change in ("apart", "touching", "no time", "overlapping"):
            if change == "touching":
                kernels[10] = (kernels[10][0], kernels[11][0])
                kernels[3] = (kernels[3][0], kernels[4][0])
            elif change == "no time":
                kernels[5] = (kernels[5][0], kernels[5][0])
                kernels[12] = (kernels[12][0], kernels[12][0])
            elif change == "overlapping":
                kernels[20] = (kernels[20][0], kernels[21][0] + 1)
            ev = RankEvents()
            ev.compute_kernels = array("q", [v for k in kernels for v in k])
            ev.comm_kernels = array("q", [v for i, k in enumerate(kernels[:8]) for v in (*k, i)])
            got = measure_windows(ev, spans)
            assert got is not None
            bounds = [lo for lo, _ in spans[1:]] + [spans[-1][1] + 1]
            for (lo, _), hi, m in zip(spans, bounds, got, strict=True):
                mine = merge([(s, e) for s, e in kernels if lo <= s < hi])
                comm = merge([(s, e) for s, e in kernels[:8] if lo <= s < hi])
                assert m.compute == total(mine)
                assert m.comm == total(comm)
                assert m.exposed == total(subtract(comm, mine))


@pytest.mark.usefixtures("parts")
def test_each_communication_kernel_is_timed_from_its_launch() -> None:
    """Launches are looked up by correlation id, in order or not, a twice-used id taking the
    later launch: the same times as a by-hand dict of every launch."""
    rng = random.Random(13)
    for _ in range(100):
        ids = sorted(rng.sample(range(1, 400), 60))
        ids[7] = ids[6]  # an id launched twice
        if rng.random() < 0.5:
            rng.shuffle(ids)
        times = [rng.uniform(0, 1e6) for _ in ids]
        ev = RankEvents()
        ev.launch_ids = array("q", ids)
        ev.launch_times = array("d", times)
        wanted = [*rng.sample(ids, 8), ids[6], 999]  # (999: a kernel whose launch is missing)
        ev.comm_kernels = array("q", [v for i, c in enumerate(wanted) for v in (i, i + 1, c)])
        by_hand = {c: int(t * 1000.0) for c, t in zip(ids, times, strict=True)}
        assert ev.comm_launches() == {c: by_hand[c] for c in wanted if c in by_hand}


def test_synthetic_job_mismatch_and_exposure(tmp_path: Path) -> None:
    # GIVEN a 3-rank synthetic job where rank 2 issues a broadcast in place of a bucket
    write_job(tmp_path, 3, 200_000, Shape(mismatch_rank=2, ops_per_forward=10))
    run = load_traces([tmp_path])
    assert all(w.grad_syncs == 1 for r in run.ranks for w in r.windows)
    # THEN the cross-rank check names the group, the window and both collectives
    (finding,) = collective_mismatch(run)
    assert finding.kind == "collective-mismatch" and finding.severity == "error"
    assert finding.ranks == (0, 2) and "broadcast" in finding.message
    # AND exposed communication is measured per window
    (exposed,) = exposed_communication(run)
    steady = figures.steady_windows(run)  # measured over the steady windows, as comm time is
    assert exposed.evidence["windows_measured"] == len(steady.windows) * len(run.ranks)
    assert 0 < float(exposed.cost["exposed_share"]) < 1  # type: ignore[arg-type]


def test_matching_ranks_have_no_mismatch(tmp_path: Path) -> None:
    write_job(tmp_path, 2, 100_000, Shape(ops_per_forward=10))
    run = load_traces([tmp_path])
    assert collective_mismatch(run) == []
    unmeasured = dataclasses.replace(
        run,
        ranks=tuple(
            dataclasses.replace(
                r, windows=tuple(dataclasses.replace(w, exposed_comm_ns=None) for w in r.windows)
            )
            for r in run.ranks
        ),
    )
    assert exposed_communication(unmeasured) == []


def test_a_trace_laid_out_as_torch_writes_it_reads_as_the_compact_one(tmp_path: Path) -> None:
    # GIVEN the same 2-rank job in torch's layout (indented, its args, flow events) and compact
    shape = Shape(sync_every_micro_batch=True, ops_per_forward=6)
    for layout in ("torch", "compact"):
        (tmp_path / layout).mkdir()
        for r in range(2):
            write_rank(tmp_path / layout / f"rank-{r}.json", r, 2, 0, shape, layout, windows=3)
    torch_run, compact_run = (load_traces([tmp_path / x]) for x in ("torch", "compact"))
    # THEN they read as one run, window for window (the flow events carry nothing read)
    assert [w.grad_syncs for r in torch_run.ranks for w in r.windows] == [4] * 6
    assert torch_run.ranks == compact_run.ranks
    # AND each layout holds what its name says: about 220 and 145 bytes an event
    for layout, low, high in (("torch", 190, 260), ("compact", 120, 170)):
        data = (tmp_path / layout / "rank-0.json").read_bytes()
        events = orjson.loads(data)["traceEvents"]
        assert low <= len(data) / len(events) <= high
        assert (b'"ph":"X"' in data) == (layout == "compact")


@pytest.mark.parametrize("name", ["syncscope-gloo-fsdp2", "syncscope-gloo-ddp-every"])
def test_worker_processes_give_the_same_run(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a multi-rank job and a redundant-sync synthetic job
    synthetic = tmp_path / "synthetic"
    write_job(synthetic, 3, 200_000, Shape(sync_every_micro_batch=True))
    for paths in ([SAMPLES / name], [synthetic]):
        monkeypatch.setenv("SYNCSCOPE_TRACE_WORKERS", "0")
        alone = load_traces(paths)
        # WHEN it is read by two worker processes
        monkeypatch.setenv("SYNCSCOPE_TRACE_WORKERS", "2")
        pooled = load_traces(paths)
        # THEN the run is the same, field for field
        assert pooled == alone


def test_worker_processes_report_bad_files_in_file_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN two good ranks, a corrupt gzip and a duplicate rank
    src = SAMPLES / "syncscope-gloo-ddp-no_sync"
    shutil.copy(src / "rank-0.json.gz", tmp_path / "a.json.gz")
    shutil.copy(src / "rank-1.json.gz", tmp_path / "b.json.gz")
    (tmp_path / "c.json.gz").write_bytes((src / "rank-1.json.gz").read_bytes()[:500])
    shutil.copy(src / "rank-0.json.gz", tmp_path / "d.json.gz")
    monkeypatch.setenv("SYNCSCOPE_TRACE_WORKERS", "2")
    # WHEN read by workers: the first bad file is the error, as in a sequential read
    with pytest.raises(BadTrace, match=r"c\.json\.gz: truncated gzip"):
        load_traces([tmp_path])
    # THEN with skip_bad both bad files are skipped and named, in file order
    run = load_traces([tmp_path], skip_bad=True)
    assert [r.rank for r in run.ranks] == [0, 1]
    skipped = [n for n in run.meta.notes if n.startswith("skipped ")]
    assert len(skipped) == 2 and "c.json.gz" in skipped[0] and "d.json.gz" in skipped[1]


def test_mismatch_evidence_lists_the_differing_rank_beyond_16(tmp_path: Path) -> None:
    # GIVEN a 20-rank job where rank 18 issues a broadcast in place of a bucket
    write_job(tmp_path, 20, 20_000, Shape(mismatch_rank=18, ops_per_forward=2, micro_batches=1))
    run = load_traces([tmp_path])
    (finding,) = collective_mismatch(run)
    # THEN the evidence table has the reference rank and rank 18, within 16 rows
    per_rank = finding.evidence["per_rank"]
    assert isinstance(per_rank, dict)
    assert "0" in per_rank and "18" in per_rank and len(per_rank) == 16
    assert "broadcast" in per_rank["18"] and "broadcast" not in per_rank["0"]
    assert set(finding.evidence["counts"]) == set(per_rank)  # type: ignore[arg-type]


def test_files_matched_to_ranks_by_the_rank_each_file_holds(tmp_path: Path) -> None:
    from syncscope.load.inputs import load

    # GIVEN 11 ranks whose file names do not follow their ranks: rank 1's file is named
    # "rank-10" and rank 10's "rank-1" (a substring test would match "rank-1" to both)
    write_job(tmp_path, 11, 20_000, Shape(ops_per_forward=2, micro_batches=1))
    (tmp_path / "rank-1.json").rename(tmp_path / "tmp.json")
    (tmp_path / "rank-10.json").rename(tmp_path / "rank-1.json")
    (tmp_path / "tmp.json").rename(tmp_path / "rank-10.json")
    run, files = load([tmp_path], skip_bad=False, progress=False)
    # THEN each rank gets the file that holds it
    assert len(files) == len(run.ranks) == 11
    assert files[1].name == "rank-10.json" and files[10].name == "rank-1.json"
    for r in (0, 2, 9):
        assert files[r].name == f"rank-{r}.json"


def test_this_process_reads_files_beside_its_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a synthetic 6-rank job, read by one worker process and by this process
    write_job(tmp_path, 6, 50_000, Shape(sync_every_micro_batch=True))
    monkeypatch.setenv("SYNCSCOPE_TRACE_WORKERS", "0")
    alone = load_traces([tmp_path])
    read_here: list[Path] = []
    real = worker.read_rank

    def counted(path: Path, advance: Any = None) -> Any:
        read_here.append(path)
        return real(path, advance)

    monkeypatch.setattr(worker, "read_rank", counted)
    monkeypatch.setenv("SYNCSCOPE_TRACE_WORKERS", "1")
    # WHEN it is read
    pooled = load_traces([tmp_path])
    # THEN this process read some files (the worker had two queued while it started), the
    # worker the others, and the run is the same, field for field
    assert 1 <= len(read_here) < 6
    assert pooled == alone


@pytest.mark.parametrize("large", [False, True])
def test_a_worker_holds_a_second_file_only_while_files_are_small(
    large: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a 6-rank job read by one worker and this process; its files taken as large or not
    write_job(tmp_path, 6, 50_000, Shape(sync_every_micro_batch=True))
    if large:
        monkeypatch.setattr(worker, "_SMALL_BYTES", 0)
    outstanding, most = 0, 0
    send, receive = worker._send, worker._receive

    def sent(fd: int, kind: bytes, obj: Any) -> None:
        nonlocal outstanding, most
        if kind == b"J":
            outstanding += 1
            most = max(most, outstanding)
        send(fd, kind, obj)

    def received(fd: int) -> tuple[bytes, Any]:
        nonlocal outstanding
        kind, obj = receive(fd)
        outstanding -= kind == b"R"
        return kind, obj

    monkeypatch.setattr(worker, "_send", sent)
    monkeypatch.setattr(worker, "_receive", received)
    monkeypatch.setenv("SYNCSCOPE_TRACE_WORKERS", "1")
    # WHEN it is read
    run = load_traces([tmp_path])
    # THEN the worker held two files at once only where they were small (where a large one
    # waits, the last two large files are not left to one reader)
    assert len(run.ranks) == 6
    assert most == (1 if large else 2)
