"""Hostile torch Flight Recorder dumps (a file a user copies from a cluster) and missing ones.

Every dump input ends in one line on stderr and exit 2, or a report, in bounded time and
memory (docs/trace-analysis.md, "Bounds"): never a traceback, never a process that runs on.
A rank of the job without a readable dump (none, empty, 16 bytes, garbage, left out by
``--skip-bad``) never leaves the verdict clean, nor does a collective one rank started and
another only scheduled. Inputs that could hang, crash or exhaust the old reader run in a
subprocess with a time and address-space limit; the others in-process.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from syncscope.cli import main
from tests.helpers import dumps as d
from tests.helpers import hostile as h

LIMIT_S = 60  # the subprocess's wall-clock limit (the old reader ran past it, or for ever)
BOUND_S = 45  # what a hostile dump may take, on a 2-core machine loaded 5 times over
MEMORY = 1 << 30  # the subprocess's address space (the old reader asked for more)
NAN = d.as_json(d.dump([d.entry(1), d.entry(2, time_created_ns=float("nan")), d.entry(3)]))


def _report(out: Path) -> dict[str, Any]:
    report: dict[str, Any] = json.loads((out / "report.json").read_text(encoding="utf-8"))
    return report


def _kinds(report: dict[str, Any]) -> list[tuple[str, str, list[int]]]:
    return [(f["kind"], f["cause"], f["ranks"]) for f in report["findings"]]


def _one_line(err: str) -> str:
    assert err.count("\n") == 1 and "Traceback" not in err, err[-2000:]
    return err.strip()


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))


def _analyze_apart(directory: Path, out: Path, *options: str) -> tuple[int, str, float]:
    """``syncscope analyze`` in a subprocess under LIMIT_S and MEMORY: (status, stderr,
    seconds); status -1 when it ran past LIMIT_S (killed)."""
    cmd = [sys.executable, "-m", "syncscope", "analyze", "-q", *options, "--out", str(out)]
    started = time.monotonic()
    try:
        done = subprocess.run(
            [*cmd, str(directory)],
            env={**h.tree_env(), "OMP_NUM_THREADS": "1"},
            capture_output=True,
            text=True,
            timeout=LIMIT_S,
            preexec_fn=_limit_memory,
        )
    except subprocess.TimeoutExpired:
        return -1, f"(killed: still running after {LIMIT_S} s)\n", time.monotonic() - started
    return done.returncode, done.stderr, time.monotonic() - started


# --- every dump input is bounded: one line, or a report ---------------------------------

ONE_LINE = {
    # name: (files beside a good rank-0 dump, what the one line says)
    "nan": ({"fr_1.json": NAN}, "fr_1.json: entry 1: time_created_ns is nan (not a finite number)"),
    "infinity": (
        {"fr_1.json": d.as_json({**d.good(), "pg_status": {"0": {"last_started_collective": float("inf")}}})},
        "fr_1.json: pg_status: group 0: last_started_collective is inf (not a finite number)",
    ),
    "5000 digits": (
        {"fr_1.json": d.as_json({**d.good(), "pg_status": {"0": {"last_enqueued_collective": "9" * 5000}}})},
        "last_enqueued_collective is a number of 5000 digits, beyond 64 bits",
    ),
    "rank of 200 digits": (
        {"fr_" + "7" * 200: d.good()},
        "the rank in the file name (200 digits) is beyond any job's (ranks go up to 2147483647)",
    ),
    "size 10**100": (
        {"fr_1": d.dump([d.entry(1), d.entry(2, input_sizes=[[10**100]]), d.entry(3)])},
        "fr_1: entry 1: input_sizes is a number of about 101 digits, beyond 64 bits",
    ),
    "list 200,000 deep (pickle)": (
        {"fr_1": d.with_top_level(d.good(), "version", d.nested_list_ops(200_000))},
        "fr_1: 'version' is not a format version",
    ),
    "list 200,000 deep (JSON)": (
        {"fr_1.json": d.deep_json(200_000)},
        "fr_1.json: truncated or corrupt Flight Recorder JSON (nested deeper than JSON is read",
    ),
    "an entry that is no dict": (
        {"fr_1": d.dump([d.entry(1), 7, d.entry(3)])},
        "fr_1: entry 1 is a int, not a dict",
    ),
    "a collective numbered 0": (
        {"fr_1": d.dump([d.entry(1), d.entry(0), d.entry(3)])},
        "fr_1: entry 1: collective_seq_id is 0 on a collective (torch numbers each group's "
        "collectives from 1)",
    ),
    "a collective numbered 10**7 after 3": (
        {"fr_1": d.dump([*d.good()["entries"], d.entry(10**7)])},
        "fr_1: group 0: collective_seq_id steps from 3 to 10000000 (at most 1000000 apart",
    ),
    "a group naming a rank twice (hid a member with no dump: clean)": (
        {"fr_1": d.good(ranks="[0, 0, 1]")},
        "fr_1: pg_config: group 0: rank 0 appears twice in its ranks",
    ),
    "pg_config a list (no member known: clean)": (
        {"fr_1": {**d.good(), "pg_config": [0, 0, 0]}},
        "fr_1: pg_config is a list, not a mapping of groups",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", list(ONE_LINE))
def test_a_hostile_dump_is_one_line_and_skipped_with_skip_bad_is_never_clean(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    """Was: a traceback, exit 1 (NaN/inf, 5,000 digits, a 200-digit rank, 10**100 sizes:
    OverflowError, ValueError, orjson's TypeError; lists 200,000 deep: RecursionError), and
    the same with --skip-bad; an entry that is no dict or numbered 0 was dropped silently,
    then a hang blamed on that rank; 10**7 took 9 s."""
    files, words = ONE_LINE[case]
    directory = d.write(tmp_path / "dumps", {"fr_0": d.good(), **files})
    started = time.monotonic()
    assert main(["analyze", "-q", "--out", str(tmp_path / "out"), str(directory)]) == 2
    err = _one_line(capsys.readouterr().err)
    assert err.startswith(f"syncscope: error: {directory}/") and words in err
    assert not (tmp_path / "out").exists()
    # --skip-bad: the rest is reported, and the dropped rank makes it incomplete
    out = tmp_path / "skip"
    assert main(["analyze", "-q", "--skip-bad", "--out", str(out), str(directory)]) == 0
    report = _report(out)
    assert report["verdict"] == "incomplete"
    (missing,) = [f for f in report["findings"] if f["kind"] == "ranks-missing"]
    assert missing["cause"] == "no-dump"
    assert any(n.startswith("skipped (--skip-bad):") and words in n for n in report["notes"])
    assert time.monotonic() - started < BOUND_S


def test_report_of_a_run_whose_flight_folder_holds_a_hostile_dump_stands(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Was: ``report RUN`` died with the same traceback as ``analyze`` of the dump."""
    run = h.write_run(tmp_path)
    d.write(run / "flight", {"fr_0": d.good(), "fr_1.json": NAN})
    assert main(["report", str(run), "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["verdict"] == "clean"  # the run's own events: every rank, every window
    assert any(
        n.startswith("Flight Recorder dump not read: ") and "time_created_ns is nan" in n
        for n in report["notes"]
    )


APART = {
    # name: (rank 1's dump, what the one line says, or "" when it reads as a report)
    "a memo index of 2**28 (23 bytes asked 2.1 GB)": (d.memo_put(1 << 28), ""),
    "a memo index of 2**32 - 16 (MemoryError)": (d.memo_put((1 << 32) - 16), ""),
    "a dict key: a tuple 300,000 deep (a segfault)": (
        d.deep_tuple_key(300_000),
        "fr_1: truncated or corrupt Flight Recorder pickle (refused a dict key of type tuple",
    ),
    "200,000 entries x 200,000 frames, shared (CPU for minutes)": (
        d.shared_entries(200_000, 200_000),
        "fr_1: holds more entries, frames and sizes than its",
    ),
    "a state of 2**40 shared leaves (memory past 2.9 GB)": (
        d.shared_state(40),
        "fr_1: entry 1: state is a list, not text",
    ),
    "a collective numbered 10**12 (never finished)": (
        d.pickle_of(d.dump([*d.good()["entries"], d.entry(10**12)])),
        "fr_1: group 0: collective_seq_id steps from 3 to 1000000000000",
    ),
}


@pytest.mark.parametrize("case", list(APART))
def test_a_dump_built_to_blow_up_reads_in_bounded_time_and_memory(
    tmp_path: Path, case: str
) -> None:
    """Was: C's unpickler sized its memo by an opcode's index (2.1 GB, or a MemoryError
    traceback); hashing a deep tuple key overflowed the C stack; shared references were walked
    (or printed) once per reference: minutes of CPU, gigabytes; sequence numbers were walked
    one by one from the first to the last."""
    dump, words = APART[case]
    directory = d.write(tmp_path / "dumps", {"fr_0": d.good(), "fr_1": dump})
    status, err, took = _analyze_apart(directory, tmp_path / "out")
    if words:
        assert status == 2, err[-2000:]
        line = _one_line(err)
        assert line.startswith(f"syncscope: error: {directory}/") and words in line
    else:  # the memo opcode stores a value: the dump reads as the good one it is
        assert status == 0, err[-2000:]
        assert _report(tmp_path / "out")["verdict"] == "clean"
    assert took < BOUND_S


# --- no clean verdict while a member rank's dump is missing or unreadable ---------------


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("fr_1", None),  # never written
        ("fr_1", b""),  # empty
        ("fr_1", d.pickle_of(d.good())[:16]),  # 16 bytes: cut short
        ("fr_1", b"\x00\x01garbage, no dump\n"),  # garbled
    ],
    ids=["missing", "empty", "16 bytes", "garbage"],
)
def test_a_member_without_a_readable_dump_is_never_clean(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, content: bytes | None
) -> None:
    """Was: read clean, with a note at most (an empty or 16-byte file was passed over as no
    dump at all)."""
    ranks = "[0, 1, 2]"
    files: dict[str, bytes | d.Dump] = {"fr_0": d.good(ranks=ranks), "fr_2": d.good(ranks=ranks)}
    if content is not None:
        files[name] = content
    directory = d.write(tmp_path / "dumps", files)
    if content is not None:  # named as the job's dumps are: read, and refused
        assert main(["analyze", "-q", "--out", str(tmp_path / "strict"), str(directory)]) == 2
        assert _one_line(capsys.readouterr().err).startswith(
            f"syncscope: error: {directory}/fr_1: "
        )
    out = tmp_path / "out"
    assert main(["analyze", "-q", "--skip-bad", "--out", str(out), str(directory)]) == 0
    report = _report(out)
    assert report["verdict"] == "incomplete"
    assert ("ranks-missing", "no-dump", [1]) in _kinds(report)


def test_nccl_dumps_where_one_rank_started_a_collective_another_only_scheduled_are_a_hang(
    tmp_path: Path,
) -> None:
    """Was: clean. Rank 0 started #7, rank 1 only scheduled it (its stream never reached it),
    none completed it."""
    started = d.entry(7, state="started", time_discovered_completed_ns=None)
    scheduled = d.entry(
        7, state="scheduled", time_discovered_started_ns=None, time_discovered_completed_ns=None
    )
    first = [d.entry(s) for s in range(1, 7)]
    directory = d.write(
        tmp_path / "dumps", {"fr_0": d.dump([*first, started]), "fr_1": d.dump([*first, scheduled])}
    )
    out = tmp_path / "out"
    assert main(["analyze", "-q", "--out", str(out), str(directory)]) == 1
    report = _report(out)
    (hang,) = [f for f in report["findings"] if f["kind"] == "hang"]
    assert (hang["cause"], hang["ranks"], hang["evidence"]["collective_seq_id"]) == (
        "not-started",
        [1],
        7,
    )
    assert report["verdict"] == "failed"


def test_a_garbage_rank_file_is_left_out_not_taken_for_rank_0(tmp_path: Path) -> None:
    """Was: "rank-00001.jsonl: rank 0 appears twice", and the whole run refused."""
    run = h.write_run(tmp_path, raw={1: b"NaN \x00\xff garbage\n"})
    out = tmp_path / "out"
    assert main(["analyze", "-q", "--out", str(out), str(run)]) == 0
    report = _report(out)
    assert report["verdict"] == "incomplete"
    assert ("ranks-missing", "no-events", [1]) in _kinds(report)
    assert "rank-00001.jsonl: no readable event: the file is left out" in report["notes"]


# --- the hung rank of a real 3-rank gloo job ---------------------------------------------

JOB = Path(__file__).resolve().parents[1] / "scripts" / "flight_job.py"


@pytest.mark.slow  # a 3-rank gloo job under torchrun
@pytest.mark.parametrize("loss", ["deleted", "16 bytes, --skip-bad"])
def test_the_hung_ranks_dump_lost_from_a_real_gloo_job_is_never_clean(
    tmp_path: Path, loss: str
) -> None:
    """Was: with the hung rank's dump gone (or cut short and skipped), the other two agree
    and the job read clean, with a note."""
    out = tmp_path / "hang"
    out.mkdir()
    env = {**os.environ, "TORCH_FR_BUFFER_SIZE": "2000", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=3"]
    subprocess.run([*cmd, str(JOB), "hang", str(out)], env=env, capture_output=True, timeout=240)
    assert sorted(p.name for p in out.glob("fr_[0-9]")) == ["fr_0", "fr_1", "fr_2"]
    (out / "fr_json_1.json").unlink()
    if loss == "deleted":
        (out / "fr_1").unlink()
    else:
        (out / "fr_1").write_bytes((out / "fr_1").read_bytes()[:16])
    report_dir = tmp_path / "report"
    options = ["--skip-bad"] if "skip-bad" in loss else []
    assert main(["analyze", "-q", *options, "--out", str(report_dir), str(out)]) == 0
    report = _report(report_dir)
    assert report["verdict"] == "incomplete"
    assert ("ranks-missing", "no-dump", [1]) in _kinds(report)
