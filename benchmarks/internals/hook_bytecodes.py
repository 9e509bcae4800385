"""Python bytecodes capture adds per window, by function: a diagnostic that noise does not blur.

    python benchmarks/internals/hook_bytecodes.py [--model mlp|transformer] [--windows 10] [--top 25]

Runs small_steps.py's shapes (``--model``) under DDP on one gloo rank (no peer, no launcher),
4 micro-batches under ``no_sync()``, twice: plain, then with every hook installed. Each time
it counts the bytecodes executed per window with ``sys.settrace`` opcode events (exact, the
same on a busy machine as on a quiet one) and prints the functions whose count capture
changes, most added first. The time a bytecode costs varies (a hook's first lines after a
backward run with cold caches), and a C call costs none here however long it takes: a
change that removes bytecodes still needs a timed check (``hook_time.py``,
``capture_breakdown.py``). One such trap: ``list.count(None)`` on a list of tensors adds no
bytecode but compares each tensor to None with ``Tensor.__eq__``, a torch call each.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))

from hook_time import small_step

from syncscope.capture.hooks import install as instrument
from syncscope.capture.recorder.core import Recorder
from syncscope.capture.writer import EventWriter


def _count(window: Any, windows: int) -> dict[str, float]:
    """Bytecodes executed per window, by "file:function" (files relative to site-packages or
    this repository)."""
    counts: collections.Counter[tuple[str, str]] = collections.Counter()

    def on_call(frame: Any, event: str, arg: Any) -> Any:
        frame.f_trace_opcodes = True
        frame.f_trace_lines = False
        return on_opcode

    def on_opcode(frame: Any, event: str, arg: Any) -> Any:
        if event == "opcode":
            code = frame.f_code
            counts[(code.co_filename, code.co_name)] += 1
        return on_opcode

    sys.settrace(on_call)
    try:
        for _ in range(windows):
            window()
    finally:
        sys.settrace(None)
    root = str(Path(__file__).resolve().parent.parent) + os.sep
    return {
        f"{file.split('site-packages/')[-1].removeprefix(root)}:{name}": n / windows
        for (file, name), n in counts.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=("mlp", "transformer"), default="mlp")
    parser.add_argument("--windows", type=int, default=10)
    parser.add_argument("--top", type=int, default=25)
    opts = parser.parse_args()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29547")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=0, world_size=1)
    window = small_step(opts.model, 0)

    for _ in range(3):
        window()
    plain = _count(window, opts.windows)
    with tempfile.TemporaryDirectory(prefix="syncscope-bytecodes-") as tmp:
        rec = Recorder(EventWriter(Path(tmp) / "rank-00000.jsonl"), rank=0, world_size=1)
        uninstall = instrument.install(rec)
        try:
            for _ in range(3):
                window()
            captured = _count(window, opts.windows)
        finally:
            uninstall()
            rec.sink.close()
    dist.destroy_process_group()
    added = sorted(((n - plain.get(name, 0.0), name) for name, n in captured.items()), reverse=True)
    total_plain, total = sum(plain.values()), sum(captured.values())
    print(
        f"{opts.model}: {total_plain:,.0f} bytecodes per window plain, {total:,.0f} captured "
        f"(+{total - total_plain:,.0f}, x{total / total_plain:.3f}), {opts.windows} windows"
    )
    for delta, name in added[: opts.top]:
        if delta:
            print(f"  {delta:+9,.1f}  {name}")


if __name__ == "__main__":
    main()
