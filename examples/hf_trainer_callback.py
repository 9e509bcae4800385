"""The Hugging Face Trainer with syncscope's callback: ``train()`` fails when a window has
more than one grad sync.

    torchrun --standalone --nproc-per-node 2 examples/hf_trainer_callback.py

A tiny randomly initialised GPT-2 built from a config (nothing downloaded) on synthetic
tokens, 2 CPU ranks (gloo), ``gradient_accumulation_steps=4``, 2 optimizer steps. The
Trainer syncs once per window, so ``max_grad_syncs_per_window=1`` holds and each rank prints
``grad syncs per window [1, 1]``. ``--sync-each-batch`` turns on Accelerate's
``sync_each_batch`` (a sync on every micro-batch): ``train()`` raises AssertionError with
``assert_syncs``'s message, the windows and the Trainer's fix, on every rank.
"""

import argparse
import os
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

from syncscope.integrations.transformers import SyncscopeCallback

ACCUM = 4  # micro-batches per optimizer step
STEPS = 2  # optimizer steps (windows)


class Tokens(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __init__(self, n: int) -> None:
        self.ids = torch.randint(0, 64, (n, 16), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sync-each-batch", action="store_true", help="sync every micro-batch")
    args = parser.parse_args()

    torch.manual_seed(0)
    model = GPT2LMHeadModel(
        GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=16)
    )
    accelerator_config = None
    if args.sync_each_batch:
        accelerator_config = {"gradient_accumulation_kwargs": {"sync_each_batch": True}}
    training_args = TrainingArguments(
        output_dir=tempfile.mkdtemp(prefix="hf-trainer-callback-"),
        per_device_train_batch_size=2,
        gradient_accumulation_steps=ACCUM,
        max_steps=STEPS,
        learning_rate=1e-3,
        use_cpu=True,
        report_to="none",
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
        accelerator_config=accelerator_config,
    )
    sync_check = SyncscopeCallback(max_grad_syncs_per_window=1)
    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=Tokens(2 * 2 * ACCUM * STEPS),  # 2 ranks x batch 2
        callbacks=[sync_check],
    )
    trainer.train()

    stats = sync_check.stats  # the same syncscope.Stats as track() gives
    ranks = [r.rank for r in stats.run.ranks]  # gathered from every rank at the end of train()
    print(
        f"rank {stats.rank} of {stats.world_size}: grad syncs per window "
        f"{stats.grad_syncs_per_window}, verdict {stats.verdict}, ranks seen {ranks}"
    )


if __name__ == "__main__":
    main()
