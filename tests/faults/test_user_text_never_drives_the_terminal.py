"""The read and render side: what a user controls never drives the terminal, and a hostile
run directory is read in bounded time, with a note for what was left out."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from syncscope import cli
from syncscope.analysis.diagnose import diagnose
from syncscope.render.diff import compare, render_diff_text
from syncscope.render.terminal import SafeConsole, print_summary, render_text
from syncscope.text import visible
from tests.helpers.runs import all_findings, make_run, redundant

CLEAR = "\x1b[2J"  # erase the screen
TITLE = "\x1b]0;owned\x07"  # OSC 0: set the window title
RED = "\x1b[31m"
C1_CSI = "\x9b2J"  # the 8-bit CSI
HOSTILE = f"{CLEAR}{TITLE}{RED}[bold]x[/bold]{C1_CSI}"
RAW = (CLEAR, "\x1b]0;", "\x07", RED, "\x9b")


def _hostile_run():  # type: ignore[no-untyped-def]
    script = f"train{HOSTILE}.py"
    run = make_run(
        sync_at=lambda r, w, mb, n: True,
        command=("torchrun", f"--name={HOSTILE}", script),
        notes=(f"a note {HOSTILE}",),
        module=f"Block{HOSTILE}",
    )
    return run, script


def test_visible_writes_control_characters_out_and_keeps_text() -> None:
    assert visible(f"a{CLEAR}b\tc\nd") == "a\\x1b[2Jb\tc\nd"
    assert visible(TITLE) == "\\x1b]0;owned\\x07"
    assert visible(C1_CSI) == "\\x9b2J"
    assert visible("café ✓") == "café ✓"


@pytest.mark.parametrize("terminal", [True, False])
def test_the_summary_shows_escapes_from_command_notes_sites_and_findings(terminal: bool) -> None:
    """A run whose command, notes, module label and finding sources carry ESC[2J, OSC 0,
    colour codes and an 8-bit CSI: the summary prints them as text, on a colour terminal
    (syncscope's own styles still applied) and as plain text (``report -f text``)."""
    run, script = _hostile_run()
    findings = [*diagnose(run), *all_findings(script=script)]
    if terminal:
        out = io.StringIO()
        print_summary(run, findings, SafeConsole(file=out, force_terminal=True, width=200))
        text = out.getvalue()
        assert "\x1b[1m" in text or "\x1b[" in text.replace(CLEAR, "")  # styles still on
    else:
        text = render_text(run, findings, width=200)
    for raw in (CLEAR, "\x1b]0;", "\x07", "\x9b"):
        assert raw not in text
    assert "\\x1b[2J" in text and "\\x1b]0;owned\\x07" in text  # the BEL shown too
    # shown before layout: every line of a finding's box is as wide as its top
    if not terminal:
        lines = text.splitlines()
        top = next(i for i, line in enumerate(lines) if line.startswith("╭"))
        end = next(i for i in range(top, len(lines)) if lines[i].startswith("╰"))
        widths = {len(line) for line in lines[top : end + 1]}
        assert len(widths) == 1, lines[top : end + 1]


def test_diff_shows_escapes_as_text() -> None:
    run_a, _script = _hostile_run()
    run_b = redundant()
    result = compare(run_a, diagnose(run_a), run_b, diagnose(run_b), labels=(HOSTILE, "b"))
    text = render_diff_text(result, color=True)
    assert CLEAR not in text and "\x1b]0;" not in text and "\\x1b[2J" in text


def test_an_error_naming_a_hostile_path_is_one_visible_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status = cli.main(["report", str(tmp_path / f"run{HOSTILE}")])
    err = capsys.readouterr().err
    assert status == 2
    assert len(err.strip().splitlines()) == 1
    for raw in RAW:
        assert raw not in err
    assert "\\x1b[2J" in err


# --- run files that are not regular files, or never end ---------------------------------------


def _report(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    status = cli.main(args)
    out = capsys.readouterr()
    return status, out.out, out.err


def _report_within(
    args: list[str], capsys: pytest.CaptureFixture[str], seconds: int = 20
) -> tuple[int, str, str]:
    """``_report``, failed with TimeoutError should it take over ``seconds`` (a read that
    never ends: a FIFO with no writer, an endless device)."""
    import signal

    def fail(*_: object) -> None:
        raise TimeoutError(f"hung: {args} took over {seconds} s")

    before = signal.signal(signal.SIGALRM, fail)
    signal.alarm(seconds)
    try:
        return _report(args, capsys)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, before)


def test_a_fifo_as_a_rank_file_is_skipped_with_a_note(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import os

    from tests.helpers.hostile import write_run

    run = write_run(tmp_path, ranks=2)
    fifo = run / "ranks" / "rank-00001.jsonl"
    fifo.unlink()
    os.mkfifo(fifo)
    status, out, err = _report_within(["report", str(run), "-f", "json"], capsys)
    assert status == 0, err
    assert "is a FIFO, not a regular file: skipped" in out


@pytest.mark.parametrize("target", ["/dev/zero", "/dev/urandom"])
def test_a_rank_file_linked_to_an_endless_device_is_skipped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], target: str
) -> None:
    from tests.helpers.hostile import write_run

    run = write_run(tmp_path, ranks=2)
    link = run / "ranks" / "rank-00001.jsonl"
    link.unlink()
    link.symlink_to(target)
    status, out, err = _report_within(["report", str(run), "-f", "json"], capsys)
    assert status == 0, err
    assert "is a device, not a regular file: skipped" in out


@pytest.mark.parametrize("target", ["/dev/zero", "/dev/urandom"])
def test_meta_json_linked_to_an_endless_device_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], target: str
) -> None:
    from tests.helpers.hostile import write_run

    run = write_run(tmp_path, ranks=2)
    (run / "meta.json").unlink()
    (run / "meta.json").symlink_to(target)
    status, _, err = _report_within(["report", str(run), "-f", "json"], capsys)
    assert status == 2
    assert err.count("\n") == 1 and "meta.json: a device, not a regular file" in err


def test_an_overlong_event_line_is_skipped_not_held(tmp_path: Path) -> None:
    from syncscope import rundir

    path = tmp_path / "rank-00000.jsonl"
    big = b'{"type": "note", "x": "' + b"a" * (rundir.EVENT_MAX_BYTES + 10) + b'"}\n'
    path.write_bytes(b'{"type": "header", "rank": 0}\n' + big + b'{"type": "exit"}\n')
    # read as a dropped record in its place, counted in a note
    assert [e["type"] for e in rundir.read_events(path)] == ["header", "dropped", "exit"]


def test_report_output_onto_a_fifo_writes_into_it_and_keeps_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import os
    import stat
    import threading

    from tests.helpers.hostile import write_run

    run = write_run(tmp_path, ranks=2)
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    status, _, err = _report(["report", str(run), "-f", "json", "-o", str(fifo)], capsys)
    reader.join(20)
    assert status == 0, err
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)  # still a FIFO, not replaced
    assert got and got[0].startswith(b"{")


def test_report_output_onto_a_device_is_written_directly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.helpers.hostile import write_run

    run = write_run(tmp_path, ranks=2)
    status, _, err = _report(["report", str(run), "-f", "json", "-o", "/dev/null"], capsys)
    assert status == 0, err
    assert Path("/dev/null").is_char_device()


# --- rough edges ------------------------------------------------------------------------------


def test_a_string_format_version_says_what_is_wrong(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.helpers.hostile import meta, write_run

    run = write_run(tmp_path, meta_data=meta(2, format_version="1"))
    status, _, err = _report(["report", str(run), "-f", "json"], capsys)
    assert status == 2
    assert "format_version is '1', not a whole number" in err and "newer" not in err


def test_a_rank_stopped_in_window_0_before_a_micro_batch_is_not_window_minus_1() -> None:
    from syncscope.analysis.crossrank import last_seen
    from syncscope.model import RankRun, Window

    window = Window(0, False, 0, 10, (), ())
    where = last_seen(RankRun(rank=0, windows=(window,)))
    assert "-1" not in where and "window 0" in where


def test_analyze_hta_on_a_run_without_traces_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.helpers.hostile import write_run

    run = write_run(tmp_path)
    status, _, err = _report(
        ["analyze", "--hta", "-q", str(run), "-o", str(tmp_path / "out")], capsys
    )
    assert status == 0, err
    assert "--hta not applied: --hta needs trace files" in err


def test_assert_syncs_names_a_micro_batch_outside_the_window() -> None:
    from syncscope.testing.asserts import check
    from tests.unit.testing.test_asserts import stats_of

    problems = check(stats_of(make_run()), at_micro_batch=-99)
    assert problems and "names none of them" in problems[0] and "-95" not in problems[0]


# --- odd records in a rank file: counted once, read in order, the last capture -------------
FALSE_ERRORS = {"collective-mismatch", "rank-divergence"}


def _rank_file(events: list[dict[str, object]]) -> bytes:
    import orjson

    return b"".join(orjson.dumps(e) + b"\n" for e in events)


def _two_per_window(rank: int, swapped: bool = False) -> list[dict[str, object]]:
    """The hand-made rank events with a broadcast (32 bytes, the next seq) after each
    all-reduce; ``swapped``: each window's two records written in the other order."""
    from tests.helpers.hostile import run_events

    events: list[dict[str, object]] = []
    seq = 0
    for ev in run_events(rank):
        if ev["type"] in ("coll", "done"):
            ev = {**ev, "seq": seq}
        events.append(ev)
        if ev["type"] == "done":
            pair = [
                {**events[-2], "seq": seq + 1, "op": "broadcast", "bytes": 32},
                {"type": "done", "seq": seq + 1, "t": ev["t"]},
            ]
            if swapped:
                events[-2:] = [pair[0], events[-2], events[-1], pair[1]]
            else:
                events.extend(pair)
            seq += 2
    return events


def _read(run: Path):  # type: ignore[no-untyped-def]
    from syncscope.commands.saved import load_and_diagnose

    run_, findings = load_and_diagnose(run)
    return run_, {f.kind for f in findings}


def test_a_record_written_twice_is_counted_once_with_a_note(tmp_path: Path) -> None:
    """Rank 1's first all-reduce and its completion each written twice: one collective, as
    on rank 0 (was: a false collective-mismatch error, rank 1 "issued" 3 to rank 0's 2)."""
    import copy

    from tests.helpers.hostile import run_events, write_run

    events = []
    for ev in run_events(1):
        events.append(ev)
        if ev["type"] in ("coll", "done") and ev["seq"] == 1:
            events.append(copy.deepcopy(ev))
    run = write_run(tmp_path, raw={1: _rank_file(events)})
    result, kinds = _read(run)
    assert not kinds & FALSE_ERRORS
    per_rank = {r: [len(w.collectives) for w in result.ranks[r].windows] for r in (0, 1)}
    assert per_rank[0] == per_rank[1] == [1, 1]
    assert any(
        "rank-00001.jsonl: 1 collective and 1 completion record(s) repeat" in n
        for n in result.meta.notes
    )


def test_collective_records_out_of_seq_order_are_read_in_seq_order(tmp_path: Path) -> None:
    """Each window issues an all-reduce then a broadcast; rank 1's file has the two written
    the other way round: read by seq, the ranks agree (in file order: a false mismatch)."""
    from tests.helpers.hostile import write_run

    run = write_run(tmp_path, events=lambda r: _two_per_window(r, swapped=r == 1))
    result, kinds = _read(run)
    assert not kinds & FALSE_ERRORS
    ops = {r: [c.op for w in result.ranks[r].windows for c in w.collectives] for r in (0, 1)}
    assert ops[0] == ops[1] == ["all_reduce", "broadcast"] * 2
    assert any("4 collective record(s) written out of seq order" in n for n in result.meta.notes)
    clean = write_run(tmp_path, "clean", events=_two_per_window)
    assert _read(clean)[0].meta.notes == ()  # in order: no note


def test_a_second_header_mid_file_reads_the_last_capture(tmp_path: Path) -> None:
    """Rank 1's file holds a first capture cut off in its second window (no exit record),
    then a whole one: the last capture is the rank, with a note; no false error."""
    from tests.helpers.hostile import run_events, write_run

    first = run_events(1)
    cut = [i for i, ev in enumerate(first) if ev["type"] == "coll"][1]
    run = write_run(tmp_path, raw={1: _rank_file([*first[:cut], *run_events(1)])})
    result, kinds = _read(run)
    assert not kinds & FALSE_ERRORS and "run-failed" not in kinds
    assert [len(result.ranks[r].windows) for r in (0, 1)] == [2, 2]
    assert any("rank-00001.jsonl: 2 attempts of the script" in n for n in result.meta.notes)


def test_diff_of_a_live_run_against_traces_warns_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.helpers.hostile import SAMPLE, write_run

    run = write_run(tmp_path)
    for a, b in ((run, SAMPLE), (SAMPLE, run)):
        status, out, err = _report(["diff", str(a), str(b)], capsys)
        assert status == 0, err
        warnings = [line for line in err.splitlines() if "measured differently" in line]
        assert len(warnings) == 1 and warnings[0].startswith("syncscope: warning: the first is")
        assert "live capture" in warnings[0] and "torch.profiler trace set" in warnings[0]
        assert "metric" in out  # the table follows
    status, _, err = _report(["diff", str(run), str(write_run(tmp_path, "b"))], capsys)
    assert status == 0 and "measured differently" not in err  # two live runs: no warning


@pytest.mark.parametrize(
    "argv",
    [
        [f"train{HOSTILE}\n.py"],
        ["--windows", f"2{HOSTILE}", "train.py"],
        ["--then", HOSTILE, "train.py"],
    ],
)
def test_attach_errors_show_escapes_as_text(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """python -m syncscope.launch.attach's one-line errors: a script path, an option's value."""
    from syncscope.launch import attach

    with pytest.raises(SystemExit) as exc:
        attach.main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2
    assert err.startswith("syncscope: error: ") and err.count("\n") == 1
    for raw in RAW:
        assert raw not in err
