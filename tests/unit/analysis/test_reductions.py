"""What the gradients went through (the bug shapes' loops), on hand-built event streams: a
reduction counts by what it reduces, wherever it is issued, and the cause comes from the
reductions and the run's objects. The real loops are in tests/integration/test_bug_shapes.py.
"""

from __future__ import annotations

import ast
from typing import Any

from syncscope.analysis.advice import SNIPPETS
from syncscope.analysis.diagnose import diagnose
from syncscope.analysis.sync_helpers import _SNIPPETS as HELPER_TEMPLATES
from syncscope.model import Finding
from tests.helpers.events import Rank, run_of


def _findings(*ranks: Rank) -> list[Finding]:
    return diagnose(run_of(*ranks))


def _fsdp_pipeline_rank(rank: int) -> Rank:
    """Two schedule steps of 2 micro-batches per optimizer step: FSDP reduce-scatters after
    each step's last backward, outside autograd (``perform_reduce_grad``)."""
    r = Rank(rank, wrappers=("fsdp",))
    for _ in range(3):
        for _step in range(2):
            for _mb in range(2):
                r.micro_batch(wrapper="fsdp", bwd_sync=False, syncs=0, labels=("fsdp:M#0",))
            r.coll(op="reduce_scatter", phase="after-backward", issuer="fsdp", via="pipelining")
        r.step()
    return r.finish()


def test_a_schedules_reduction_after_backward_is_a_grad_sync_and_never_missing() -> None:
    run = run_of(_fsdp_pipeline_rank(0), _fsdp_pipeline_rank(1))
    for rank in run.ranks:
        assert [w.grad_syncs for w in rank.windows] == [2, 2, 2]
        assert [w.grad_sync_micro_batches for w in rank.windows] == [[1, 3]] * 3
    findings = diagnose(run)
    assert not [f for f in findings if f.kind == "missing-sync"]
    (f,) = [f for f in findings if f.kind == "redundant-sync"]
    assert (f.severity, f.cause) == ("warning", "pipeline-reduce-per-step")
    assert f.fix is not None and f.fix.style == "pipeline-step"
    assert "n_microbatches" in f.fix.snippet and "no_sync" not in f.fix.snippet
    assert "step()" in f.message


def test_an_fsdp_reduction_after_backward_without_pipelining_still_counts() -> None:
    r = Rank(0, wrappers=("fsdp",))
    for _ in range(2):
        for _mb in range(4):
            r.micro_batch(wrapper="fsdp", bwd_sync=False, syncs=0, labels=("fsdp:M#0",))
        r.coll(op="reduce_scatter", phase="after-backward", issuer="fsdp")
        r.step()
    run = run_of(r.finish())
    assert [w.grad_sync_micro_batches for w in run.ranks[0].windows] == [[3], [3]]
    assert not [f for f in diagnose(run) if f.kind in ("missing-sync", "redundant-sync")]


def _moe_rank(rank: int, also_ddp: str = "ddp") -> Rank:
    r = Rank(rank)
    for _ in range(2):
        for i in range(4):
            r.micro_batch(fwd_sync=i == 3, syncs=1 if i == 3 else 0)
        for name in ("experts.0.weight", "experts.0.bias"):
            r.coll(
                phase="after-backward",
                issuer="user",
                grad_storage=True,
                nbytes=512,
                grad_params=[name],
                also_reduced_by=also_ddp,
                site={"file": "/u/train.py", "line": 72},
            )
        r.step()
    return r.finish()


def test_gradients_reduced_by_ddp_and_by_hand_are_reduced_twice() -> None:
    findings = _findings(_moe_rank(0), _moe_rank(1))
    (f,) = [f for f in findings if f.cause == "reduced-twice"]
    assert (f.kind, f.severity) == ("redundant-sync", "warning")
    assert f.evidence["parameters_reduced_twice"] == ["experts.0.bias", "experts.0.weight"]
    assert f.cost["wasted_bytes_per_window"] == 1024
    assert ("all_reduce", "/u/train.py:72") in [(role, str(s)) for role, s in f.sites]
    assert "twice" in f.message
    # the advice removes a reduction; it never adds another all-reduce over the world
    assert f.fix is not None and "_set_params_and_buffers_to_ignore_for_model" in f.fix.snippet
    assert "group=" in f.fix.snippet


def test_a_hand_reduction_of_parameters_ddp_ignores_is_reduced_once() -> None:
    findings = _findings(_moe_rank(0, also_ddp=""), _moe_rank(1, also_ddp=""))
    assert not [f for f in findings if f.cause == "reduced-twice"]
    assert not [f for f in findings if f.severity in ("warning", "error")]


def _recurse_rank(rank: int) -> Rank:
    r = Rank(rank, wrappers=("fsdp",))
    for _ in range(2):
        for i in range(4):
            r.add(
                "toggle",
                how="set_requires_gradient_sync",
                value=i == 3,
                module="fsdp:M#0",
                recurse=False,
                site={"file": "/u/train.py", "line": 9},
            )
            r.micro_batch(wrapper="fsdp", bwd_sync=i == 3, syncs=0, labels=("fsdp:M#0",))
            # the children still reduce-scatter: their flags were never set
            r.coll(op="reduce_scatter", issuer="fsdp", detail="blocks.0")
            r.t += 1
        r.step()
    return r.finish()


def test_recurse_false_on_a_root_whose_children_shard_is_a_warning_not_deliberate() -> None:
    findings = _findings(_recurse_rank(0), _recurse_rank(1))
    (f,) = [f for f in findings if f.kind == "redundant-sync"]
    assert (f.severity, f.cause) == ("warning", "toggle-not-recursive")
    assert f.evidence["toggle_argument"] == "recurse=False"
    assert f.evidence["fsdp_modules_still_reducing"] == ["blocks.0"]
    assert f.fix is not None and "recurse=False" in f.fix.summary


def _static_rank(rank: int, fail: bool = False) -> Rank:
    r = Rank(rank)
    r.events[2]["static_graph"] = True
    for _ in range(1 if fail else 3):
        for i in range(4):
            if 0 < i < 3:
                r.add("toggle", how="no_sync", value=False, module="ddp:M#0")
            if fail and i == 0:
                r.add("toggle", how="no_sync", value=False, module="ddp:M#0")
                r.add("fwd", wrapper="ddp", module="ddp:M#0", sync=False, depth=0)
                r.add("bwd", sync={"ddp:M#0": False})
                reason = "RuntimeError: expect_autograd_hooks_ INTERNAL ASSERT FAILED"
                return r.add("exit", status=1, reason=reason, dist_initialized=True)
            r.micro_batch(fwd_sync=i in (0, 3), syncs=1 if i in (0, 3) else 0)
            if 0 < i < 3:
                r.add("toggle", how="no_sync", value=True, module="ddp:M#0")
        r.step()
    return r.finish()


def test_a_static_graph_ddp_failing_under_no_sync_names_the_cause() -> None:
    findings = _findings(_static_rank(0, fail=True), _static_rank(1, fail=True))
    (f,) = [f for f in findings if f.kind == "run-failed"]
    assert f.cause == "static-graph-no_sync"
    assert f.fix is not None and f.fix.style == "static-graph"
    assert "first_backward" in f.fix.snippet


def test_the_static_graph_workaround_is_never_advised_no_sync_on_micro_batch_0() -> None:
    findings = _findings(_static_rank(0), _static_rank(1))
    (f,) = [f for f in findings if f.kind == "redundant-sync"]
    assert f.cause == "static-graph-first-sync"
    assert f.windows == (1, 2)  # window 0's first backward must sync
    assert f.fix is not None and f.fix.style == "static-graph"
    assert "step == 0 and micro == 0" in f.fix.snippet


def test_a_static_graph_ddp_syncing_every_micro_batch_gets_the_static_graph_advice() -> None:
    r = Rank(0)
    r.events[2]["static_graph"] = True
    for _ in range(2):
        r.window([0, 1, 2, 3])
    (f,) = [f for f in _findings(r.finish()) if f.kind == "redundant-sync"]
    assert f.fix is not None and f.fix.style == "static-graph"


def test_a_setter_looked_up_on_a_module_that_is_not_fsdp_is_named() -> None:
    def rank(i: int) -> Rank:
        r = Rank(i, wrappers=())
        r.add(
            "wrapper",
            kind="fsdp",
            label="fsdp:M#0",
            params=4,
            param_bytes=4096,
            shard_world=2,
            outer="PeftLikeModel",
            fsdp_modules=["", "blocks.0"],
            setter_mentions=[{"file": "/u/train.py", "line": 66}],
        )
        for _ in range(2):
            r.window([0, 1, 2, 3], wrapper="fsdp", op="reduce_scatter", labels=("fsdp:M#0",))
        return r.finish()

    (f,) = [f for f in _findings(rank(0), rank(1)) if f.kind == "redundant-sync"]
    assert (f.severity, f.cause) == ("warning", "toggle-not-fsdp-module")
    assert f.evidence["helper_target"] == "PeftLikeModel"
    assert f.evidence["fsdp_modules"] == ["(root)", "blocks.0"]
    assert ("sync_toggle", "/u/train.py:66") in [(role, str(s)) for role, s in f.sites]
    assert f.fix is not None and "isinstance(module, FSDPModule)" in f.fix.snippet


def test_a_forward_around_the_ddp_wrapper_is_named_with_its_line() -> None:
    def rank(i: int) -> Rank:
        r = Rank(i)
        for _ in range(2):
            for _mb in range(4):
                site = {"file": "/u/train.py", "line": 36}
                r.add("fwd", wrapper="none", module="bypass:ddp:M#0", depth=0, site=site)
                r.add("bwd", sync={"ddp:M#0": True}).add("bwd_end", mem=1)
            r.step(fp=(float(i),))
        return r.finish()

    findings = _findings(rank(0), rank(1))
    (f,) = [f for f in findings if f.kind == "missing-sync"]
    assert f.cause == "wrapper-bypassed"
    assert ("forward", "/u/train.py:36") in [(role, str(s)) for role, s in f.sites]
    assert f.fix is not None and f.fix.style == "call-wrapper"
    assert "every gradient reduction" in str(f.evidence["reductions_lost"])


def _parses(code: str) -> None:
    ast.parse(code)


def test_every_snippet_template_parses() -> None:
    for style, fix in SNIPPETS.items():
        try:
            _parses(fix.snippet)
        except SyntaxError as exc:  # pragma: no cover - the message is the point
            raise AssertionError(f"snippet {style!r} does not parse: {exc}") from None
    for template in HELPER_TEMPLATES.values():
        for setter in ("set_requires_gradient_sync", "set_requires_all_reduce"):
            _parses(template.format(name="grad_sync_context", setter=setter))


def snippets_of(report: dict[str, Any]) -> list[str]:
    """Every code snippet a report.json shows (used by the slow tests on real runs)."""
    return [
        f["fix"]["snippet"]
        for f in report.get("findings", [])
        if isinstance(f.get("fix"), dict) and f["fix"].get("snippet")
    ]


def test_fsdp2_alone_in_its_shard_group_reduces_nothing_and_misses_nothing() -> None:
    # FSDP2 at world size 1 issues no reduce-scatter (measured on an H100 and on CPU)
    r = Rank(0, world_size=1, wrappers=("fsdp",))
    for _ in range(2):
        r.window([], wrapper="fsdp", op="reduce_scatter", labels=("fsdp:M#0",))
    findings = diagnose(run_of(r.finish(), world_size=1))
    assert not [f for f in findings if f.severity in ("warning", "error")]
    # with a shard group of two, the same windows miss their sync
    r2 = [Rank(i, wrappers=("fsdp",)) for i in (0, 1)]
    for r in r2:
        for _ in range(2):
            r.window([], wrapper="fsdp", op="reduce_scatter", labels=("fsdp:M#0",))
    findings = diagnose(run_of(*(r.finish() for r in r2)))
    assert [f.kind for f in findings if f.severity == "error"][:1] == ["missing-sync"]


def test_no_cause_is_named_other_each_names_what_was_seen() -> None:
    # DDP armed at forward although the window toggled elsewhere
    r = Rank(0)
    for _ in range(2):
        r.add("toggle", how="no_sync", value=False, module="ddp:M#0")
        r.add("toggle", how="no_sync", value=True, module="ddp:M#0")
        r.window([0, 1, 2, 3])
    (f,) = [f for f in _findings(r.finish()) if f.kind == "redundant-sync"]
    assert f.cause == "toggle-missed-micro-batch"
    # DDP not armed at forward, yet it reduced (one DDP module)
    r = Rank(0)
    for _ in range(2):
        r.window([0, 1, 2, 3], fwd_sync=False)
    (f,) = [f for f in _findings(r.finish()) if f.kind == "redundant-sync"]
    assert f.cause == "reduced-unarmed"
    # FSDP all-reducing on every micro-batch (FSDP1 NO_SHARD): no FSDP cause matches
    r = Rank(0, wrappers=("fsdp",))
    for _ in range(2):
        r.window([0, 1, 2, 3], wrapper="fsdp", op="all_reduce", labels=("fsdp:M#0",))
    (f,) = [f for f in _findings(r.finish()) if f.kind == "redundant-sync"]
    assert f.cause == "fsdp-all-reduce-early"
