"""Fix snippets in the idiom of the wrapper a run used, and the cost arithmetic findings share."""

from __future__ import annotations

from syncscope.analysis.deepspeed_zero import SNIPPETS as DEEPSPEED_SNIPPETS
from syncscope.analysis.reductions import SNIPPETS as REDUCTION_SNIPPETS
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
dist.all_reduce(flat, group=group)  # the group they were reduced over (None: the world)
flat /= dist.get_world_size(group)
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
    "stuck-rank": Fix(
        "stuck-rank",
        "The other ranks wait for this rank in a collective while it is stuck outside "
        "communication: find what it waits on at that line (a lock, a queue, a file, a child "
        "process, a sleep); py-spy dump --pid PID shows every thread's stack.",
        """# see where a stuck rank's threads are, without stopping it
#   py-spy dump --pid PID
# and bound what it waits on, so a stall fails loudly instead of hanging the job
item = work_queue.get(timeout=600)""",
    ),
    "start-up": Fix(
        "start-up",
        "Every rank must reach init_process_group with the launcher's RANK, WORLD_SIZE, "
        "MASTER_ADDR and MASTER_PORT: don't override them in the script, and don't make one "
        "rank do long work (a download, a sleep) before it while the others wait there.",
        """# let torchrun's environment say who meets where; do slow set-up after the group
dist.init_process_group("gloo")  # reads RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
if dist.get_rank() == 0:
    prepare_data()  # the others wait in the barrier, not in the rendezvous
dist.barrier()""",
    ),
    "balance-ranks": Fix(
        "balance-ranks",
        "Share the work the other ranks wait for (an evaluation, a checkpoint, logging): give "
        "each rank its part, or run it beside training; while they wait in a collective their "
        "devices sit idle, and a wait longer than the process group's timeout ends the job.",
        """# every rank evaluates its own shard; the results are summed
sampler = DistributedSampler(eval_set, shuffle=False)
loss = evaluate(model, DataLoader(eval_set, sampler=sampler))
dist.all_reduce(loss)""",
    ),
    # -- in a framework's own terms: the knob the framework offers, not hand-written code --
    "lightning": Fix(
        "lightning",
        "Lightning accumulates for you: set accumulate_grad_batches on the Trainer and keep "
        "automatic optimization. It runs the micro-batches before the last under DDP's "
        "no_sync and the last one inside optimizer.step(closure); don't call no_sync(), "
        "require_backward_grad_sync, optimizer.step() or zero_grad() by hand in training_step.",
        """trainer = L.Trainer(strategy="ddp", accumulate_grad_batches=accum_steps)
trainer.fit(model, train_dataloaders=loader)

# in the LightningModule: return the loss, Lightning does the rest
def training_step(self, batch, batch_idx):
    return self.compute_loss(batch)""",
    ),
    "lightning-window": Fix(
        "lightning-window",
        "Lightning steps at the end of every epoch, even when fewer than "
        "accumulate_grad_batches micro-batches remain: make the batches per epoch (dataset "
        "size / (batch size x world size), or limit_train_batches) a multiple of "
        "accumulate_grad_batches.",
        """batches_per_epoch = len(loader)  # per rank
trainer = L.Trainer(
    strategy="ddp",
    accumulate_grad_batches=accum_steps,
    limit_train_batches=batches_per_epoch // accum_steps * accum_steps,  # whole windows
)""",
    ),
    "lightning-zero-grad": Fix(
        "lightning-zero-grad",
        "Lightning zeroes gradients itself at the first micro-batch of each window: don't call "
        "optimizer.zero_grad() or model.zero_grad() in training_step or in hooks that run "
        "between micro-batches (on_before_backward, on_after_backward).",
        """def training_step(self, batch, batch_idx):
    loss = self.compute_loss(batch)
    return loss  # no self.zero_grad() / optimizer.zero_grad() here""",
    ),
    "hf-trainer": Fix(
        "hf-trainer",
        "The Trainer accumulates through Accelerate: set gradient_accumulation_steps in "
        "TrainingArguments and let it skip the sync. In a Trainer subclass (compute_loss, "
        "training_step) don't enter model.no_sync() or call optimizer.step()/zero_grad() "
        "yourself, and keep self.accelerator.backward(loss).",
        """args = TrainingArguments(
    output_dir="out",
    per_device_train_batch_size=batch_size,
    gradient_accumulation_steps=accum_steps,
)
Trainer(model=model, args=args, train_dataset=train_dataset).train()""",
    ),
    "hf-trainer-sync-each-batch": Fix(
        "hf-trainer-sync-each-batch",
        "Deliberate: the Trainer's accelerator_config asks Accelerate to sync every "
        "micro-batch (less gradient memory). If memory allows, turn it off there to reduce "
        "once per optimizer step.",
        """args = TrainingArguments(
    output_dir="out",
    gradient_accumulation_steps=accum_steps,
    accelerator_config={"gradient_accumulation_kwargs": {"sync_each_batch": False}},
)""",
    ),
    "hf-trainer-window": Fix(
        "hf-trainer-window",
        "The Trainer steps at the end of each epoch even on a partial window: make the "
        "batches per epoch (dataset size / (per_device_train_batch_size x world size)) a "
        "multiple of gradient_accumulation_steps, or train by max_steps.",
        """args = TrainingArguments(
    output_dir="out",
    per_device_train_batch_size=batch_size,
    gradient_accumulation_steps=accum_steps,
    max_steps=total_steps,  # or size the dataset in whole windows
)""",
    ),
    "hf-trainer-zero-grad": Fix(
        "hf-trainer-zero-grad",
        "The Trainer zeroes gradients after each optimizer step: don't call "
        "model.zero_grad() or optimizer.zero_grad() in compute_loss, training_step or a "
        "callback's on_substep_end (it runs between micro-batches).",
        """class MyTrainer(Trainer):
    def compute_loss(self, model, inputs, return_outputs=False, **kwargs):
        outputs = model(**inputs)
        return (outputs.loss, outputs) if return_outputs else outputs.loss  # no zero_grad""",
    ),
    "accelerate-window": Fix(
        "accelerate-window",
        "Let Accelerate decide when a window ends: gradient_accumulation_steps with "
        "accumulate() instead of a hand-written modulo, and sync_with_dataloader=True (the "
        "default) so the short window at the end of the dataloader still syncs and steps; or "
        "size the dataloader in whole windows.",
        """plugin = GradientAccumulationPlugin(num_steps=accum_steps, sync_with_dataloader=True)
accelerator = Accelerator(gradient_accumulation_plugin=plugin)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
for batch in loader:  # len(loader) a multiple of accum_steps keeps every window full
    with accelerator.accumulate(model):
        loss = model(batch).loss
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()""",
    ),
    "accelerate-zero-grad": Fix(
        "accelerate-zero-grad",
        "Inside accumulate(), zero through the prepared optimizer (a no-op until the window's "
        "last micro-batch); model.zero_grad() is not wrapped and wipes the gradients "
        "accumulated so far.",
        """with accelerator.accumulate(model):
    loss = model(batch).loss
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()  # the prepared optimizer's, not model.zero_grad()""",
    ),
}

# Under a framework, the generic fix (hand-written no_sync, a modulo gate, ...) becomes the
# framework's own knob; fixes with no framework form (FSDP sharding trade-offs, bucketing,
# identical collective sequences) stay as they are.
_SYNC_STYLES = ("ddp-no_sync", "ddp-flag", "accelerate", "fsdp2")
FRAMEWORK_FIXES: dict[str, dict[str, str]] = {
    "lightning": {
        **dict.fromkeys(_SYNC_STYLES, "lightning"),
        "step-gate": "lightning-window",
        "zero-grad": "lightning-zero-grad",
    },
    "transformers": {
        **dict.fromkeys(_SYNC_STYLES, "hf-trainer"),
        "sync-each-batch": "hf-trainer-sync-each-batch",
        "step-gate": "hf-trainer-window",
        "zero-grad": "hf-trainer-zero-grad",
    },
    "accelerate": {
        **dict.fromkeys(_SYNC_STYLES, "accelerate"),
        "step-gate": "accelerate-window",
        "zero-grad": "accelerate-zero-grad",
    },
}
FRAMEWORK_FIXES["deepspeed"] = {
    **dict.fromkeys(_SYNC_STYLES, "deepspeed"),
    "step-gate": "deepspeed-step",
}
SNIPPETS.update(DEEPSPEED_SNIPPETS)
SNIPPETS.update(REDUCTION_SNIPPETS)
FRAMEWORK_NAMES = {
    "deepspeed": "DeepSpeed",
    "lightning": "PyTorch Lightning",
    "transformers": "Hugging Face Trainer",
    "accelerate": "Accelerate",
}


def in_framework(rank: RankRun, style: str) -> str:
    """The fix in the terms of the framework the rank ran under (recorded at capture)."""
    return FRAMEWORK_FIXES.get(rank.framework, {}).get(style, style)


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
