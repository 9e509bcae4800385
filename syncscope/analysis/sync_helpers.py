"""A sync helper of the user's own that did nothing: named, with what it missed.

Trainers wrap forward and backward in their own context manager (``with
grad_sync_context(model, is_boundary):``, ``with no_sync(model):``) that calls DDP's
``no_sync()`` only when the model it is given is a ``DistributedDataParallel``: under
FSDP2/HSDP, or with DDP inside another module, it enters nothing and every micro-batch syncs.
The advice then is not "put forward and backward inside no_sync()" (they already are, inside
the helper) but "this helper, at this line, changed no sync state": the capture records the
``with`` statements around each forward and backward call site (``MicroBatch.helpers``).
"""

from __future__ import annotations

from dataclasses import replace

from syncscope.model import Finding, Fix, SourceLocation, Window

HELPER_CAUSE = "sync-helper-no-op"
# causes a no-op helper explains better: the job meant to skip these syncs
REPLACED_CAUSES = frozenset(
    {
        "no-no_sync",
        "toggled-yet-reduced",
        "forward-not-seen",
        "reduced-unarmed",
        "toggle-missed-micro-batch",
        "fsdp-sync-on-early",
        "fsdp-all-reduce-early",
        "fsdp-sharded-accumulation",
        "hsdp-all-reduce-every-micro-batch",
    }
)

_WHAT_IT_MISSED = {
    "ddp-no_sync": (
        "the model it is given is not the DistributedDataParallel module itself (DDP is "
        "inside it), so it enters no no_sync(): call no_sync() on the DDP module (the one "
        "DistributedDataParallel(...) returned), or find it by walking the modules"
    ),
    "ddp-flag": (
        "the model it is given is not the DistributedDataParallel module itself, so the flag "
        "it sets is not DDP's: set require_backward_grad_sync on the DDP module"
    ),
    "fsdp2": (
        "under FSDP2 nothing it did reached an FSDP module: FSDP decides at backward from "
        "each FSDP module's own flag, so call set_requires_gradient_sync(is_last) on the "
        "FSDP modules themselves (before the backward)"
    ),
    "hsdp": (
        "under HSDP nothing it did reached an FSDP module: call "
        "set_requires_all_reduce(is_last) on the FSDP modules themselves (keeps the "
        "reduce-scatter, gradients stay sharded), or set_requires_gradient_sync(is_last) to "
        "skip both at a memory cost"
    ),
}


def _fsdp_target(finding: Finding) -> str:
    """What the run saw the helper's model to be, where that explains the no-op."""
    outer = finding.evidence.get("helper_target")
    modules = finding.evidence.get("fsdp_modules")
    names = ", ".join(map(str, modules)) if isinstance(modules, list) and modules else ""
    text = ""
    if isinstance(outer, str) and outer:
        text = (
            f"; the model the forward went through is a {outer}, not an FSDPModule, so a "
            "sync setter looked up on it is not FSDP's"
        )
    if names:
        text += f"; the FSDP modules inside it: {names}"
    return text


def helper_no_op(window: Window, position: int) -> SourceLocation | None:
    """The user's ``with`` around micro-batch ``position``'s forward and backward when the
    window's sync state never changed: no toggle turned sync off, no ``no_sync`` entered."""
    if not 0 <= position < len(window.micro_batches):
        return None
    mb = window.micro_batches[position]
    if not mb.helpers or any(not t.value for t in window.toggles):
        return None
    if mb.in_no_sync_at_forward or mb.in_no_sync_at_backward or mb.sync_each_batch:
        return None
    return mb.helpers[-1]  # the innermost


def helper_text(site: SourceLocation) -> str:
    return f"{site.function}() at {site}"


_SNIPPETS = {
    "ddp": """import contextlib
from torch.nn.parallel import DistributedDataParallel as DDP


def {name}(model, enabled=True):
    # the DDP module wherever it sits (a wrapper around it, torch.compile's module)
    ddp = next((m for m in model.modules() if isinstance(m, DDP)), None)
    return ddp.no_sync() if enabled and ddp is not None else contextlib.nullcontext()""",
    "fsdp2": """import contextlib
from torch.distributed.fsdp import FSDPModule
from torch.nn.parallel import DistributedDataParallel as DDP


@contextlib.contextmanager
def {name}(model, is_boundary):
    # the wrappers wherever they sit: model may be a module around them (PEFT, your own)
    for module in model.modules():
        if isinstance(module, FSDPModule):  # fully_shard: decides at backward
            module.{setter}(is_boundary, recurse=False)  # True again on the boundary
    ddp = next((m for m in model.modules() if isinstance(m, DDP)), None)
    if ddp is not None and not is_boundary:
        with ddp.no_sync():
            yield
    else:
        yield""",
}


def name_helper(finding: Finding) -> Finding:
    """The fix of a ``sync-helper-no-op`` finding, in terms of the helper it names."""
    helper = next((s for role, s in finding.sites if role == "sync_helper"), None)
    if finding.cause != HELPER_CAUSE or helper is None or finding.fix is None:
        return finding
    style = finding.fix.style
    missed = _WHAT_IT_MISSED.get(style, "check what it does under this wrapper")
    if style in ("fsdp2", "hsdp"):
        missed += _fsdp_target(finding)
    summary = (
        f"Forward and backward already run inside your helper {helper_text(helper)}, but "
        f"it changed no sync state, so every micro-batch synced: {missed}."
    )
    name = helper.function.rsplit(".", 1)[-1] or "sync_helper"
    setter = "set_requires_all_reduce" if style == "hsdp" else "set_requires_gradient_sync"
    template = _SNIPPETS["ddp" if style.startswith("ddp") else "fsdp2"]
    if style not in _WHAT_IT_MISSED:  # a framework's own idiom: its snippet stays
        template = finding.fix.snippet.replace("{", "{{").replace("}", "}}")
    snippet = template.format(name=name, setter=setter)
    return replace(finding, fix=Fix(style, summary, snippet))
