"""``spawn``: run a function on N local ranks with a process group, never hanging a test suite.

The parent hosts the rendezvous store on a free port (no port guessing, no races), starts
``world_size`` processes, and collects each rank's return value or exception. A rank that
raises has its exception re-raised in the parent with that rank's traceback attached (as a
note); a run that outlives ``timeout`` has every process ended and raises TimeoutError.

Each rank reports before it tears its process group down. After a first failure the parent
waits a moment for the others, then re-raises the root cause: a rank's own exception (or
its ``sys.exit`` code), before a rank that died without a word (``os._exit(9)``, a signal),
before ranks that only saw the connection to a failed peer drop ("Connection reset by
peer"); those follow as notes.
"""

from __future__ import annotations

import multiprocessing as mp
import pickle
import queue
import re
import signal
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

_OK = "ok"
_ERR = "error"
_GRACE_S = 1.0  # how long to look for a dead rank's last message before calling it lost
_SETTLE_S = 2.0  # after a first failure, how long to wait for the others (the root cause)


class _Exit:
    """``sys.exit(code)`` in a rank, as sent to the parent: the code itself, not a pickled
    SystemExit (a parent or rank that imports dask.distributed pickles exceptions through
    tblib, and a SystemExit comes back with its code lost)."""

    def __init__(self, code: object) -> None:
        self.code = code


def _error_payload(exc: BaseException) -> tuple[bytes | None, str]:
    """The pickled exception (None when it does not survive a round trip) and its text:
    the traceback alone when the exception travels (its message is printed with it, so the
    note does not repeat a long assert_syncs message), the whole text otherwise."""
    text = "".join(traceback.format_exception(exc))
    try:
        if isinstance(exc, SystemExit):
            code = exc.code if isinstance(exc.code, (int, str, type(None))) else repr(exc.code)
            data = pickle.dumps(_Exit(code))
            return data, text
        data = pickle.dumps(exc)
        pickle.loads(data)  # custom __init__ signatures pickle but do not unpickle
    except Exception:
        return None, text
    frames = "".join(traceback.format_tb(exc.__traceback__))
    return data, f"Traceback (most recent call last):\n{frames}{type(exc).__qualname__} (above)"


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
        try:
            store = dist.TCPStore(  # type: ignore[attr-defined]
                "127.0.0.1", port, world_size, is_master=False, timeout=timedelta(seconds=timeout)
            )
            dist.init_process_group(
                backend,
                store=store,
                rank=rank,
                world_size=world_size,
                timeout=timedelta(seconds=timeout),
            )
            value = fn(*args)
            try:
                payload = pickle.dumps(value)
            except Exception as exc:
                raise TypeError(
                    f"the return value of rank {rank} cannot be sent to the parent: {exc}"
                ) from exc
            results.put((rank, _OK, payload, ""))
        except BaseException as exc:  # report everything, KeyboardInterrupt included
            data, text = _error_payload(exc)
            results.put((rank, _ERR, data, text))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _rank_error(rank: int, world_size: int, data: bytes | None, text: str) -> BaseException:
    """The rank's exception, with its traceback as a note; RuntimeError if it cannot be
    rebuilt or would stop the parent (SystemExit, KeyboardInterrupt)."""
    exc: object = None
    if data is not None:
        try:
            exc = pickle.loads(data)
        except Exception:
            exc = None
    if isinstance(exc, _Exit):  # sys.exit(9) in the function: its code is the news
        code = exc.code
        status = code if isinstance(code, int) else (0 if code is None else 1)
        exc = RuntimeError(
            f"spawn: rank {rank} exited with code {status} (sys.exit({code!r}) in the function)"
        )
    elif not isinstance(exc, Exception):
        last = text.strip().splitlines()[-1] if text.strip() else "unknown error"
        exc = RuntimeError(f"rank {rank} failed: {last}")
    exc.add_note(f"raised on rank {rank} of {world_size}; that rank's traceback:\n{text}")
    return exc


# how a rank sees a peer that died: its own error is a consequence, not the cause
_BROKEN_LINK = re.compile(
    r"Connection (closed|reset) by peer|Broken pipe|Socket Timeout|Connection refused"
    r"|remote worker crashing"
)


@dataclass
class _Failure:
    rank: int
    error: BaseException
    kind: int  # 0: its own error; 1: died without reporting; 2: a broken link to a peer


def _failure(rank: int, error: BaseException) -> _Failure:
    return _Failure(rank, error, 2 if _BROKEN_LINK.search(str(error)) else 0)


def _lost_error(rank: int, code: int) -> RuntimeError:
    how = f"was killed by signal {_signal_name(-code)}" if code < 0 else f"exited with code {code}"
    return RuntimeError(
        f"spawn: rank {rank} {how} without reporting (killed, os._exit(), or a crash in "
        "native code)"
    )


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)


def _root_cause(failures: list[_Failure], world_size: int) -> BaseException:
    """The first rank's own failure (its exception, its exit code), before a rank that died
    without a word, before ranks that only saw a peer's connection drop; the others are
    noted on it as consequences."""
    ordered = sorted(enumerate(failures), key=lambda item: (item[1].kind, item[0]))
    root = ordered[0][1]
    for _, other in ordered[1:]:
        first = (str(other.error).strip().splitlines() or [""])[0][:300]
        why = " (its connection to a failed rank broke)" if other.kind == 2 else ""
        root.error.add_note(
            f"then rank {other.rank} of {world_size} failed{why}: "
            f"{type(other.error).__name__}: {first}"
        )
    return root.error


def spawn(
    fn: Callable[..., Any],
    world_size: int = 2,
    backend: str = "gloo",
    args: Sequence[Any] = (),
    timeout: float = 120,
    start_method: str = "spawn",
) -> list[Any]:
    """Run ``fn(*args)`` on ``world_size`` processes in one process group; return the values
    indexed by rank.

    ``fn``, ``args`` and the return values must be picklable (``fn`` a module-level
    function). The first rank to raise has its exception re-raised here, with that rank's
    traceback in its notes; if the ranks have not all returned within ``timeout`` seconds,
    TimeoutError. Either way every process is ended before this returns or raises.
    """
    import torch.distributed as dist

    if isinstance(world_size, bool) or not isinstance(world_size, int):
        raise TypeError(f"world_size must be an int, not {world_size!r}")
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, not {world_size}")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"timeout must be a number of seconds, not {timeout!r}")
    if not 0 < timeout < 10**6:  # NaN fails both; inf overflows the store's timedelta
        raise ValueError(f"timeout must be a positive, finite number of seconds, not {timeout}")
    store = dist.TCPStore(  # type: ignore[attr-defined]
        "127.0.0.1",
        0,
        world_size + 1,
        is_master=True,
        wait_for_workers=False,
        timeout=timedelta(seconds=timeout),
    )
    ctx: Any = mp.get_context(start_method)
    results = ctx.Queue()
    procs = [
        ctx.Process(
            target=_worker,
            args=(fn, tuple(args), rank, world_size, backend, store.port, timeout, results),
            name=f"syncscope-rank-{rank}",
        )
        for rank in range(world_size)
    ]
    values: dict[int, Any] = {}
    deadline = time.monotonic() + timeout
    try:
        for p in procs:
            p.start()
        _collect(procs, results, values, timeout, deadline)
    finally:
        _stop(procs, grace=2.0 if len(values) == world_size else 0.0)
        results.close()
        results.join_thread()
        del store
    return [values[r] for r in range(world_size)]


def _collect(
    procs: list[Any], results: Any, values: dict[int, Any], timeout: float, deadline: float
) -> None:
    """Fill ``values`` with each rank's return value as the ranks report; raise the root
    cause once a rank has failed and the others have reported, died or had ``_SETTLE_S`` s
    (``_root_cause``), TimeoutError at ``deadline`` (``timeout`` s after the start)."""
    world_size = len(procs)
    failures: list[_Failure] = []
    settle = float("inf")  # after the first failure: when to stop waiting for the others
    exited_at: dict[int, float] = {}
    while len(values) < world_size:
        now = time.monotonic()
        heard = set(values) | {f.rank for f in failures}
        if failures and (now >= min(settle, deadline) or len(heard) == world_size):
            raise _root_cause(failures, world_size)
        if now >= deadline:
            from syncscope.model import compress_ranks

            missing = compress_ranks([r for r in range(world_size) if r not in values])
            raise TimeoutError(
                f"spawn: rank(s) {missing} of {world_size} did not finish within "
                f"{timeout:g} s (hung in a collective, or waiting for a rank that "
                "returned early?); every rank was stopped"
            )
        try:
            rank, status, data, text = results.get(timeout=min(deadline - now, 0.1))
        except queue.Empty:
            for r, p in enumerate(procs):
                if r in heard or p.exitcode is None:
                    continue
                exited_at.setdefault(r, now)
                if now - exited_at[r] >= _GRACE_S:  # its message may still be in the pipe
                    failures.append(_Failure(r, _lost_error(r, p.exitcode), 1))
                    settle = min(settle, now + _SETTLE_S)
            continue
        if status == _ERR:
            failures.append(_failure(rank, _rank_error(rank, world_size, data, text)))
            settle = min(settle, time.monotonic() + _SETTLE_S)
        else:
            values[rank] = pickle.loads(data)


def _stop(procs: list[Any], grace: float) -> None:
    """End every process: let finished ranks exit for ``grace`` s, then SIGTERM, then SIGKILL
    for any still alive after a moment."""
    deadline = time.monotonic() + grace
    for p in procs:
        if p.pid is not None:
            p.join(timeout=max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + 5
    for p in procs:
        if p.pid is None:  # never started
            continue
        p.join(timeout=max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join(timeout=5)
