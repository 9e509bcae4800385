"""The recorder's view of several wrapped models (syncscope.capture.recorder.models), on
stand-ins for FSDP's objects: which root an FSDP reduction reduces (found on the stack), and
whose gradients a backward changed. FSDP1 needs an accelerator in this torch, so its objects
are stand-ins named as FSDP1 names them; FSDP2 roots are checked on gloo end to end in
tests/integration/test_torch_recipes.py."""

from __future__ import annotations

import weakref
from typing import Any

import torch

from syncscope.capture.recorder.models import ModelIndex


class FullyShardedDataParallel(torch.nn.Module):  # FSDP1's class name, a stand-in
    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(4))
        self._all_fsdp_states = [self]


class _Index(ModelIndex):
    def __init__(self, *fsdp1: tuple[Any, str]) -> None:
        self.ddp_labels = {}
        self.fsdp_roots = weakref.WeakKeyDictionary()
        self.fsdp1_modules = weakref.WeakKeyDictionary(dict(fsdp1))
        self._init_models()


def _post_backward_hook(state: Any, index: _Index) -> str:  # FSDP1's hook signature
    return _reduce(index)


def _reduce(index: _Index) -> str:
    return index.fsdp_model_of_reduction(0)


def test_an_fsdp1_reduction_names_the_root_its_hook_runs_for() -> None:
    d, g = FullyShardedDataParallel(), FullyShardedDataParallel()
    index = _Index((d, "fsdp:D#0"), (g, "fsdp:G#1"))
    assert _post_backward_hook(g, index) == "fsdp:G#1"
    assert _post_backward_hook(d, index) == "fsdp:D#0"


def test_one_model_names_nothing_and_reads_nothing() -> None:
    d = FullyShardedDataParallel()
    index = _Index((d, "fsdp:D#0"))
    assert _post_backward_hook(d, index) == ""
    assert index.model_grad_state() is None


def test_a_backward_names_the_models_whose_gradients_it_changed() -> None:
    d, g = FullyShardedDataParallel(), FullyShardedDataParallel()
    index = _Index((d, "fsdp:D#0"), (g, "fsdp:G#1"))
    index._model_grads = index.model_grad_state()
    (g.weight * 2).sum().backward()
    assert index.models_with_new_grads() == ["fsdp:G#1"]
    index._model_grads = index.model_grad_state()
    (g.weight * d.weight).sum().backward()  # accumulates into G's gradient in place
    assert index.models_with_new_grads() == ["fsdp:D#0", "fsdp:G#1"]
