"""Ground truth for the bug-shape scripts of tests/scripts/bugs/ (issue 41), taken without
syncscope: what happened to the gradients, per optimizer step ("window").

- Every collective the stack issues through the ``torch.distributed`` Python API
  (``all_reduce``, ``reduce_scatter_tensor``, ``reduce_scatter_single``, ``all_gather_*``,
  ...) is counted by a wrapper of that function: op, group size, bytes (the largest tensor
  argument: the reduce-scatter's input), window, micro-batch and phase.
- DDP's C++ reducer reduces its buckets below Python: a pass-through comm hook registered by
  the script (``truth.ddp_comm_hook(model)``) logs each bucket and then hands it to torch's
  own ``allreduce_hook`` (the default behaviour: divide by the group size, all-reduce); the
  ``dist.all_reduce`` that hook calls is the bucket's, not logged twice.
- Collectives compiled into a graph (compiled autograd's functional all-reduces) are never
  seen by Python: ``truth.profiled_backward`` counts the ``_c10d_functional`` all-reduces
  torch.profiler records in the backward.
- After each optimizer step the parameters (and gradients, where still present) are
  compared across replicas: a float64 checksum per tensor, full tensors for DTensors
  (``full_tensor()``), all-gathered over the replica group. These collectives run with
  counting off, so they are never in the truth.

A *round* is one (micro-batch, phase) in which at least one gradient reduction ran: the
phases are ``backward`` (inside ``loss.backward()``: DDP's and FSDP's hooks), ``after``
(after the backward, before the step: a hand all-reduce) and ``step`` (inside a pipelining
schedule's ``step()``). Two reductions of the same gradients on the same micro-batch by
DDP's hooks and by hand are two rounds.

The wrappers are compiled under a file name in angle brackets, as tests/scripts/frameworks/
_truth.py does: syncscope takes such code for library code, so a collective FSDP issues
through a wrapper is still FSDP's and a hand all-reduce is still the script's.

``BUG_TRUTH_DIR`` set: each rank writes ``truth-rank{R}.json`` there (also when the script
raises: the error is recorded and re-raised).
"""

from __future__ import annotations

import contextlib
import json
import os
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

OPS = (
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
REDUCTIONS = frozenset(op for op in OPS if "reduce" in op)

_SOURCE = """
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
_ns: dict[str, Any] = {}
exec(compile(_SOURCE, "<bug-truth>", "exec"), _ns)


def nbytes(value: object) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(nbytes(v) for v in value)
    return 0


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
        for name in OPS:
            original = getattr(dist, name, None)
            if original is not None and not getattr(original, "_bug_truth", False):
                setattr(dist, name, _ns["make"](name, original, self))

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

        hook = _ns["comm_hook"](self, default_hooks.allreduce_hook, name)
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
