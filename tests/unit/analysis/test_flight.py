"""Flight Recorder dumps built in torch's schema (the keys FlightRecorder.hpp writes), for what
a 3-rank gloo job cannot show: NCCL states, the ring buffer wrapped, subgroups, older formats,
a thousand ranks, bad files. Real dumps from a real job: tests/integration/test_flight_recorder.py.
"""

from __future__ import annotations

import json
import pickle
import time
from pathlib import Path
from typing import Any

import pytest

from syncscope.analysis.flight import analyze_dumps, grad_sync_rounds
from syncscope.cli import main
from syncscope.load.flight import BadDump, find_dumps, read_dump, read_dumps

SAMPLE = Path(__file__).resolve().parents[3] / "sample_traces" / "syncscope-gloo-ddp-no_sync"
BACKWARD = [
    {
        "name": "_engine_run_backward",
        "filename": "/x/site-packages/torch/autograd/graph.py",
        "line": 9,
    },
    {"name": "train", "filename": "/job/train.py", "line": 40},
]


def entry(seq: int, name: str = "all_reduce", size: int = 8, **kw: Any) -> dict[str, Any]:
    e: dict[str, Any] = {
        "record_id": seq - 1,
        "pg_id": 0,
        "process_group": ("0", "default_pg"),
        "collective_seq_id": seq,
        "p2p_seq_id": 0,
        "op_id": seq,
        "profiling_name": f"nccl:{name}",
        "time_created_ns": 1_000_000 * seq,
        "input_sizes": [[size]],
        "input_dtypes": ["Float"],
        "output_sizes": [[size]],
        "output_dtypes": ["Float"],
        "state": "completed",
        "time_discovered_started_ns": 1_000_000 * seq + 10,
        "time_discovered_completed_ns": 1_000_000 * seq + 20,
        "retired": True,
        "timeout_ms": 600000,
        "is_p2p": False,
        "thread_name": "python",
        "thread_id": "1",
        "frames": [{"name": "train", "filename": "/job/train.py", "line": 50}],
    }
    e.update(kw)
    return e


def dump(
    entries: list[dict[str, Any]], ranks: str = "[0, 1, 2, 3]", **groups: str
) -> dict[str, Any]:
    config = {"0": {"name": "0", "desc": "default_pg", "ranks": ranks}}
    config.update({k: {"name": k, "desc": "sub", "ranks": v} for k, v in groups.items()})
    return {
        "version": "2.10",
        "pg_config": config,
        "pg_status": {
            "0": {
                "last_enqueued_collective": len(entries),
                "last_started_collective": -1,
                "last_completed_collective": -1,
            }
        },
        "comm_lib_version": "2.21.5",
        "entries": entries,
    }


def write(directory: Path, per_rank: dict[int, dict[str, Any]], fmt: str = "pickle") -> Path:
    directory.mkdir(exist_ok=True)
    for rank, data in per_rank.items():
        if fmt == "pickle":
            (directory / f"nccl_trace_rank_{rank}").write_bytes(pickle.dumps(data))
        else:
            plain = {
                **data,
                "entries": [{k: v for k, v in e.items() if k != "frames"} for e in data["entries"]],
            }
            (directory / f"nccl_trace_rank_{rank}.json").write_text(json.dumps(plain))
    return directory


def desync(tmp_path: Path, per_rank: dict[int, dict[str, Any]]) -> list[Any]:
    result = analyze_dumps(read_dumps(find_dumps([write(tmp_path / "d", per_rank)])))
    return [f for f in result.findings if f.kind != "flight-recorder"]


def test_every_rank_started_and_none_completed_is_a_stuck_collective(tmp_path: Path) -> None:
    last = {"state": "started", "time_discovered_completed_ns": None}
    per_rank = {r: dump([entry(1), entry(2, **last)]) for r in range(4)}
    (f,) = desync(tmp_path, per_rank)
    assert (f.kind, f.cause, f.evidence["collective_seq_id"]) == ("hang", "stuck-in-collective", 2)
    position = f.evidence["last_issued_started_completed"]["0-3"]
    assert "started #2" in position and "completed #1" in position


def test_ranks_are_aligned_on_sequence_numbers_after_the_ring_buffer_wrapped(
    tmp_path: Path,
) -> None:
    per_rank = {
        0: dump([entry(s) for s in range(5, 21)]),
        1: dump([entry(s) for s in range(3, 21)]),
        2: dump([entry(s) for s in range(9, 21)]),
        3: dump([entry(s, size=16 if s == 12 else 8) for s in range(1, 21)]),
    }
    (f,) = desync(tmp_path, per_rank)
    assert (f.cause, f.evidence["collective_seq_id"], f.evidence["culprit_ranks"]) == (
        "size",
        12,
        [3],
    )


def test_a_desync_in_a_subgroup_names_the_subgroup_and_its_members(tmp_path: Path) -> None:
    tp = {"process_group": ("1", "sub"), "pg_id": 1}
    per_rank = {}
    for r in range(4):
        entries = [entry(1), entry(2)]
        if r in (0, 1):  # the subgroup [0, 1]: rank 1 issues a broadcast where 0 all-gathers
            entries.append(entry(1, name="broadcast" if r == 1 else "all_gather", **tp))
        per_rank[r] = dump(entries, **{"1": "[0, 1]"})
    (f,) = desync(tmp_path, per_rank)
    assert f.cause == "op" and f.evidence["group"] == "1:sub (ranks 0-1)"
    assert f.evidence["culprit_ranks"] == [1]  # two ranks: the one that is not the lowest


def test_older_formats_without_dtypes_p2p_flags_or_threads(tmp_path: Path) -> None:
    """torch 2.4 wrote version 2.2: no is_p2p, thread or timeout fields; very old dumps had
    ``seq_id`` and no dtypes."""
    old = ("is_p2p", "thread_name", "thread_id", "timeout_ms", "input_dtypes", "output_dtypes")
    per_rank = {}
    for r in range(2):
        entries = []
        for s in (1, 2):
            e = {
                k: v for k, v in entry(s, size=4 if (r, s) == (1, 2) else 8).items() if k not in old
            }
            e["seq_id"] = e.pop("collective_seq_id")
            entries.append(e)
        per_rank[r] = {**dump(entries, ranks="[0, 1]"), "version": "2.2"}
    (f,) = desync(tmp_path, per_rank)
    assert (f.cause, f.evidence["collective_seq_id"], f.ranks) == ("size", 2, (1,))


def test_point_to_point_ops_are_not_matched_and_coalesced_ops_are_one_collective(
    tmp_path: Path,
) -> None:
    p2p = {"is_p2p": True, "collective_seq_id": 0, "p2p_seq_id": 1}
    per_rank = {
        0: dump(
            [entry(1), entry(0, name="send 0->1", **p2p), entry(2), entry(2, size=4)], "[0, 1]"
        ),
        1: dump(
            [entry(1), entry(0, name="recv 1<-0", **p2p), entry(2), entry(2, size=4)], "[0, 1]"
        ),
    }
    assert desync(tmp_path, per_rank) == []


def test_grad_sync_rounds_split_where_bucket_sizes_start_over() -> None:
    frames = {"frames": BACKWARD}
    entries = [entry(1, name="broadcast")]  # DDP's set-up
    entries += [entry(s, size=n, **frames) for s, n in ((2, 100), (3, 50), (4, 100), (5, 50))]
    entries += [entry(6, size=1)]  # a loss all-reduce: not a gradient
    entries += [entry(7, size=100, **frames), entry(8, size=50, input_dtypes=["Long"], **frames)]
    directory = Path("/nonexistent")
    rounds = grad_sync_rounds(read_dump_from(entries, directory))
    assert [(r["first_seq"], r["collectives"], r["bytes"]) for r in rounds] == [
        (2, 2, 600),
        (4, 2, 600),
        (7, 1, 400),  # the int64 all-reduce beside it (DDP's unused-parameter map) is not one
    ]
    assert {r["issuer"] for r in rounds} == {"ddp"} and {r["window"] for r in rounds} == {None}


def read_dump_from(entries: list[dict[str, Any]], _unused: Path) -> Any:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "fr_0"
        path.write_bytes(pickle.dumps(dump(entries)))
        return read_dump(path)


@pytest.mark.slow  # seconds of CPU: in the slow loop (.ci/run)
def test_a_thousand_ranks_read_in_seconds_with_merged_evidence(tmp_path: Path) -> None:
    world = 1024
    ranks = str(list(range(world)))
    per_rank = {
        r: dump([entry(s) for s in range(1, 51)] + ([] if r == 517 else [entry(51)]), ranks=ranks)
        for r in range(world)
    }
    directory = write(tmp_path / "big", per_rank)
    started = time.perf_counter()
    status = main(["analyze", "--quiet", "--out", str(tmp_path / "out"), str(directory)])
    elapsed = time.perf_counter() - started
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    (f,) = [f for f in report["findings"] if f["kind"] == "hang"]
    assert status == 1 and f["ranks"] == [517]
    assert set(f["evidence"]["per_rank"]) == {"0-516,518-1023", "517"}
    assert elapsed < 60, f"{world} ranks took {elapsed:.1f} s"


def test_json_and_pickle_of_one_rank_keep_the_pickle(tmp_path: Path) -> None:
    per_rank = {0: dump([entry(1)], ranks="[0, 1]"), 1: dump([entry(1)], ranks="[0, 1]")}
    write(tmp_path / "d", per_rank)
    write(tmp_path / "d", per_rank, fmt="json")
    dumps = read_dumps(find_dumps([tmp_path / "d"]))
    assert [(d.rank, d.has_frames) for d in dumps] == [(0, True), (1, True)]


def test_beside_kineto_traces_the_reports_hold_both(tmp_path: Path) -> None:
    per_rank = {
        r: dump([entry(1), entry(2, size=4 if r == 1 else 8)], ranks="[0, 1]") for r in range(2)
    }
    directory = write(tmp_path / "d", per_rank)
    status = main(["analyze", "-q", "--out", str(tmp_path / "out"), str(SAMPLE), str(directory)])
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    kinds = {(f["kind"], f["cause"]) for f in report["findings"]}
    assert ("collective-mismatch", "size") in kinds and ("flight-recorder", "dumps") in kinds
    assert report["grad_syncs_per_window"], "the traces' windows are kept"
    assert status == 1


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (pickle.dumps(dump([entry(1)]))[:40], "truncated or corrupt Flight Recorder pickle"),
        (b"\x80\x04cos\nsystem\n(S'echo hacked'\ntR.entries version", "refused to load os.system"),
        (b'{"entries": 3, "version": "2.10"}', "no 'entries' list"),
        (b'{"comm_lib_version": "", "entries": [', "truncated or corrupt Flight Recorder JSON"),
    ],
)
def test_a_bad_dump_is_one_line_and_exit_status_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes, words: str
) -> None:
    (tmp_path / "fr_0").write_bytes(content)
    assert main(["analyze", "-q", "--out", str(tmp_path / "out"), str(tmp_path / "fr_0")]) == 2
    err = capsys.readouterr().err
    assert words in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_a_rank_dumped_twice_is_refused(tmp_path: Path) -> None:
    (tmp_path / "a_0").write_bytes(pickle.dumps(dump([entry(1)])))
    (tmp_path / "b_0").write_bytes(pickle.dumps(dump([entry(1)])))
    with pytest.raises(BadDump, match="rank 0 dumped twice"):
        read_dumps(find_dumps([tmp_path]))


def test_skip_bad_leaves_out_an_unreadable_dump_and_says_so(tmp_path: Path) -> None:
    per_rank = {r: dump([entry(1), entry(2)], ranks="[0, 1, 2]") for r in range(2)}
    directory = write(tmp_path / "d", per_rank)
    (directory / "nccl_trace_rank_2").write_bytes(pickle.dumps(dump([entry(1)]))[:30])
    out = tmp_path / "out"
    assert main(["analyze", "-q", "--skip-bad", "--out", str(out), str(directory)]) == 0
    notes = json.loads((out / "report.json").read_text())["notes"]
    assert any(n.startswith("skipped (--skip-bad):") and "rank_2" in n for n in notes)
    assert any("no readable dump from rank(s) 2" in n for n in notes)


def test_dumps_without_entries_say_the_recorder_was_off(tmp_path: Path) -> None:
    directory = write(tmp_path / "d", {0: dump([]), 1: dump([])})
    result = analyze_dumps(read_dumps(find_dumps([directory])))
    assert any("the recorder was off" in n for n in result.notes)
    assert [f.kind for f in result.findings] == ["flight-recorder"]


def test_dumps_of_torch_2_7_after_gloo_collectives_say_gloo_is_never_recorded(
    tmp_path: Path,
) -> None:
    # GIVEN: what torch 2.7.1's _dump_nccl_trace returns after a gloo all-reduce (measured:
    # its recorder records NCCL collectives only; gloo's from torch 2.8, format 2.9)
    torch_2_7 = {"version": "2.4", "pg_config": {}, "pg_status": {}, "entries": []}
    directory = write(tmp_path / "d", {0: torch_2_7, 1: torch_2_7})
    # WHEN: the dumps are read
    result = analyze_dumps(read_dumps(find_dumps([directory])))
    # THEN: one note says why they are empty (not "the recorder was off")
    (note,) = [n for n in result.notes if "no entries" in n]
    assert note == (
        "Flight Recorder: the dumps hold no entries, and their format is torch 2.7's or "
        "older, whose recorder records NCCL collectives only: a gloo job's are never in it"
    )
    assert [f.kind for f in result.findings] == ["flight-recorder"]


def test_gloo_subgroups_without_membership_take_the_ranks_that_used_them(tmp_path: Path) -> None:
    """gloo (torch 2.13) writes ``pg_config`` as ``{"": {"ranks": "[]"}}``, subgroups absent
    (seen on a 3-rank job with ``new_group([0, 1])`` and ``new_group([1, 2])``)."""
    sub = {"process_group": ("2", "undefined"), "pg_id": 2}
    per_rank = {}
    for r in range(3):
        entries = [entry(1, profiling_name="gloo:all_reduce")]
        if r in (1, 2):  # group "2" = [1, 2]: rank 2 all-reduces 4 elements, rank 1 8
            entries.append(entry(1, size=4 if r == 2 else 8, **sub))
        data = dump(entries)
        data["pg_config"] = {"": {"name": "", "desc": "", "ranks": "[]"}}
        per_rank[r] = data
    (f,) = desync(tmp_path, per_rank)
    assert (f.cause, f.evidence["group"], f.evidence["culprit_ranks"]) == (
        "size",
        "2 (ranks 1-2)",
        [2],
    )


def test_hosts_in_file_names_name_the_culprits_host(tmp_path: Path) -> None:
    directory = tmp_path / "d"
    directory.mkdir()
    for r, host in enumerate(("node-a", "node-a", "node-b")):
        entries = [entry(1)] + ([] if r == 2 else [entry(2)])
        (directory / f"trace_{host}_{r}").write_bytes(
            pickle.dumps(dump(entries, ranks="[0, 1, 2]"))
        )
    result = analyze_dumps(read_dumps(find_dumps([directory])))
    (f,) = [f for f in result.findings if f.kind == "hang"]
    assert f.evidence["culprit_hosts"] == {"2": "node-b"}


def test_one_directory_of_kineto_traces_and_json_dumps_reads_both(tmp_path: Path) -> None:
    import shutil

    mixed = tmp_path / "mixed"
    shutil.copytree(SAMPLE, mixed)
    per_rank = {
        r: dump([entry(1), entry(2, size=4 if r == 1 else 8)], ranks="[0, 1]") for r in range(2)
    }
    write(mixed, per_rank, fmt="json")  # nccl_trace_rank_R.json beside rank-R.json.gz
    assert main(["analyze", "-q", "--out", str(tmp_path / "out"), str(mixed)]) == 1
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["source"] == "trace" and report["grad_syncs_per_window"]
    (f,) = [f for f in report["findings"] if f["kind"] == "collective-mismatch"]
    assert f["evidence"]["culprit_ranks"] == [1] and f["evidence"]["source"] == "flight recorder"


def test_a_rank_that_dumped_before_its_first_collective_is_the_missing_one(tmp_path: Path) -> None:
    per_rank = {r: dump([entry(1), entry(2)] if r != 3 else []) for r in range(4)}
    (f,) = desync(tmp_path, per_rank)
    assert (f.kind, f.cause, f.ranks, f.evidence["collective_seq_id"]) == (
        "hang",
        "missing-rank",
        (3,),
        1,
    )


def test_an_uncompressed_kineto_trace_is_not_taken_for_a_dump(tmp_path: Path) -> None:
    """A Kineto trace's distributedInfo holds "pg_config" too, within its first bytes."""
    import gzip

    traces = tmp_path / "traces"
    traces.mkdir()
    for path in sorted(SAMPLE.glob("rank-*.json.gz")):
        (traces / path.name[: -len(".gz")]).write_bytes(gzip.decompress(path.read_bytes()))
    assert find_dumps([traces]) == []
    assert main(["analyze", "-q", "--out", str(tmp_path / "out"), str(traces)]) == 0
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["grad_syncs_per_window"] and not any(
        f["kind"] == "flight-recorder" for f in report["findings"]
    )
