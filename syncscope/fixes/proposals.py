"""What ``syncscope fix`` does about each finding, shown where the finding is shown.

After a run is diagnosed, the profiled script (when it is still the file that ran: same
sha256) goes through ``fix``: a finding whose loop ``fix`` rewrites gets the exact command
(``syncscope fix --apply --verify SCRIPT ARGS``, with ``--from RUN`` where the rewrite needs
the run's facts) and the user's own diff; a finding whose loop ``fix`` cannot rewrite gets
the form to write in the script's own names, with the reason. Other findings keep their
advice. The terminal card, report.json and report.html all show the same ``Fix``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from syncscope.errors import SyncscopeError
from syncscope.model import Finding, Fix, Run

if TYPE_CHECKING:  # libcst is imported only when a script is there to read
    from syncscope.fixes.codemod import FixResult, Problem

# findings about a loop's syncs: the ones a loop rewrite can answer
LOOP_KINDS = frozenset(
    {
        "redundant-sync",
        "missing-sync",
        "grad-reset-mid-window",
        "irregular-window",
        "unsharded-grad-memory",
        "rank-divergence",
    }
)


def with_fix_proposals(
    run: Run, findings: Sequence[Finding], run_dir: Path | None
) -> list[Finding]:
    """``findings``, each loop finding in the profiled script with ``fix``'s own answer."""
    script = _script(run)
    if script is None or not any(_lines_in(f, script) for f in findings if _loopy(f)):
        return list(findings)
    path, data = script
    try:
        return _propose(run, list(findings), run_dir, path, data)
    except (SyncscopeError, RecursionError, MemoryError):
        return list(findings)  # a script fix cannot read: the findings keep their advice


def _loopy(finding: Finding) -> bool:
    return finding.kind in LOOP_KINDS and finding.severity in ("error", "warning", "info")


# a report does not wait on a rewrite of a huge file (``syncscope fix`` itself reads up to
# 64 MiB): about a second of libcst at this size
MAX_SCRIPT_BYTES = 1 << 20


def _script(run: Run) -> tuple[Path, bytes] | None:
    """The profiled script and its bytes, when it is still what ran."""
    meta = run.meta
    if not meta.script or not meta.script_sha256:
        return None
    path = Path(meta.script)
    try:
        with path.open("rb") as stream:
            data = stream.read(MAX_SCRIPT_BYTES + 1)
    except OSError:
        return None
    if len(data) > MAX_SCRIPT_BYTES or b"backward" not in data:
        return None
    if hashlib.sha256(data).hexdigest() != meta.script_sha256:
        return None  # edited since the run: the run's lines may not be its lines
    return path, data


def _lines_in(finding: Finding, script: tuple[Path, bytes]) -> set[int]:
    path = script[0]
    lines = set()
    for _role, site in finding.sites:
        try:
            same = Path(site.file).resolve() == path.resolve()
        except (OSError, ValueError):
            same = False
        if same:
            lines.add(site.line)
    return lines


def _propose(
    run: Run, findings: list[Finding], run_dir: Path | None, path: Path, data: bytes
) -> list[Finding]:
    from syncscope.fixes.codemod import fix_source
    from syncscope.fixes.driver import _decode

    source, _encoding = _decode(path, data)
    plain = fix_source(source, path=str(path))
    hinted: FixResult | None = None
    out = []
    for finding in findings:
        lines = _lines_in(finding, (path, data)) if _loopy(finding) else set()
        if not lines:
            out.append(finding)
            continue
        # the plain command where it rewrites the loop, ``--from RUN`` where only the run's
        # facts let it; the form to write only where neither rewrites it
        proposal = _rewrite(finding, lines, plain, run, path, None)
        if proposal is None and run_dir is not None:
            if hinted is None:
                hinted = _with_run(run, findings, run_dir, path, data, source)
            proposal = _rewrite(finding, lines, hinted, run, path, run_dir)
        proposal = proposal or _form(finding, lines, hinted or plain)
        out.append(dataclasses.replace(finding, fix=proposal) if proposal else finding)
    return out


def _with_run(
    run: Run, findings: list[Finding], run_dir: Path, path: Path, data: bytes, source: str
) -> FixResult:
    """``fix --from RUN`` on the script: the run's findings as report.json holds them."""
    from syncscope.fixes.codemod import FixOptions
    from syncscope.fixes.run_edits import fix_with_run
    from syncscope.fixes.run_hints import hints_from_report
    from syncscope.render.json_report import report_dict

    report = report_dict(run, findings)
    hints = hints_from_report(report, run_dir / "report.json", path, data)
    return fix_with_run(source, FixOptions("auto", hints), str(path))


def _ours(result: FixResult, lines: set[int]) -> list[Problem]:
    """The problems of ``result`` whose loop holds one of ``lines``."""
    return [p for p in result.problems if any(p.span[0] <= n <= p.span[1] for n in lines)]


def _style(finding: Finding) -> str:
    return finding.fix.style if finding.fix is not None else "loop"


def _rewrite(
    finding: Finding,
    lines: set[int],
    result: FixResult,
    run: Run,
    path: Path,
    run_dir: Path | None,
) -> Fix | None:
    """The command and the diff, where ``result`` rewrites the finding's loop."""
    fixed = [p for p in _ours(result, lines) if p.fixed]
    if not fixed or not result.changed:
        return None
    command = _command(run, path, run_dir)
    codes = ", ".join(sorted({p.code for p in fixed}))
    diff = result.diff(_shown(path))
    summary = (
        f"syncscope fix rewrites this loop ({codes}) and proves it with a re-profile: {command}"
    )
    return Fix(_style(finding), summary, diff, command=command, diff=diff)


def _form(finding: Finding, lines: set[int], result: FixResult) -> Fix | None:
    """The form to write, in the script's own names, where fix does not rewrite the loop."""
    unfixed = [p for p in _ours(result, lines) if not p.fixed and p.snippet]
    if not unfixed:
        return None
    summary = f"syncscope fix does not rewrite this loop: {unfixed[0].suggestion}"
    return Fix(_style(finding), summary, unfixed[0].snippet)


def _shown(path: Path) -> str:
    """The script as the user names it from here: relative inside the working directory."""
    try:
        return os.path.relpath(path) if path.resolve().is_relative_to(Path.cwd()) else str(path)
    except (OSError, ValueError):
        return str(path)


def _command(run: Run, path: Path, run_dir: Path | None) -> str:
    words = ["syncscope", "fix"]
    if run_dir is not None:
        words += ["--from", _shown(run_dir)]
    words += ["--apply", "--verify"]
    if run.world_size != 2:
        words += ["--nproc-per-node", str(run.world_size)]
    words += [_shown(path), *run.meta.command[1:]]
    return shlex.join(words)
