"""Seven loop shapes from bugs reported in public projects, each our own minimal
CPU/gloo loop (tests/scripts/bugs/, the public source named in each docstring), profiled by
``syncscope profile`` with the scripts' own truth beside it.

Each script counts, without syncscope (tests/helpers/truth.py), every gradient
reduction the stack issued per optimizer step (wrapped ``torch.distributed`` functions, a
pass-through DDP comm hook, torch.profiler's functional all-reduces for a compiled graph)
and compares parameters across replicas after each step; with ``BUG_TRUTH_DIR`` set each
rank writes it as ``truth-rank{R}.json``. The tests check:

1. the truth itself: what really happens on this torch (each script's docstring says what
   it expects);
2. counts: syncscope's grad syncs (rounds) per window equal the truth's rounds per window,
   on every rank (a grad sync is any reduction of the gradients, wherever
   it is issued: the pipelining shape counts 2 per window and is never a missing-sync);
3. replicas: rank-divergence is reported exactly when the truth saw replicas differ;
4. causes, in their own section below;
5. every code snippet a finding shows parses.

A truth round is one (micro-batch, phase) in which at least one gradient reduction ran (DDP's
buckets in the backward and a hand all-reduce after it, on the same micro-batch, are two).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, ProfiledRun, profile

pytestmark = pytest.mark.slow

BUGS = ROOT / "tests" / "scripts" / "bugs"
WINDOWS = 3


@dataclass(frozen=True)
class Shape:
    script: str
    nproc: int = 2
    # what really happens (the truth on torch 2.13 CPU/gloo, 3 windows): rounds per window,
    # the micro-batches they ran after, parameters equal across replicas after each step
    rounds: int = 1
    reduced_at: tuple[int, ...] = (3,)
    replicas_equal: bool = True
    crashes: bool = False
    # whether the truth's micro-batches are syncscope's (False for pipelining: a truth
    # micro-batch is one schedule.step() call, syncscope cuts one per backward inside it)
    same_micro_batches: bool = True


SHAPES = {
    s.script: s
    for s in (
        Shape("module_forward", rounds=0, reduced_at=(), replicas_equal=False),
        Shape("static_graph_no_sync", crashes=True),
        Shape("static_graph_workaround", rounds=2, reduced_at=(0, 3)),
        Shape("fsdp2_outer_toggle", rounds=4, reduced_at=(0, 1, 2, 3)),
        Shape("fsdp2_recurse_false", rounds=4, reduced_at=(0, 1, 2, 3)),
        Shape(
            "pipelining_two_steps", nproc=4, rounds=2, reduced_at=(0, 1), same_micro_batches=False
        ),
        Shape("moe_subgroup", rounds=2),
        Shape("hand_bucketed_once"),
        Shape("compiled_autograd_python_reducer"),
    )
}
RUNS = [name for name, shape in SHAPES.items() if not shape.crashes]


@dataclass
class BugRun:
    shape: Shape
    profiled: ProfiledRun
    truth: dict[int, dict[str, Any]]  # rank -> truth-rank{R}.json

    @property
    def report(self) -> dict[str, Any]:
        return self.profiled.report

    def findings(self, kind: str | None = None) -> list[dict[str, Any]]:
        return [f for f in self.report["findings"] if kind is None or f["kind"] == kind]

    def script_path(self) -> Path:
        return BUGS / f"{self.shape.script}.py"

    def line_of(self, text: str) -> int:
        """The first line of the script's code (its docstring left out) holding ``text``."""
        source = self.script_path().read_text()
        body = ast.parse(source).body
        after = (body[0].end_lineno or 0) if isinstance(body[0], ast.Expr) else 0
        lines = source.splitlines()
        return next(i for i, line in enumerate(lines, 1) if i > after and text in line)

    def diagnostics(self) -> str:
        return (
            f"findings: {[(f['kind'], f['cause'], f['severity']) for f in self.findings()]}\n"
            f"stderr: {self.profiled.proc.stderr[-2000:]}"
        )


_runs: dict[str, BugRun] = {}


@pytest.fixture(scope="module")
def bug_run(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """bug_run(name) -> BugRun: ``syncscope profile`` of tests/scripts/bugs/NAME.py with
    ``BUG_TRUTH_DIR`` set, each made once per module (one at a time: 2 cores)."""

    def get(name: str) -> BugRun:
        if name not in _runs:
            shape = SHAPES[name]
            tmp = tmp_path_factory.mktemp(name)
            truth_dir = tmp / "truth"
            with pytest.MonkeyPatch.context() as mp:
                mp.setenv("BUG_TRUTH_DIR", str(truth_dir))
                run = profile(
                    tmp, BUGS / f"{name}.py", "--windows", str(WINDOWS), nproc=shape.nproc
                )
            truth = {
                int(p.stem.removeprefix("truth-rank")): json.loads(p.read_text())
                for p in truth_dir.glob("truth-rank*.json")
            }
            assert sorted(truth) == list(range(shape.nproc)), run.proc.stderr[-3000:]
            _runs[name] = BugRun(shape, run, truth)
        return _runs[name]

    return get


# -- 1. the truth: what really happens -------------------------------------------------------


@pytest.mark.parametrize("name", RUNS)
def test_truth_is_what_really_happens(bug_run, name: str) -> None:  # type: ignore[no-untyped-def]
    run = bug_run(name)
    shape = run.shape
    for rank, truth in run.truth.items():
        assert truth["error"] is None, (rank, truth["error"])
        assert truth["windows_completed"] == WINDOWS
        for w in truth["windows"]:
            assert w["rounds"] == shape.rounds, (rank, w)
            assert tuple(w["reduced_at_micro_batch"]) == shape.reduced_at, (rank, w)
            assert w["params_equal"] is shape.replicas_equal, (rank, w)
    if name == "moe_subgroup":  # DDP's bucket in the backward, the experts again after it
        for truth in run.truth.values():
            for w in truth["windows"]:
                assert w["round_keys"] == [[3, "after"], [3, "backward"]]
            hand = [e for e in truth["log"] if e["phase"] == "after" and e["reduction"]]
            per_window = sum(e["bytes"] for e in hand) // WINDOWS
            assert per_window == truth["notes"]["expert_grad_bytes"]
    if name == "pipelining_two_steps":  # each step() ends in the schedule's reduce-scatter
        for truth in run.truth.values():
            ops = {e["op"] for e in truth["log"] if e["reduction"]}
            # FSDP's reduce-scatter, by the name of this torch's function: reduce_scatter_tensor
            # on torch 2.8, reduce_scatter_single on 2.13 and 2.15 (measured)
            scatter = ops & {"reduce_scatter_single", "reduce_scatter_tensor"}
            assert len(scatter) == 1, ops
            # torch 2.15's schedule also all-reduces 4 bytes in the dp group inside step()
            # (measured; no gradients: one scalar), in a round the reduce-scatter opens anyway
            assert ops - scatter <= {"all_reduce"}, ops
            hand = [e for e in truth["log"] if e["reduction"] and e["op"] == "all_reduce"]
            assert all(e["bytes"] <= 8 and e["phase"] == "step" for e in hand), hand
            assert {e["phase"] for e in truth["log"] if e["reduction"]} == {"step"}
            assert {e["group_size"] for e in truth["log"] if e["reduction"]} == {2}  # dp
    if name == "fsdp2_outer_toggle":
        assert all(t["notes"]["toggle_found"] is False for t in run.truth.values())


def test_truth_static_graph_no_sync_crashes_on_the_first_backward(bug_run) -> None:  # type: ignore[no-untyped-def]
    run = bug_run("static_graph_no_sync")
    for truth in run.truth.values():
        assert truth["windows_completed"] == 0
        assert "expect_autograd_hooks_" in (truth["error"] or "")
        # measured on torch 2.13: the static graph's first backward still hands DDP's one
        # bucket to the comm hook (micro-batch 0, under no_sync), then the reducer asserts
        reductions = [e for e in truth["log"] if e["reduction"]]
        assert {(e["micro_batch"], e["phase"]) for e in reductions} <= {(0, "backward")}
    assert run.profiled.proc.returncode != 0
    assert run.report["verdict"] == "failed"
    assert [f["kind"] for f in run.findings("run-failed")] == ["run-failed"]


# -- 2. counts: syncscope's grad syncs per window are the truth's rounds --------------------


@pytest.mark.parametrize("name", RUNS)
def test_grad_syncs_per_window_equal_the_truth(bug_run, name: str) -> None:  # type: ignore[no-untyped-def]
    run = bug_run(name)
    for rank, truth in run.truth.items():
        windows = run.profiled.complete_windows(rank)
        assert len(windows) == WINDOWS, windows
        for w, true in zip(windows, truth["windows"], strict=True):
            assert w["grad_syncs"] == true["rounds"], (rank, w)
            if run.shape.same_micro_batches:
                assert w["micro_batches"] == 4
                assert w["grad_sync_micro_batches"] == true["reduced_at_micro_batch"], (rank, w)
    assert run.report["grad_syncs_per_window"] == [w["rounds"] for w in run.truth[0]["windows"]]


@pytest.mark.parametrize("name", RUNS)
def test_reduced_gradients_are_never_a_missing_sync(bug_run, name: str) -> None:  # type: ignore[no-untyped-def]
    """Every window of the truth reduced its gradients after its last micro-batch (all
    shapes but module_forward): no missing-sync, whoever issued the reduction (pipelining:
    the schedule, after the last backward)."""
    run = bug_run(name)
    truth = run.truth[0]["windows"]
    if all(w["rounds"] > 0 for w in truth):
        assert run.findings("missing-sync") == [], run.diagnostics()
    else:
        assert run.findings("missing-sync"), run.diagnostics()


# -- 3. replicas ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", RUNS)
def test_rank_divergence_exactly_when_replicas_differ(bug_run, name: str) -> None:  # type: ignore[no-untyped-def]
    run = bug_run(name)
    equal = all(w["params_equal"] for t in run.truth.values() for w in t["windows"])
    divergence = run.findings("rank-divergence")
    if equal:
        assert divergence == [], run.diagnostics()
    else:
        assert divergence, run.diagnostics()
        assert divergence[0]["severity"] == "error"


# -- 5. every snippet parses ------------------------------------------------------------------


@pytest.mark.parametrize("name", list(SHAPES))
def test_every_snippet_shown_parses(bug_run, name: str) -> None:  # type: ignore[no-untyped-def]
    run = bug_run(name)
    for finding in run.findings():
        fix = finding.get("fix") or {}
        snippet = fix.get("snippet") or ""
        if fix.get("diff"):  # fix's own rewrite of the script: a unified diff, not a snippet
            assert snippet == fix["diff"] and snippet.startswith("--- a/"), fix
        elif snippet:
            ast.parse(snippet)  # SyntaxError fails the test with the snippet's line


# -- 4. causes: the names the analysis gives ------------------------------------------------
#
# The causes, their evidence and their advice, as docs/findings describes them.


def test_cause_module_forward_is_wrapper_bypassed(bug_run) -> None:  # type: ignore[no-untyped-def]
    run = bug_run("module_forward")
    (finding,) = run.findings("missing-sync")
    assert (finding["cause"], finding["severity"]) == ("wrapper-bypassed", "error")
    call_line = run.line_of("= model.module(x)")
    sites = {(Path(s["file"]), s["line"]) for s in finding["sources"]}
    assert (run.script_path(), call_line) in sites, finding["sources"]
    fix = finding["fix"]
    # the card gives fix's own rewrite (with the run's facts): the forward calls the wrapper
    assert fix["style"] == "call-wrapper" and " fix --from " in fix["command"], fix
    assert "-            loss = model.module(x).pow(2).mean() / args.accum" in fix["diff"], fix
    assert "+                loss = model(x).pow(2).mean() / args.accum" in fix["diff"], fix
    assert "every gradient reduction of the window" in finding["evidence"]["reductions_lost"]
    # and fix --from rewrites the forward to call the wrapper
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "syncscope",
            "fix",
            "--from",
            str(run.profiled.run_dir),
            str(run.script_path()),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1 and "SYN110" in done.stderr, done.stderr
    assert "loss = model(x)" in done.stdout, done.stdout
    # and the loop, which syncs every micro-batch once it reaches DDP, gets no_sync with it
    assert "SYN101" in done.stderr and "model.no_sync()" in done.stdout, done.stderr


def test_cause_static_graph_no_sync_is_named(bug_run) -> None:  # type: ignore[no-untyped-def]
    run = bug_run("static_graph_no_sync")
    (finding,) = run.findings("run-failed")
    assert finding["cause"] == "static-graph-no_sync"
    fix = finding.get("fix") or {}
    assert fix, "a static-graph no_sync crash comes with the fixes that work on this torch"
    # only the first backward of training syncs; then no_sync (measured on torch 2.13)
    assert "first_backward = step == 0 and micro == 0" in fix["snippet"]
    assert "static_graph=True" in fix["summary"]


def test_cause_static_graph_workaround_never_advises_no_sync_on_micro_batch_0(bug_run) -> None:  # type: ignore[no-untyped-def]
    run = bug_run("static_graph_workaround")
    for finding in run.findings("redundant-sync"):
        assert finding["cause"] == "static-graph-first-sync", run.diagnostics()
        assert (finding.get("fix") or {}).get("style") != "ddp-no_sync", finding["fix"]
    # a warning: only the first backward of training must sync, so the workaround wastes a
    # reduction in every later window (window 0's is required and not reported)
    (finding,) = run.findings("redundant-sync")
    assert finding["severity"] == "warning" and finding["windows"] == [1, 2]
    assert "step == 0 and micro == 0" in finding["fix"]["snippet"]


def test_cause_fsdp2_outer_toggle_is_toggle_not_fsdp_module(bug_run) -> None:  # type: ignore[no-untyped-def]
    run = bug_run("fsdp2_outer_toggle")
    (finding,) = run.findings("redundant-sync")
    assert finding["cause"] == "toggle-not-fsdp-module", run.diagnostics()
    assert finding["severity"] == "warning"
    toggle_line = run.line_of('if hasattr(model, "set_requires_gradient_sync")')
    sites = {(Path(s["file"]), s["line"]) for s in finding["sources"]}
    # the setter's call, under its hasattr guard
    assert (run.script_path(), toggle_line + 1) in sites, finding["sources"]
    snippet = (finding.get("fix") or {}).get("snippet") or ""
    assert "model.set_requires_gradient_sync(" not in snippet, snippet  # no-op on the wrapper
    assert "isinstance(module, FSDPModule)" in snippet, snippet  # the FSDP modules inside
    assert finding["evidence"]["helper_target"] == "PeftLikeModel"
    assert finding["evidence"]["fsdp_modules"] == ["(root)", "blocks.0", "blocks.1"]
    wrappers = run.report["ranks"][0]["wrappers"]
    assert [w.get("outer") for w in wrappers] == ["PeftLikeModel"]


def test_cause_recurse_false_is_a_warning_naming_the_argument(bug_run) -> None:  # type: ignore[no-untyped-def]
    run = bug_run("fsdp2_recurse_false")
    (finding,) = run.findings("redundant-sync")
    assert (finding["cause"], finding["severity"]) == ("toggle-not-recursive", "warning")
    text = json.dumps(finding)
    assert "recurse" in text
    assert "deliberate" not in (finding.get("fix") or {}).get("summary", "").lower()
    assert run.report["verdict"] != "clean"


def test_cause_pipelining_is_a_reduction_per_step(bug_run) -> None:  # type: ignore[no-untyped-def]
    run = bug_run("pipelining_two_steps")
    assert run.findings("missing-sync") == [], run.diagnostics()
    (finding,) = run.findings("redundant-sync")
    assert finding["cause"] == "pipeline-reduce-per-step", run.diagnostics()
    assert finding["severity"] == "warning"
    assert run.profiled.proc.returncode == 0  # not an error (--fail-on never here anyway)
    fix = finding["fix"]
    assert fix["style"] == "pipeline-step" and "n_microbatches" in fix["snippet"]
    assert "torch 2.13" in fix["summary"]  # the version whose schedules were read
    assert finding["evidence"]["reductions_after_schedule_steps"] == 2


def test_cause_moe_is_reduced_twice(bug_run) -> None:  # type: ignore[no-untyped-def]
    run = bug_run("moe_subgroup")
    (finding,) = run.findings("redundant-sync")
    assert (finding["cause"], finding["severity"]) == ("reduced-twice", "warning")
    hand_line = run.line_of("dist.all_reduce(p.grad")
    sites = {(Path(s["file"]), s["line"]) for s in finding["sources"]}
    assert (run.script_path(), hand_line) in sites, finding["sources"]
    # the advice never adds another all-reduce: no finding of this run (fragmented-sync
    # included) shows a snippet that reduces the gradients again over the world, and the
    # reduced-twice snippet keeps at most the one hand reduction, over its subgroup
    for any_finding in run.findings():
        for line in ((any_finding.get("fix") or {}).get("snippet") or "").splitlines():
            code = line.split("#")[0]
            if "all_reduce(" in code:
                assert "group=" in code, (any_finding["kind"], any_finding["cause"], line)
    snippet = (finding.get("fix") or {}).get("snippet") or ""
    assert snippet.count("all_reduce(") <= 1, snippet
    evidence = finding["evidence"]
    assert all(p.startswith("experts.") for p in evidence["parameters_reduced_twice"])
    assert evidence["parameters_reduced_twice_count"] == 4
    assert finding["cost"]["wasted_bytes_per_window"] == run.truth[0]["notes"]["expert_grad_bytes"]


@pytest.mark.parametrize("name", ["hand_bucketed_once", "compiled_autograd_python_reducer"])
def test_reduced_once_is_clean(bug_run, name: str) -> None:  # type: ignore[no-untyped-def]
    run = bug_run(name)
    assert run.report["verdict"] == "clean", run.diagnostics()
    assert [f for f in run.findings() if f["severity"] != "info"] == [], run.diagnostics()
