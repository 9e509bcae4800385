"""The run model: plain, typed, immutable data that every output is rendered from.

A *run* is one training job seen from every rank. Each rank's activity is cut into
*windows*: the span of micro-batches that ends in one optimizer step. A *micro-batch* is
one backward pass (plus the forward that fed it). A *collective* is one c10d operation; a
*grad sync* is a collective that reduces gradients. A *round* is one reduction of the
gradient set: all the bucket all-reduces of one DDP backward, or one user loop of
per-parameter all-reduces, count as one round.

Nothing here does I/O. Builders (``syncscope.load.captured`` for live captures,
``syncscope.load.trace`` for Kineto traces) make these objects; diagnoses and renderers read them.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

Phase = Literal["forward", "backward", "after-backward", "optimizer", "other"]
Wrapper = Literal["ddp", "fsdp", "deepspeed", "none"]
Issuer = Literal["ddp", "fsdp", "deepspeed", "user", "torch"]
Severity = Literal["info", "warning", "error"]
# Most severe first: the order findings are listed and counted in.
SEVERITIES: tuple[Severity, ...] = ("error", "warning", "info")
_SEVERITY_RANK: dict[str, int] = {s: i for i, s in enumerate(SEVERITIES)}
Verdict = Literal["clean", "warnings", "incomplete", "errors", "failed"]
Source = Literal["live", "trace"]

OPS: tuple[str, ...] = (
    "all_reduce",
    "reduce_scatter",
    "all_gather",
    "broadcast",
    "all_to_all",
    "send",
    "recv",
    "barrier",
    "other",
)
GRAD_REDUCING_OPS = frozenset({"all_reduce", "reduce_scatter"})


def reduces_gradients(
    op: str, issuer: str, phase: str, floating: bool, grad_storage: bool, grad_content: bool
) -> bool:
    """Whether a collective reduces gradients: when what it reduces *is* gradients, never by
    size. The one rule, for the run model (``load.captured.is_grad_sync``) and for the marks
    ``--trace`` puts in the Kineto trace (the recorder):

    - a DDP, FSDP or DeepSpeed reduction issued during backward on a floating-point tensor
      (a DDP bucket, an FSDP reduce-scatter of sharded gradients or HSDP's all-reduce); DDP's
      integer used-parameter map (``find_unused_parameters``) and its broadcasts, and FSDP's
      all-gathers of parameters in backward, are not;
    - an FSDP reduction issued after a backward, outside autograd (a pipelining schedule
      reduces its stages' gradients after the step's last backward);
    - the user's all-reduce/reduce-scatter of a tensor that shares storage with a ``.grad``
      (or with the bucket a DDP comm hook was handed), or that holds the gradients' values
      (a flattened copy), checked before the collective ran.
    """
    if op not in GRAD_REDUCING_OPS:
        return False
    if issuer == "fsdp" and phase == "after-backward":
        return floating  # a pipelining schedule's ``perform_reduce_grad``
    if issuer in ("ddp", "fsdp", "deepspeed"):
        return phase == "backward" and floating
    if issuer == "user":
        return grad_storage or grad_content
    return False


# c10d ops that take their output first and read their second argument: gathers, scatters,
# all-to-all (``allgather_(outputs, inputs)``, ``c10d::_reduce_scatter_base_(out, in)``)
_INPUT_SECOND = (
    "allgather",
    "all_gather",
    "reduce_scatter",
    "alltoall",
    "all_to_all",
    "gather",
    "scatter",
)


def severity_rank(severity: str) -> int:
    """Sort key, most severe first: 0 for ``error``, 1 ``warning``, 2 ``info`` (3: unknown)."""
    return _SEVERITY_RANK.get(severity, len(SEVERITIES))


@functools.lru_cache(maxsize=256)
def input_argument(op_name: str) -> int:
    """Which argument of a c10d op holds the tensor(s) it reads: 1 for gathers, scatters and
    all-to-all (output first), else 0. ``op_name`` as dispatched (``allgather_``) or as a
    trace names it (``c10d::allgather_``)."""
    name = op_name.lower()
    if "allreduce" in name or "all_reduce" in name:
        return 0
    return 1 if any(k in name for k in _INPUT_SECOND) else 0


@functools.lru_cache(maxsize=256)
def normalize_op(name: str) -> str:
    """``allreduce_``, ``c10d::_allgather_base_``, ``nccl:all_reduce`` -> one of OPS."""
    n = name.split("::", 1)[-1].split(":", 1)[-1].lower().strip("_")
    if "allreduce" in n or "all_reduce" in n:
        return "all_reduce"
    if "reduce_scatter" in n or "reducescatter" in n:
        return "reduce_scatter"
    if "allgather" in n or "all_gather" in n:
        return "all_gather"
    if "broadcast" in n:
        return "broadcast"
    if "alltoall" in n or "all_to_all" in n:
        return "all_to_all"
    if "barrier" in n:
        return "barrier"
    if n.startswith("send"):
        return "send"
    if n.startswith("recv"):
        return "recv"
    return "other"


@dataclass(frozen=True, slots=True)
class SourceLocation:
    """A place in the user's code (file and 1-based line)."""

    file: str
    line: int
    function: str = ""

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass(frozen=True, slots=True)
class Collective:
    """One c10d collective as one rank issued it."""

    seq: int  # order of issue on this rank, from 0
    op: str  # normalized, one of OPS
    raw_op: str  # as observed: "allreduce_" (live dispatch op) or "c10d::allreduce_" (trace)
    bytes: int
    dtype: str
    group_ranks: tuple[int, ...] | None  # global ranks of the process group, None if unknown
    group_name: str
    start_ns: int  # host-side issue, wall-clock-aligned nanoseconds
    end_ns: int  # host-side return of the issuing call
    done_ns: int | None  # completion (work finished), None if never seen
    phase: Phase
    micro_batch: int  # 0-based position within its window
    grad_sync: bool
    issuer: Issuer
    bucket: int | None = None  # DDP bucket index (order within one backward)
    module: str = ""  # FSDP module name, or the DDP model whose forward armed the reduction
    # several wrapped models on the rank: the model (DDP model or FSDP root) whose gradients
    # it reduces, "" where one model or none can be named
    model: str = ""
    site: SourceLocation | None = None  # user call site, when the user issued it
    via: str = ""  # what drove a wrapper's reduction outside autograd ("pipelining")
    # a user reduction of ``.grad`` tensors: the parameters (names, at most 32), and the
    # wrapper that also reduces them ("ddp": they are its parameters, not ignored by it)
    grad_params: tuple[str, ...] = ()
    also_reduced_by: str = ""

    @property
    def duration_ns(self) -> int:
        """Issue to completion when known, else the host-side call duration."""
        end = self.done_ns if self.done_ns is not None else self.end_ns
        return max(0, end - self.start_ns)


@dataclass(frozen=True, slots=True)
class MicroBatch:
    """One backward pass within a window and the forward(s) that fed it."""

    index: int  # 0-based position within its window
    start_ns: int
    end_ns: int
    wrapper: Wrapper
    # Sync intent, as the wrapper saw it: DDP decides at forward, FSDP at backward.
    forward_sync: bool | None  # DDP: reducer armed at forward; FSDP: flag at forward
    backward_sync: bool | None  # DDP: require_backward_grad_sync at backward; FSDP: reduce_grads
    in_no_sync_at_forward: bool = False
    in_no_sync_at_backward: bool = False
    forward_site: SourceLocation | None = None
    backward_site: SourceLocation | None = None
    sync_each_batch: bool | None = None  # Accelerate GradientAccumulationPlugin setting
    backward_start_ns: int | None = None  # start of the backward pass (forward ends before)
    # the user's ``with`` statements around both the forward and the backward (a sync
    # helper), outermost first: the ``with`` line, ``function`` the call it enters
    helpers: tuple[SourceLocation, ...] = ()
    # several DDP models: the ones whose forward armed their reducer before this backward,
    # and the ones whose gradients the backward changed (None: one model, or not recorded)
    armed: tuple[str, ...] = ()
    grads_of: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True)
class GradReset:
    """Gradients wiped after ``after_micro_batches`` backward passes of a window."""

    after_micro_batches: int
    how: str  # "optimizer.zero_grad", "module.zero_grad", "grad=None"
    site: SourceLocation | None = None


@dataclass(frozen=True, slots=True)
class SyncToggle:
    """A change of sync intent made by the user's code (no_sync, flag, FSDP setter)."""

    how: str  # "no_sync", "require_backward_grad_sync", "set_requires_gradient_sync", ...
    value: bool
    micro_batch: int  # backward passes already done in the window when it happened
    before_forward: bool  # True if made before this micro-batch's forward
    site: SourceLocation | None = None
    recurse: bool = True  # FSDP2 setters: False sets the module's own flag, not its children's
    module: str = ""  # the wrapper's label (DDP, FSDP2 root), "" when not recorded


@dataclass(frozen=True, slots=True)
class ParamPrint:
    """A parameter's fingerprint at a point of training (recorded only where asked, see
    docs/formats.md): the position-weighted sum of a fixed sample of its values and that
    weighted sample's Euclidean norm (``scale``); NaN for a value that was not finite."""

    name: str
    value: float
    scale: float
    dtype: str = "float32"


@dataclass(frozen=True, slots=True)
class Window:
    """The micro-batches that end in one optimizer step (``complete``), or a trailing span."""

    index: int
    complete: bool
    start_ns: int
    end_ns: int
    # a tuple (live captures) or a packed ``Rows`` view (traces, see syncscope.load.trace.packed)
    micro_batches: Sequence[MicroBatch]
    collectives: Sequence[Collective]
    grad_resets: tuple[GradReset, ...] = ()
    toggles: tuple[SyncToggle, ...] = ()
    steps: int = 1  # optimizer.step calls that closed this window (several optimizers)
    # GradScaler found inf/NaN gradients and skipped optimizer.step(): the window ended there
    # with no update (normal in the first steps of an fp16 run)
    step_skipped: bool = False
    step_site: SourceLocation | None = None
    step_ns: int = 0  # time spent in optimizer.step
    peak_memory_bytes: int = 0
    fingerprint: tuple[float, ...] | None = None
    fingerprint_sharded: bool = False
    fingerprint_match: bool | None = None  # filled in across ranks
    # each parameter's fingerprint after the window's optimizer step(s), in the optimizers'
    # order (empty unless the run recorded them)
    params: tuple[ParamPrint, ...] = ()
    # lines of the rank's file read in this window that were no event (dropped): no finding
    # is drawn from such a window, whose record is known to be incomplete
    records_dropped: int = 0
    # Overlap, where a trace could measure it (None: not measured).
    comm_ns: int | None = None  # union of time in collectives (kernels on GPU)
    exposed_comm_ns: int | None = None  # of which not overlapped with compute
    compute_ns: int | None = None

    @property
    def grad_sync_collectives(self) -> tuple[Collective, ...]:
        return tuple(c for c in self.collectives if c.grad_sync)

    @property
    def grad_sync_rounds(self) -> list[tuple[int, str, str]]:
        """Distinct reductions of the gradient set: (micro-batch, phase, issuer) keys."""
        seen: dict[tuple[int, str, str], None] = {}
        for c in self.collectives:
            if c.grad_sync:
                seen.setdefault((c.micro_batch, c.phase, c.issuer), None)
        return list(seen)

    @property
    def grad_syncs(self) -> int:
        return len(self.grad_sync_rounds)

    @property
    def grad_sync_micro_batches(self) -> list[int]:
        return sorted({c.micro_batch for c in self.collectives if c.grad_sync})

    @property
    def grad_sync_bytes(self) -> int:
        return sum(c.bytes for c in self.collectives if c.grad_sync)

    @property
    def duration_ns(self) -> int:
        return max(0, self.end_ns - self.start_ns)

    def op_counts(self) -> dict[str, int]:
        counts = dict.fromkeys(OPS, 0)
        for c in self.collectives:
            counts[c.op] = counts.get(c.op, 0) + 1
        return counts


@dataclass(frozen=True, slots=True)
class WrapperInfo:
    """A DDP or FSDP root module the rank ran."""

    kind: Wrapper
    label: str  # e.g. "DistributedDataParallel(Sequential)#0"
    param_count: int = 0
    param_bytes: int = 0  # unsharded parameter bytes
    shard_world: int = 1  # FSDP shard group size
    bucket_cap_bytes: int | None = None
    site: SourceLocation | None = None
    zero_stage: int | None = None  # DeepSpeed engine: its ZeRO stage (0-3)
    accumulation_steps: int | None = None  # DeepSpeed engine: gradient_accumulation_steps
    static_graph: bool = False  # DDP built with static_graph=True
    # FSDP2: the class of the user's module whose forward called the root, when it is not
    # an FSDPModule (a PEFT-style wrapper: a sync setter looked up on it toggles nothing),
    # and the FSDP modules under the root (fully-qualified names, "" for the root)
    outer: str = ""
    fsdp_modules: tuple[str, ...] = ()
    # where the user's loop around an ``outer`` module names an FSDP sync setter
    setter_sites: tuple[SourceLocation, ...] = ()


@dataclass(frozen=True, slots=True)
class PendingCollective:
    """A collective issued but never seen to complete (what a hung rank is blocked in)."""

    seq: int
    op: str
    bytes: int
    group_ranks: tuple[int, ...] | None
    start_ns: int
    window: int
    micro_batch: int
    phase: Phase


@dataclass(frozen=True, slots=True)
class RankRun:
    rank: int
    windows: tuple[Window, ...]
    local_rank: int = 0
    host: str = ""
    pid: int = 0
    device: str = "cpu"
    wrappers: tuple[WrapperInfo, ...] = ()
    finished: bool = True  # the rank wrote its footer (exited through syncscope)
    exit_status: int | None = 0
    exit_reason: str = ""
    last_event_ns: int = 0
    in_progress: str = ""  # what the rank was inside at its last event: "forward", "backward",
    # "optimizer.step" ("" between micro-batches)
    last_completed: PendingCollective | None = None
    pending: tuple[PendingCollective, ...] = ()
    dist_initialized: bool = True
    backend: str = ""
    framework: str = ""  # "lightning", "transformers" (HF Trainer), "accelerate", "deepspeed"
    framework_version: str = ""
    zero_stage: int | None = None  # DeepSpeed: the engine's ZeRO stage
    # the parameters' fingerprints before each optimizer's first step (where recorded)
    initial_params: tuple[ParamPrint, ...] = ()


@dataclass(frozen=True, slots=True)
class RunMeta:
    command: tuple[str, ...] = ()
    script: str = ""  # absolute path of the profiled script ("" for -m MODULE or traces)
    script_sha256: str = ""  # its content hash when profiled (fix --from refuses a changed file)
    world_size: int = 1
    created: str = ""
    syncscope_version: str = ""
    torch_version: str = ""
    launcher: dict[str, str] = field(default_factory=dict)
    nodes: tuple[str, ...] = ()
    source: Source = "live"
    hang_timeout_s: float | None = None
    hung: bool = False  # the launcher stopped the job because it made no progress
    hang_start_up: bool = False  # it hung before any rank had its process group
    main_threads: dict[str, str] = field(default_factory=dict)  # rank -> what it did, hung
    # ranks that waited in torch.distributed while another computed (profile's monitor):
    # {"rank", "for": [ranks], "seconds", "since", "waiting": text, "running": {rank: file:line}}
    waits: tuple[dict[str, object], ...] = ()
    notes: tuple[str, ...] = ()  # what the data cannot tell, said plainly
    one_rank_view: bool = False  # track(gather=False): this rank's events only, by choice


@dataclass(frozen=True, slots=True)
class Run:
    meta: RunMeta
    ranks: tuple[RankRun, ...]

    @property
    def world_size(self) -> int:
        return self.meta.world_size

    def rank(self, rank: int) -> RankRun | None:
        for r in self.ranks:
            if r.rank == rank:
                return r
        return None


@dataclass(frozen=True, slots=True)
class Fix:
    """How to fix a finding, in the idiom of the wrapper the script uses."""

    style: str  # "ddp-no_sync", "ddp-flag", "accelerate", "fsdp2", "hsdp", ...
    summary: str
    snippet: str
    # where ``syncscope fix`` rewrites the loop: the command to run, and the diff it makes to
    # the script (then ``snippet`` is that diff too)
    command: str = ""
    diff: str = ""


@dataclass(frozen=True, slots=True)
class Finding:
    kind: str  # stable name, e.g. "redundant-sync"
    severity: Severity
    cause: str
    message: str
    ranks: tuple[int, ...]
    windows: tuple[int, ...]
    evidence: dict[str, object] = field(default_factory=dict)
    cost: dict[str, object] = field(default_factory=dict)
    sites: tuple[tuple[str, SourceLocation], ...] = ()  # (role, code location involved)
    fix: Fix | None = None

    @property
    def sources(self) -> tuple[tuple[str, SourceLocation], ...]:
        """``sites`` under its former name, which report.json keeps (``"sources"``)."""
        return self.sites


# Findings that say the job itself did not run to its end: the verdict is "failed", above
# "errors", whatever else was measured before it stopped.
FAILED_KINDS = frozenset({"run-failed", "hang"})
# Findings that say the report could not judge all of the run (a rank's data is missing, no
# window was closed by an optimizer step): the verdict is "incomplete" unless an error was
# found in what could be judged; they are warnings, so ``--fail-on warning`` fails on them.
INCOMPLETE_KINDS = frozenset({"ranks-missing", "no-optimizer-step"})


def rank_failed(rank: RankRun) -> bool:
    """The rank did not end normally: a non-zero exit status, a signal, or no exit record."""
    return not rank.finished or rank.exit_status != 0


def verdict_of(findings: list[Finding] | tuple[Finding, ...]) -> Verdict:
    if any(f.kind in FAILED_KINDS for f in findings):
        return "failed"
    severities = {f.severity for f in findings}
    if "error" in severities:
        return "errors"
    if any(f.kind in INCOMPLETE_KINDS for f in findings):
        return "incomplete"
    if "warning" in severities:
        return "warnings"
    return "clean"


def rank_runs(ranks: Iterable[int]) -> list[tuple[int, int]]:
    """``[0, 1, 2, 5, 7, 8]`` -> ``[(0, 2), (5, 5), (7, 8)]``: contiguous runs, first and last."""
    runs: list[tuple[int, int]] = []
    for r in sorted(set(ranks)):
        if runs and r == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], r)
        else:
            runs.append((r, r))
    return runs


def ranks_text(runs: Sequence[tuple[int, int]], count: int | None = None) -> str:
    """The one way rank sets are written: ``"0-2,5,7-8"``, contiguous runs joined; with
    ``count`` (the ranks in all) greater than the runs hold, ``", ... (N ranks)"`` after them."""
    text = ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
    listed = sum(b - a + 1 for a, b in runs)
    if count is not None and count > listed:
        text += f", ... ({count} ranks)"
    return text


def compress_ranks(ranks: Iterable[int]) -> str:
    """``[0, 1, 2, 5, 7, 8]`` -> ``"0-2,5,7-8"``: readable rank sets at any world size."""
    return ranks_text(rank_runs(ranks))


MAX_LISTED_RUNS = 32  # more runs of absent ranks than this: the rest counted, not listed


def missing_rank_runs(present: Iterable[int], world: int) -> tuple[list[tuple[int, int]], int]:
    """Ranks below ``world`` not in ``present``, as contiguous runs (the first
    ``MAX_LISTED_RUNS``), and how many ranks are missing in all.

    Bounded by the ranks actually present, never by ``world`` (a header may say 10**12).
    """
    seen = sorted({r for r in present if 0 <= r < world})
    runs: list[tuple[int, int]] = []
    nxt = 0  # the lowest rank not yet accounted for
    for r in [*seen, world]:
        if r > nxt and len(runs) < MAX_LISTED_RUNS:
            runs.append((nxt, r - 1))
        nxt = r + 1
    return runs, world - len(seen)


def missing_ranks_text(present: Iterable[int], world: int) -> tuple[str, int]:
    """``("2-127", 126)``: the ranks below ``world`` not in ``present``, written exactly
    (``ranks_text``), and how many; ``("", 0)`` when none is missing."""
    runs, count = missing_rank_runs(present, world)
    return (ranks_text(runs, count) if count else ""), count
