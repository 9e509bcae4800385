"""A rank's side of the Flight Recorder dumps ``syncscope profile`` asks for on a hang.

``profile`` turns torch's Flight Recorder on in the ranks (``TORCH_FR_BUFFER_SIZE``, unless
the user set it) and sets ``SYNCSCOPE_FLIGHT_DUMPS``. Each rank then runs one daemon thread
that looks for ``RUN/flight/request`` twice a second; when the monitor declares a hang it
writes that file, and every rank still alive writes ``RUN/flight/fr_<rank>`` (torch's pickle,
``_dump_fr_trace``), from this thread: the main thread may be blocked in the collective that
hangs. ``syncscope analyze RUN`` and the hang finding read them.
"""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path

__all__ = ["DUMPS_ENV", "FLIGHT_DIR", "REQUEST", "dump_to", "start_dumper"]

DUMPS_ENV = "SYNCSCOPE_FLIGHT_DUMPS"
FLIGHT_DIR = "flight"
REQUEST = "request"
POLL_S = 0.5


def dump_to(folder: Path, rank: int) -> bool:
    """Write this rank's Flight Recorder buffer to ``folder/fr_<rank>`` (atomically)."""
    try:
        import torch._C._distributed_c10d as c10d

        # torch 2.8 on; 2.6 and 2.7 record NCCL collectives only, dumped by the older name
        dump = getattr(c10d, "_dump_fr_trace", None) or getattr(c10d, "_dump_nccl_trace", None)
        data = dump(True, True, False) if dump is not None else None
    except (ImportError, RuntimeError):
        return False
    if not isinstance(data, bytes):
        return False
    partial = folder / f".fr_{rank}.{os.getpid()}"
    try:
        partial.write_bytes(data)
        partial.replace(folder / f"fr_{rank}")
    except OSError:
        return False
    return True


def start_dumper(run_dir: Path, rank: int) -> None:
    """Under ``syncscope profile`` with the recorder on: dump once when asked."""
    if os.environ.get(DUMPS_ENV) != "1":
        return
    folder = run_dir / FLIGHT_DIR
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(POLL_S):
            with contextlib.suppress(OSError):
                if (folder / REQUEST).exists():
                    dump_to(folder, rank)
                    return

    threading.Thread(target=watch, name="syncscope-flight-dump", daemon=True).start()
