"""Hints from a profile (``--from RUN_DIR``): which loops to target and which wrapper.

A profile knows what syntax cannot: the wrapper decided in another file, a sync flag
toggled through a helper. Its findings carry source lines (forward, backward, toggle, step)
and a fix style; those steer the rewrite. A script changed since the run is refused.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from syncscope.errors import BadRunDirectory, SyncscopeError
from syncscope.fields import field_int, field_of
from syncscope.fixes.canonical import DdpForm
from syncscope.fixes.codemod import RunFinding, RunHints
from syncscope.fixes.resolve import WrapperKind

TOGGLE_ROLES = frozenset(
    {
        "no_sync",
        "toggle",
        "flag",
        "sync_toggle",
        "require_backward_grad_sync",
        "set_requires_gradient_sync",
        "set_requires_all_reduce",
    }
)
STYLE_HINTS: dict[str, tuple[WrapperKind, DdpForm | None]] = {
    "ddp-no_sync": ("ddp", "no_sync"),
    "ddp-flag": ("ddp", "flag"),
    "accelerate": ("accelerate", None),
    "fsdp2": ("fsdp2", None),
    "hsdp": ("fsdp2", None),
}
CAUSE_HINTS: dict[str, WrapperKind] = {"fsdp-sharded-accumulation": "fsdp2"}


def _read_report(run_dir: Path) -> dict[str, Any]:
    path = run_dir / "report.json"
    if not path.is_file():
        raise BadRunDirectory(
            f"{run_dir}: no report.json (run `syncscope profile --out DIR` first)"
        )
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadRunDirectory(f"{path}: cannot read it ({exc})") from None
    except RecursionError:
        raise BadRunDirectory(f"{path}: not a syncscope report (JSON nested too deeply)") from None
    if not isinstance(report, dict) or report.get("schema_version") != 1:
        raise BadRunDirectory(f"{path}: not a syncscope report of schema version 1")
    return report


def _same_file(a: str, b: Path) -> bool:
    try:
        return Path(a).resolve() == b.resolve()
    except OSError:
        return False


@dataclass
class _RunFacts:
    """What ``fix --from`` takes from the run's findings beside the loop hints: the forwards
    that bypassed DDP, the toggle target that is not an FSDPModule, a static-graph DDP, and
    the run's errors and warnings at their first line in this script."""

    bypass: set[int] = field(default_factory=set)
    target: str = ""
    static_graph: bool = False
    findings: list[RunFinding] = field(default_factory=list)

    def add(self, finding: dict[str, Any], fix: dict[str, Any], here: dict[str, int]) -> None:
        """``here``: role -> line of the finding's first source of that role in this script."""
        cause = str(finding.get("cause", ""))
        if cause == "wrapper-bypassed" and "forward" in here:
            self.bypass.add(here["forward"])
        evidence = finding.get("evidence")
        if isinstance(evidence, dict) and isinstance(evidence.get("helper_target"), str):
            self.target = self.target or evidence["helper_target"]
        self.static_graph = self.static_graph or fix.get("style") == "static-graph"
        if finding.get("severity") in ("error", "warning"):
            summary = str(fix.get("summary") or finding.get("message", ""))
            line = next(iter(here.values()), 0)
            self.findings.append(RunFinding(str(finding.get("kind", "")), cause, line, summary))


def load_hints(run_dir: Path, script: Path, data: bytes) -> RunHints:
    """Hints for ``script`` (whose bytes are ``data``) from ``run_dir/report.json``."""
    return hints_from_report(_read_report(run_dir), run_dir / "report.json", script, data)


def hints_from_report(report: dict[str, Any], where: Path, script: Path, data: bytes) -> RunHints:
    """Hints for ``script`` from a report (as report.json holds it; ``where`` names it in
    errors)."""
    recorded = field_of(report, "script", where, dict, default={})
    digest = hashlib.sha256(data).hexdigest()
    if recorded.get("sha256") != digest:
        raise SyncscopeError(
            f"{script} changed since the run in {where.parent} (sha256 differs): profile it again"
        )
    # the content matched: a renamed or moved copy of the profiled script is that script
    profiled = str(recorded.get("path", "") or script)
    lines: set[int] = set()
    helper_codes: set[str] = set()
    wrapper: WrapperKind | None = None
    form: DdpForm | None = None
    hsdp = False
    text = data.decode("utf-8", errors="replace").splitlines()
    facts = _RunFacts()
    findings = field_of(report, "findings", where, list, default=[])
    for i, finding in enumerate(findings):
        field_of({"f": finding}, "f", where, dict, label=f"findings[{i}]")
        fix = field_of(finding, "fix", where, dict, default={}, label=f"findings[{i}].fix")
        style = STYLE_HINTS.get(str(fix.get("style", "")))
        if style is not None:
            wrapper, form = style[0], style[1] or form
        wrapper = CAUSE_HINTS.get(str(finding.get("cause", "")), wrapper)
        hsdp = (
            hsdp or fix.get("style") == "hsdp" or str(finding.get("cause", "")).startswith("hsdp-")
        )
        sources = field_of(
            finding, "sources", where, list, default=[], label=f"findings[{i}].sources"
        )
        here: dict[str, int] = {}
        for j, source in enumerate(sources):
            label = f"findings[{i}].sources[{j}]"
            field_of({"s": source}, "s", where, dict, label=label)
            line = field_int(source, "line", where, default=0, label=f"{label}.line")
            file = str(source.get("file", ""))
            ours = _same_file(file, script) or _same_file(file, Path(profiled))
            if not ours or not 0 < line <= len(text):
                continue
            lines.add(line)
            here.setdefault(str(source.get("role", "")), line)
            if source.get("role") in TOGGLE_ROLES:
                helper_codes.add(text[line - 1].strip())
        facts.add(finding, fix, here)
    return RunHints(
        wrapper,
        form,
        frozenset(lines),
        frozenset(helper_codes),
        hsdp,
        toggle_target=facts.target,
        bypass_lines=frozenset(facts.bypass),
        findings=tuple(facts.findings),
        static_graph=facts.static_graph,
    )
