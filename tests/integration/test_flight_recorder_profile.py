"""``syncscope profile`` turns torch's Flight Recorder on in the ranks and, on a hang, has them
dump it into the run directory; the hang finding then names the culprit and each rank's stack.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from syncscope.cli import main
from syncscope.launch.flight import enable
from tests.conftest import LOOPS

LOOP_LINES = LOOPS.read_text(encoding="utf-8").splitlines()


def _line(text: str) -> int:
    return next(i for i, line in enumerate(LOOP_LINES, 1) if line.strip() == text)


def test_the_recorder_is_turned_on_unless_the_user_chose() -> None:
    env: dict[str, str] = {}
    assert enable(env) and env["TORCH_FR_BUFFER_SIZE"] == "2000"
    env = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "500"}
    assert enable(env) and "TORCH_FR_BUFFER_SIZE" not in env  # the older name is the user's
    env = {"TORCH_FR_BUFFER_SIZE": "0", "SYNCSCOPE_FLIGHT_DUMPS": "1"}
    assert not enable(env) and env == {"TORCH_FR_BUFFER_SIZE": "0"}  # off: no dumps asked


@pytest.mark.parametrize(("release", "names"), [((2, 7), 2), ((2, 8), 1), ((2, 15), 1)])
def test_the_recorder_is_turned_on_by_the_name_the_release_reads(
    release: tuple[int, int], names: int
) -> None:
    # GIVEN: torch 2.6 or 2.7, whose recorder (NCCL only) reads TORCH_NCCL_TRACE_BUFFER_SIZE
    # alone, or 2.8 on (TORCH_FR_BUFFER_SIZE, the older name a fallback)
    env: dict[str, str] = {}
    # WHEN: profile turns the recorder on
    assert enable(env, release=release)
    # THEN: by the name that release reads, and the newer name only from 2.8
    sizes = {k: v for k, v in env.items() if k.endswith("BUFFER_SIZE")}
    assert sizes == dict.fromkeys(
        ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")[:names], "2000"
    )


@pytest.mark.slow
def test_a_hang_is_dumped_into_the_run_and_its_finding_names_the_culprit(profiled) -> None:  # type: ignore[no-untyped-def]
    run = profiled(LOOPS, "mismatch-hang", options=("--hang-timeout", "3"))
    assert run.report["hung"] is True
    flight = run.run_dir / "flight"
    assert sorted(p.name for p in flight.glob("fr_*")) == ["fr_0", "fr_1"]
    hang = run.finding("hang")
    evidence = hang["evidence"]
    # loops.py: rank 1 all-reduces once more, then both ranks enter the barrier
    extra, barrier = _line("dist.all_reduce(torch.ones(3))"), _line("dist.barrier()")
    assert evidence["culprit_ranks"] == [1]
    assert f"loops.py:{barrier} in <module>" in evidence["stacks"]["0"]
    assert f"loops.py:{extra} in <module>" in evidence["stacks"]["1"]
    assert evidence["last_issued_started_completed"]["1"].startswith("issued #")
    assert "syncscope/" not in json.dumps(evidence["stacks"])  # the user's frames, not ours
    # the mismatch is the hang's cause, on its card: no second error
    kinds = [f["kind"] for f in run.report["findings"]]
    assert "collective-mismatch" not in kinds and kinds.count("hang") == 1, kinds
    assert "rank(s) 1 issued all_reduce of 12 bytes" in evidence["collective_mismatch"]


@pytest.mark.slow
def test_analyze_and_report_of_the_run_read_its_dumps_again(profiled, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    run = profiled(LOOPS, "mismatch-hang", options=("--hang-timeout", "3"))
    assert main(["analyze", "-q", "--out", str(tmp_path / "a"), str(run.run_dir)]) == 1
    again = json.loads((tmp_path / "a" / "report.json").read_text())
    hang = next(f for f in again["findings"] if f["kind"] == "hang")
    assert hang["evidence"]["culprit_ranks"] == [1]
    assert main(["report", str(run.run_dir), "--format", "json"]) in (0, 1)
    # the run without its flight/, and the dumps given beside it
    bare = tmp_path / "run"
    shutil.copytree(run.run_dir, bare, ignore=shutil.ignore_patterns("flight", "report.*"))
    dumps = shutil.copytree(run.run_dir / "flight", tmp_path / "dumps")
    assert main(["analyze", "-q", "--out", str(tmp_path / "b"), str(bare), str(dumps)]) == 1
    beside = json.loads((tmp_path / "b" / "report.json").read_text())
    hang = next(f for f in beside["findings"] if f["kind"] == "hang")
    assert hang["cause"] == "no-progress" and hang["evidence"]["culprit_ranks"] == [1]


@pytest.mark.slow
def test_a_user_who_turned_the_recorder_off_gets_no_dumps(
    profiled, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "0")
    run = profiled(LOOPS, "mismatch-hang", options=("--hang-timeout", "2"))
    assert run.report["hung"] is True
    assert not list((run.run_dir / "flight").glob("fr_*"))
    assert "culprit_ranks" not in run.finding("hang")["evidence"]


def test_request_dumps_waits_for_the_ranks_asked_and_no_longer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from syncscope.launch.flight import request_dumps

    monkeypatch.setenv("SYNCSCOPE_FLIGHT_DUMPS", "1")
    (tmp_path / "flight").mkdir()
    (tmp_path / "flight" / "fr_0").write_bytes(b"x")
    assert request_dumps(tmp_path, [0, -1], wait_s=5) == [0]  # -1: no header read, not waited
    assert (tmp_path / "flight" / "request").exists()
    assert request_dumps(tmp_path, [0, 1], wait_s=0.3) == [0]  # rank 1 never answers
    monkeypatch.delenv("SYNCSCOPE_FLIGHT_DUMPS")
    assert request_dumps(tmp_path, [0], wait_s=5) == []  # the recorder off: nothing asked


def test_a_rank_dumps_its_buffer_when_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import time

    from syncscope.capture.flightdump import start_dumper
    from syncscope.load.flight import read_dump

    monkeypatch.setenv("SYNCSCOPE_FLIGHT_DUMPS", "1")
    start_dumper(tmp_path, 7)
    (tmp_path / "flight").mkdir()
    (tmp_path / "flight" / "request").write_text("dump\n")
    deadline = time.monotonic() + 10
    while not (tmp_path / "flight" / "fr_7").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    dumped = read_dump(tmp_path / "flight" / "fr_7")  # torch's own pickle, read back
    assert dumped.rank == 7 and dumped.version
    assert not list((tmp_path / "flight").glob(".fr_*"))  # written whole, then renamed
