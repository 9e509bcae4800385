"""A run's findings: syncscope's diagnoses, exposed communication where a trace measured
it, and what the ranks' Flight Recorder dumps of a hang add."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from syncscope.model import FAILED_KINDS, Finding, Run, severity_rank
from syncscope.model.flight import FlightDump


def findings_for(run: Run, hta: dict[str, Any] | None = None) -> list[Finding]:
    """syncscope's diagnoses plus exposed communication, where a trace measured it."""
    from syncscope.analysis.diagnose import diagnose
    from syncscope.analysis.exposed import exposed_communication

    findings = diagnose(run)
    findings.extend(exposed_communication(run, hta))
    findings.sort(key=lambda f: severity_rank(f.severity))
    return findings


def with_flight_dumps(
    run: Run, findings: list[Finding], dumps: Sequence[FlightDump], label: str, problem: str = ""
) -> tuple[Run, list[Finding]]:
    """The run and its findings with what the ranks' Flight Recorder dumps of a hang say
    (``RUN/flight/``, written by ``syncscope profile``); unchanged where there are none.
    ``problem``: why (some of) the dumps could not be read (a note: the run's own report
    stands, with what the readable dumps say)."""
    if problem:
        meta = dataclasses.replace(run.meta, notes=(*run.meta.notes, problem))
        run = dataclasses.replace(run, meta=meta)
    if not dumps:
        return run, findings
    from syncscope.analysis.flight import analyze_dumps, merge_findings, with_dump_notes

    flight = analyze_dumps(dumps, label)
    findings = merge_findings(findings, flight, live=run.meta.source == "live")
    findings.sort(key=lambda f: (f.kind not in FAILED_KINDS, severity_rank(f.severity)))
    return with_dump_notes(run, flight), findings
