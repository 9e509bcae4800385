"""A saved run, loaded and diagnosed: the one path every re-rendering command takes
(``report``, ``diff``), the same as ``profile``'s own report."""

from __future__ import annotations

from pathlib import Path

from syncscope.errors import BadRunDirectory
from syncscope.model import Finding, Run


def load_and_diagnose(run_dir: Path) -> tuple[Run, list[Finding]]:
    """Read a saved run and diagnose it, with its Flight Recorder dumps where it has any."""
    from syncscope.analysis.findings import findings_for, with_flight_dumps
    from syncscope.fixes.proposals import with_fix_proposals
    from syncscope.load.inputs import load, run_dumps

    if not run_dir.exists():
        raise BadRunDirectory(f"{run_dir}: no such run directory")
    run, _files = load([run_dir], skip_bad=False, progress=False)
    dumps, problem = run_dumps([run_dir])
    run, findings = with_flight_dumps(run, findings_for(run), dumps, str(run_dir), problem)
    return run, with_fix_proposals(run, findings, run_dir)
