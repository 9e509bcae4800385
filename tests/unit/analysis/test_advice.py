"""Fixes in the framework's own terms, on hand-built runs: the framework a rank ran under
(a ``framework`` event, as capture records it) picks the knob the finding names."""

from __future__ import annotations

import pytest

from syncscope.analysis.diagnose import diagnose
from syncscope.load.captured import is_grad_sync, rank_from_events
from syncscope.model import Finding
from tests.helpers.events import Rank, run_of

EVERY = [0, 1, 2, 3]


def findings(framework: str | None, build) -> list[Finding]:  # type: ignore[no-untyped-def]
    ranks = []
    for r in (Rank(0), Rank(1)):
        if framework is not None:
            r.add("framework", name=framework, version="1.0")
        ranks.append(build(r))
    return diagnose(run_of(*ranks))


def fix_of(found: list[Finding], kind: str) -> str:
    (f,) = [f for f in found if f.kind == kind]
    assert f.fix is not None
    return f.fix.style


@pytest.mark.parametrize(
    ("framework", "style", "knob"),
    [
        (None, "ddp-no_sync", "no_sync()"),
        ("lightning", "lightning", "accumulate_grad_batches"),
        ("transformers", "hf-trainer", "gradient_accumulation_steps"),
        ("accelerate", "accelerate", "accumulate("),
    ],
)
def test_redundant_sync_fix_names_the_frameworks_knob(framework, style, knob) -> None:  # type: ignore[no-untyped-def]
    found = findings(framework, lambda r: r.window(EVERY).window(EVERY).finish())
    (f,) = found
    assert f.fix is not None and f.fix.style == style
    assert knob in f.fix.snippet
    if framework == "lightning":
        assert "don't call no_sync()" in f.fix.summary  # never hand-written no_sync


@pytest.mark.parametrize(
    ("framework", "style"),
    [(None, "ddp-no_sync"), ("lightning", "lightning"), ("transformers", "hf-trainer")],
)
def test_missing_sync_fix_names_the_frameworks_knob(framework, style) -> None:  # type: ignore[no-untyped-def]
    def build(r: Rank) -> Rank:
        for _ in range(2):
            for _ in range(4):
                r.micro_batch(fwd_sync=False, bwd_sync=False, syncs=0)
            r.step()
        return r.finish()

    assert fix_of(findings(framework, build), "missing-sync") == style


def test_hf_trainer_sync_each_batch_points_at_accelerator_config() -> None:
    accel = {"sync_each_batch": True, "sync_gradients": True}
    found = findings("transformers", lambda r: r.window(EVERY, accelerate=accel).finish())
    (f,) = found
    assert (f.cause, f.severity) == ("sync-each-batch", "info")
    assert f.fix is not None and f.fix.style == "hf-trainer-sync-each-batch"
    assert "accelerator_config" in f.fix.snippet
    assert "GradientAccumulationPlugin" not in f.fix.snippet


def test_accelerate_sync_each_batch_keeps_the_plugin_advice() -> None:
    accel = {"sync_each_batch": True, "sync_gradients": True}
    found = findings("accelerate", lambda r: r.window(EVERY, accelerate=accel).finish())
    assert fix_of(found, "redundant-sync") == "sync-each-batch"


@pytest.mark.parametrize(
    ("framework", "style", "knob"),
    [
        (None, "step-gate", "% accum_steps"),
        ("accelerate", "accelerate-window", "sync_with_dataloader"),
        ("lightning", "lightning-window", "accumulate_grad_batches"),
        ("transformers", "hf-trainer-window", "gradient_accumulation_steps"),
    ],
)
def test_uneven_window_fix_names_the_frameworks_knob(framework, style, knob) -> None:  # type: ignore[no-untyped-def]
    def build(r: Rank) -> Rank:
        return r.window([3]).window([1], n=2).window([3]).window([3]).finish()

    found = findings(framework, build)
    assert fix_of(found, "irregular-window") == style
    (f,) = found
    assert f.fix is not None and knob in f.fix.snippet


@pytest.mark.parametrize(
    ("framework", "style"),
    [
        (None, "zero-grad"),
        ("lightning", "lightning-zero-grad"),
        ("transformers", "hf-trainer-zero-grad"),
        ("accelerate", "accelerate-zero-grad"),
    ],
)
def test_grad_reset_fix_names_the_framework(framework, style) -> None:  # type: ignore[no-untyped-def]
    def build(r: Rank) -> Rank:
        r.micro_batch(syncs=0).micro_batch(syncs=0)
        r.add("reset", how="optimizer.zero_grad", set_to_none=True, site=None)
        r.micro_batch(syncs=0).micro_batch(syncs=1)
        return r.step().finish()

    assert fix_of(findings(framework, build), "grad-reset-mid-window") == style


def test_fsdp_sharded_trade_off_has_no_framework_form() -> None:
    def build(r: Rank) -> Rank:
        for _ in range(4):
            r.micro_batch(wrapper="fsdp", op="reduce_scatter", labels=("fsdp:M#0",))
        return r.step(sharded=True).finish()

    ranks = []
    for r in (Rank(0, wrappers=("fsdp",)), Rank(1, wrappers=("fsdp",))):
        r.add("framework", name="lightning", version="2.6.6")
        ranks.append(build(r))
    (f,) = diagnose(run_of(*ranks))
    assert f.fix is not None and f.fix.style == "fsdp-sharded"


def test_framework_is_carried_into_the_rank() -> None:
    r = Rank(0).add("framework", name="transformers", version="5.23.0").window([3]).finish()
    rank = rank_from_events(r.events)
    assert (rank.framework, rank.framework_version) == ("transformers", "5.23.0")
    assert rank_from_events(Rank(0).window([3]).finish().events).framework == ""


def test_closure_time_is_micro_batch_time_not_optimizer_time() -> None:
    r = Rank(0)
    r.micro_batch(syncs=0)
    r.add("step", site=None, mem=0, cuda_peak=0, closure=True)
    r.add("closure")
    r.micro_batch(syncs=1)
    r.add("closure_end")
    r.add("fp", window=0, fp=[1.0, 2.0], fp_sharded=False, fp_count=4)
    r.add("step_end")
    (w,) = rank_from_events(r.finish().events).windows
    assert len(w.micro_batches) == 2 and w.grad_sync_micro_batches == [1]
    assert w.fingerprint == (1.0, 2.0)
    assert w.step_ns == 3000  # step_end - step (10 events), minus the closure (7 events)


@pytest.mark.parametrize(
    ("event", "grad"),
    [
        # DDP's reducer in backward: a float bucket, or the int used-parameter map
        ({"issuer": "ddp", "phase": "backward", "dtype": "float32"}, True),
        ({"issuer": "ddp", "phase": "backward", "dtype": "bfloat16"}, True),
        ({"issuer": "ddp", "phase": "backward", "dtype": "int32"}, False),
        ({"issuer": "ddp", "phase": "forward", "dtype": "float32"}, False),
        ({"issuer": "fsdp", "phase": "backward", "dtype": "float32"}, True),
        # the user's: storage or content decide; size alone never does
        ({"issuer": "user", "grad_storage": True, "grad_content": False}, True),
        ({"issuer": "user", "grad_storage": False, "grad_content": True}, True),
        (
            {"issuer": "user", "grad_storage": False, "grad_content": False, "grad_numel": True},
            False,
        ),
        # older captures (no grad_content): their size test is honoured
        ({"issuer": "user", "grad_storage": False, "grad_numel": True}, True),
        ({"issuer": "torch", "grad_storage": True, "grad_content": True}, False),
    ],
)
def test_is_grad_sync_by_what_the_tensor_is(event, grad) -> None:  # type: ignore[no-untyped-def]
    assert is_grad_sync({"op": "all_reduce", **event}) is grad
