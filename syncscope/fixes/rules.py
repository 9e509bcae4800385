"""The rules: one class per problem, each with a code, a message and an optional rewrite.

A rule looks at one accumulation loop in its ``Context`` and returns a ``Violation`` or
None. A violation without a rewrite carries a suggestion instead. Rewrites only remove a
wrong construct or add the canonical form (``canonical.canonical_rewrite``); the driver
(``codemod``) applies them one at a time and analyzes again, so a wrong toggle that is
stripped comes back in the right place through ``NoSyncSuppression``.

Every judgement follows the wrapper's semantics (docs/concepts.md, "Sync intent per wrapper"):
DDP decides at forward, FSDP at backward, Accelerate's ``accumulate`` covers both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import libcst as cst

from syncscope.fixes import edits
from syncscope.fixes.canonical import Context, canonical_rewrite
from syncscope.fixes.edits import Edit
from syncscope.fixes.gates import agree, code_of, effective
from syncscope.fixes.loops import Toggle
from syncscope.fixes.resolve import WRAPPER_WORDS
from syncscope.fixes.syntax import contains, is_backward, statement_call

SUGGEST_STYLE = (
    "name the wrapper with --style (no_sync or flag for DDP, fsdp2, accelerate) "
    "or pass --from RUN_DIR from `syncscope profile`"
)


@dataclass
class Violation:
    code: str
    name: str
    message: str
    line: int
    rewrite: Edit | None = None
    suggestion: str = ""


class Rule:
    code: ClassVar[str]
    name: ClassVar[str]

    def check(self, ctx: Context) -> Violation | None:
        raise NotImplementedError

    def found(
        self, ctx: Context, message: str, rewrite: Edit | None, why_not: str = "", line: int = 0
    ) -> Violation:
        suggestion = "" if rewrite is not None else why_not
        return Violation(self.code, self.name, message, line or ctx.loop.line, rewrite, suggestion)


def _n(ctx: Context) -> str:
    gate = ctx.loop.last_gate
    return gate.pred.n if gate is not None else "N"


def _sync_toggles(ctx: Context) -> list[Toggle]:
    return [t for t in ctx.loop.toggles if t.kind != "accumulate"]


def _strip(ctx: Context) -> Edit:
    return edits.strip_toggles(ctx.loop, _sync_toggles(ctx))


class UnresolvedWrapper(Rule):
    code = "SYN100"
    name = "unresolved-wrapper"

    def check(self, ctx: Context) -> Violation | None:
        if ctx.wrapper is not None or not ctx.distributed:
            return None
        return self.found(
            ctx,
            f"accumulation loop, but {ctx.why_unresolved}: cannot tell where its sync belongs",
            None,
            SUGGEST_STYLE,
        )


class NoSyncSuppression(Rule):
    code = "SYN101"
    name = "no-sync-suppression"

    def check(self, ctx: Context) -> Violation | None:
        loop = ctx.loop
        if ctx.wrapper is None or loop.style == "accumulate" or loop.toggles:
            return None
        n = _n(ctx)
        if ctx.wrapper == "fsdp2" and ctx.hsdp:
            message = (
                f"HSDP all-reduces across replicas on every micro-batch ({n} per window, 1 "
                "needed); set_requires_all_reduce skips it and keeps gradients sharded"
            )
        elif ctx.wrapper == "fsdp2":
            message = (
                f"FSDP2 reduce-scatters on every micro-batch ({n} per window, 1 needed); "
                f"toggling saves {n} - 1 per window but holds unsharded gradients between "
                "micro-batches (memory trade-off)"
            )
        else:
            message = (
                f"no sync suppression: {WRAPPER_WORDS[ctx.wrapper]} reduces gradients on every "
                f"micro-batch ({n} per window, 1 needed)"
            )
        rewrite, why_not = canonical_rewrite(ctx)
        return self.found(ctx, message, rewrite, why_not)


class NoSyncBackwardOnly(Rule):
    code = "SYN102"
    name = "no_sync-backward-only"

    def check(self, ctx: Context) -> Violation | None:
        if ctx.wrapper not in ("ddp", "accelerate"):
            return None
        loop = ctx.loop
        for toggle in loop.toggles:
            if toggle.kind == "no_sync" and toggle.covers == "backward":
                message = (
                    "no_sync() wraps the backward only: DDP decides at forward, so every "
                    "micro-batch still all-reduces"
                )
                rewrite = None
                if toggle.node is loop.body[toggle.index] and loop.forward < toggle.index:
                    rewrite = edits.extend_with_over_forward(loop.loop, loop.forward, toggle.index)
                return self.found(ctx, message, rewrite or _strip(ctx), line=toggle.line)
        return None


class FsdpToggleMisplaced(Rule):
    code = "SYN103"
    name = "fsdp-toggle-not-at-backward"

    def check(self, ctx: Context) -> Violation | None:
        loop = ctx.loop
        if ctx.wrapper not in ("fsdp1", "fsdp2"):
            return None
        setters = [t for t in loop.toggles if t.kind == "setter"]
        before = [t for t in setters if t.index < loop.backward]
        # several models (a GAN's D and G): a setter between two backwards gates the later
        # one, so only a setter after the body's last backward comes too late
        last_backward = max(
            (i for i, s in enumerate(loop.body) if contains(s, is_backward)), default=loop.backward
        )
        for toggle in loop.toggles:
            forward_only = toggle.kind == "no_sync" and toggle.covers == "forward"
            after_backward = toggle.kind == "setter" and toggle.index > last_backward
            enabled_last = bool(before) and toggle is before[-1] and _literal(toggle, "True")
            if forward_only or after_backward or (enabled_last and len(setters) > 1):
                message = (
                    "the sync toggle does not hold at backward: FSDP decides at backward, so "
                    "every micro-batch still reduce-scatters"
                )
                return self.found(ctx, message, _strip(ctx), line=toggle.line)
        return None


def _literal(toggle: Toggle, value: str) -> bool:
    node = toggle.node
    call = statement_call(node) if isinstance(node, cst.BaseStatement) else None
    return call is not None and bool(call.args) and code_of(call.args[0].value) == value


class FlagAfterForward(Rule):
    code = "SYN104"
    name = "flag-after-forward"

    def check(self, ctx: Context) -> Violation | None:
        if ctx.wrapper not in ("ddp", "accelerate"):
            return None
        loop = ctx.loop
        for toggle in loop.toggles:
            if toggle.kind in ("flag", "helper") and toggle.index > loop.forward:
                message = (
                    "the DDP sync flag is set after the forward: DDP decides at forward, so the "
                    "sync lands on the next window's first micro-batch and the last one is never "
                    "synced (ranks diverge)"
                )
                rewrite = edits.insert_before_forward(loop, [], toggle.index, None)
                return self.found(ctx, message, rewrite, line=toggle.line)
        return None


class NeverSyncs(Rule):
    code = "SYN105"
    name = "sync-never-enabled"

    def check(self, ctx: Context) -> Violation | None:
        if ctx.loop.style == "helper":  # its caller decides when it runs: not "never"
            return None
        decides_at = "backward" if ctx.wrapper in ("fsdp1", "fsdp2") else "forward"
        setters = [t for t in ctx.loop.toggles if t.kind == "setter"]
        for toggle in ctx.loop.toggles:
            bare = toggle.kind == "no_sync" and toggle.never_syncs
            if (bare and toggle.covers in (decides_at, "both")) or (
                toggle.never_syncs and toggle.kind == "setter" and len(setters) == 1
            ):
                message = (
                    "gradient sync is turned off and never back on in this loop: no window "
                    "reduces its gradients (ranks diverge)"
                )
                return self.found(ctx, message, _strip(ctx), line=toggle.line)
        return None


class GatesDisagree(Rule):
    code = "SYN108"
    name = "sync-gate-disagrees"

    def check(self, ctx: Context) -> Violation | None:
        loop = ctx.loop
        if ctx.wrapper is None or loop.last_gate is None:
            return None
        for toggle in loop.toggles:
            if toggle.sync is None:
                continue
            if agree(toggle.sync, loop.last_gate, loop.bases) is False:
                message = (
                    "the sync gate and the step gate disagree: gradients are reduced on a "
                    "micro-batch other than the one before the step"
                )
                return self.found(ctx, message, _strip(ctx), line=toggle.line)
        return None


class ZeroGradPerMicroBatch(Rule):
    code = "SYN106"
    name = "zero-grad-per-micro-batch"

    def check(self, ctx: Context) -> Violation | None:
        loop = ctx.loop
        optimizer = loop.optimizer
        if optimizer is None:
            return None
        if loop.style == "accumulate":
            bad = [
                z for z in loop.zero_grads if z.receiver == loop.model or z.index < loop.step_index
            ]
        else:
            bad = list(loop.zero_grads)
        if not bad:
            return None
        first = bad[0]
        if first.receiver == loop.model or first.receiver != optimizer:
            call = f"{optimizer}.zero_grad()"
        else:
            call = edits.code_of_statement(loop.body[first.index])
        message = (
            f"{first.receiver}.zero_grad() runs on every micro-batch: only the last "
            "micro-batch's gradient reaches the step"
        )
        rewrite = edits.move_zero_grad(loop, [z.index for z in bad], call)
        return self.found(ctx, message, rewrite, line=first.line)


class OffByOneGate(Rule):
    code = "SYN107"
    name = "off-by-one-step-gate"

    def check(self, ctx: Context) -> Violation | None:
        loop = ctx.loop
        gate = loop.last_gate
        if loop.gate is None or gate is None or gate.pred.form != "mod" or not gate.positive:
            return None
        if effective(gate, loop.bases) != 0:
            return None
        message = (
            f"off-by-one step gate: '{gate.pred.var}' counts from 0, so the first window has "
            f"1 micro-batch and the others {gate.pred.n}"
        )
        rewrite = edits.shift_gate(loop, gate.pred.var) if gate.pred.offset == 0 else None
        return self.found(
            ctx, message, rewrite, f"step on ({gate.pred.var} + 1) % {gate.pred.n} == 0"
        )


ALL_RULES: tuple[Rule, ...] = (
    UnresolvedWrapper(),
    OffByOneGate(),
    FlagAfterForward(),
    NoSyncBackwardOnly(),
    FsdpToggleMisplaced(),
    NeverSyncs(),
    GatesDisagree(),
    NoSyncSuppression(),
    ZeroGradPerMicroBatch(),
)
