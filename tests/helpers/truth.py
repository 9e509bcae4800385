"""What a tests/scripts/cuda_loops.py run counted itself (``CUDA_LOOPS_TRUTH``), per window,
set beside what syncscope reported: the comparison of the GPU tests (tests/gpu), also run on
CPU ranks by tests/integration/test_cuda_loops_on_cpu.py.

A gradient reduction, in the script's own count, is a reducing collective issued inside a
backward pass (a DDP bucket through the pass-through comm hook, an FSDP2 reduce-scatter, an
HSDP replicate all-reduce, an FSDP1 reduction); a grad-sync round is a micro-batch that had
at least one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

REDUCING = {
    "all_reduce",
    "all_reduce_coalesced",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "reduce_scatter_single",
}
# torch.distributed's function -> the op syncscope counts it as (report.json's `collectives`)
CATEGORY = {
    "all_reduce": "all_reduce",
    "all_reduce_coalesced": "all_reduce",
    "reduce_scatter": "reduce_scatter",
    "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter_single": "reduce_scatter",
    "all_gather": "all_gather",
    "all_gather_into_tensor": "all_gather",
    "all_gather_single": "all_gather",
}
COMPARED = ("all_reduce", "reduce_scatter", "all_gather")


def read_truths(directory: Path, world_size: int) -> list[dict[str, Any]]:
    """Each rank's ``truth-RANK.json``, by rank."""
    return [
        json.loads((directory / f"truth-{rank}.json").read_text()) for rank in range(world_size)
    ]


def truth_windows(truth: dict[str, Any]) -> list[dict[str, Any]]:
    """Per window closed by a real optimizer step, from the script's own count."""
    out = []
    for w, micro_batches in enumerate(truth["micro_batches"]):
        colls = [c for c in truth["collectives"] if c["window"] == w]
        syncs = [c for c in colls if c["phase"] == "backward" and c["op"] in REDUCING]
        window: dict[str, Any] = {
            "micro_batches": micro_batches,
            "grad_syncs": len({c["micro"] for c in syncs}),
            "grad_sync_micro_batches": sorted({c["micro"] for c in syncs}),
            "grad_sync_collectives": len(syncs),
            "grad_sync_bytes": sum(c["bytes"] for c in syncs),
        }
        for op in COMPARED:
            window[op] = sum(1 for c in colls if CATEGORY.get(c["op"]) == op)
        out.append(window)
    return out


def measured_windows(report: dict[str, Any], rank: int) -> list[dict[str, Any]]:
    """The same fields from syncscope's report.json, per complete window of ``rank``."""
    out = []
    for w in report["ranks"][rank]["windows"]:
        if not w["complete"]:
            continue
        window = {
            key: w[key]
            for key in (
                "micro_batches",
                "grad_syncs",
                "grad_sync_micro_batches",
                "grad_sync_collectives",
                "grad_sync_bytes",
            )
        }
        for op in COMPARED:
            window[op] = w["collectives"][op]
        out.append(window)
    return out


def assert_matches_truth(report: dict[str, Any], truths: list[dict[str, Any]]) -> None:
    """syncscope's windows on every rank are the script's own count: micro-batches, grad-sync
    rounds, their positions, collectives and bytes, and the all-reduces, reduce-scatters and
    all-gathers of each window (window 0 may hold more all-gathers: DDP's constructor checks
    the parameter shapes across ranks with one, from C++, before the loop)."""
    assert len(report["ranks"]) == len(truths), report["ranks"]
    for truth in truths:
        rank = truth["rank"]
        expected = truth_windows(truth)
        measured = measured_windows(report, rank)
        assert len(measured) == len(expected), (rank, measured, expected)
        for index, (m, t) in enumerate(zip(measured, expected, strict=True)):
            if index == 0:
                assert m["all_gather"] >= t["all_gather"], (rank, m, t)
                m = {**m, "all_gather": t["all_gather"]}
            assert m == t, (rank, index)
        if truth["buckets"]:  # a DDP model: its reductions are the buckets the hook saw
            assert_buckets_are_the_reductions(truth)
    first = truth_windows(truths[0])
    assert report["grad_syncs_per_window"] == [w["grad_syncs"] for w in first]


def assert_buckets_are_the_reductions(truth: dict[str, Any]) -> None:
    """Under DDP each bucket the comm hook saw is one all-reduce in the same backward: the
    two counts of the script agree (the hook did reduce what DDP handed it)."""

    def at(entries: list[dict[str, Any]]) -> list[tuple[int, int, str]]:
        return sorted((e["window"], e["micro"], e["phase"]) for e in entries)

    reductions = [c for c in truth["collectives"] if c["op"] == "all_reduce"]
    assert at(truth["buckets"]) == at(reductions), truth


def assert_communication_timed(report: dict[str, Any], truths: list[dict[str, Any]]) -> None:
    """Two ranks over gloo exchange data: every window with a grad sync has time with a
    collective in flight. (Asserted only where ranks communicate: NCCL at world size 1
    moves nothing and launches no kernel.)"""
    for truth in truths:
        assert truth["world_size"] == 2 and truth["backend"] == "gloo", truth
        for w in report["ranks"][truth["rank"]]["windows"]:
            if w["complete"] and w["grad_syncs"]:
                assert w["comm_in_flight_ns"] > 0, w
