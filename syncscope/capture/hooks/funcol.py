"""Functional collectives issued from inside a tensor subclass's dispatch (DTensor).

The functional collectives' kernel sits at the ``ADInplaceOrView`` key
(``syncscope.capture.hooks.collectives``). A DTensor op runs its sharding code in
``__torch_dispatch__``, below the autograd keys, where torch has excluded ``ADInplaceOrView``
for the thread: a collective it issues there on the local shards (the all-reduce that makes
a ``Partial`` norm ``Replicate``: ``clip_grad_norm_`` over FSDP2's sharded gradients) would
go straight to the backend, unseen. So torch's ``torch.distributed._functional_collectives``
functions that DTensor calls are wrapped: where ``ADInplaceOrView`` is excluded, the call runs
with that one key allowed again, and reaches the same kernel as every other functional
collective (recorded once, by the same rules). Elsewhere the wrapper calls through.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

# the functions DTensor's placements and redistribution call (torch 2.13), and their kin
FUNCTIONS = (
    "all_reduce",
    "all_reduce_coalesced",
    "all_gather_single",
    "all_gather_tensor",
    "all_gather_into_tensor_coalesced",
    "reduce_scatter_single",
    "reduce_scatter_tensor",
    "reduce_scatter_tensor_coalesced",
    "all_to_all_single",
    "broadcast",
)
_AD_INPLACE = torch._C.DispatchKey.ADInplaceOrView


def _reaching_the_kernel(function: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(function)
    def call(*args: Any, **kwargs: Any) -> Any:
        if torch.compiler.is_compiling():
            return function(*args, **kwargs)
        excluded = torch._C._dispatch_tls_local_exclude_set()
        if not excluded.has(_AD_INPLACE):
            return function(*args, **kwargs)
        included = torch._C._dispatch_tls_local_include_set()
        with torch._C._ForceDispatchKeyGuard(included, excluded.remove(_AD_INPLACE)):
            return function(*args, **kwargs)

    return call


def patch_functional_collectives(patch: Callable[[Any, str, Any], None]) -> None:
    """Wrap ``FUNCTIONS`` of ``torch.distributed._functional_collectives`` where they exist."""
    try:
        from torch.distributed import _functional_collectives as funcol
    except ImportError:
        return
    for name in FUNCTIONS:
        function = getattr(funcol, name, None)
        if callable(function):
            patch(funcol, name, _reaching_the_kernel(function))
