"""``syncscope.track()`` in-process: a real gloo process group of world size 1 (DDP still
all-reduces there), no launcher, no other process."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

from syncscope.capture.hooks import collectives
from syncscope.render.json_report import window_dict
from syncscope.testing.track import Stats, track
from tests.helpers.ranks import ACCUM, STEPS, make_ddp, train


@pytest.mark.usefixtures("process_group")
def test_no_no_sync_syncs_every_micro_batch_and_is_diagnosed() -> None:
    # GIVEN DDP (world size 1) and a loop without no_sync (pattern 1)
    model = make_ddp()
    # WHEN it runs inside track()
    with track() as stats:
        train(model, mode="every")
    # THEN every micro-batch syncs, and the waste is a finding with a fix
    assert stats.grad_syncs_per_window == [ACCUM] * STEPS
    assert [w["grad_sync_micro_batches"] for w in stats.windows] == [[0, 1, 2, 3]] * STEPS
    kinds = {(f.kind, f.cause) for f in stats.findings}
    assert ("redundant-sync", "no-no_sync") in kinds
    assert all(f.fix is not None for f in stats.findings if f.kind == "redundant-sync")


@pytest.mark.usefixtures("process_group")
def test_correct_no_sync_syncs_once_on_the_last_micro_batch() -> None:
    model = make_ddp()
    with track() as stats:
        train(model, mode="no_sync")
    assert stats.grad_syncs_per_window == [1] * STEPS
    assert [w["grad_sync_micro_batches"] for w in stats.windows] == [[ACCUM - 1]] * STEPS
    assert stats.findings == []
    assert (stats.rank, stats.world_size) == (0, 1)


@pytest.mark.usefixtures("process_group")
def test_windows_have_the_report_json_fields() -> None:
    model = make_ddp()
    with track() as stats:
        train(model, mode="no_sync", steps=1)
    expected_keys = set(window_dict(stats.run.ranks[0].windows[0]))
    assert stats.windows
    assert all(set(w) == expected_keys for w in stats.windows)
    assert stats.windows[0]["micro_batches"] == ACCUM
    assert stats.windows[0]["complete"] is True


@pytest.mark.usefixtures("process_group")
def test_stats_are_live_inside_the_block_and_count_complete_windows_only() -> None:
    model = make_ddp()
    with track() as stats:
        assert stats.grad_syncs_per_window == []
        train(model, mode="every", steps=1)
        assert stats.grad_syncs_per_window == [ACCUM]
        # a trailing micro-batch without an optimizer step is an incomplete window
        model(torch.randn(4, 8)).sum().backward()
        assert stats.grad_syncs_per_window == [ACCUM]
        assert [w["complete"] for w in stats.windows] == [True, False]
    assert stats.grad_syncs_per_window == [ACCUM]


def test_without_a_process_group_nothing_syncs_and_nothing_is_found() -> None:
    assert not dist.is_initialized()
    model = nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with track() as stats:
        for _ in range(2):
            for _ in range(ACCUM):
                model(torch.randn(4, 8)).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
    assert stats.grad_syncs_per_window == [0, 0]
    assert [w["micro_batches"] for w in stats.windows] == [ACCUM, ACCUM]
    assert stats.findings == []
    assert (stats.rank, stats.world_size) == (0, 1)


def test_an_exception_propagates_and_every_hook_is_removed() -> None:
    before = (
        torch.Tensor.backward,
        torch.autograd.backward,
        torch.optim.Optimizer.zero_grad,
        torch.nn.Module.zero_grad,
        torch.nn.parallel.DistributedDataParallel.forward,
    )
    model = nn.Linear(8, 1)
    with pytest.raises(KeyError, match="boom"), track() as stats:
        model(torch.randn(2, 8)).sum().backward()
        raise KeyError("boom")
    after = (
        torch.Tensor.backward,
        torch.autograd.backward,
        torch.optim.Optimizer.zero_grad,
        torch.nn.Module.zero_grad,
        torch.nn.parallel.DistributedDataParallel.forward,
    )
    assert after == before
    assert "require_backward_grad_sync" not in vars(torch.nn.parallel.DistributedDataParallel)
    assert collectives._library is None  # no recorder left: the c10d kernels are unregistered
    # what was seen before the exception is still there
    assert [w["micro_batches"] for w in stats.windows] == [1]
    assert stats.run.ranks[0].exit_reason == "exception"


def test_track_does_not_record_after_exit() -> None:
    model = nn.Linear(8, 1)
    with track() as stats:
        model(torch.randn(2, 8)).sum().backward()
    model(torch.randn(2, 8)).sum().backward()
    assert [w["micro_batches"] for w in stats.windows] == [1]


def test_syncscope_track_is_callable_after_the_submodule_is_imported() -> None:
    # the module is syncscope.testing.track, so importing it never shadows syncscope.track
    import syncscope
    import syncscope.testing.track

    with syncscope.track() as stats:
        pass
    assert isinstance(stats, Stats)


def test_syncscope_track_works_on_a_fresh_import() -> None:
    code = (
        "import sys, syncscope\n"
        "assert 'torch' not in sys.modules\n"
        "with syncscope.track() as stats:\n"
        "    pass\n"
        "assert stats.grad_syncs_per_window == []\n"
        "from syncscope import Stats, track\n"
        "assert isinstance(stats, Stats)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.usefixtures("process_group")
@pytest.mark.filterwarnings("ignore:Full backward hook is firing")
def test_covers_what_comm_debug_mode_cannot() -> None:
    """torch's CommDebugMode counts c10d ops but has no windows or micro-batches, and on
    torch 2.8-2.13 it crashes (IndexError in its module tracker) when it wraps more than one
    DDP forward. Where it works (around a bare backward) our counts agree with it."""
    from torch.distributed.tensor.debug import CommDebugMode

    allreduce = torch.ops.c10d.allreduce_
    # GIVEN a forward outside, a backward inside: CommDebugMode copes, and so do we
    model = make_ddp()
    loss = model(torch.randn(4, 8)).sum()
    with CommDebugMode() as comm:  # type: ignore[no-untyped-call]
        loss.backward()
    loss = model(torch.randn(4, 8)).sum()
    with track() as stats:
        loss.backward()
    assert comm.get_comm_counts()[allreduce] == 1
    assert stats.windows[0]["collectives"]["all_reduce"] == 1
    # GIVEN a real accumulation loop (forwards inside): CommDebugMode crashes on torch 2.8
    # and 2.13 (measured), and on 2.15 counts the loop's all-reduces with no window in sight
    release = tuple(int(x) for x in torch.__version__.split(".")[:2])
    if release < (2, 15):
        with pytest.raises(IndexError), CommDebugMode():  # type: ignore[no-untyped-call]
            train(make_ddp(), mode="no_sync")
    else:
        with CommDebugMode() as comm:  # type: ignore[no-untyped-call]
            train(make_ddp(), mode="no_sync")
        assert comm.get_comm_counts()[allreduce] == STEPS  # one number for the whole loop
    # ... while track() gives the per-window story (a fresh model: a crash leaves
    # CommDebugMode's hooks on the old one)
    with track() as stats:
        train(make_ddp(), mode="no_sync")
    assert stats.grad_syncs_per_window == [1] * STEPS
    assert [w["grad_sync_micro_batches"] for w in stats.windows] == [[ACCUM - 1]] * STEPS


def test_fsdp1_is_hooked_when_imported_and_unhooked_after() -> None:
    # FSDP1 needs an accelerator to run; its hooks are installed on import and removed at exit
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP1

    before = (FSDP1.forward, FSDP1.no_sync)
    with track(gather=False):
        assert FSDP1.forward is not before[0]
        assert FSDP1.no_sync is not before[1]
    assert (FSDP1.forward, FSDP1.no_sync) == before


def test_a_forked_child_records_nothing_and_reaches_no_profiler() -> None:
    """A process the rank forks (a pool worker) inherits the hooks: they stay inert there."""
    import os

    from syncscope.capture.recorder.core import MemorySink, Recorder

    class Hooks:
        calls = 0

        def __getattr__(self, name: str) -> Any:
            def hook(*args: Any) -> None:
                Hooks.calls += 1

            return hook

    sink = MemorySink()
    rec = Recorder(sink, rank=0, world_size=1, trace=Hooks())  # type: ignore[arg-type]
    pid = os.fork()
    if pid == 0:  # the child: exit status 0 only if nothing is recorded or traced
        rec.on_forward_begin("ddp", "ddp:M#0", True)
        rec.on_backward_end(rec.on_backward_begin())
        ok = rec.trace is None and not sink.events and Hooks.calls == 0
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    rec.on_forward_begin("ddp", "ddp:M#0", True)  # the parent still records
    assert rec.trace is not None and [e["type"] for e in sink.events] == ["fwd"]
