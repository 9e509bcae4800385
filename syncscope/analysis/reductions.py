"""What the gradients went through: causes named from the reductions themselves.

A window's gradients must be reduced exactly once (docs/concepts.md). Who issued a reduction
(DDP's reducer, FSDP's hooks, a pipelining schedule, the user's own all-reduce) does not
decide whether it counts; it decides only how the cause is named and which fix is shown.
The rules here look at what a window's reductions did to the gradients:

- ``reduced_twice``: the same gradients reduced by a wrapper *and* by hand on one
  micro-batch (DDP over all parameters plus a hand all-reduce of some of them: the MoE
  expert shape), on every stack, not only DeepSpeed's;
- ``redundant_cause``: why a window reduced before its last micro-batch, where the stack
  itself says so: a pipelining schedule reducing at the end of each ``step()``, an FSDP
  setter called with ``recurse=False`` on a root whose children shard, a static-graph DDP
  whose first micro-batch syncs;
- ``static_graph_failure``: a static-graph DDP that failed on a backward under ``no_sync``.

Every fix named here is in ``SNIPPETS`` (each parses: tests/unit/analysis/test_reductions.py).
"""

from __future__ import annotations

from syncscope.model import Collective, Fix, RankRun, Window, WrapperInfo

PIPELINE_CAUSE = "pipeline-reduce-per-step"
RECURSE_CAUSE = "toggle-not-recursive"
STATIC_FIRST_CAUSE = "static-graph-first-sync"
STATIC_FAILED_CAUSE = "static-graph-no_sync"
TWICE_CAUSE = "reduced-twice"
UNUSED_CAUSE = "unused-parameters"  # DDP armed, a parameter got no gradient, buckets unfinished
NOT_FSDP_CAUSE = "toggle-not-fsdp-module"


def static_graph_ddp(rank: RankRun) -> WrapperInfo | None:
    return next((w for w in rank.wrappers if w.kind == "ddp" and w.static_graph), None)


def redundant_cause(rank: RankRun, window: Window, early: list[Collective]) -> str | None:
    """The cause of reductions before the last micro-batch, where the reductions (not the
    API that issued them) tell it; None where the wrapper's own rules decide."""
    if any(c.via == "pipelining" for c in early):
        return PIPELINE_CAUSE
    positions = {c.micro_batch for c in early}
    if any(not t.recurse and not t.value for t in window.toggles) and any(
        c.issuer == "fsdp" for c in early
    ):
        return RECURSE_CAUSE
    if setter_missed(rank, window) is not None and any(c.issuer == "fsdp" for c in early):
        return NOT_FSDP_CAUSE
    mbs = window.micro_batches
    if (
        static_graph_ddp(rank) is not None
        and positions == {0}
        and len(mbs) > 2
        and all(mb.in_no_sync_at_forward for mb in mbs[1:-1])
    ):
        return STATIC_FIRST_CAUSE
    return None


def setter_missed(rank: RankRun, window: Window) -> WrapperInfo | None:
    """An FSDP root called through a module that is not an FSDPModule, whose loop names a
    sync setter that no FSDP module saw in this window: the setter was looked up on the
    outer module (``hasattr`` false, or a method of its own) and toggled nothing."""
    if any(t.how.startswith("set_requires_") for t in window.toggles):
        return None
    return next((w for w in rank.wrappers if w.kind == "fsdp" and w.outer and w.setter_sites), None)


def first_window(rank: RankRun, window: Window) -> bool:
    return bool(rank.windows) and rank.windows[0].index == window.index


def cause_evidence(cause: str, window: Window, early: list[Collective]) -> dict[str, object]:
    """What the finding shows besides the counts, per cause."""
    if cause == PIPELINE_CAUSE:
        return {
            "reductions_after_schedule_steps": sum(
                1 for key in window.grad_sync_rounds if key[1] == "after-backward"
            ),
            "reduced_by": "torch.distributed.pipelining schedule step()",
        }
    if cause == RECURSE_CAUSE:
        modules = sorted({c.module for c in early if c.issuer == "fsdp" and c.module})
        return {"toggle_argument": "recurse=False", "fsdp_modules_still_reducing": modules[:16]}
    return {}


def reduced_twice(window: Window) -> list[Collective]:
    """The hand reductions of gradients a wrapper reduced on the same micro-batch too: each
    user reduction of ``.grad`` tensors that a DDP module also reduces (its parameters, not
    ignored by it), on a micro-batch with a DDP reduction."""
    wrapped = {c.micro_batch for c in window.grad_sync_collectives if c.issuer == "ddp"}
    return [
        c
        for c in window.grad_sync_collectives
        if c.issuer == "user" and c.also_reduced_by == "ddp" and c.micro_batch in wrapped
    ]


def twice_evidence(window: Window, position: int, hand: list[Collective]) -> dict[str, object]:
    params = sorted({name for c in hand for name in c.grad_params})
    groups = sorted({len(c.group_ranks) for c in hand if c.group_ranks is not None})
    return {
        "micro_batches": len(window.micro_batches),
        "micro_batch": position,
        "hand_reductions": len(hand),
        "parameters_reduced_twice": params[:16],
        "parameters_reduced_twice_count": len(params),
        "hand_reduction_group_sizes": groups,
        "also_reduced_by": "DDP (its gradient buckets, over its process group)",
    }


def static_graph_failure(rank: RankRun) -> bool:
    """A static-graph DDP whose backward failed under ``no_sync`` (torch's reducer asserts
    ``expect_autograd_hooks_``: the graph is recorded on the first backward, which must sync)."""
    if static_graph_ddp(rank) is None:
        return False
    if "expect_autograd_hooks_" in rank.exit_reason:
        return True
    window = rank.windows[-1] if rank.windows else None
    return (
        rank.in_progress == "backward"
        and window is not None
        and not window.complete
        and any(t.how == "no_sync" and not t.value for t in window.toggles)
    )


_STATIC_GRAPH_LOOP = """import contextlib

for step, micro_batches in enumerate(windows):
    for micro, batch in enumerate(micro_batches):
        # static_graph=True records DDP's graph on the first backward of training, which
        # must sync: skip the sync on every other micro-batch but each window's last
        first_backward = step == 0 and micro == 0
        skip = micro < accum_steps - 1 and not first_backward
        with model.no_sync() if skip else contextlib.nullcontext():
            loss = model(batch).loss / accum_steps
            loss.backward()
    optimizer.step()
    optimizer.zero_grad()"""

SNIPPETS: dict[str, Fix] = {
    "fsdp-modules-toggle": Fix(
        "fsdp-modules-toggle",
        "The sync setter was looked up on a module that is not an FSDPModule (a PEFT-style "
        "wrapper around the FSDP model), so no FSDP module's flag changed and every "
        "micro-batch reduce-scattered. Call it on the FSDP modules inside.",
        """from torch.distributed.fsdp import FSDPModule

for micro, batch in enumerate(micro_batches):
    is_last = micro == accum_steps - 1
    # model is a module around the FSDP roots: toggle the FSDP modules themselves
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_requires_gradient_sync(is_last, recurse=False)
    loss = model(batch).loss / accum_steps
    loss.backward()
optimizer.step()
optimizer.zero_grad()""",
    ),
    "ddp-unused-parameters": Fix(
        "ddp-unused-parameters",
        "DDP armed its all-reduce at this forward, but some parameters got no gradient in the "
        "backward (a branch this micro-batch did not use), so its buckets never completed and "
        "torch stops the job at the next forward. The sync gate is right: tell DDP which "
        "parameters may go unused, or use every parameter in every forward.",
        """ddp_model = DDP(model, find_unused_parameters=True)  # unused branches marked ready
# or, keeping find_unused_parameters=False: every parameter in every forward's loss
out = head(h) + 0.0 * aux(h)  # the unused branch contributes a zero gradient""",
    ),
    "call-wrapper": Fix(
        "call-wrapper",
        "Call the DDP wrapper, not the module inside it: DDP arms its gradient all-reduce in "
        "its own forward, so a forward through ddp_model.module reduces nothing and every "
        "rank steps on its own gradients. Keep .module for saving and loading state.",
        """loss = ddp_model(batch).loss / accum_steps  # the wrapper: its forward arms the sync
loss.backward()
# ddp_model.module is for state_dict() and attribute access, never for the training forward""",
    ),
    "pipeline-step": Fix(
        "pipeline-step",
        "A pipelining schedule reduces the stages' gradients at the end of every step() "
        "(after its last backward, outside autograd), and scales them by its micro-batch "
        "count again: call step() once per optimizer step with the whole accumulated batch, "
        "and raise n_microbatches instead of calling step() several times. torch 2.13's "
        "schedules have no argument to defer that reduction to a later step().",
        """schedule = ScheduleGPipe(stage, n_microbatches=micro_batches_per_step * accum_steps,
                        loss_fn=loss_fn)
# one step() per optimizer step: the schedule splits the batch into n_microbatches and
# reduces the gradients once, after the last backward
schedule.step(whole_batch, target=whole_target)
optimizer.step()
optimizer.zero_grad()""",
    ),
    "fsdp2-recurse": Fix(
        "fsdp2-recurse",
        "set_requires_gradient_sync(False, recurse=False) sets the root's own flag only: the "
        "FSDP modules inside it keep reduce-scattering. Keep recurse=True (the default), "
        "which sets every FSDP module under the root.",
        """for micro, batch in enumerate(micro_batches):
    is_last = micro == accum_steps - 1
    model.set_requires_gradient_sync(is_last)  # recurse=True: every FSDP module inside
    loss = model(batch).loss / accum_steps
    loss.backward()
optimizer.step()
optimizer.zero_grad()""",
    ),
    "static-graph": Fix(
        "static-graph",
        "DDP(static_graph=True) records its graph on the first backward of training, and "
        "that backward must sync (under no_sync torch 2.13 fails an internal assert, "
        "expect_autograd_hooks_). Sync only that first micro-batch, then no_sync on every "
        "micro-batch but each window's last; or build DDP without static_graph=True.",
        _STATIC_GRAPH_LOOP,
    ),
    "reduced-twice": Fix(
        "reduced-twice",
        "DDP already all-reduces (averages) these gradients in its buckets: the hand "
        "all-reduce reduces them a second time. Reduce each gradient once: exclude the "
        "parameters the hand all-reduce owns (experts reduced over their own group) from "
        "DDP before wrapping, or delete the hand all-reduce.",
        """from torch.nn.parallel import DistributedDataParallel as DDP

# before wrapping: DDP leaves these parameters to the hand reduction below
expert_names = [name for name, _ in model.named_parameters() if ".experts." in name]
DDP._set_params_and_buffers_to_ignore_for_model(model, expert_names)
ddp_model = DDP(model)

loss.backward()  # DDP reduces every other gradient here
for p in expert_params:  # and these, once, over the expert-data-parallel group
    dist.all_reduce(p.grad, op=dist.ReduceOp.AVG, group=expert_data_parallel_group)""",
    ),
}


def fix_for(cause: str) -> str | None:
    return {
        UNUSED_CAUSE: "ddp-unused-parameters",
        PIPELINE_CAUSE: "pipeline-step",
        RECURSE_CAUSE: "fsdp2-recurse",
        STATIC_FIRST_CAUSE: "static-graph",
        STATIC_FAILED_CAUSE: "static-graph",
        TWICE_CAUSE: "reduced-twice",
        NOT_FSDP_CAUSE: "fsdp-modules-toggle",
        "wrapper-bypassed": "call-wrapper",
    }.get(cause)
