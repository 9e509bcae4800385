"""``syncscope analyze`` on torch Flight Recorder dumps that torch writes here, in the test.

Each scenario of tests/scripts/flight_job.py runs as a 3-rank gloo job under torchrun with
``TORCH_FR_BUFFER_SIZE`` set; every rank dumps its recorder (pickle and JSON). The expected
culprit and line come from the job's own code (the scenario and the line of the call), never
from a recorded result. Where torch's own analyzer can read the dumps (renamed as NCCL's
default group, which it expects), the test runs it on the same dumps and checks that it names
the same ranks.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from syncscope.cli import main

pytestmark = pytest.mark.slow

JOB = Path(__file__).resolve().parents[1] / "scripts" / "flight_job.py"
RANKS = 3
_RUNS: dict[str, Path] = {}


def _line(text: str) -> int:
    """The job's line that is ``text`` (1-based): where a collective is called."""
    lines = JOB.read_text(encoding="utf-8").splitlines()
    return next(i for i, line in enumerate(lines, 1) if line.strip() == text)


def dumps(scenario: str, root: Path) -> Path:
    """The directory of the scenario's dumps (the job runs once per test session)."""
    if scenario in _RUNS:
        return _RUNS[scenario]
    out = root / scenario
    out.mkdir(parents=True)
    env = {**os.environ, "TORCH_FR_BUFFER_SIZE": "2000", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    cmd += [f"--nproc-per-node={RANKS}", str(JOB), scenario, str(out)]
    subprocess.run(cmd, env=env, capture_output=True, timeout=240, check=False)
    written = sorted(p.name for p in out.iterdir())
    expected = sorted(
        [f"fr_{r}" for r in range(RANKS)] + [f"fr_json_{r}.json" for r in range(RANKS)]
    )
    assert written == expected, f"{scenario}: the job left {written}"
    _RUNS[scenario] = out
    return out


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("flight")


def analyze(paths: list[Path], out: Path) -> tuple[int, dict[str, Any]]:
    status = main(["analyze", "--quiet", "--out", str(out), *map(str, paths)])
    return status, json.loads((out / "report.json").read_text(encoding="utf-8"))


def desyncs(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [f for f in report["findings"] if f["kind"] in ("collective-mismatch", "hang")]


def only(directory: Path, pattern: str, dest: Path) -> Path:
    dest.mkdir()
    for p in directory.glob(pattern):
        shutil.copy(p, dest / p.name)
    return dest


def test_healthy_run_is_clean_and_shows_one_grad_sync_round_per_window(root: Path) -> None:
    status, report = analyze([dumps("healthy", root)], root / "r-healthy")
    assert status == 0
    assert desyncs(report) == []
    (summary,) = [f for f in report["findings"] if f["kind"] == "flight-recorder"]
    # the job: 2 windows, DDP reducing once per window (no_sync on the first micro-batch)
    assert summary["evidence"]["grad_sync_rounds"] == {"0-2": "2 round(s) (2 x 324 bytes; ddp)"}
    ranges = summary["evidence"]["sequence_ranges"]
    assert list(ranges.values()) == [{"0-2": "#1-#11"}]  # 3 DDP set-up + 4 + 4 per window
    notes = " ".join(report["notes"])
    assert "micro-batches, optimizer steps and gradient values are not in it" in notes
    assert "gloo backend leaves every entry 'scheduled'" in notes


def test_a_rank_that_skips_an_all_reduce_is_named_with_the_skipped_call(root: Path) -> None:
    status, report = analyze([dumps("skip", root)], root / "r-skip")
    assert status == 1
    (finding,) = desyncs(report)
    assert (finding["kind"], finding["cause"]) == ("collective-mismatch", "skipped")
    assert finding["evidence"]["culprit_ranks"] == [1]
    skipped = _line("dist.all_reduce(loss)")
    per_rank = finding["evidence"]["per_rank"]
    assert per_rank["0,2"].endswith(f"flight_job.py:{skipped}")
    assert per_rank["1"].endswith(f"flight_job.py:{_line('dist.all_reduce(metric)')}")
    assert f"flight_job.py:{skipped} in train" in finding["evidence"]["stacks"]["0,2"]


def test_a_hang_names_the_rank_that_never_arrived_and_where_the_others_wait(root: Path) -> None:
    status, report = analyze([dumps("hang", root)], root / "r-hang")
    assert status == 1 and report["verdict"] == "failed"
    (finding,) = desyncs(report)
    assert (finding["kind"], finding["cause"]) == ("hang", "missing-rank")
    assert finding["ranks"] == [1]
    backward = _line("model(torch.randn(4, 8)).pow(2).mean().backward()")
    waiting = finding["evidence"]["per_rank"]["0,2"]
    assert "all_reduce" in waiting and waiting.endswith(f"flight_job.py:{backward}")
    assert finding["evidence"]["per_rank"]["1"].startswith("never issued #")
    stacks = finding["evidence"]["stacks"]["0,2"]
    assert "_engine_run_backward" in stacks and f"flight_job.py:{backward} in train" in stacks
    positions = finding["evidence"]["last_issued_started_completed"]
    assert all("issued #" in v and "completed #" in v for v in positions.values())


@pytest.mark.parametrize(("scenario", "cause"), [("size", "size"), ("dtype", "dtype")])
def test_a_mismatch_names_the_odd_rank(root: Path, scenario: str, cause: str) -> None:
    status, report = analyze([dumps(scenario, root)], root / f"r-{scenario}")
    assert status == 1
    (finding,) = desyncs(report)
    assert (finding["kind"], finding["cause"]) == ("collective-mismatch", cause)
    assert finding["evidence"]["culprit_ranks"] == [RANKS - 1]  # the job's odd rank


def test_json_dumps_give_the_same_culprit_without_stacks(root: Path) -> None:
    directory = only(dumps("size", root), "fr_json_*", root / "json-size")
    status, report = analyze([directory], root / "r-json-size")
    assert status == 1
    (finding,) = desyncs(report)
    assert finding["evidence"]["culprit_ranks"] == [RANKS - 1]
    assert "stacks" not in finding["evidence"]
    assert any("no Python stacks" in n for n in report["notes"])
    # pg_status, numbers as strings in JSON, still gives each rank's last completed one
    positions = finding["evidence"]["last_issued_started_completed"]
    assert all("| completed #" in v for v in positions.values())


def _as_nccl_default_group(source: Path, dest: Path) -> Path:
    """The pickles as torch's analyzer expects them: NCCL names, the default group under its
    name in pg_config (gloo records it under "", which the analyzer cannot look up)."""
    dest.mkdir()
    for path in source.glob("fr_[0-9]*"):
        data = pickle.loads(path.read_bytes())
        ranks = next(iter(data["pg_config"].values()))["ranks"]
        data["pg_config"] = {"0": {"name": "0", "desc": "default_pg", "ranks": ranks}}
        for entry in data["entries"]:
            entry["profiling_name"] = entry["profiling_name"].replace("gloo:", "nccl:")
        (dest / path.name).write_bytes(pickle.dumps(data))
    return dest


def _torch_culprits(directory: Path) -> set[int]:
    """The ranks torch's analyzer names at its first failed collective (rank 0's dump first,
    as its reference: it walks the files in directory order otherwise)."""
    from torch.distributed.flight_recorder.components.builder import build_db
    from torch.distributed.flight_recorder.components.config_manager import JobConfig
    from torch.distributed.flight_recorder.components.loader import read_dir

    args = JobConfig().parse_args([str(directory)])
    details, version = read_dir(args)
    details = dict(sorted(details.items(), key=lambda kv: int(kv[1]["rank"])))
    for c in build_db(details, args, version).collectives:
        if c.missing_ranks:
            return set(c.missing_ranks)
        if not c.pass_check:
            return set(c.mismatch_collectives or {})
    return set()


def test_torchs_own_analyzer_fails_on_gloo_dumps_that_syncscope_reads(root: Path) -> None:
    directory = only(dumps("hang", root), "fr_[0-9]*", root / "torch-gloo")
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", str(directory)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode != 0 and "KeyError" in done.stderr


@pytest.mark.parametrize("scenario", ["size", "dtype", "hang"])
def test_torchs_analyzer_names_the_same_culprit(root: Path, scenario: str) -> None:
    converted = _as_nccl_default_group(dumps(scenario, root), root / f"nccl-{scenario}")
    status, report = analyze([converted], root / f"r-nccl-{scenario}")
    (finding,) = desyncs(report)
    assert set(finding["evidence"]["culprit_ranks"]) == _torch_culprits(converted)
    assert status == 1
