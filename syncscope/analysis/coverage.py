"""What the run lets syncscope judge: findings for runs that are not what a diagnosis needs.

A report is only as good as the data under it, so three kinds of run are said plainly rather
than reported clean (or, worse, as a false error):

- ``no-optimizer-step``: micro-batches or gradient syncs were recorded, but no optimizer step
  closed a window, so there is nothing to judge the syncs against (verdict ``incomplete``);
- ``ranks-missing``: ranks of the job left no data (no rank file, an empty or unreadable one,
  traces of some ranks only): their syncs were not judged (verdict ``incomplete``);
- ``no-process-group``: several ranks ran and none initialised ``torch.distributed``: they
  were independent copies of the script, with nothing to synchronize (a warning, in place of
  the ``rank-divergence`` their different gradients would otherwise raise).

Pure: ``Run -> list[Finding]``.
"""

from __future__ import annotations

from syncscope.model import (
    Finding,
    Fix,
    Run,
    missing_rank_runs,
    rank_failed,
    ranks_text,
)

MAX_FINDING_RANKS = 64  # more missing ranks than this: counted and written, not listed one by one
STEP_FIX = Fix(
    style="optimizer-step",
    summary=(
        "syncscope closes a window at each outermost `step()` of a `torch.optim.Optimizer` "
        "(torch's global optimizer hooks): call the optimizer's `step()` once per window; an "
        "optimizer of your own must derive from `torch.optim.Optimizer`, and a hand-written "
        "update (`p -= lr * p.grad`) is not seen as a step."
    ),
    snippet=(
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.01)  # any torch.optim.Optimizer\n"
        "for micro, batch in enumerate(micro_batches):\n"
        "    model(batch).loss.backward()\n"
        "optimizer.step()  # closes the window: syncs are judged per step\n"
        "optimizer.zero_grad()"
    ),
)

PROCESS_GROUP_FIX = Fix(
    style="process-group",
    summary=(
        "Initialise a process group and wrap the model for data parallelism, so the ranks "
        "train one model; or run one process (`--nproc-per-node 1`) if the script is not "
        "meant to be distributed."
    ),
    snippet=(
        "import torch.distributed as dist\n"
        "from torch.nn.parallel import DistributedDataParallel as DDP\n"
        "\n"
        'dist.init_process_group("gloo")  # "nccl" on GPUs; torchrun sets rank and world size\n'
        "model = DDP(model)"
    ),
)


def _plural(n: int, word: str, many: str = "") -> str:
    return f"{n} {word if n == 1 else many or word + 's'}"


def no_optimizer_step(run: Run) -> list[Finding]:
    """Backward passes or grad syncs recorded, and no window closed by an optimizer step on
    any rank: every count is of one open-ended span, and nothing can be judged. A run that
    failed or hung says why it stopped (run-failed, hang): not repeated here."""
    if any(w.complete for r in run.ranks for w in r.windows):
        return []
    if run.meta.hung or any(rank_failed(r) for r in run.ranks):
        return []
    micro = {r.rank: sum(len(w.micro_batches) for w in r.windows) for r in run.ranks}
    syncs = {r.rank: sum(w.grad_syncs for w in r.windows) for r in run.ranks}
    if not any(micro.values()) and not any(syncs.values()):
        return []
    ranks = tuple(r.rank for r in run.ranks if micro[r.rank] or syncs[r.rank])
    example = ranks[0]
    return [
        Finding(
            kind="no-optimizer-step",
            severity="warning",
            cause="no-step-recognised",
            message=(
                f"{_plural(micro[example], 'micro-batch', 'micro-batches')} and {_plural(syncs[example], 'grad sync')}"
                f" recorded on rank {example}, but no optimizer step was recognised: no window "
                "was closed, so the syncs could not be judged"
            ),
            ranks=ranks,
            windows=(),
            evidence={
                "micro_batches_recorded": micro[example],
                "grad_syncs_recorded": syncs[example],
                "complete_windows": 0,
                "example_rank": example,
            },
            cost={},
            fix=STEP_FIX,
        )
    ]


def ranks_missing(run: Run) -> list[Finding]:
    """Ranks below the world size with no data in the run: the report covers the others
    (not for ``track(gather=False)``, which keeps one rank's view by choice)."""
    if run.meta.one_rank_view:
        return []
    runs, count = missing_rank_runs((r.rank for r in run.ranks), run.world_size)
    if not count:
        return []
    shown = ranks_text(runs, count)
    listed = [r for a, b in runs for r in range(a, b + 1)] if count <= MAX_FINDING_RANKS else []
    present = len(run.ranks)
    what = "no trace" if run.meta.source == "trace" else "no readable events"
    return [
        Finding(
            kind="ranks-missing",
            severity="warning",
            cause="no-trace" if run.meta.source == "trace" else "no-events",
            message=(
                f"{what} from {_plural(count, 'rank')} of {run.world_size} ({shown}): their "
                f"syncs were not judged; this report covers {_plural(present, 'rank')}"
            ),
            ranks=tuple(listed) if count == len(listed) else (),  # all of them, or none
            windows=(),
            evidence={
                "world_size": run.world_size,
                "ranks_with_data": present,
                "ranks_missing": count,
            },
            cost={},
        )
    ]


def no_process_group(run: Run) -> list[Finding]:
    """Several ranks of a live run, none in a process group: independent copies."""
    if run.meta.source != "live" or len(run.ranks) < 2:
        return []
    if any(r.dist_initialized for r in run.ranks):
        return []
    if any(rank_failed(r) and not r.windows for r in run.ranks):
        return []  # it failed before it could reach one (at import): run-failed says so
    n = len(run.ranks)
    return [
        Finding(
            kind="no-process-group",
            severity="warning",
            cause="independent-copies",
            message=(
                f"no process group: the {n} ranks never initialised torch.distributed, so "
                f"{n} independent copies of the script ran, each as world size 1, each "
                "training its own model; there was nothing to synchronize"
            ),
            ranks=tuple(r.rank for r in run.ranks),
            windows=(),
            evidence={"ranks": n, "process_group": "none"},
            cost={},
            fix=PROCESS_GROUP_FIX,
        )
    ]


def independent_copies(run: Run) -> bool:
    """No rank joined a process group: ranks' gradients differ by design, not divergence."""
    return bool(run.ranks) and not any(r.dist_initialized for r in run.ranks)
