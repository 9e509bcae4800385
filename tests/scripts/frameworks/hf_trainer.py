"""The Hugging Face Trainer on a tiny randomly initialised GPT-2 and synthetic tokens:
``hf_trainer.py [sync-each-batch]``. Nothing is downloaded (model built from a config, no
tokenizer). ``gradient_accumulation_steps=4``; ``sync-each-batch`` sets the Trainer's
``accelerator_config={"gradient_accumulation_kwargs": {"sync_each_batch": True}}``.
Run under ``syncscope profile --nproc-per-node 2``.
"""

import os
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

ACCUM = 4
STEPS = 2


class Tokens(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, 64, (n, 16), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def main() -> None:
    torch.manual_seed(0)
    model = GPT2LMHeadModel(
        GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=16)
    )
    accelerator_config = None
    if "sync-each-batch" in sys.argv[1:]:
        accelerator_config = {"gradient_accumulation_kwargs": {"sync_each_batch": True}}
    args = TrainingArguments(
        output_dir=tempfile.mkdtemp(prefix="syncscope-hf-"),
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
    if int(os.environ.get("RANK", "0")) == 0:  # ground truth: the gradient bytes of one sync
        print(f"grad_bytes={sum(p.numel() * p.element_size() for p in model.parameters())}")
    Trainer(model=model, args=args, train_dataset=Tokens(2 * 2 * ACCUM * STEPS)).train()


if __name__ == "__main__":
    main()
