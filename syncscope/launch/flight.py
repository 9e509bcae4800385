"""``syncscope profile`` and torch's Flight Recorder: on in the ranks, dumped on a hang.

The recorder is turned on (``TORCH_FR_BUFFER_SIZE=2000``) unless the user set
``TORCH_FR_BUFFER_SIZE`` or the older ``TORCH_NCCL_TRACE_BUFFER_SIZE`` (``0`` turns it off).
When the monitor declares a hang, ``request_dumps`` asks the ranks still running for their
buffers (``syncscope.capture.flightdump``) and waits for them before stopping the job; the
hang finding then says which collective each rank is stuck in, with its stack.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import MutableMapping, Sequence
from pathlib import Path

from syncscope.capture.flightdump import DUMPS_ENV, FLIGHT_DIR, REQUEST

__all__ = ["BUFFER_SIZE", "enable", "request_dumps"]

BUFFER_SIZE = "2000"  # torch's own default size where the recorder is on
FR_ENV = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
WAIT_S = 15.0  # a rank blocked in a collective may take seconds to get the GIL


def enable(
    environ: MutableMapping[str, str] | None = None, release: tuple[int, int] | None = None
) -> bool:
    """Turn the recorder on for the ranks unless the user chose; True when it is on.
    ``release``: torch's (major, minor), the installed one's unless given."""
    env = os.environ if environ is None else environ
    if release is None:
        from syncscope.capture.release import torch_release

        release = torch_release()
    if not any(env.get(k, "").strip() for k in FR_ENV):
        env["TORCH_FR_BUFFER_SIZE"] = BUFFER_SIZE
        if release < (2, 8):  # torch 2.6 and 2.7 read the older name only (NCCL only)
            env["TORCH_NCCL_TRACE_BUFFER_SIZE"] = BUFFER_SIZE
    size = next((env[k].strip() for k in FR_ENV if env.get(k, "").strip()), "0")
    on = size.isdigit() and int(size) > 0
    if on:
        env[DUMPS_ENV] = "1"
    else:
        env.pop(DUMPS_ENV, None)
    return on


def request_dumps(run_dir: Path, ranks: Sequence[int], wait_s: float = WAIT_S) -> list[int]:
    """Ask the ranks for their recorder's buffer and wait until ``ranks`` have written
    theirs (or ``wait_s``); returns the ranks that did. Nothing when the recorder is off."""
    if os.environ.get(DUMPS_ENV) != "1" or not ranks:
        return []
    folder = run_dir / FLIGHT_DIR
    with contextlib.suppress(OSError):
        folder.mkdir(exist_ok=True)
        (folder / REQUEST).write_text("dump\n")
    deadline = time.monotonic() + wait_s
    wanted = {r for r in ranks if r >= 0}  # -1: a rank whose header was never read
    while True:
        done = {r for r in wanted if (folder / f"fr_{r}").exists()}
        if done == wanted or time.monotonic() > deadline:
            return sorted(done)
        time.sleep(0.1)
