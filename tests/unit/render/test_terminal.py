"""The terminal header and the page's header name the framework and its version, as
report.json's ``ranks[].framework`` does."""

from __future__ import annotations

import dataclasses

from rich.console import Console

from syncscope.model import Run
from syncscope.render.html import render_html
from syncscope.render.json_report import report_dict
from syncscope.render.terminal import summary_renderables
from tests.helpers.events import Rank, run_of


def _run(framework: str, version: str, zero: int | None = None) -> Run:
    run = run_of(Rank(0).micro_batch().step().finish(), Rank(1).micro_batch().step().finish())
    ranks = tuple(
        dataclasses.replace(r, framework=framework, framework_version=version, zero_stage=zero)
        for r in run.ranks
    )
    return dataclasses.replace(run, ranks=ranks)


def _terminal_header(run: Run) -> str:
    console = Console(record=True, width=300, color_system=None)
    console.print(summary_renderables(run, [])[0])
    return console.export_text().strip()


def test_terminal_header_names_the_framework_and_its_version() -> None:
    run = _run("transformers", "4.57.1")
    header = _terminal_header(run)
    assert "world size 2  ·  transformers 4.57.1  ·  source live" in header
    framework = report_dict(run, [])["ranks"][0]["framework"]
    assert f"{framework['name']} {framework['version']}" in header  # the same as report.json


def test_deepspeed_header_names_its_zero_stage() -> None:
    assert "deepspeed 0.19.8 (ZeRO 2)" in _terminal_header(_run("deepspeed", "0.19.8", zero=2))


def test_a_plain_torch_loop_names_no_framework() -> None:
    run = run_of(Rank(0).micro_batch().step().finish())
    assert _terminal_header(run).endswith("world size 1  ·  source live")


def test_the_page_header_names_it_too() -> None:
    assert "<span>lightning 2.5.0</span>" in render_html(_run("lightning", "2.5.0"), [])


def test_a_findings_fix_is_shown_as_highlighted_code() -> None:
    # the highlighter is imported where a fix is shown (not by every summary): shown, it
    # still renders the snippet, with colour on a colour terminal
    from syncscope.model import Finding, Fix
    from syncscope.render.terminal import finding_panel

    fix = Fix("ddp-no_sync", "sync once per window", "with model.no_sync():\n    loss.backward()")
    finding = Finding(
        "redundant-sync", "error", "sync-every-microbatch", "m", (0, 1), (1,), fix=fix
    )
    console = Console(record=True, width=120, color_system="truecolor", force_terminal=True)
    console.print(finding_panel(finding))
    assert "with model.no_sync():" in console.export_text(clear=False)
    assert "\x1b[" in console.export_text(styles=True)
