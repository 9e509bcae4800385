"""``syncscope fix``: find and rewrite gradient-accumulation loops that sync wrongly.

The pipeline shows in the modules:

- ``resolve``: which wrapper (DDP, FSDP1, FSDP2, Accelerate) each name in a file holds;
- ``loops``: the accumulation loops of a file, described as plain data (forward, backward,
  step gate, sync toggles, ``zero_grad`` calls), with the gates canonicalized;
- ``toggles``: where a loop changes sync intent (the DDP flag, the FSDP setters, ``with``);
- ``sites``: every accumulation loop of a file, so that one no rule reads is still said
  (SYN109) with the form to write in the script's own names;
- ``rules``: one small class per problem, each with a code, a message and an optional
  rewrite (TorchFix style);
- ``codemod``: applies the rewrites one at a time until none is left, adds the
  imports they need and renders the unified diff;
- ``run_hints``: hints from a profile's ``report.json`` (``--from``), and ``run_edits``: the
  edits a profile's findings call for beyond the loop rules;
- ``verify``: profiles the original and the fixed script and compares them (``--verify``);
- ``proposals``: what ``fix`` does about each finding of a profile, for its report;
- ``driver``: the ``syncscope fix`` command's work, from the script read to the diff shown,
  verified or written (``fix()``), and ``check``: ``fix --check`` for CI and pre-commit.

The package exports the codemod's API lazily: importing ``syncscope.fixes.styles`` (the
command line does, to list ``--style``) imports no libcst.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from syncscope.fixes.codemod import FixOptions, FixResult, Problem, fix_source

__all__ = ["FixOptions", "FixResult", "Problem", "fix_source"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from syncscope.fixes import codemod

        return getattr(codemod, name)
    raise AttributeError(f"module 'syncscope.fixes' has no attribute {name!r}")
