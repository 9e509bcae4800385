"""The Hugging Face Trainer driving DeepSpeed on CPU (``DS_ACCELERATOR=cpu``, gloo):
``hf_trainer_deepspeed.py STAGE TRUTH_DIR``, a tiny randomly initialised GPT-2 (built from a
config, nothing downloaded), synthetic tokens, ``gradient_accumulation_steps=4``, 3 steps,
``TrainingArguments(deepspeed={... "zero_optimization": {"stage": STAGE}})``.

Two CPU ranks need one thing the Trainer does not do itself: Accelerate's ``PartialState``,
created by ``TrainingArguments`` for a DeepSpeed config, gets no ``backend`` on that path, finds
no GPU to pick one, and so records ``num_processes = 1`` (its ``backend is None`` branch) even
though ``deepspeed.comm`` has just initialised a gloo group of 2: the Trainer then computes a
world size of 1 and DeepSpeed refuses ``train_batch_size`` (2 x 4 x 1 != 2 x 4 x 2). Creating
the ``PartialState`` first with ``backend="gloo"`` (and ``ACCELERATE_USE_DEEPSPEED``, as
``accelerate launch`` sets it) and passing ``accelerator_config={"use_configured_state": True}``
gives it the real world size; the Trainer and DeepSpeed then agree.

Ground truth, taken without syncscope: every ``torch.distributed`` collective is counted by a
wrapper of the Python API (op, bytes, window, micro-batch in the window, and whether it came
inside ``DeepSpeedEngine.forward``/``backward``/``step``), the engine's boundaries are taken
at its ``step``; each rank writes it as JSON to ``TRUTH_DIR/rank<R>.json``. Run under
``syncscope profile --nproc-per-node 2``.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("ACCELERATE_USE_DEEPSPEED", "true")  # what `accelerate launch` would set

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the checkout: tests.helpers
from tests.helpers.truth import count_collectives, phase

GAS = 4
STEPS = 3
BATCH = 2
_state: dict[str, object] = {"micro": 0, "window": 0, "counting": False, "phase": "other"}
_log: list[dict[str, object]] = []
_boundaries: list[int] = []
count_collectives(_state, _log)  # installed before DeepSpeed binds the API

from accelerate import PartialState  # noqa: E402
from deepspeed.runtime.engine import DeepSpeedEngine  # noqa: E402
from hf_trainer import Tokens  # noqa: E402  (the same synthetic tokens)
from transformers import (  # noqa: E402
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

for _name in ("forward", "backward", "step"):
    setattr(
        DeepSpeedEngine,
        _name,
        phase(_name, getattr(DeepSpeedEngine, _name), _state, _boundaries),
    )


class Count(TrainerCallback):  # type: ignore[misc]
    """Counts from the first training step on (not the engine's set-up)."""

    def on_train_begin(self, *args: object, **kwargs: object) -> None:
        _state["counting"] = True

    def on_train_end(self, *args: object, **kwargs: object) -> None:
        _state["counting"] = False


def main() -> None:
    stage = int(sys.argv[1])
    truth_dir = sys.argv[2]
    state = PartialState(backend="gloo")  # the world size the Trainer lacks on CPU
    torch.manual_seed(0)
    model = GPT2LMHeadModel(
        GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=16)
    )
    grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    config = {
        "train_micro_batch_size_per_gpu": "auto",
        "train_batch_size": "auto",
        "gradient_accumulation_steps": "auto",
        "optimizer": {"type": "AdamW", "params": {"lr": "auto"}},
        "zero_optimization": {"stage": stage},
        "zero_allow_untested_optimizer": True,
    }
    args = TrainingArguments(
        output_dir=tempfile.mkdtemp(prefix="syncscope-hf-ds-"),
        per_device_train_batch_size=BATCH,
        gradient_accumulation_steps=GAS,
        max_steps=STEPS,
        learning_rate=1e-3,
        deepspeed=config,
        accelerator_config={"use_configured_state": True},
        report_to="none",
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    assert args.world_size == dist.get_world_size() == state.num_processes, args.world_size
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=Tokens(BATCH * 2 * GAS * STEPS),
        callbacks=[Count()],
    )
    trainer.train()
    truth = {
        "rank": dist.get_rank(),
        "stage": stage,
        "world_size": args.world_size,
        "grad_bytes": grad_bytes,
        "boundaries": _boundaries,
        "collectives": _log,
    }
    with open(os.path.join(truth_dir, f"rank{dist.get_rank()}.json"), "w") as f:
        json.dump(truth, f)


if __name__ == "__main__":
    main()
