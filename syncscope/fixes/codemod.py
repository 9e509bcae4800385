"""The driver: analyze, apply one rewrite, analyze again, until nothing is left to fix.

One rewrite per pass keeps each rewrite simple (it only ever sees a freshly parsed file)
and makes the result a fixed point: running the fix on its own output changes nothing. A
rewrite that would leave its loop with a new problem it cannot fix is rolled back, so a
wrong toggle is never stripped without the right one taking its place.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field

import libcst as cst
from libcst.metadata import MetadataWrapper

from syncscope.errors import SyncscopeError
from syncscope.fixes.canonical import Context, DdpForm
from syncscope.fixes.edits import Edit, apply_edit
from syncscope.fixes.focus import Focus, focus, python_lines
from syncscope.fixes.imports import add_imports
from syncscope.fixes.loops import AccumLoop, find_loops
from syncscope.fixes.resolve import (
    WRAPPER_WORDS,
    Resolution,
    WrapperKind,
    resolve_wrappers,
    usable_guard,
)
from syncscope.fixes.rules import ALL_RULES, Violation
from syncscope.fixes.sites import find_sites, site_message, site_reason, suggestion
from syncscope.fixes.styles import Style
from syncscope.fixes.syntax import effects

MAX_PASSES = 24
DISTRIBUTED_WORDS = ("torch.distributed", "accelerate", "DistributedDataParallel", "fully_shard")


@dataclass(frozen=True)
class RunFinding:
    """An error or warning of the profiled run (``--from``), at its first line here."""

    kind: str
    cause: str
    line: int
    summary: str


@dataclass(frozen=True)
class RunHints:
    """What a profile (``--from``) says about the script."""

    wrapper: WrapperKind | None = None
    ddp_form: DdpForm | None = None
    lines: frozenset[int] = frozenset()  # source lines of findings, in this script
    helper_codes: frozenset[str] = frozenset()  # statements that toggle sync via a helper
    hsdp: bool = False  # the run was HSDP: skip the cross-replica all-reduce only
    # the run's model is not an FSDPModule (a module around the FSDP roots, e.g. PEFT's):
    # an FSDP setter is called on the FSDP modules inside it, never on it
    toggle_target: str = ""
    bypass_lines: frozenset[int] = frozenset()  # forwards through ``ddp_model.module``
    findings: tuple[RunFinding, ...] = ()  # the run's errors and warnings
    static_graph: bool = False  # DDP(static_graph=True): its first backward must sync


@dataclass(frozen=True)
class FixOptions:
    style: Style = "auto"
    hints: RunHints | None = None


@dataclass(frozen=True)
class Problem:
    """One problem found in the original file, and whether the fix takes care of it."""

    code: str
    name: str
    line: int
    message: str
    fixed: bool
    suggestion: str = ""  # why it is not rewritten, and what to do
    snippet: str = ""  # where not rewritten: the canonical form in the script's own names
    span: tuple[int, int] = (0, 0)  # the first and last line of its loop


@dataclass(frozen=True)
class FixResult:
    original: str
    fixed: str
    problems: tuple[Problem, ...] = ()
    notes: tuple[str, ...] = field(default=())

    @property
    def changed(self) -> bool:
        return self.fixed != self.original

    def diff(self, path: str) -> str:
        lines = difflib.unified_diff(
            self.original.splitlines(keepends=True),
            self.fixed.splitlines(keepends=True),
            fromfile=f"a/{path}",
            tofile=f"b/{path}",
        )
        return "".join(line if line.endswith("\n") else line + "\n" for line in lines)


def parse(source: str, path: str) -> cst.Module:
    try:
        return cst.parse_module(source)
    except cst.ParserSyntaxError as exc:  # Python compiled it (_parse_checked) first
        raise SyncscopeError(
            f"{path}: syncscope fix's parser (libcst) cannot read line {exc.raw_line}, "
            f"column {exc.raw_column} (Python can): not rewritten"
        ) from None


_STYLE_WRAPPER: dict[Style, WrapperKind] = {
    "accelerate": "accelerate",
    "no_sync": "ddp",
    "flag": "ddp",
    "fsdp2": "fsdp2",
}


def _wrapper_of(
    loop: AccumLoop, resolution: Resolution, options: FixOptions, line: int
) -> tuple[WrapperKind | None, str]:
    """The wrapper of ``loop``'s model (``line``: the loop's line in the whole file)."""
    resolved = resolution.kind_of(loop.model)
    style = options.style
    if resolved is not None:
        wanted = _STYLE_WRAPPER.get(style)
        compatible = wanted in (None, resolved) or (resolved == "fsdp1" and style == "no_sync")
        if not compatible:
            raise SyncscopeError(
                f"--style {style} does not fit line {line}: "
                f"'{loop.model}' holds {WRAPPER_WORDS[resolved]}"
            )
        return resolved, ""
    if options.hints is not None and options.hints.wrapper is not None:
        return options.hints.wrapper, ""
    kinds = {t.kind for t in loop.toggles}
    if style != "auto":
        return _STYLE_WRAPPER[style], ""
    if "flag" in kinds:
        return "ddp", ""
    if "setter" in kinds:
        return "fsdp2", ""
    if "accumulate" in kinds:
        return "accelerate", ""
    return None, resolution.why_unresolved(loop.model)


def _ddp_form(loop: AccumLoop, options: FixOptions) -> DdpForm:
    if options.style in ("flag", "no_sync"):
        return "flag" if options.style == "flag" else "no_sync"
    if options.hints is not None and options.hints.ddp_form is not None:
        return options.hints.ddp_form
    return "flag" if any(t.kind == "flag" for t in loop.toggles) else "no_sync"


@dataclass
class _Pass:
    module: cst.Module
    violations: list[tuple[int, Violation]]


class _Driver:
    def __init__(
        self, source: str, path: str, options: FixOptions, focused: Focus | None = None
    ) -> None:
        self.path = path
        self.source = source
        self.options = options
        self.focus = focused or Focus(source, {})  # a long file: what a fix can touch or read
        self.module = parse(self.focus.text, path)
        self.distributed = any(word in source for word in DISTRIBUTED_WORDS)
        self.targets: set[int] | None = None  # loop ordinals, with --from
        self.forms: dict[int, DdpForm] = {}  # chosen on the original file, kept across passes
        self.sites: list[Problem] = []  # accumulation loops of the original no rule reads
        self.spans: dict[int, tuple[int, int]] = {}  # loop ordinal -> its lines, in the file

    def analyze(self, module: cst.Module) -> _Pass:
        wrapper = MetadataWrapper(module)
        resolution = resolve_wrappers(wrapper)
        hints = self.options.hints
        helpers = hints.helper_codes if hints is not None else frozenset()
        loops = find_loops(wrapper, resolution, helpers)
        if module is self.module:
            self.sites = self._unread_sites(wrapper, resolution, loops)
            self.spans = {i: self._span(loop.lines) for i, loop in enumerate(loops)}
        if self.targets is None and hints is not None:
            self.targets = {
                i
                for i, loop in enumerate(loops)
                if {self.focus.original_line(n) for n in loop.lines} & hints.lines
            }
        found: list[tuple[int, Violation]] = []
        for ordinal, loop in enumerate(loops):
            if self.targets is not None and ordinal not in self.targets:
                continue
            line = self.focus.original_line(loop.line)
            kind, why = _wrapper_of(loop, resolution, self.options, line)
            form = self.forms.setdefault(ordinal, _ddp_form(loop, self.options))
            guard = usable_guard(resolution, loop.model, wrapper.module)
            ctx = Context(
                loop, kind, form, resolution, wrapper.module, why, self.distributed, guard
            )
            ctx.hsdp = kind == "fsdp2" and hints is not None and hints.hsdp
            ctx.setter_on_modules = hints is not None and bool(hints.toggle_target)
            ctx.static_graph = hints is not None and hints.static_graph
            for rule in ALL_RULES:
                violation = rule.check(ctx)
                if violation is not None:
                    found.append((ordinal, violation))
        return _Pass(wrapper.module, found)

    def _span(self, lines: frozenset[int]) -> tuple[int, int]:
        if not lines:
            return (0, 0)
        return (self.focus.original_line(min(lines)), self.focus.original_line(max(lines)))

    def _unread_sites(
        self, wrapper: MetadataWrapper, resolution: Resolution, loops: list[AccumLoop]
    ) -> list[Problem]:
        """SYN109 for each accumulation site of a distributed file that no loop the rules
        read covers (with ``--from``: only those a finding points into)."""
        words = ("no_sync", "require_backward_grad_sync", "set_requires_gradient_sync")
        if not (resolution.kinds or any(w in self.source for w in words)):
            return []
        read = [loop.lines for loop in loops]
        helpers = {loop.loop.name.value for loop in loops if isinstance(loop.loop, cst.FunctionDef)}
        hints = self.options.hints
        problems = []
        for site in find_sites(wrapper, resolution):
            if any(lines & site.lines for lines in read):
                continue
            if site.through is not None and site.through.rsplit(".", 1)[-1] in helpers:
                continue
            lines = {self.focus.original_line(n) for n in site.lines}
            if hints is not None and not lines & hints.lines:
                continue
            wrapper_kind = site.wrapper or (hints.wrapper if hints is not None else None)
            problems.append(
                Problem(
                    "SYN109",
                    "loop-not-rewritten",
                    self.focus.original_line(site.line),
                    site_message(site),
                    False,
                    site_reason(site),
                    suggestion(site, wrapper_kind),
                    self._span(site.lines),
                )
            )
        return problems

    def apply(self, state: _Pass, violations: list[Violation]) -> cst.Module:
        """Apply the rewrites of several loops in one visit (their edits touch other nodes)."""
        merged = Edit()
        imports: list[str] = []
        for violation in violations:
            assert violation.rewrite is not None
            merged.replace.update(violation.rewrite.replace)
            imports.extend(violation.rewrite.imports)
        module = apply_edit(state.module, merged)
        return add_imports(module, imports) if imports else module

    def _batch(self, state: _Pass, tried: set[tuple[int, str]]) -> list[tuple[int, Violation]]:
        """The next rewrite of every loop that has one, when their edits do not overlap.

        One rewrite per loop per pass, all loops in the same pass: the passes (each a whole
        analysis of the file) follow the rewrites one loop needs, not the number of loops,
        so the time grows linearly with the file instead of quadratically.
        """
        batch: list[tuple[int, Violation]] = []
        taken: set[int] = set()
        seen: set[int] = set()
        for o, v in state.violations:
            if v.rewrite is None or (o, v.code) in tried or o in seen:
                continue
            seen.add(o)
            keys = set(v.rewrite.replace)
            if keys & taken:
                continue  # overlaps an edit of this pass: next pass
            taken |= keys
            batch.append((o, v))
        return batch

    def _without_lossy(
        self,
        state: _Pass,
        batch: list[tuple[int, Violation]],
        before: frozenset[str],
        refused: dict[tuple[int, str], str],
    ) -> list[tuple[int, Violation]]:
        """The batch less the rewrites that would drop a call or an assignment expression
        of the user's (``if (loss := model(x)...)``: removing the test removed the forward);
        those are refused, naming what they would drop. Tried one by one only when the batch
        together dropped something."""
        kept = []
        for ordinal, violation in batch:
            lost = before - effects(self.apply(state, [violation]))
            if lost:
                refused[(ordinal, violation.code)] = (
                    f"the rewrite would drop `{sorted(lost)[0]}`: rewrite this loop by hand"
                )
            else:
                kept.append((ordinal, violation))
        return kept

    def run(self) -> FixResult | None:
        """The result; None where a placeholder of the elided text did not come back
        intact (the caller fixes the whole file instead)."""
        state = initial = self.analyze(self.module)
        first = list(state.violations)
        lost = self._unkept_line()
        if lost is None:
            state, refused = self._rewrite(state)
        else:  # report, rewrite nothing: a rewrite would change bytes outside the loops
            why = (
                f"libcst, which writes the fix, would not keep line {lost} byte for byte "
                "(a form feed?): not rewritten"
            )
            refused = {(o, v.code): why for o, v in first}
        remaining = {(o, v.code) for o, v in state.violations}
        problems = []
        for ordinal, v in first:
            fixed = (ordinal, v.code) not in remaining and (ordinal, v.code) not in refused
            suggestion = v.suggestion or refused.get((ordinal, v.code), "")
            line = self.focus.original_line(v.line)
            span = self.spans.get(ordinal, (line, line))
            problems.append(Problem(v.code, v.name, line, v.message, fixed, suggestion, span=span))
        problems.extend(self.sites)
        notes: list[str] = []
        if self.targets == set() and not self.sites:
            notes.append("no finding of the profile points into an accumulation loop here")
        if state is initial:
            fixed_text: str | None = self.source  # nothing rewritten: not one byte changed
        else:
            fixed_text = self.focus.restore(state.module.code)
        if fixed_text is None:
            return None
        return FixResult(self.source, fixed_text, tuple(problems), tuple(notes))

    def _unkept_line(self) -> int | None:
        """The first line (of the whole file) that libcst does not render back as it read
        it (a form feed before a statement); None when it renders the text unchanged."""
        rendered = self.module.code
        if rendered == self.focus.text:
            return None
        ours, its = python_lines(self.focus.text), python_lines(rendered)
        pairs = enumerate(zip(ours, its, strict=False), 1)
        differ = next((n for n, (a, b) in pairs if a != b), None)
        return self.focus.original_line(differ or min(len(ours), len(its)) + 1)

    def _rewrite(self, state: _Pass) -> tuple[_Pass, dict[tuple[int, str], str]]:
        """Apply the rewrites, pass after pass; the final state and the refused rewrites."""
        tried: set[tuple[int, str]] = set()
        refused: dict[tuple[int, str], str] = {}
        for _ in range(MAX_PASSES):
            batch = self._batch(state, tried)
            if not batch:
                break
            tried.update((o, v.code) for o, v in batch)
            had = effects(state.module)
            while batch:
                module = self.apply(state, [v for _, v in batch])
                if had - effects(module):
                    batch = self._without_lossy(state, batch, had, refused)
                    continue
                candidate = self.analyze(module)
                stuck_loops: set[int] = set()
                for ordinal, violation in batch:
                    before = {v.code for o, v in state.violations if o == ordinal}
                    stuck = [
                        v
                        for o, v in candidate.violations
                        if o == ordinal and v.rewrite is None and v.code not in before
                    ]
                    if stuck:
                        refused[(ordinal, violation.code)] = stuck[0].suggestion or stuck[0].message
                        stuck_loops.add(ordinal)
                if not stuck_loops:
                    state = candidate
                    break
                batch = [(o, v) for o, v in batch if o not in stuck_loops]  # roll those back
        return state, refused


MAX_LINES = 50_000  # through libcst (the elided text): its tree takes ~80 KB a line
MAX_FILE_LINES = 1_000_000  # the whole file: about 350 MB at this bound (lines, summaries)
MAX_NESTING = 500  # brackets plus operators in one logical line: deeper is refused
_STACK_BYTES = 256 << 20  # the rewrite runs on a thread with this much stack ...
_RECURSION_LIMIT = 20_000  # ... and this recursion limit, so MAX_NESTING always fits


def _too_long(lines: int, limit: int, path: str, what: str) -> SyncscopeError:
    return SyncscopeError(
        f"{path}: {lines:,} lines{what}, more than syncscope fix reads ({limit:,}); "
        "give it the file that holds the loop"
    )


def _focused(source: str, path: str) -> Focus:
    """What of ``source`` goes through libcst (``focus``), compiled on the way: what Python
    cannot compile is refused in one line (the syntax error, or nesting beyond its
    recursion limit)."""
    lines = source.count("\n") + 1
    if lines > MAX_FILE_LINES:
        raise _too_long(lines, MAX_FILE_LINES, path, "")
    nul = source.find("\0")
    if nul >= 0:  # Python's own error names no line for it
        line = source.count("\n", 0, nul) + 1
        column = nul - source.rfind("\n", 0, nul)
        raise SyncscopeError(
            f"{path}: a NUL byte at line {line}, column {column}: not Python source; "
            "fix it before running syncscope fix"
        )
    try:
        return focus(source, path)
    except SyntaxError as exc:
        raise SyncscopeError(
            f"{path}: syntax error at line {exc.lineno}, column {exc.offset or 0} "
            f"({exc.msg}); fix it before running syncscope fix"
        ) from None
    except ValueError as exc:  # a NUL byte
        raise SyncscopeError(f"{path}: not Python source ({exc})") from None
    except (RecursionError, MemoryError):
        raise SyncscopeError(
            f"{path}: nested too deeply for Python to compile it: not rewritten"
        ) from None


def _check_nesting(source: str, path: str) -> None:
    """Refuse, in one line, what is nested beyond MAX_NESTING, or too long for libcst.

    libcst's native parser recurses on the C stack: a file nested deeply enough crashes
    the process (SIGSEGV) instead of raising, so depth is measured with ``tokenize`` first
    (on the text libcst will parse: elided statements never reach it).
    """
    import io
    import tokenize

    lines = source.count("\n") + 1
    if lines > MAX_LINES:
        raise _too_long(lines, MAX_LINES, path, " where a fix can touch or read")
    depth = score = 0
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == tokenize.OP:
                if tok.string in "([{":
                    depth += 1
                elif tok.string in ")]}":
                    depth -= 1
                elif tok.string not in (",", ":", "=", ";"):
                    score += 1
            elif tok.type == tokenize.NAME and tok.string in ("and", "or", "not", "lambda"):
                score += 1
            elif tok.type == tokenize.NEWLINE:
                score = 0
            if depth + score > MAX_NESTING:
                raise SyncscopeError(
                    f"{path}:{tok.start[0]}: nested too deeply for syncscope fix (more than "
                    f"{MAX_NESTING} brackets and operators in one statement): not rewritten"
                )
    except (tokenize.TokenError, IndentationError):
        return  # compile() accepted it; the parser will say what it thinks


def fix_source(source: str, options: FixOptions | None = None, path: str = "<script>") -> FixResult:
    """Find the problems of ``source`` and the fixed text (raises SyncscopeError).

    A long file goes through libcst only where a fix can touch or read it (``focus``); the
    rest is elided and put back byte for byte. The cyclic garbage collector is paused
    meanwhile: the syntax trees are millions of acyclic objects (freed by reference
    counting), and its passes over them took about half of ``ast.parse``'s time on a
    200,000-line file.
    """
    import gc

    collecting = gc.isenabled()
    gc.disable()
    try:
        focused = _focused(source, path)
        result = _fix_in_thread(source, options, path, focused)
        if result is None:  # a placeholder did not come back: the whole file, as before
            result = _fix_in_thread(source, options, path, Focus(source, {}))
        assert result is not None
        return result
    finally:
        if collecting:
            gc.enable()


def _fix_in_thread(
    source: str, options: FixOptions | None, path: str, focused: Focus
) -> FixResult | None:
    """fix_source's work on ``focused``. Runs on a thread with a large stack and recursion
    limit: time and stack grow with the text, bounded by MAX_NESTING; a RecursionError
    still met is a one-line refusal.
    """
    import sys
    import threading

    _check_nesting(focused.text, path)
    outcome: dict[str, object] = {}

    def work() -> None:
        try:
            outcome["result"] = _Driver(source, path, options or FixOptions(), focused).run()
        except RecursionError:
            outcome["error"] = SyncscopeError(
                f"{path}: nested too deeply for syncscope fix (recursion limit): not rewritten"
            )
        except BaseException as exc:  # re-raised in the caller's thread
            outcome["error"] = exc

    previous_stack = threading.stack_size(_STACK_BYTES)
    previous_limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(previous_limit, _RECURSION_LIMIT))
    try:
        worker = threading.Thread(target=work, name="syncscope-fix", daemon=True)
        worker.start()
    finally:
        threading.stack_size(previous_stack)
    try:
        worker.join()
    finally:
        sys.setrecursionlimit(previous_limit)
    error = outcome.get("error")
    if isinstance(error, BaseException):
        raise error
    result = outcome["result"]
    assert result is None or isinstance(result, FixResult)
    return result
