"""A hang's card tells one story: one numbering, the mismatch behind it on the card, the
rank that stopped the job named, advice that fits; report.html shows the terminal's paths.

- a collective mismatch that hangs the job is the hang's cause: one card (no separate
  collective-mismatch error), its collectives numbered from 1 everywhere (#N as torch's
  Flight Recorder numbers them);
- a rank stuck outside communication (asleep) while the other waits in a collective: the
  card names it, ``blocked_in`` says "no collective in flight" (not "exited" beside its
  main thread "idle at ..."), no count mismatch is invented, and the advice is to find
  what it waits on (no ``break``);
- a rank that ended its script early (exit status 0) while the other waits in a collective
  (which gloo then ends with "Connection closed by peer"): the run-failed card names the rank
  that left, not the one that waited;
- a script failing at import: run-failed only, not also no-process-group."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.hostile import profile_script


def _findings(out: Path) -> list[dict[str, Any]]:
    report: dict[str, Any] = json.loads((out / "report.json").read_text())
    findings: list[dict[str, Any]] = report["findings"]
    return findings


SKIPS_ALL_REDUCE = textwrap.dedent(
    """
    import torch, torch.distributed as dist

    dist.init_process_group("gloo")
    t = torch.ones(3)
    dist.all_reduce(t)
    if dist.get_rank() == 0:
        dist.all_reduce(t)  # rank 1 skips it and waits in the barrier: neither returns
    dist.barrier()
    """
)


@pytest.mark.slow
def test_a_mismatch_that_hangs_is_one_card_with_one_numbering(tmp_path: Path) -> None:
    done, out = profile_script(tmp_path, "train.py", SKIPS_ALL_REDUCE, "--hang-timeout", "4")
    assert done.returncode == 1, done.stderr[-3000:]
    findings = _findings(out)
    kinds = [f["kind"] for f in findings]
    assert "collective-mismatch" not in kinds and kinds.count("hang") == 1, kinds
    (card,) = [f for f in findings if f["kind"] == "hang"]
    text = json.dumps(card)
    # the second collective of the group is #2 wherever the card counts it
    assert "at collective #2:" in card["evidence"]["collective_mismatch"]
    assert "all_reduce #2 (12 bytes)" in card["evidence"]["per_rank"]["0"]["blocked_in"]
    assert "barrier #2 (0 bytes)" in card["evidence"]["per_rank"]["1"]["blocked_in"]
    assert "#1 (" not in text.replace("all_reduce #1 (12", "")  # nothing else says #1
    assert "position" not in text
    assert {s["line"] for s in card["sources"]} == {8, 9}


SLEEPS = textwrap.dedent(
    """
    import time
    import torch, torch.distributed as dist

    dist.init_process_group("gloo")
    t = torch.ones(3)
    dist.all_reduce(t)
    if dist.get_rank() == 1:
        time.sleep(600)  # stuck outside communication
    dist.all_reduce(t)
    """
)


@pytest.mark.slow
def test_a_rank_stuck_outside_communication_is_named_with_advice_that_fits(
    tmp_path: Path,
) -> None:
    done, out = profile_script(tmp_path, "train.py", SLEEPS, "--hang-timeout", "4")
    assert done.returncode == 1, done.stderr[-3000:]
    findings = _findings(out)
    kinds = [f["kind"] for f in findings]
    assert "collective-mismatch" not in kinds, kinds  # rank 1 never came: no mismatch
    (card,) = [f for f in findings if f["kind"] == "hang"]
    assert card["ranks"] == [1]
    assert card["evidence"]["per_rank"]["1"]["blocked_in"] == "no collective in flight"
    assert card["evidence"]["main_threads"]["1"].startswith("idle at ")
    assert card["message"].startswith(
        "no progress for 4 s: syncscope stopped the job: rank 1 idle at "
    )
    assert "train.py:9" in card["message"] and "rank 0 waiting in all_reduce at " in card["message"]
    assert card["fix"]["style"] == "stuck-rank" and "break" not in card["fix"]["snippet"]


ENDS_EARLY = textwrap.dedent(
    """
    import torch, torch.distributed as dist

    dist.init_process_group("gloo")
    t = torch.ones(3)
    dist.all_reduce(t)
    if dist.get_rank() == 0:
        dist.all_reduce(t)  # rank 1 has left: rank 0 waits for it
    """
)


@pytest.mark.slow
def test_a_rank_that_ended_early_is_the_one_named(tmp_path: Path) -> None:
    done, out = profile_script(tmp_path, "train.py", ENDS_EARLY, "--hang-timeout", "30")
    assert done.returncode == 1, done.stderr[-3000:]
    # gloo ends rank 0's all_reduce with "Connection closed by peer": the run failed there,
    # and the card names rank 1, which had left, as its cause
    (failed,) = [f for f in _findings(out) if f["kind"] == "run-failed"]
    assert failed["cause"] == "left-early" and failed["ranks"] == [1], failed
    assert failed["evidence"]["left_early"] == [1]
    assert failed["evidence"]["first_failed_rank"] == 0
    assert (
        "rank(s) 1 had ended the script (exit status 0) while it still waited"
        in (failed["message"])
    )


def test_report_html_shows_source_paths_as_the_terminal_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from syncscope.render.html import render_html
    from syncscope.render.terminal import site_text
    from tests.helpers.runs import finding, make_run

    monkeypatch.chdir(tmp_path)
    script = str(tmp_path / "src" / "train.py")
    found = finding(script=script)
    page = render_html(make_run(), [found])
    (_, site) = found.sites[0]
    assert site_text(site) == "src/train.py:57"
    assert "<code>src/train.py:57</code>" in page
    assert str(tmp_path) not in page.split('class="sources"', 1)[1].split("</ul>", 1)[0]


@pytest.mark.slow
def test_a_script_failing_at_import_is_a_failed_run_only(tmp_path: Path) -> None:
    source = "import torch\nraise ImportError('no module named dataset_utils')\n"
    done, out = profile_script(tmp_path, "train.py", source, "--hang-timeout", "30")
    assert done.returncode == 1, done.stderr[-3000:]
    kinds = [f["kind"] for f in _findings(out)]
    assert kinds == ["run-failed"], kinds  # not also "no process group: independent copies"
