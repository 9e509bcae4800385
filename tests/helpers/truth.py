"""Ground truth, counted without syncscope, and its comparison with what syncscope reported.

The scripts of tests/scripts/ import this module in their ranks (each puts the checkout first
on ``sys.path``); the tests read what the ranks wrote and compare.

In the ranks, two counters:

- ``Truth`` (the bug shapes of tests/scripts/bugs/ and the recipes of tests/scripts/recipes/):
  what happened to the gradients, per optimizer step ("window"). Every collective the stack
  issues through the ``torch.distributed`` Python API is counted by a wrapper of that
  function: op, group size, bytes (the largest tensor argument: the reduce-scatter's input),
  window, micro-batch and phase. DDP's C++ reducer reduces its buckets below Python: a
  pass-through comm hook registered by the script (``truth.ddp_comm_hook(model)``) logs each
  bucket and then hands it to torch's own ``allreduce_hook`` (divide by the group size,
  all-reduce); the ``dist.all_reduce`` that hook calls is the bucket's, not logged twice.
  Collectives compiled into a graph (compiled autograd's functional all-reduces) are never
  seen by Python: ``truth.profiled_backward`` counts the ``_c10d_functional`` all-reduces
  torch.profiler records in the backward. After each optimizer step the parameters (and
  gradients, where still present) are compared across replicas: a float64 checksum per
  tensor, full tensors for DTensors (``full_tensor()``), all-gathered over the replica group,
  with counting off, so these collectives are never in the truth. A *round* is one
  (micro-batch, phase) in which at least one gradient reduction ran: the phases are
  ``backward`` (inside ``loss.backward()``: DDP's and FSDP's hooks), ``after`` (after the
  backward, before the step: a hand all-reduce) and ``step`` (inside a pipelining schedule's
  ``step()``). Two reductions of the same gradients on the same micro-batch by DDP's hooks
  and by hand are two rounds. ``BUG_TRUTH_DIR`` set: each rank writes ``truth-rank{R}.json``
  there (also when the script raises: the error is recorded and re-raised).
- ``count_collectives``, ``count_buckets`` and ``phase`` (the framework scripts of
  tests/scripts/frameworks/ and tests/scripts/cuda_loops.py): a counting wrapper of the
  ``torch.distributed`` Python API (op, bytes, window, micro-batch and phase of every
  collective), a pass-through DDP comm hook that counts the buckets DDP reduces, and a
  wrapper of a DeepSpeed engine's methods that keeps the window, micro-batch and phase (the
  counting itself is checked on CPU by tests/unit/helpers/test_truth.py).

Every wrapper is compiled under a file name in angle brackets: syncscope takes such code for
library code, so a collective FSDP or DeepSpeed issues through a wrapper is still theirs and
the user's own all-reduce is still the user's (a wrapper defined in a script would be the
user's).

In the tests: what a tests/scripts/cuda_loops.py run counted itself (``CUDA_LOOPS_TRUTH``),
per window, set beside what syncscope reported (``assert_matches_truth``): the comparison of
the GPU tests (tests/gpu), also run on CPU ranks by
tests/integration/test_cuda_loops_on_cpu.py. A gradient reduction, in that count, is a
reducing collective issued inside a backward pass (a DDP bucket through the pass-through comm
hook, an FSDP2 reduce-scatter, an HSDP replicate all-reduce, an FSDP1 reduction); a grad-sync
round is a micro-batch that had at least one.
"""

from __future__ import annotations

import contextlib
import json
import os
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist


def nbytes(value: object) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(nbytes(v) for v in value)
    return 0


# -- in the ranks: Truth, the bug shapes' and recipes' counter ----------------------------------

TRUTH_OPS = (
    "all_reduce",
    "all_reduce_coalesced",
    "reduce_scatter_tensor",
    "reduce_scatter",
    "reduce_scatter_single",
    "reduce",
    "all_gather_into_tensor",
    "all_gather",
    "all_gather_single",
    "broadcast",
    "all_to_all_single",
)
REDUCTIONS = frozenset(op for op in TRUTH_OPS if "reduce" in op)

_TRUTH_SOURCE = """
def make(name, original, truth):
    def counted(*args, **kwargs):
        if truth.counting and not truth.in_comm_hook:
            truth.record(name, args, kwargs, via="torch.distributed")
        return original(*args, **kwargs)
    counted._bug_truth = True
    return counted

def comm_hook(truth, default_hook, name=None):
    def pass_through(process_group, bucket):
        if truth.counting:
            truth.record_bucket(process_group, bucket, name)
        truth.in_comm_hook = True
        try:
            return default_hook(process_group, bucket)
        finally:
            truth.in_comm_hook = False
    return pass_through
"""
_truth_ns: dict[str, Any] = {}
exec(compile(_TRUTH_SOURCE, "<bug-truth>", "exec"), _truth_ns)


class Truth:
    """One rank's truth. ``micro(i)`` / ``phase(name)`` place what follows; ``end_window()``
    after ``optimizer.step()``; ``write()`` at the end (or ``run(main)`` does all)."""

    def __init__(self, script: str) -> None:
        self.script = script
        self.counting = True
        self.in_comm_hook = False
        self.window = 0
        self.micro_batch: int | None = None
        self.phase_name = "forward"
        self.model_name: str | None = None  # the model whose backward runs (named by the script)
        self.log: list[dict[str, Any]] = []
        self.replicas: list[dict[str, Any]] = []
        self.notes: dict[str, Any] = {}
        self.error: str | None = None
        for name in TRUTH_OPS:
            original = getattr(dist, name, None)
            if original is not None and not getattr(original, "_bug_truth", False):
                setattr(dist, name, _truth_ns["make"](name, original, self))

    # -- placing what happens ----------------------------------------------------------------

    def micro(self, index: int) -> None:
        self.micro_batch = index
        self.phase_name = "forward"

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        outer, self.phase_name = self.phase_name, name
        try:
            yield
        finally:
            self.phase_name = "after" if name == "backward" else outer

    def backward(self, loss: torch.Tensor, model: str | None = None) -> None:
        """``loss.backward()``; ``model``: the one model this backward gives gradients to
        (the script freezes or detaches the others), named on each reduction it runs."""
        self.model_name = model
        try:
            with self.phase("backward"):
                loss.backward()
        finally:
            self.model_name = None

    @contextlib.contextmanager
    def excluded(self) -> Iterator[None]:
        outer, self.counting = self.counting, False
        try:
            yield
        finally:
            self.counting = outer

    # -- recording ---------------------------------------------------------------------------

    def _entry(self, op: str, group: Any, size: int, via: str) -> dict[str, Any]:
        return {
            "op": op,
            "reduction": op in REDUCTIONS,
            "group_size": dist.get_world_size(group)
            if group is not None
            else dist.get_world_size(),
            "bytes": size,
            "window": self.window,
            "micro_batch": self.micro_batch,
            "phase": self.phase_name,
            "via": via,
        }

    def record(self, op: str, args: tuple[Any, ...], kwargs: dict[str, Any], via: str) -> None:
        group = kwargs.get("group")
        if group is None:
            group = next((a for a in args if isinstance(a, dist.ProcessGroup)), None)
        tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, (torch.Tensor, list))]
        size = max((nbytes(t) for t in tensors), default=0)
        entry = self._entry(op, group, size, via)
        if self.model_name is not None:
            entry["model"] = self.model_name
        self.log.append(entry)

    def record_bucket(self, process_group: Any, bucket: Any, name: str | None = None) -> None:
        entry = self._entry("all_reduce", process_group, nbytes(bucket.buffer()), "ddp_comm_hook")
        if name is not None:  # several DDP models: whose bucket it was
            entry["model"] = name
        self.log.append(entry)

    def record_functional(self, op: str, size: int) -> None:
        self.log.append(self._entry(op, None, size, "torch.profiler"))

    def ddp_comm_hook(self, model: Any, name: str | None = None) -> None:
        """Register the pass-through comm hook on a DDP model (C++ reducer); ``name``: the
        model's, logged with each of its buckets where a script steps several."""
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        hook = _truth_ns["comm_hook"](self, default_hooks.allreduce_hook, name)
        model.register_comm_hook(None, hook)

    def profiled_backward(self, loss: torch.Tensor, backward: Any = None) -> None:
        """``loss.backward()`` (or ``backward()``) under torch.profiler; the functional
        all-reduces it ran (a compiled graph's) are logged with their input bytes."""
        from torch.profiler import ProfilerActivity, profile

        with self.phase("backward"):
            with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
                (backward or loss.backward)()
            for event in prof.events():
                if event.name in ("_c10d_functional::all_reduce", "_c10d_functional::all_reduce_"):
                    numel = 1
                    for d in event.input_shapes[0] if event.input_shapes else []:
                        numel *= d
                    self.record_functional("all_reduce", numel * 4)  # float32 parameters

    # -- replicas ----------------------------------------------------------------------------

    def compare_replicas(self, tensors: dict[str, Any], group: Any = None) -> None:
        """After ``optimizer.step()``: are parameters and gradients the same on every rank
        of ``group`` (the replica group; default: the world)? Counting off."""
        with self.excluded():
            params = [_full(t) for t in tensors.values()]
            grads = [_full(getattr(t, "grad", None)) for t in tensors.values()]
            mine = torch.tensor(
                [_checksum(p) for p in params] + [_checksum(g) for g in grads],
                dtype=torch.float64,
            )
            n = dist.get_world_size(group) if group is not None else dist.get_world_size()
            gathered = [torch.empty_like(mine) for _ in range(n)]
            dist.all_gather(gathered, mine, group=group)
        k = len(params)
        same_params = all(torch.equal(g[:k], gathered[0][:k]) for g in gathered)
        same_grads = all(torch.equal(g[k:], gathered[0][k:]) for g in gathered)
        differing = [
            name
            for i, name in enumerate(tensors)
            if not all(torch.equal(g[i], gathered[0][i]) for g in gathered)
        ]
        self.replicas.append(
            {
                "window": self.window,
                "replica_group_size": n,
                "params_equal": same_params,
                "grads_equal": same_grads,
                "differing_params": differing,
            }
        )

    def end_window(self) -> None:
        self.window += 1
        self.micro_batch = None
        self.phase_name = "forward"

    # -- output ------------------------------------------------------------------------------

    def summary(self) -> dict[str, Any]:
        windows = []
        for w in range(self.window):
            reductions = [e for e in self.log if e["window"] == w and e["reduction"]]
            rounds = sorted(
                {(e["micro_batch"], e["phase"]) for e in reductions},
                key=lambda r: (-1 if r[0] is None else r[0], r[1]),
            )
            replica = next((r for r in self.replicas if r["window"] == w), None)
            by_model: dict[str, Any] = {}
            sizes: dict[str, set[int]] = {}
            for e in reductions:
                if "model" in e:
                    by_model.setdefault(e["model"], set()).add((e["micro_batch"], e["phase"]))
                    sizes.setdefault(e["model"], set()).add(e["bytes"])
            windows.append(
                {
                    "window": w,
                    "rounds": len(rounds),
                    "round_keys": [list(r) for r in rounds],
                    "reduction_calls": len(reductions),
                    "reduction_bytes": sum(e["bytes"] for e in reductions),
                    "reduced_at_micro_batch": sorted(
                        {e["micro_batch"] for e in reductions if e["micro_batch"] is not None}
                    ),
                    "params_equal": replica["params_equal"] if replica else None,
                    "grads_equal": replica["grads_equal"] if replica else None,
                    "differing_params": replica["differing_params"] if replica else None,
                    # per model (scripts that name their models): rounds and where they ran
                    "models": {
                        name: {
                            "rounds": len(keys),
                            "reduced_at": sorted(m for m, _ in keys),
                            "bytes": sorted(sizes[name]),
                        }
                        for name, keys in sorted(by_model.items())
                    },
                }
            )
        return {
            "script": self.script,
            "rank": dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", 0)),
            "world_size": int(os.environ.get("WORLD_SIZE", 1)),
            "torch": torch.__version__,
            "windows_completed": self.window,
            "windows": windows,
            "error": self.error,
            "notes": self.notes,
            "log": self.log,
        }

    def write(self) -> None:
        out = os.environ.get("BUG_TRUTH_DIR")
        rank = int(os.environ.get("RANK", 0))
        data = self.summary()
        if out:
            Path(out).mkdir(parents=True, exist_ok=True)
            Path(out, f"truth-rank{rank}.json").write_text(json.dumps(data, indent=1))
        short = [
            (w["rounds"], w["reduced_at_micro_batch"], w["params_equal"]) for w in data["windows"]
        ]
        print(
            f"truth rank {rank}: (rounds, at micro-batch, params equal) per window {short}"
            + (f"; error: {self.error.splitlines()[-1]}" if self.error else ""),
            flush=True,
        )

    def run(self, main: Any) -> None:
        """``main()``, then ``write()``; an exception is recorded, written and re-raised."""
        try:
            main()
        except BaseException as exc:
            self.error = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            self.write()
            raise
        self.write()


def _full(t: Any) -> torch.Tensor | None:
    if t is None:
        return None
    t = t.detach()
    if hasattr(t, "full_tensor"):
        t = t.full_tensor()
    return t


def _checksum(t: torch.Tensor | None) -> float:
    """Order-sensitive float64 checksum: differs when any element differs (in practice)."""
    if t is None:
        return 0.0
    flat = t.reshape(-1).to(torch.float64)
    weights = torch.arange(1, flat.numel() + 1, dtype=torch.float64).sin_()
    return float((flat * weights).sum() + flat.abs().sum())


def parse(default_windows: int = 3, default_accum: int = 4) -> Any:
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--windows", type=int, default=default_windows)
    parser.add_argument("--accum", type=int, default=default_accum)
    return parser.parse_args()


# -- in the ranks: the framework scripts' and cuda_loops.py's counter ---------------------------

OPS = (
    "all_reduce",
    "reduce_scatter_tensor",
    "reduce_scatter",
    "all_gather_into_tensor",
    "all_gather",
    "broadcast",
    "reduce",
)
# the newer entry points, where this torch has them (torch 2.13's FSDP2 reduce-scatters with
# reduce_scatter_single and all-gathers with all_gather_single)
NEWER_OPS = ("reduce_scatter_single", "all_gather_single", "all_reduce_coalesced")

_COUNTER_SOURCE = """
def make(name, original, state, log, nbytes):
    def counted(*args, **kwargs):
        if state["counting"]:
            second = name in ("all_gather_into_tensor", "reduce_scatter_tensor", "all_gather",
                              "reduce_scatter", "reduce_scatter_single", "all_gather_single")
            payload = kwargs.get("input_tensor", kwargs.get("input", kwargs.get("tensor")))
            if payload is None and args:
                payload = args[1] if second and len(args) > 1 else args[0]
            log.append({"op": name, "bytes": nbytes(payload), "window": state["window"],
                        "micro": state["micro"], "phase": state["phase"]})
        return original(*args, **kwargs)
    return counted

def bucket_hook(inner, state, buckets):
    def hook(process_group, bucket):
        if state["counting"]:
            buffer = bucket.buffer()
            buckets.append({"bytes": buffer.numel() * buffer.element_size(),
                            "window": state["window"], "micro": state["micro"],
                            "phase": state["phase"]})
        return inner(process_group, bucket)
    return hook

def phase(name, original, state, boundaries):
    def wrapped(self, *args, **kwargs):
        outer = state["phase"]
        boundary = name == "step" and self.is_gradient_accumulation_boundary()
        state["phase"] = name
        try:
            return original(self, *args, **kwargs)
        finally:
            state["phase"] = outer
            if name == "backward":
                state["total"] = state.get("total", 0) + 1
            if boundary:
                boundaries.append(state["total"] - 1)
                state["window"] += 1
                state["micro"] = 0
            elif name == "backward" and not self.is_gradient_accumulation_boundary():
                state["micro"] += 1
    return wrapped
"""
_counter_ns: dict[str, Any] = {}
exec(compile(_COUNTER_SOURCE, "<ground-truth>", "exec"), _counter_ns)


def all_ops() -> tuple[str, ...]:
    """OPS and those of NEWER_OPS that this torch has."""
    return OPS + tuple(name for name in NEWER_OPS if hasattr(dist, name))


def count_collectives(
    state: dict[str, object], log: list[dict[str, object]], ops: tuple[str, ...] = OPS
) -> None:
    """Wrap every op in ``ops``; call before a framework binds the API (before importing
    it). ``state`` holds "counting", "window", "micro" and "phase"."""
    for name in ops:
        setattr(dist, name, _counter_ns["make"](name, getattr(dist, name), state, log, nbytes))


def count_buckets(model: Any, state: dict[str, object], buckets: list[dict[str, object]]) -> None:
    """Register on the DDP ``model`` a comm hook that logs each bucket (bytes, window,
    micro-batch, phase) and reduces it with torch's ``allreduce_hook``: what DDP's built-in
    reduction does (divide by the group's size, all-reduce), through the Python API."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    model.register_comm_hook(None, _counter_ns["bucket_hook"](allreduce_hook, state, buckets))


def phase(
    name: str, original: Callable[..., Any], state: dict[str, object], boundaries: list[int]
) -> Callable[..., Any]:
    """An engine method that keeps ``state``'s phase, window and micro-batch."""
    return _counter_ns["phase"](name, original, state, boundaries)  # type: ignore[no-any-return]


# -- in the tests: cuda_loops.py's count beside syncscope's report ------------------------------

REDUCING = {
    "all_reduce",
    "all_reduce_coalesced",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "reduce_scatter_single",
}
# torch.distributed's function -> the op syncscope counts it as (report.json's `collectives`)
CATEGORY = {
    "all_reduce": "all_reduce",
    "all_reduce_coalesced": "all_reduce",
    "reduce_scatter": "reduce_scatter",
    "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter_single": "reduce_scatter",
    "all_gather": "all_gather",
    "all_gather_into_tensor": "all_gather",
    "all_gather_single": "all_gather",
}
COMPARED = ("all_reduce", "reduce_scatter", "all_gather")


def read_truths(directory: Path, world_size: int) -> list[dict[str, Any]]:
    """Each rank's ``truth-RANK.json``, by rank."""
    return [
        json.loads((directory / f"truth-{rank}.json").read_text()) for rank in range(world_size)
    ]


def truth_windows(truth: dict[str, Any]) -> list[dict[str, Any]]:
    """Per window closed by a real optimizer step, from the script's own count."""
    out = []
    for w, micro_batches in enumerate(truth["micro_batches"]):
        colls = [c for c in truth["collectives"] if c["window"] == w]
        syncs = [c for c in colls if c["phase"] == "backward" and c["op"] in REDUCING]
        window: dict[str, Any] = {
            "micro_batches": micro_batches,
            "grad_syncs": len({c["micro"] for c in syncs}),
            "grad_sync_micro_batches": sorted({c["micro"] for c in syncs}),
            "grad_sync_collectives": len(syncs),
            "grad_sync_bytes": sum(c["bytes"] for c in syncs),
        }
        for op in COMPARED:
            window[op] = sum(1 for c in colls if CATEGORY.get(c["op"]) == op)
        out.append(window)
    return out


def measured_windows(report: dict[str, Any], rank: int) -> list[dict[str, Any]]:
    """The same fields from syncscope's report.json, per complete window of ``rank``."""
    out = []
    for w in report["ranks"][rank]["windows"]:
        if not w["complete"]:
            continue
        window = {
            key: w[key]
            for key in (
                "micro_batches",
                "grad_syncs",
                "grad_sync_micro_batches",
                "grad_sync_collectives",
                "grad_sync_bytes",
            )
        }
        for op in COMPARED:
            window[op] = w["collectives"][op]
        out.append(window)
    return out


def assert_matches_truth(report: dict[str, Any], truths: list[dict[str, Any]]) -> None:
    """syncscope's windows on every rank are the script's own count: micro-batches, grad-sync
    rounds, their positions, collectives and bytes, and the all-reduces, reduce-scatters and
    all-gathers of each window (window 0 may hold more all-gathers: DDP's constructor checks
    the parameter shapes across ranks with one, from C++, before the loop)."""
    assert len(report["ranks"]) == len(truths), report["ranks"]
    for truth in truths:
        rank = truth["rank"]
        expected = truth_windows(truth)
        measured = measured_windows(report, rank)
        assert len(measured) == len(expected), (rank, measured, expected)
        for index, (m, t) in enumerate(zip(measured, expected, strict=True)):
            if index == 0:
                assert m["all_gather"] >= t["all_gather"], (rank, m, t)
                m = {**m, "all_gather": t["all_gather"]}
            assert m == t, (rank, index)
        if truth["buckets"]:  # a DDP model: its reductions are the buckets the hook saw
            assert_buckets_are_the_reductions(truth)
    first = truth_windows(truths[0])
    assert report["grad_syncs_per_window"] == [w["grad_syncs"] for w in first]


def assert_buckets_are_the_reductions(truth: dict[str, Any]) -> None:
    """Under DDP each bucket the comm hook saw is one all-reduce in the same backward: the
    two counts of the script agree (the hook did reduce what DDP handed it)."""

    def at(entries: list[dict[str, Any]]) -> list[tuple[int, int, str]]:
        return sorted((e["window"], e["micro"], e["phase"]) for e in entries)

    reductions = [c for c in truth["collectives"] if c["op"] == "all_reduce"]
    assert at(truth["buckets"]) == at(reductions), truth


def assert_communication_timed(report: dict[str, Any], truths: list[dict[str, Any]]) -> None:
    """Two ranks over gloo exchange data: every window with a grad sync has time with a
    collective in flight. (Asserted only where ranks communicate: NCCL at world size 1
    moves nothing and launches no kernel.)"""
    for truth in truths:
        assert truth["world_size"] == 2 and truth["backend"] == "gloo", truth
        for w in report["ranks"][truth["rank"]]["windows"]:
            if w["complete"] and w["grad_syncs"]:
                assert w["comm_in_flight_ns"] > 0, w
