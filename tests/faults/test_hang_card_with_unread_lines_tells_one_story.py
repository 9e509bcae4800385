"""A hang card tells one story when lines of a rank's file could not be read (``NaN`` among
a record's numbers), and no card shows a Python list or dict.

- rank 0 of a hung 3-rank job waits in an ``all_reduce`` (its main thread says so) while its
  collective records hold ``NaN`` bytes: the card said ``last_completed: none`` and
  ``blocked_in: no collective in flight`` beside ``waiting in all_reduce``; it now names the
  all-reduce its main thread waits in and says its records could not be read;
- the terminal printed evidence lists and mappings as Python does (``culprit ranks [0]``,
  ``{'last_completed': ...}``): ranks are ranges, mappings ``label value`` pairs;
- a ``meta.json`` whose ``hang.main_threads`` holds a list (``[0, 0, 0]``) was printed in the
  hang's headline (``rank 0 [0, 0, 0]``): one line, exit 2;
- a wait "for" ranks ``[0, 0, 0]`` named the ranks ``[0, 0, 0]`` in report.json."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import orjson
import pytest

from syncscope.cli import main
from syncscope.commands.saved import load_and_diagnose
from syncscope.model import Finding
from syncscope.render.terminal import finding_panel
from tests.helpers import hostile as h

T0 = 1_700_000_000_000_000_000
THREADS = {
    "0": "waiting in all_reduce at train.py:8",
    "1": "waiting in barrier at train.py:9",
    "2": "waiting in barrier at train.py:9",
}


def _rank(rank: int) -> list[dict[str, Any]]:
    """Three all-reduces done, then rank 0 issues a fourth while 1 and 2 wait in a barrier."""
    site = {"file": "train.py", "line": 6, "function": "<module>"}
    ev: list[dict[str, Any]] = [
        {"type": "header", "format": "syncscope-events", "version": 2, "rank": rank,
         "local_rank": rank, "world_size": 3, "host": "h", "pid": 100 + rank, "t": T0,
         "target": "train.py", "argv": []},
        {"type": "dist", "t": T0 + 1, "backend": "gloo", "world_size": 3, "rank": rank},
        {"type": "pg", "t": T0 + 2, "pg": "0", "group": [0, 1, 2]},
    ]  # fmt: skip
    last = ("all_reduce", 8) if rank == 0 else ("barrier", 9)
    for seq, (op, line) in enumerate([("all_reduce", 6)] * 3 + [last]):
        t = T0 + 1000 * (seq + 1)
        ev.append({"type": "coll", "seq": seq, "t": t, "t_end": t + 10, "op": op, "bytes": 12,
                   "pg": "0", "phase": "other", "issuer": "user",
                   "site": {**site, "line": line}})  # fmt: skip
        if seq < 3:
            ev.append({"type": "done", "seq": seq, "t": t + 20})
    return ev


def _file(rank: int, nan: bool) -> bytes:
    lines = [orjson.dumps(e) for e in _rank(rank)]
    if nan:  # what a writer that let a NaN through would leave
        lines = [line.replace(b'"bytes":12', b'"bytes":NaN') for line in lines]
    return b"".join(line + b"\n" for line in lines)


def _hung_run(tmp_path: Path, threads: Any = THREADS) -> Path:
    meta = h.meta(
        3, hung=True, hang_timeout_s=4.0, hang={"start_up": False, "main_threads": threads}
    )
    raw = {r: _file(r, nan=r == 0) for r in range(3)}
    return h.write_run(tmp_path, meta_data=meta, ranks=3, raw=raw)


def _card(run: Path) -> Finding:
    _, findings = load_and_diagnose(run)
    (card,) = [f for f in findings if f.kind == "hang"]
    return card


def _text(found: Finding) -> str:
    from rich.console import Console

    out = io.StringIO()
    Console(width=400, file=out).print(finding_panel(found))
    return out.getvalue()


def test_a_rank_whose_records_were_unread_is_blocked_where_its_main_thread_waits(
    tmp_path: Path,
) -> None:
    card = _card(_hung_run(tmp_path))
    told = card.evidence["per_rank"]["0"]  # type: ignore[index]
    assert told["blocked_in"].startswith("all_reduce at train.py:8 (its main thread; ")
    assert "no collective in flight" not in json.dumps(card.evidence)
    assert told["last_completed"] == "not known: 4 line(s) of its file could not be read"
    # the other ranks' records read as ever: one numbering, from 1
    assert card.evidence["per_rank"]["1"]["blocked_in"].startswith("barrier #4 (12 bytes)")  # type: ignore[index]


def test_a_hang_card_shows_no_python_list_or_dict(tmp_path: Path) -> None:
    card = _card(_hung_run(tmp_path))
    text = _text(card)
    assert "{'" not in text and "['" not in text, text
    assert "0: last completed not known: " in text
    assert "; blocked in all_reduce at train.py:8" in text


def test_evidence_ranks_read_as_ranges_in_the_terminal() -> None:
    found = Finding(
        kind="hang", severity="error", cause="no-progress", message="m", ranks=(0, 1, 2),
        windows=(), evidence={"culprit_ranks": [0, 1, 2, 5], "sizes": [3, 4]}, cost={},
    )  # fmt: skip
    text = _text(found)
    assert "culprit ranks 0-2,5" in text and "sizes 3, 4" in text, text
    assert "[" not in text.replace("[0", "")


@pytest.mark.parametrize(
    "threads", [{"0": [0, 0, 0], "1": "idle at train.py:9"}, {"zero": "idle at train.py:9"}]
)
def test_main_threads_that_are_not_words_for_ranks_are_one_line(
    tmp_path: Path, threads: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _hung_run(tmp_path, threads)
    assert main(["report", "-f", "text", str(run)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("syncscope: error: ") and "hang.main_threads" in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_a_wait_for_one_rank_named_thrice_names_it_once(tmp_path: Path) -> None:
    from syncscope.analysis.hangs import waited_for_rank
    from syncscope.load.runs import load_run

    waits = [{"rank": 1, "for": [0, 0, 0], "seconds": 12.0, "waiting": "waiting in barrier"}]
    run = h.write_run(tmp_path, meta_data=h.meta(waits=waits))
    (wait,) = waited_for_rank(load_run(run))
    assert wait.ranks == (0,)
    assert "for rank(s) 0 (" in wait.message


def test_a_heartbeat_with_lists_for_words_or_ids_says_nothing_of_them(tmp_path: Path) -> None:
    """Was: ``waiting in [0, 0, 0] at [0, 0, 0]`` in the hang's headline; a ``pid`` that is
    no integer stopped the monitor with a traceback."""
    from syncscope.launch.watch import Beats

    (tmp_path / "beats").mkdir()
    garbled = {"pid": 1000, "rank": 0, "seq": 1, "state": "waiting", "pg": True}
    garbled.update(call=[0, 0, 0], where=[0, 0, 0])
    beats = {0: garbled, 1: {"pid": "x", "rank": 1, "seq": 1, "state": "running"}}
    for rank, beat in beats.items():
        (tmp_path / "beats" / f"rank-{rank:05d}.json").write_bytes(orjson.dumps(beat))
    views = Beats(tmp_path).read({0: (1000, "elsewhere"), 1: (1001, "elsewhere")}, now=0.0)
    assert views[0].text() == "waiting in torch.distributed"
    assert views[1].state == ""  # no beat: what /proc says (nothing, on another host)
