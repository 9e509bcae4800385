"""The profile points to the fix: a loop finding in the profiled script carries what
``syncscope fix`` does about it (the command and the script's own diff, or the form to write
where fix cannot rewrite it), and every output shows it."""

from __future__ import annotations

import dataclasses
import hashlib
import shutil
from pathlib import Path

import pytest

from syncscope.fixes.proposals import with_fix_proposals
from syncscope.model import Finding, Fix, Run, RunMeta, SourceLocation
from syncscope.render.html import render_html
from syncscope.render.json_report import finding_dict
from syncscope.render.terminal import render_text

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "fix"
ADVICE = Fix("ddp-no_sync", "Put forward and backward inside no_sync()", "for micro, batch ...")


def _run(script: Path, *args: str, world: int = 2) -> Run:
    digest = hashlib.sha256(script.read_bytes()).hexdigest()
    meta = RunMeta(command=(str(script), *args), script=str(script), script_sha256=digest)
    return Run(meta=dataclasses.replace(meta, world_size=world), ranks=())


def _finding(script: Path, *lines: int, kind: str = "redundant-sync") -> Finding:
    sites = tuple((f"role{n}", SourceLocation(str(script), n)) for n in lines)
    cause = "no_sync-backward-only"
    return Finding(kind, "warning", cause, "m", (0, 1), (0,), sites=sites, fix=ADVICE)


@pytest.fixture
def script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "train.py"
    shutil.copy(FIXTURES / "ifelse_forward_before.in.py", path)
    return path


def test_a_loop_fix_rewrites_gets_the_command_and_the_diff(script: Path) -> None:
    # GIVEN a redundant-sync finding at the if/else loop of the profiled script
    run = _run(script, "--steps", "6")
    (finding,) = with_fix_proposals(run, [_finding(script, 19, 21, 25)], None)
    # THEN it carries the exact command and the script's own diff, in the finding's style
    assert finding.fix is not None
    assert finding.fix.command == "syncscope fix --apply --verify train.py --steps 6"
    assert finding.fix.style == "ddp-no_sync"
    assert finding.fix.diff.startswith("--- a/train.py\n+++ b/train.py\n")
    assert "+    with (model.no_sync() if not is_last else contextlib.nullcontext()):" in (
        finding.fix.diff
    )
    assert finding.fix.snippet == finding.fix.diff
    assert "--apply --verify train.py" in finding.fix.summary


def test_the_command_names_the_ranks_when_not_two(script: Path) -> None:
    run = _run(script, world=4)
    (finding,) = with_fix_proposals(run, [_finding(script, 19)], None)
    assert finding.fix is not None
    assert finding.fix.command == "syncscope fix --apply --verify --nproc-per-node 4 train.py"


def test_a_loop_fix_cannot_rewrite_gets_the_form_in_the_scripts_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "train.py"
    shutil.copy(FIXTURES / "helper_no_toggle.in.py", path)
    (finding,) = with_fix_proposals(_run(path), [_finding(path, 11, 12, 18)], None)
    assert finding.fix is not None and not finding.fix.command
    assert "train_step()" in finding.fix.summary
    assert "        train_step(batch)" in finding.fix.snippet


def test_a_script_changed_since_the_run_keeps_the_advice(script: Path) -> None:
    run = _run(script)
    script.write_text(script.read_text() + "\n# edited\n")
    finding = _finding(script, 19)
    assert with_fix_proposals(run, [finding], None) == [finding]


def test_findings_elsewhere_and_other_kinds_keep_their_advice(script: Path) -> None:
    other = _finding(script, 19, kind="collective-mismatch")
    outside = _finding(script, 3)  # a line of the imports: no loop there
    assert with_fix_proposals(_run(script), [other, outside], None) == [other, outside]


def test_terminal_json_and_html_show_the_same_fix(script: Path) -> None:
    run = _run(script)
    (finding,) = with_fix_proposals(run, [_finding(script, 21)], None)
    assert finding.fix is not None
    assert finding_dict(finding)["fix"]["command"] == finding.fix.command
    text = render_text(run, [finding], width=200)
    assert finding.fix.command in text
    assert "+        loss = criterion(model(x), y) / accum" in text
    page = render_html(run, [finding])
    assert "syncscope fix --apply --verify train.py" in page
