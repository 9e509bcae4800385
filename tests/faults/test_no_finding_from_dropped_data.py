"""No finding from data syncscope dropped, and collectives grouped by their process group.

- A line of a rank file that is no event (not JSON; ``NaN`` among its numbers, which JSON
  has no word for) was dropped with no note: one NaN in a grad-sync line gave a false
  collective-mismatch, NaN ``bytes`` on rank 0's collectives gave grad syncs [0, 0] and
  missing-sync and collective-mismatch errors. Now every dropped line is counted and named
  in a note, and no finding is drawn from a window that held one.
- A background thread all-reducing on ``new_group([0, 1])`` of a 2-rank job interleaves
  differently with DDP's all-reduces on each rank: grouped by member list, the two groups
  were one stream and a false "precursor of a hang". Grouped by process group identity.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from syncscope.commands.saved import load_and_diagnose
from tests.helpers.hostile import run_events, write_run

FALSE_ERRORS = {"collective-mismatch", "rank-divergence", "missing-sync"}


def _raw(events: list[dict[str, Any]], nan_in: set[int] = frozenset()) -> bytes:  # type: ignore[assignment]
    """Rank events as written, with ``NaN`` in place of ``bytes`` in the ``coll`` records of
    the given ``seq``s (what a writer that let a NaN through would leave)."""
    lines = []
    for ev in events:
        line = orjson.dumps(ev)
        if ev.get("type") == "coll" and ev["seq"] in nan_in:
            line = line.replace(b'"bytes":64', b'"bytes":NaN')
        lines.append(line + b"\n")
    return b"".join(lines)


def test_a_nan_in_one_grad_sync_line_is_noted_and_draws_no_false_error(tmp_path: Path) -> None:
    run = write_run(tmp_path, raw={1: _raw(run_events(1), nan_in={1})})
    result, findings = load_and_diagnose(run)
    assert not {f.kind for f in findings} & FALSE_ERRORS, [(f.kind, f.cause) for f in findings]
    (note,) = [n for n in result.meta.notes if "could not be read" in n]
    assert "rank-00001.jsonl: 1 line(s) could not be read and were dropped" in note
    assert "NaN" in note and "no finding is drawn" in note
    assert [w.records_dropped for w in result.ranks[1].windows] == [1, 0]


def test_nan_bytes_on_every_collective_of_rank_0_draw_no_false_errors(tmp_path: Path) -> None:
    run = write_run(tmp_path, raw={0: _raw(run_events(0), nan_in={1, 2})})
    result, findings = load_and_diagnose(run)
    assert not {f.kind for f in findings} & FALSE_ERRORS, [(f.kind, f.cause) for f in findings]
    assert any("rank-00000.jsonl: 2 line(s) could not be read" in n for n in result.meta.notes)


def test_a_line_that_is_no_json_is_counted_not_silently_lost(tmp_path: Path) -> None:
    events = run_events(0)
    raw = _raw(events[:5]) + b"{not json\n" + b"[1, 2]\n" + _raw(events[5:])
    run = write_run(tmp_path, raw={0: raw})
    result, _ = load_and_diagnose(run)
    (note,) = [n for n in result.meta.notes if "could not be read" in n]
    assert "2 line(s)" in note and "line 6, 7" in note


def test_a_torn_last_line_is_what_a_kill_leaves_and_is_not_counted(tmp_path: Path) -> None:
    raw = _raw(run_events(0)) + b'{"type": "fwd", "t": 12'  # no newline: cut mid-write
    run = write_run(tmp_path, raw={0: raw})
    result, _ = load_and_diagnose(run)
    assert not [n for n in result.meta.notes if "could not be read" in n]


def _with_side_group(rank: int, order: str) -> list[dict[str, Any]]:
    """Rank events with a second process group ("1") of the same members as the default
    ("0"): a background thread's all-reduce on it, written before (``order`` "before") or
    after ("after") DDP's all-reduce of each window."""
    out: list[dict[str, Any]] = [{"type": "pg", "pg": "0", "group": [0, 1], "t": 1}]
    out.append({"type": "pg", "pg": "1", "group": [0, 1], "t": 1})
    seq = 100
    for ev in run_events(rank):
        if ev["type"] in ("coll", "done"):
            ev = {k: v for k, v in ev.items() if k != "group"}
            ev["pg"] = "0" if ev["type"] == "coll" else ev.get("pg")
            if ev["pg"] is None:
                del ev["pg"]
        side = {
            "type": "coll",
            "seq": seq,
            "op": "all_reduce",
            "bytes": 4,
            "issuer": "user",
            "phase": "backward",
            "pg": "1",
            "t": ev.get("t", 0),
            "t_end": ev.get("t", 0),
        }
        if ev["type"] == "coll" and order == "before":
            out += [side, {"type": "done", "seq": seq, "t": ev["t"]}, ev]
            seq += 1
        elif ev["type"] == "done" and order == "after":
            out += [ev, side, {"type": "done", "seq": seq, "t": ev["t"]}]
            seq += 1
        else:
            out.append(ev)
    return _renumbered(out)


def _renumbered(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``seq`` is the order of issue on a rank: collectives numbered as written."""
    new: dict[int, int] = {}
    for ev in events:
        if ev["type"] == "coll":
            new[ev["seq"]] = len(new)
            ev["seq"] = new[ev["seq"]]
        elif ev["type"] == "done":
            ev["seq"] = new[ev["seq"]]
    return events


def test_two_groups_of_the_same_members_are_two_streams(tmp_path: Path) -> None:
    run = write_run(tmp_path, events=lambda r: _with_side_group(r, "before" if r == 0 else "after"))
    result, findings = load_and_diagnose(run)
    assert not {f.kind for f in findings} & FALSE_ERRORS, [(f.kind, f.message) for f in findings]
    groups = {c.group_name for w in result.ranks[0].windows for c in w.collectives}
    assert groups == {"0", "1"}


def test_a_real_mismatch_on_the_side_group_names_that_group(tmp_path: Path) -> None:
    def events(rank: int) -> list[dict[str, Any]]:
        evs = _with_side_group(rank, "before")
        if rank == 1:  # rank 1's side all-reduces carry other sizes: a real mismatch
            for ev in evs:
                if ev.get("pg") == "1" and ev["type"] == "coll":
                    ev["bytes"] = 8
        return evs

    _, findings = load_and_diagnose(write_run(tmp_path, events=events))
    (m,) = [f for f in findings if f.kind == "collective-mismatch"]
    assert m.evidence["group"] == "0-1 (process group 1)"
