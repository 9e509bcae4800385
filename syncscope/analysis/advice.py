"""Fix snippets in the idiom of the wrapper a run used, and the cost arithmetic findings share."""

from __future__ import annotations

from collections.abc import Sequence

from syncscope.model import Fix, RankRun, Window

SNIPPETS: dict[str, Fix] = {
    "ddp-no_sync": Fix(
        "ddp-no_sync",
        "Put forward *and* backward inside no_sync() on every micro-batch but the last: "
        "DDP decides at forward time whether the backward all-reduces.",
        """import contextlib

for micro, batch in enumerate(micro_batches):
    is_last = micro == accum_steps - 1
    with model.no_sync() if not is_last else contextlib.nullcontext():
        loss = model(batch).loss / accum_steps  # forward inside: DDP decides here
        loss.backward()
optimizer.step()
optimizer.zero_grad()""",
    ),
    "ddp-flag": Fix(
        "ddp-flag",
        "Set require_backward_grad_sync *before* the forward (as nanoGPT does); set after "
        "the forward it only takes effect on the next micro-batch.",
        """for micro, batch in enumerate(micro_batches):
    model.require_backward_grad_sync = micro == accum_steps - 1  # before the forward
    loss = model(batch).loss / accum_steps
    loss.backward()
optimizer.step()
optimizer.zero_grad()""",
    ),
    "accelerate": Fix(
        "accelerate",
        "Let Accelerate count micro-batches: accumulate() enters no_sync around forward and "
        "backward and makes step()/zero_grad() no-ops until the last micro-batch.",
        """accelerator = Accelerator(gradient_accumulation_steps=accum_steps)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
for batch in loader:
    with accelerator.accumulate(model):
        loss = model(batch).loss
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()""",
    ),
    "fsdp2": Fix(
        "fsdp2",
        "FSDP decides at backward time: call set_requires_gradient_sync(is_last) before each "
        "micro-batch (it must be True again for the last backward).",
        """for micro, batch in enumerate(micro_batches):
    is_last = micro == accum_steps - 1
    model.set_requires_gradient_sync(is_last)  # covers the backward that follows
    loss = model(batch).loss / accum_steps
    loss.backward()
optimizer.step()
optimizer.zero_grad()""",
    ),
    "hsdp": Fix(
        "hsdp",
        "Under HSDP call set_requires_all_reduce(is_last): the reduce-scatter still runs on "
        "every micro-batch (gradients stay sharded) and only the cross-replica all-reduce "
        "waits for the last. The alternative, set_requires_gradient_sync(is_last), skips the "
        "reduce-scatter too and saves more bytes, but holds unsharded gradients between "
        "micro-batches (the extra memory is in the cost).",
        """for micro, batch in enumerate(micro_batches):
    is_last = micro == accum_steps - 1
    model.set_requires_all_reduce(is_last)  # reduce-scatter stays; all-reduce on the last only
    # memory for bytes instead: model.set_requires_gradient_sync(is_last)
    loss = model(batch).loss / accum_steps
    loss.backward()
optimizer.step()
optimizer.zero_grad()""",
    ),
    "sync-each-batch": Fix(
        "sync-each-batch",
        "Deliberate: syncing every micro-batch keeps gradient memory low. If memory allows, "
        "drop sync_each_batch=True to reduce once per step.",
        """plugin = GradientAccumulationPlugin(num_steps=accum_steps, sync_each_batch=False)
accelerator = Accelerator(gradient_accumulation_plugin=plugin)""",
    ),
    "fsdp-sharded": Fix(
        "fsdp-sharded",
        "Deliberate trade-off: reduce-scattering every micro-batch keeps gradients sharded. "
        "If memory allows, skip it on all but the last micro-batch.",
        """model.set_requires_gradient_sync(micro == accum_steps - 1)  # before each micro-batch""",
    ),
    "zero-grad": Fix(
        "zero-grad",
        "Zero gradients once per optimizer step, after step(), never between micro-batches.",
        """for micro, batch in enumerate(micro_batches):
    loss = model(batch).loss / accum_steps
    loss.backward()
optimizer.step()
optimizer.zero_grad()  # here, once per window""",
    ),
    "step-gate": Fix(
        "step-gate",
        "Gate the step on the count of micro-batches done, so every window has N of them "
        "(with i counting from 0, step when (i + 1) % N == 0); size epochs as a multiple "
        "of N, or drop the leftover micro-batches, rather than stepping on a short window.",
        """for i, batch in enumerate(loader):
    ...
    loss.backward()
    if (i + 1) % accum_steps == 0:
        optimizer.step()
        optimizer.zero_grad()""",
    ),
    "bucket": Fix(
        "bucket",
        "Reduce gradients in a few large buckets: let DDP do it, or flatten before reducing.",
        """from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

grads = [p.grad for p in model.parameters() if p.grad is not None]
flat = _flatten_dense_tensors(grads)
dist.all_reduce(flat)
flat /= dist.get_world_size()
for g, synced in zip(grads, _unflatten_dense_tensors(flat, grads)):
    g.copy_(synced)""",
    ),
    "same-sequence": Fix(
        "same-sequence",
        "Every rank must issue the same collectives in the same order: make window "
        "boundaries and any rank-dependent branches identical on all ranks.",
        """# decide data-dependent control flow collectively, e.g.
stop = torch.tensor(float(local_should_stop))
dist.all_reduce(stop, op=dist.ReduceOp.MAX)
if stop.item():
    break""",
    ),
}


def fix_style(rank: RankRun, window: Window) -> str:
    """The idiom the script already speaks: Accelerate, the DDP flag, no_sync, or FSDP2."""
    if any(mb.sync_each_batch is not None for mb in window.micro_batches):
        return "accelerate"
    wrapper = window.micro_batches[0].wrapper if window.micro_batches else "none"
    if wrapper == "none" and rank.wrappers:
        wrapper = rank.wrappers[0].kind
    if wrapper == "fsdp":
        return "fsdp2"
    if any(t.how == "require_backward_grad_sync" for t in window.toggles):
        return "ddp-flag"
    return "ddp-no_sync"


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0
