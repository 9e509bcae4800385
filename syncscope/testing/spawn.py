"""``spawn``: run a function on N local ranks with a process group, never hanging a test suite.

The parent hosts the rendezvous store on a free port (no port guessing, no races), starts
``world_size`` processes, and collects each rank's return value or exception. A rank that
raises has its exception re-raised in the parent with that rank's traceback attached (as a
note); a run that outlives ``timeout`` has every process ended and raises TimeoutError.
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import time
import traceback
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

_OK = "ok"
_ERR = "error"


def _worker(
    fn: Callable[..., Any],
    args: Sequence[Any],
    rank: int,
    world_size: int,
    backend: str,
    port: int,
    timeout: float,
    results: Any,
) -> None:
    import torch.distributed as dist

    try:
        store = dist.TCPStore(
            "127.0.0.1", port, world_size, is_master=False, timeout=timedelta(seconds=timeout)
        )
        dist.init_process_group(
            backend, store=store, rank=rank, world_size=world_size,
            timeout=timedelta(seconds=timeout),
        )
        try:
            value = fn(*args)
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()
        results.put((rank, _OK, value, ""))
    except BaseException as exc:  # report everything, KeyboardInterrupt included
        text = traceback.format_exc()
        try:
            results.put((rank, _ERR, exc, text))
        except Exception:  # the exception itself would not pickle
            results.put((rank, _ERR, RuntimeError(f"{type(exc).__name__}: {exc}"), text))


def spawn(
    fn: Callable[..., Any],
    world_size: int = 2,
    backend: str = "gloo",
    args: Sequence[Any] = (),
    timeout: float = 120,
    start_method: str = "spawn",
) -> list[Any]:
    """Run ``fn(*args)`` on ``world_size`` processes in one process group; return the values
    indexed by rank. ``fn`` and ``args`` must be picklable (a module-level function)."""
    import torch.distributed as dist

    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, not {world_size}")
    store = dist.TCPStore(
        "127.0.0.1", 0, world_size + 1, is_master=True, wait_for_workers=False,
        timeout=timedelta(seconds=timeout),
    )
    ctx = mp.get_context(start_method)
    results = ctx.Queue()
    procs = [
        ctx.Process(
            target=_worker,
            args=(fn, tuple(args), rank, world_size, backend, store.port, timeout, results),
            name=f"syncscope-rank-{rank}",
            daemon=True,
        )
        for rank in range(world_size)
    ]
    for p in procs:
        p.start()
    values: dict[int, Any] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(values) < world_size:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                missing = [r for r in range(world_size) if r not in values]
                raise TimeoutError(
                    f"spawn: rank(s) {missing} did not finish within {timeout:g} s "
                    "(hung in a collective?); all ranks were stopped"
                )
            try:
                rank, status, value, text = results.get(timeout=min(remaining, 0.5))
            except queue.Empty:
                dead = [
                    r for r, p in enumerate(procs)
                    if r not in values and not p.is_alive() and p.exitcode not in (0, None)
                ]
                if dead:
                    r = dead[0]
                    raise RuntimeError(
                        f"spawn: rank {r} died with exit code {procs[r].exitcode} "
                        "without reporting (killed, or crashed in native code)"
                    ) from None
                continue
            if status == _ERR:
                if isinstance(value, BaseException):
                    value.add_note(f"raised on rank {rank} of {world_size}:\n{text}")
                    raise value
                raise RuntimeError(f"rank {rank} failed:\n{text}")
            values[rank] = value
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        results.close()
        del store
    return [values[r] for r in range(world_size)]
