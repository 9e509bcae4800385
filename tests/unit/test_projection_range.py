"""The projected speed-up's range on CPU ranks reaches up to the early syncs' whole time in
flight, and says why beside it; on GPU ranks it is the exposed-wait range alone."""

from __future__ import annotations

import dataclasses

from rich.console import Console

from syncscope.model import Run, figures
from syncscope.render.json_report import report_dict
from syncscope.render.terminal import figures_line
from tests.helpers import runs


def _on(device: str, run: Run) -> Run:
    ranks = tuple(dataclasses.replace(r, device=device) for r in run.ranks)
    return dataclasses.replace(run, ranks=ranks)


def test_cpu_ranks_widen_the_range_to_the_syncs_time_in_flight() -> None:
    # GIVEN every micro-batch all-reduces 2 buckets, the first issued 100 us before the second
    run = runs.redundant()
    cpu, gpu = figures.projection(_on("cpu", run)), figures.projection(_on("cuda", run))
    assert cpu.speedup is not None and gpu.speedup is not None
    # THEN on GPU: the exposed-wait figure (1 ms window - 0.42 ms waited per early micro-batch)
    assert gpu.widened == ""
    assert round(gpu.speedup.low, 2) == round(gpu.speedup.high, 2) == 1.43
    # on CPU: the same median and low end, the top at the syncs' whole time in flight (from
    # the first bucket's issue, 0.5 ms into the micro-batch, to its end), and the reason
    assert cpu.speedup.median == gpu.speedup.median
    assert cpu.speedup.low == gpu.speedup.low
    early = 3 * 500_000
    window = 4 * 1_000_000 + 200_000
    assert round(cpu.speedup.high, 3) == round(window / (window - early), 3)
    assert cpu.widened.startswith("range widened: the ranks compute on CPU")
    assert "(range widened: the ranks compute on CPU" in cpu.text()


def test_the_reason_is_printed_beside_the_range_and_kept_in_report_json() -> None:
    run = runs.redundant()
    findings = [runs.finding()]
    console = Console(record=True, width=400, color_system=None)
    console.print(figures_line(run, findings))
    line = next(ln for ln in console.export_text().splitlines() if "projected" in ln)
    assert "1.43-1.56x (median 1.43x)" in line
    assert "range widened: the ranks compute on CPU" in line
    projection = report_dict(run, findings)["figures"]["projection"]
    assert projection["widened"].startswith("range widened: the ranks compute on CPU")
    gpu = report_dict(_on("cuda", run), findings)["figures"]["projection"]
    assert gpu["widened"] is None


def test_syncs_waited_on_whole_are_not_widened() -> None:
    # one bucket per micro-batch: its whole flight is waited on, nothing overlaps to contend
    run = runs.make_run(sync_at=runs.every, buckets=1)
    p = figures.projection(run)
    assert p.shown and p.widened == ""


def test_fsdp_on_cpu_says_the_range_is_a_floor() -> None:
    # GIVEN FSDP ranks on CPU (their reduce-scatters removed also speed up the all-gathers)
    run = runs.make_run(sync_at=runs.every, buckets=1)
    ranks = tuple(
        dataclasses.replace(
            r, wrappers=tuple(dataclasses.replace(w, kind="fsdp") for w in r.wrappers)
        )
        for r in run.ranks
    )
    fsdp = dataclasses.replace(run, ranks=ranks)
    p = figures.projection(fsdp)
    assert p.shown and "read the range as a floor" in p.text()
    assert "range widened" not in p.text()  # nothing overlapped: the range itself is not wider
    assert figures.projection(_on("cuda", fsdp)).widened == ""
