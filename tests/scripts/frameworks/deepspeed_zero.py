"""DeepSpeed on CPU (``DS_ACCELERATOR=cpu``, gloo) with a tiny MLP:
``deepspeed_zero.py STAGE [MODE [TRUTH_DIR]]``, ``gradient_accumulation_steps=4`` and the loop
``loss = engine(x); engine.backward(loss); engine.step()`` on every micro-batch.

MODE: ``clean`` (default); ``buckets`` (ZeRO-2 with ``overlap_comm``, ``contiguous_gradients``
and a small ``reduce_bucket_size``); the misuses: ``step-every-2`` (``engine.step()``
once per 2 micro-batches); ``manual-twice`` (the user all-reduces the model's gradients at
the boundary beside DeepSpeed's reduction); ``manual-every`` (the user all-reduces the
gradients after every backward); ``gas1-by-hand`` (``gradient_accumulation_steps`` 1 in the
config while the loop accumulates 4 micro-batches by hand); ``diverge`` (rank 0 alone
scales a weight after each boundary: ranks train different models under ZeRO-0);
``rank0-load`` (rank 0 alone changes its weights after ``deepspeed.initialize``, as a
checkpoint loaded on one rank: window 0 computes with different weights).

Ground truth, taken without syncscope: every ``torch.distributed`` collective the job issues
is counted by a wrapper of the Python API (op, bytes, the micro-batch it came in, and
whether the step that followed was DeepSpeed's boundary), and the parameters are compared
across ranks (by the test, from the files) after every boundary. Each rank writes it as JSON to ``TRUTH_DIR/rank<R>.json`` (or ``$DS_TRUTH_DIR``).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the checkout: tests.helpers
from tests.helpers.truth import count_collectives

GAS = 4
# mode "buckets": overlapped, contiguous reduction in small buckets (more collectives per
# reduction, some issued from gradient hooks inside loss.backward())
BUCKETS = {"overlap_comm": True, "contiguous_gradients": True, "reduce_bucket_size": 300}
WINDOWS = 3
_state: dict[str, object] = {"micro": 0, "window": 0, "counting": False, "phase": "other"}
_log: list[dict[str, object]] = []
count_collectives(_state, _log)  # installed before DeepSpeed binds the API

import deepspeed  # noqa: E402


def main() -> None:
    stage = int(sys.argv[1])
    mode = sys.argv[2] if len(sys.argv) > 2 else "clean"
    deepspeed.init_distributed(dist_backend="gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
    gas = 1 if mode == "gas1-by-hand" else GAS
    config = {
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": gas,
        "optimizer": {"type": "SGD", "params": {"lr": 0.01}},
        "zero_optimization": {"stage": stage, **(BUCKETS if mode == "buckets" else {})},
        "zero_allow_untested_optimizer": True,
    }
    engine, _, _, _ = deepspeed.initialize(
        model=model, model_parameters=model.parameters(), config=config
    )
    # the model's gradient bytes (ZeRO-3 leaves each parameter empty but for ds_numel)
    grad_bytes = sum(getattr(p, "ds_numel", p.numel()) * 4 for p in model.parameters())
    gen = torch.Generator().manual_seed(100 + rank)
    boundaries: list[int] = []
    params_after_boundary: list[list[float]] = []
    params_before_window: list[list[float]] = []
    micro_in_window = 0
    if (
        mode == "rank0-load" and rank == 0
    ):  # rank 0 alone loads (here: changes) its weights after init
        with torch.no_grad():
            next(model.parameters()).mul_(1.01)
    _state["counting"] = True
    for i in range(WINDOWS * GAS * (2 if mode == "step-every-2" else 1)):
        _state["micro"] = micro_in_window
        x = torch.randn(4, 16, generator=gen)
        if mode in ("diverge", "rank0-load") and micro_in_window == 0:
            _state["counting"] = False  # the weights each window computes with (ZeRO 0-1)
            params_before_window.append(_params(engine))
            _state["counting"] = True
        _state["phase"] = "forward"
        loss = engine(x).pow(2).mean()
        _state["phase"] = "backward"
        engine.backward(loss)
        _state["phase"] = "user"
        if mode == "manual-every" or (mode == "manual-twice" and (i + 1) % GAS == 0):
            for p in model.parameters():
                if p.grad is not None:
                    dist.all_reduce(p.grad)
        if mode == "step-every-2" and i % 2 == 0:
            micro_in_window += 1
            continue
        if mode == "gas1-by-hand" and (i + 1) % GAS:
            micro_in_window += 1
            continue
        boundary = engine.is_gradient_accumulation_boundary()
        _state["phase"] = "step"
        engine.step()
        _state["phase"] = "other"
        if boundary:
            boundaries.append(i)
            _state["counting"] = False
            params_after_boundary.append(_params(engine))
            if mode == "diverge" and rank == 0:  # a rank-local change of the weights
                with torch.no_grad():
                    next(model.parameters()).mul_(1.01)
            _state["counting"] = True
            _state["window"] += 1
            micro_in_window = 0
        else:
            micro_in_window += 1
        _state["micro"] = micro_in_window
    _state["counting"] = False
    truth = {
        "rank": rank,
        "stage": stage,
        "mode": mode,
        "grad_bytes": grad_bytes,
        "boundaries": boundaries,
        "params": params_after_boundary,
        "params_before": params_before_window,
        "collectives": _log,
    }
    out = sys.argv[3] if len(sys.argv) > 3 else os.environ.get("DS_TRUTH_DIR")
    if out:
        with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
            json.dump(truth, f)


def _params(engine: object) -> list[float]:
    """The whole parameters after the step (gathered under ZeRO-3: that gather is not
    counted), compared across ranks by the test, with no collective of this script's own."""
    params = list(engine.module.parameters())  # type: ignore[attr-defined]
    if int(engine.zero_optimization_stage()) == 3:  # type: ignore[attr-defined]
        with deepspeed.zero.GatheredParameters(params):
            return torch.cat([p.detach().reshape(-1).clone() for p in params]).tolist()
    return torch.cat([p.detach().reshape(-1) for p in params]).tolist()


if __name__ == "__main__":
    main()
