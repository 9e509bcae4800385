"""report.json: the stable, versioned contract CI users script against (docs/formats.md).

``report_dict`` is the whole report as one dict; ``write_report_json`` writes the same
document rank by rank, so a job of hundreds of ranks never holds every rank's windows as
JSON-ready dicts (or their text) at once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import IO, Any

import orjson

from syncscope.model import (
    Finding,
    RankRun,
    Run,
    SourceLocation,
    Window,
    compress_ranks,
    figures,
    verdict_of,
)
from syncscope.model.per_model import grad_syncs_by_model

SCHEMA_VERSION = 1


def _site(site: SourceLocation | None) -> dict[str, Any] | None:
    return (
        None if site is None else {"file": site.file, "line": site.line, "function": site.function}
    )


def window_dict(w: Window, rank: RankRun | None = None) -> dict[str, Any]:
    """One window; ``rank``: its rank, which names each model's own count (``models``)
    where the rank steps several DDP models."""
    comm = sum(c.duration_ns for c in w.collectives)
    models = grad_syncs_by_model(rank, w) if rank is not None else {}
    out: dict[str, Any] = {
        "index": w.index,
        "complete": w.complete,
        "micro_batches": len(w.micro_batches),
        "grad_syncs": w.grad_syncs,
        "expected_grad_syncs": 1 if w.micro_batches else 0,
        "grad_sync_micro_batches": w.grad_sync_micro_batches,
        "grad_sync_collectives": len(w.grad_sync_collectives),
        "grad_sync_bytes": w.grad_sync_bytes,
        "collectives": w.op_counts(),
        "collective_bytes": sum(c.bytes for c in w.collectives),
        "collective_time_ns": comm,  # a sum of overlapping durations: can exceed the window
        "comm_in_flight_ns": figures.comm_ns(w),  # union: the communication time figure
        "grad_sync_time_ns": sum(c.duration_ns for c in w.grad_sync_collectives),
        "grad_resets": len([r for r in w.grad_resets if r.after_micro_batches > 0]),
        "fingerprint_match": w.fingerprint_match,
        "peak_memory_bytes": w.peak_memory_bytes,
        "start_ns": w.start_ns,
        "duration_ns": w.duration_ns,
        "steps": w.steps,
        "step_skipped": w.step_skipped,
        "comm_ns": w.comm_ns,
        "exposed_comm_ns": w.exposed_comm_ns,
        "compute_ns": w.compute_ns,
    }
    if models:  # one grad sync expected per model
        out["expected_grad_syncs"] = len(models)
        out["models"] = models
    return out


def _framework(r: RankRun) -> dict[str, Any] | None:
    if not r.framework:
        return None
    out: dict[str, Any] = {"name": r.framework, "version": r.framework_version}
    if r.zero_stage is not None:
        out["zero_stage"] = r.zero_stage
    return out


def rank_dict(r: RankRun) -> dict[str, Any]:
    return {
        "rank": r.rank,
        "local_rank": r.local_rank,
        "host": r.host,
        "device": r.device,
        "finished": r.finished,
        "exit_status": r.exit_status,
        "exit_reason": r.exit_reason,
        "framework": _framework(r),
        "wrappers": [
            {
                "kind": w.kind,
                "label": w.label,
                "params": w.param_count,
                "param_bytes": w.param_bytes,
                **({"static_graph": True} if w.static_graph else {}),
                **({"outer": w.outer} if w.outer else {}),
                **({"fsdp_modules": list(w.fsdp_modules)} if w.fsdp_modules else {}),
            }
            for w in r.wrappers
        ],
        "windows": [window_dict(w, r) for w in r.windows],
    }


def finding_dict(f: Finding) -> dict[str, Any]:
    return {
        "kind": f.kind,
        "severity": f.severity,
        "cause": f.cause,
        "message": f.message,
        "ranks": list(f.ranks),
        "rank_ranges": compress_ranks(f.ranks),
        "windows": list(f.windows),
        "evidence": f.evidence,
        "cost": f.cost,
        "sources": [{"role": role, **(_site(site) or {})} for role, site in f.sites],
        "fix": dataclasses.asdict(f.fix) if f.fix else None,
    }


def report_dict(run: Run, findings: Sequence[Finding]) -> dict[str, Any]:
    return {
        **_head(run),
        "ranks": [rank_dict(r) for r in run.ranks],
        **_tail(findings),
        "figures": figures_dict(run, findings),
    }


def _stat(stat: figures.Stat | None) -> dict[str, float] | None:
    if stat is None:
        return None
    return {"median": stat.median, "low": stat.low, "high": stat.high, "n": stat.n}


def figures_dict(run: Run, findings: Sequence[Finding]) -> dict[str, Any]:
    """The headline figures (syncscope.model.figures; docs/concepts.md defines each)."""
    steady = figures.steady_windows(run)
    projecting = {r for f in findings if "redundant_time_ns_per_window" in f.cost for r in f.ranks}
    p = figures.projection(run, projecting, steady) if projecting else None
    return {
        "steady_windows": list(steady.windows),
        "warmup_windows": [{"index": i, "why": why} for i, why in steady.warmup],
        "window_time_ns": _stat(figures.window_time(run, steady)),
        "warmup_window_time_ns": _stat(figures.warmup_time(run, steady)),
        "comm_in_flight_ns": _stat(figures.comm_time(run, steady)),
        "grad_sync_bytes": _stat(figures.sync_bytes(run, steady)),
        "peak_memory_bytes": figures.peak_memory(run),
        "projection": None
        if p is None
        else {
            "window_ns": _stat(p.window),
            "projected_window_ns": _stat(p.projected),
            "speedup": _stat(p.speedup) if p.shown else None,
            "basis": p.basis,
            "omitted": p.omitted or None,
            "widened": p.widened or None if p.shown else None,
            "floor": p.floor if p.shown else None,
        },
    }


def _head(run: Run) -> dict[str, Any]:
    meta = run.meta
    return {
        "schema_version": SCHEMA_VERSION,
        "source": meta.source,
        "world_size": meta.world_size,
        "command": list(meta.command),
        "script": {"path": meta.script, "sha256": meta.script_sha256} if meta.script else None,
        "created": meta.created,
        "versions": {"syncscope": meta.syncscope_version, "torch": meta.torch_version},
        "launcher": meta.launcher,
        "nodes": list(meta.nodes),
        "notes": list(meta.notes),
        "hung": meta.hung,
        "grad_syncs_per_window": grad_syncs_per_window(run),
    }


def _tail(findings: Sequence[Finding]) -> dict[str, Any]:
    return {
        "findings": [finding_dict(f) for f in findings],
        "verdict": verdict_of(list(findings)),
    }


# Dataclasses and other odd values in evidence are written as their str(), as always.
_OPTIONS = orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS | orjson.OPT_PASSTHROUGH_DATACLASS


def _dump(value: Any, depth: int) -> bytes:
    """``value`` as indented JSON, to sit ``depth`` levels deep in the document."""
    text = orjson.dumps(value, default=str, option=_OPTIONS)
    return (
        text.replace(b"\n", b"\n" + b"  " * depth) if depth else text
    )  # no raw newlines in JSON strings


def _members(out: IO[bytes], values: dict[str, Any], first: bool) -> None:
    for key, value in values.items():
        out.write(b"" if first else b",")
        out.write(b"\n  " + orjson.dumps(key) + b": " + _dump(value, 1))
        first = False


def write_report_json(run: Run, findings: Sequence[Finding], out: IO[bytes]) -> None:
    """The document ``report_dict`` describes, written to ``out`` one rank at a time."""
    out.write(b"{")
    _members(out, _head(run), first=True)
    out.write(b',\n  "ranks": [')
    for i, rank in enumerate(run.ranks):
        out.write(b"\n    " if i == 0 else b",\n    ")
        out.write(_dump(rank_dict(rank), 2))
    out.write(b"\n  ]" if run.ranks else b"]")
    _members(out, {**_tail(findings), "figures": figures_dict(run, findings)}, first=False)
    out.write(b"\n}\n")


def grad_syncs_per_window(run: Run) -> list[int]:
    """Grad-sync rounds per complete window on the lowest rank (the headline number)."""
    if not run.ranks:
        return []
    return [w.grad_syncs for w in run.ranks[0].windows if w.complete]
