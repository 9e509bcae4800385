"""Hostile inputs, table-driven: each gives its exit status and one line, never a traceback.

Every case builds its input under ``tmp_path``, runs ``syncscope.cli.main`` in process and
checks the exit status, the first line of stderr (a pattern naming the file and the field)
and that no traceback was printed. The huge-header cases also run in a subprocess under a
1.5 GB address-space limit (``test_huge_headers_bounded_memory``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from syncscope import cli
from tests.helpers import hostile as h

Builder = Callable[[Path], list[str]]  # tmp -> argv


@dataclass(frozen=True)
class Case:
    id: str
    build: Builder
    status: int
    first_line: str  # regex searched in the first line of stderr


def analyze(edit: Callable[[h.Doc], object], both: bool = True) -> Builder:
    return lambda tmp: [
        "analyze",
        "-q",
        "--out",
        str(tmp / "out"),
        str(h.write_traces(tmp, edit, both)),
    ]


def report(**kwargs: object) -> Builder:
    return lambda tmp: [
        "report",
        "-f",
        "json",
        "-o",
        str(tmp / "r.json"),
        str(h.write_run(tmp, **kwargs)),  # type: ignore[arg-type]
    ]


def c10d_op(**values: object) -> Callable[[h.Doc], object]:
    return h.edit_events(lambda evs: h.first_cpu_op(evs, **values))


UNPLACED = r"rank-0\.json: 1 collective event\(s\) without a usable time"

TRACE_CASES = [
    Case("trace-events-are-integers", analyze(h.set_key("traceEvents", [1, 2, 3])), 2,
         r"rank-0\.json: traceEvents holds 3 entries that are not objects"),
    Case("trace-distributedinfo-list", analyze(h.set_key("distributedInfo", [1])), 2,
         r"rank-0\.json: distributedInfo must be an object"),
    Case("trace-worldsize-string", analyze(h.set_info(world_size="2")), 2,
         r"rank-0\.json: distributedInfo\.world_size must be an integer"),
    Case("trace-worldsize-huge", analyze(h.set_info(world_size=10**12)), 0, r""),
    Case("trace-rank-negative", analyze(h.set_info(rank=-1)), 2,
         r"rank-0\.json: distributedInfo\.rank must be at least 0"),
    Case("trace-basetime-string", analyze(h.set_key("baseTimeNanoseconds", "x")), 2,
         r"rank-0\.json: baseTimeNanoseconds must be an integer"),
    Case("trace-pg-config-malformed", analyze(h.set_info(pg_config=[{"pg_size": "x"}])), 2,
         r"rank-0\.json: distributedInfo\.pg_config\[0\]\.pg_size must be an integer"),
    Case("trace-pg-config-not-list", analyze(h.set_info(pg_config=5)), 2,
         r"rank-0\.json: distributedInfo\.pg_config must be a list"),
    Case("trace-timestamp-1e300", analyze(c10d_op(ts=1e300)), 2, UNPLACED),
    Case("trace-collective-without-ts", analyze(c10d_op(ts=None)), 2, UNPLACED),
    Case("trace-collective-negative-dur", analyze(c10d_op(dur=-5.0)), 2, UNPLACED),
    Case("trace-op-without-ts-is-a-note", analyze(h.edit_events(h.aten_without_ts)), 0, r""),
    Case("trace-top-level-list", lambda tmp: ["analyze", "-q", str(h.write_text(tmp, "t.json", "[1, 2]"))],
         2, r"t\.json: .*not a Kineto trace"),
    Case("trace-spaced-events", lambda tmp: ["analyze", "-q", "--out", str(tmp / "o"), str(h.spaced_trace(tmp))],
         0, r""),
    Case("trace-huge-string", lambda tmp: ["analyze", "-q", "--out", str(tmp / "o"), str(h.huge_string_trace(tmp))],
         2, r"rank-0\.json: an event near byte \d+ is larger than 32 MiB"),
]  # fmt: skip


META = r"run/meta\.json: "
EV = r"rank-00000\.jsonl: event \d+: "

RUN_CASES = [
    Case("meta-world-size-string", report(meta_data=h.meta(world_size="2")), 2,
         META + r"world_size must be an integer, not str"),
    Case("meta-world-size-negative", report(meta_data=h.meta(world_size=-3)), 2,
         META + r"world_size must be at least 0"),
    Case("meta-world-size-huge", report(meta_data=h.meta(world_size=10**12)), 0, r"^syncscope: wrote"),
    Case("meta-launcher-list", report(meta_data=h.meta(launcher=["a"])), 2,
         META + r"launcher must be an object, not list"),
    Case("meta-notes-int", report(meta_data=h.meta(notes=5)), 2, META + r"notes must be a list"),
    Case("meta-hang-timeout-nan", report(meta_data=h.meta(hang_timeout_s=float("nan"))), 2,
         META + r"hang_timeout_s must be a finite number"),
    Case("meta-command-dict", report(meta_data=h.meta(command={"a": 1})), 2,
         META + r"command must be a list or a string"),
    Case("meta-not-json", lambda tmp: ["report", str(h.broken_meta(tmp, b"{nope"))], 2,
         r"meta\.json: not valid JSON"),
    Case("meta-top-level-list", lambda tmp: ["report", str(h.broken_meta(tmp, b"[1]"))], 2,
         r"meta\.json: not a syncscope run"),
    Case("event-done-without-seq", report(events=h.with_event("done", seq=None)), 2,
         EV + r"seq is missing \(a 'done' event needs it\)"),
    Case("event-t-string", report(events=h.with_event("bwd", t="soon")), 2,
         EV + r"t must be an integer, not str"),
    Case("event-bytes-string", report(events=h.with_event("coll", bytes="64")), 2,
         EV + r"bytes must be an integer, not str"),
    Case("event-header-rank-string", report(events=h.with_event("header", rank="0")), 2,
         EV + r"rank must be an integer, not str"),
    Case("event-header-rank-negative", report(events=h.with_event("header", rank=-1)), 2,
         EV + r"rank must be at least 0, not -1"),
    Case("event-step-fp-string", report(events=h.with_event("step", fp="1,2")), 2,
         EV + r"fp must be a list, not str"),
    Case("event-fp-holds-strings", report(events=h.with_event("step", fp=[1.0, "x"])), 2,
         EV + r"fp\[1\] must be a number, not str"),
    Case("event-group-strings", report(events=h.with_event("coll", group=["0", "1"])), 2,
         EV + r"group\[0\] must be an integer, not str"),
    Case("event-type-int", report(events=h.with_event("dist", type=7)), 2,
         EV + r"type must be a string, not int"),
    Case("event-site-list", report(events=h.with_event("fwd", site=[1])), 2,
         EV + r"site must be an object, not list"),
    Case("event-seq-float-huge", report(events=h.with_event("coll", seq=1e300)), 2,
         EV + r"seq must be an integer, not float"),
    Case("run-without-rank-files", report(ranks=0), 2, r"run: the run holds no rank events"),
    Case("run-binary-rank-files", report(raw={0: b"\x00\xff" * 100, 1: b""}), 2,
         r"run: the run holds no rank events"),
    Case("run-not-a-run", lambda tmp: ["report", str(tmp)], 2, r"no trace files"),
]  # fmt: skip


def diff_runs(world_b: int = 2, ranks_b: int = 2) -> Builder:
    def build(tmp: Path) -> list[str]:
        a = h.write_run(tmp, "a")
        b = h.write_run(tmp, "b", meta_data=h.meta(world_b), ranks=ranks_b)
        return ["diff", str(a), str(b)]

    return build


def fix_from(report: object) -> Builder:
    def build(tmp: Path) -> list[str]:
        script = h.write_text(tmp, "train.py", "print('hi')\n")
        run = h.write_run(tmp)
        (run / "report.json").write_text(h.json.dumps(report))
        return ["fix", "--from", str(run), str(script)]

    return build


def report_doc(**values: object) -> dict[str, object]:
    import hashlib

    digest = hashlib.sha256(b"print('hi')\n").hexdigest()
    return {"schema_version": 1, "script": {"sha256": digest}, **values}


OTHER_CASES = [
    Case("diff-different-world-sizes", diff_runs(world_b=1, ranks_b=1), 0,
         r"warning: the runs have different world sizes \(2 vs 1\)"),
    Case("diff-run-without-rank-files", diff_runs(ranks_b=0), 2,
         r"b: the run holds no rank events"),
    Case("fix-from-findings-not-list", fix_from(report_doc(findings=3)), 2,
         r"report\.json: findings must be a list, not int"),
    Case("fix-from-finding-not-object", fix_from(report_doc(findings=[7])), 2,
         r"report\.json: findings\[0\] must be an object"),
    Case("fix-from-line-string", fix_from(report_doc(findings=[{"sources": [{"line": "x"}]}])), 2,
         r"report\.json: findings\[0\]\.sources\[0\]\.line must be an integer"),
    Case("fix-from-script-list", fix_from(report_doc(script=[1])), 2,
         r"report\.json: script must be an object"),
    Case("fix-from-not-json", fix_from("{"), 2, r"not a syncscope report"),
]  # fmt: skip


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    status = cli.main(argv)
    out, err = capsys.readouterr()
    return status, out, err


@pytest.mark.parametrize("case", TRACE_CASES + RUN_CASES + OTHER_CASES, ids=lambda c: c.id)
def test_hostile(case: Case, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = case.build(tmp_path)
    status, out, err = _run(argv, capsys)
    assert "Traceback" not in out + err
    first = err.splitlines()[0] if err.strip() else ""
    assert re.search(case.first_line, first), err
    assert status == case.status, err


@pytest.mark.parametrize("kind", ["report", "analyze"])
def test_huge_headers_bounded_memory(kind: str, tmp_path: Path) -> None:
    """A world size of 10**12 in a header: one subprocess under a 1.5 GB address-space cap."""
    import resource
    import subprocess
    import sys

    if kind == "report":
        target = h.write_run(tmp_path, meta_data=h.meta(world_size=10**12))
        argv = ["report", "-f", "json", "-o", str(tmp_path / "r.json"), str(target)]
    else:
        target = h.write_traces(tmp_path, h.set_info(world_size=10**12))
        argv = ["analyze", "-q", "--out", str(tmp_path / "o"), str(target)]

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (1536 << 20, 1536 << 20))

    proc = subprocess.run(
        [sys.executable, "-m", "syncscope", *argv],
        preexec_fn=cap,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=h.ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    if kind == "report":
        notes = h.json.loads((tmp_path / "r.json").read_text())["notes"]
        assert any("rank(s) 2-999999999999 of 1000000000000" in n for n in notes)
