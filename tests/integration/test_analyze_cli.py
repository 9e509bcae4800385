"""``syncscope analyze`` end to end: in-process through main(), and once as a subprocess."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from syncscope.cli import main

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "sample_traces"


def _copy(tmp_path: Path, name: str) -> Path:
    dest = tmp_path / name
    shutil.copytree(SAMPLES / name, dest)
    return dest


def test_redundant_syncs_from_gloo_traces(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    traces = _copy(tmp_path, "syncscope-gloo-ddp-every")
    out = tmp_path / "report"
    status = main(["analyze", str(traces), "--out", str(out), "--fail-on", "never"])
    assert status == 0
    report = json.loads((out / "report.json").read_text())
    kinds = {f["kind"] for f in report["findings"]}
    assert "redundant-sync" in kinds and "exposed-communication" in kinds
    assert report["source"] == "trace"
    assert "redundant-sync" in capsys.readouterr().out


def test_correct_loop_is_clean_of_sync_findings(tmp_path: Path) -> None:
    traces = _copy(tmp_path, "syncscope-gloo-ddp-no_sync")
    out = tmp_path / "report"
    status = main(["analyze", str(traces), "--out", str(out), "--quiet"])
    report = json.loads((out / "report.json").read_text())
    kinds = {f["kind"] for f in report["findings"]}
    assert not kinds & {"redundant-sync", "missing-sync", "collective-mismatch"}
    assert status == 0


def test_bad_trace_is_one_line_and_status_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    traces = _copy(tmp_path, "syncscope-gloo-ddp-no_sync")
    (traces / "rank-1.json.gz").write_bytes(b"\x1f\x8b\x08\x00" + b"\x01" * 64)
    status = main(["analyze", str(traces), "--out", str(tmp_path / "r"), "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(err) == 1 and "rank-1.json.gz" in err[0]
    status = main(["analyze", str(traces), "--out", str(tmp_path / "r"), "--quiet", "--skip-bad"])
    assert status == 0
    notes = json.dumps(json.loads((tmp_path / "r" / "report.json").read_text()))
    assert "skipped" in notes and "rank-1.json.gz" in notes


@pytest.mark.slow
def test_subprocess(tmp_path: Path) -> None:
    traces = _copy(tmp_path, "nccl_parser_config")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "syncscope", "analyze", str(traces), "--out", str(tmp_path / "r")],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode in (0, 1), proc.stderr
    assert "Traceback" not in proc.stderr
    assert (tmp_path / "r" / "report.json").is_file()


def _fresh_python(code: str) -> str:
    """What ``code`` prints, run by a fresh interpreter with this checkout on its path (what
    a module imports is seen only there: this process has imported everything already)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_analyze_imports_only_what_it_runs(tmp_path: Path) -> None:
    # Memory is part of analyze's contract (2x the largest trace file at most), and a small
    # trace is mostly interpreter and imports: the other commands' modules, and the standard
    # modules that only they need, must stay out. (decimal comes in with msgspec, the event
    # parser, which imports it itself.)
    code = (
        "import sys\n"
        "before = set(sys.modules)  # what the interpreter's own start-up loaded\n"
        "from syncscope.cli import main\n"
        f"status = main(['analyze', {str(SAMPLES / 'nccl_parser_config')!r}, '--quiet',\n"
        f"               '--out', {str(tmp_path / 'r')!r}])\n"
        "unwanted = ('syncscope.commands.profile', 'syncscope.commands.fix', 'syncscope.capture',\n"
        "            'torch', 'rich', 'pygments', 'plotly', 'hta', 'pandas', 'html.entities',\n"
        "            'statistics', 'tempfile', 'threading')\n"
        "new = set(sys.modules) - before\n"
        "print(status, sorted(m for m in new if m.startswith(unwanted)))\n"
    )
    status, loaded = _fresh_python(code).split(" ", 1)
    assert status in ("0", "1") and loaded.strip() == "[]"


def test_a_summary_without_a_fix_loads_no_syntax_highlighter(tmp_path: Path) -> None:
    # pygments (rich.syntax) is a fifth of a small analyze's start-up: only a summary that
    # shows a fix's code loads it (trace_filter's findings carry none)
    code = (
        "import sys, io, contextlib\n"
        "from syncscope.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    status = main(['analyze', {str(SAMPLES / 'trace_filter')!r},\n"
        f"                   '--out', {str(tmp_path / 'r')!r}])\n"
        "print(status, 'rich.console' in sys.modules,\n"
        "      sorted(m for m in sys.modules if m.startswith(('pygments', 'rich.syntax'))))\n"
    )
    assert _fresh_python(code).split() == ["0", "True", "[]"]


def test_traces_of_unnamed_groups_are_compared_op_by_op(tmp_path: Path) -> None:
    """trace_filter's ranks interleave their all-to-alls (other process groups,
    which the old-style trace does not name) and gradient all-reduces differently: no fault,
    so no collective-mismatch and no exit 1; the report says which ranks it lacks instead."""
    traces = _copy(tmp_path, "trace_filter")
    out = tmp_path / "report"
    status = main(["analyze", str(traces), "--out", str(out), "--quiet"])
    report = json.loads((out / "report.json").read_text())
    kinds = [f["kind"] for f in report["findings"]]
    assert "collective-mismatch" not in kinds and status == 0
    assert "ranks-missing" in kinds and report["verdict"] == "incomplete"


def test_a_mismatch_within_one_op_of_an_unnamed_group_is_still_found(tmp_path: Path) -> None:
    """The op-by-op comparison still finds a rank issuing one all-to-all fewer."""
    import gzip

    traces = _copy(tmp_path, "trace_filter")
    path = traces / "sampled_rank-1.json.gz"
    doc = json.loads(gzip.decompress(path.read_bytes()))
    last = max(e["ts"] for e in doc["traceEvents"] if e.get("name") == "c10d::alltoall_base_")
    doc["traceEvents"] = [  # its last all-to-all: the op, its record_param_comms and nccl: ops
        e
        for e in doc["traceEvents"]
        if not (e.get("cat") == "cpu_op" and 0 <= e.get("ts", 0) - last < 100)
    ]
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    out = tmp_path / "report"
    status = main(["analyze", str(traces), "--out", str(out), "--quiet"])
    report = json.loads((out / "report.json").read_text())
    mismatch = [f for f in report["findings"] if f["kind"] == "collective-mismatch"]
    assert status == 1 and len(mismatch) == 1 and mismatch[0]["cause"] == "count"
    assert "all_to_alls of unnamed groups" in mismatch[0]["message"]


def test_fsdp_memory_cost_from_traces_is_unknown_not_zero(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Traces record no parameter sizes: the memory that skipping the reduce-scatter
    would hold is unknown (null, "unknown"), never ~0 B."""
    traces = _copy(tmp_path, "syncscope-gloo-fsdp2")
    out = tmp_path / "report"
    main(["analyze", str(traces), "--out", str(out)])
    text = capsys.readouterr().out
    report = json.loads((out / "report.json").read_text())
    card = next(f for f in report["findings"] if f["cause"] == "fsdp-sharded-accumulation")
    assert card["cost"]["extra_memory_bytes_if_skipped"] is None
    assert "~0 B" not in text and "more gradient memory: unknown" in " ".join(text.split())
    html = (out / "report.html").read_text()
    assert "extra gradient memory if the sync is skipped</dt><dd>unknown</dd>" in html
