"""A recipe of this directory run under ``torch.profiler`` from its start to its end (CPU
activity, shapes recorded), each rank exporting its Chrome trace to ``OUT_DIR/rank{R}.json``:
what ``syncscope analyze`` reads, made the way a user makes it, with no syncscope in the run.

    torchrun --nproc-per-node 2 traced.py OUT_DIR RECIPE [RECIPE_ARGS...]

RECIPE is a script name of this directory (``amp_skipped_step``, ``gan_two_models``,
``fsdp_gan_two_models``); its truth (``BUG_TRUTH_DIR``) is written as when it runs alone.
"""

import os
import runpy
import sys

import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile


def main() -> None:
    out, recipe, *args = sys.argv[1:]
    here = os.path.dirname(os.path.abspath(__file__))
    os.makedirs(out, exist_ok=True)
    # the group is made before the profiler starts (the trace's ``distributedInfo``), and
    # lives until the trace is written: the recipe's own init and destroy do nothing
    dist.init_process_group("gloo")
    init, destroy = dist.init_process_group, dist.destroy_process_group
    dist.init_process_group = dist.destroy_process_group = lambda *a, **k: None
    rank = dist.get_rank()
    sys.argv = [os.path.join(here, f"{recipe}.py"), *args]
    try:
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            runpy.run_path(sys.argv[0], run_name="__main__")
    finally:
        dist.init_process_group, dist.destroy_process_group = init, destroy
    prof.export_chrome_trace(os.path.join(out, f"rank{rank}.json"))
    destroy()


if __name__ == "__main__":
    main()
