"""Run one rank of a training script under syncscope: ``python -m syncscope.launch.attach``.

This is what ``syncscope profile`` starts on every rank through torch's elastic agent, and
what a user with their own launcher runs instead of the script::

    torchrun --nproc-per-node 8 -m syncscope.launch.attach [--out DIR] train.py --lr 3e-4
    torchrun ... -m syncscope.launch.attach [--out DIR] -m my_package.train ...
    torchrun ... -m syncscope.launch.attach --windows 20 --skip-windows 100 [--then stop] train.py

Bounded capture (``--windows N``, ``--skip-windows W``, ``--then run|stop``, or the variables
``SYNCSCOPE_WINDOWS``, ``SYNCSCOPE_SKIP_WINDOWS``, ``SYNCSCOPE_THEN``; options win): windows
W..W+N-1 are captured, then every hook is removed and the rank's record is complete; the job
runs on at plain speed, or with ``--then stop`` every rank raises ``SystemExit(0)`` at the
end of the optimizer step that closes window W+N-1 (all ranks at the same step).

Each rank appends its events to ``DIR/ranks/rank-NNNNN.jsonl``. Without ``--out`` (or the
``SYNCSCOPE_OUT`` variable) every rank of a torchrun job picks the same directory,
``syncscope-out/<script>-<TORCHELASTIC_RUN_ID>``. Ranks on other nodes write their own
directory there; ``syncscope analyze DIR_NODE0 DIR_NODE1 ...`` merges them.
"""

from __future__ import annotations

import contextlib
import os
import re
import runpy
import signal
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, NoReturn

from syncscope.fields import check_bounds

if TYPE_CHECKING:
    from syncscope.capture.session import CaptureSession

ENV_OUT = "SYNCSCOPE_OUT"
ENV_TRACE = "SYNCSCOPE_TRACE_WINDOWS"  # "A:B" or "" for all windows; unset: no trace
ENV_WINDOWS = "SYNCSCOPE_WINDOWS"
ENV_SKIP_WINDOWS = "SYNCSCOPE_SKIP_WINDOWS"
ENV_THEN = "SYNCSCOPE_THEN"
ENV_PROFILE_PID = "SYNCSCOPE_PROFILE_PID"  # the `syncscope profile` process: ranks end with it
WATCH_S = 0.5  # how often a rank checks that `syncscope profile` is still there
GRACE_S = 5.0  # after SIGTERM to itself, how long a rank waits before it exits anyway
# syncscope/ (this file is syncscope/launch/attach.py): its frames are not the user's
_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_HERE_REAL = os.path.dirname(os.path.dirname(os.path.realpath(__file__))) + os.sep

USAGE = (
    "usage: python -m syncscope.launch.attach [--out DIR] [--windows N] [--skip-windows W] "
    "[--then run|stop] (SCRIPT | -m MODULE) [ARGS...]"
)
OPTIONS = ("--out", "--windows", "--skip-windows", "--then")


def _die(message: str) -> NoReturn:
    """One error line, exit 2. A script path, an option's value or a directory is user text:
    its control characters (and line breaks) are written out, never sent to the terminal."""
    from syncscope.text import visible

    line = visible(message).replace("\n", "\\n")
    print(f"syncscope: error: {line}", file=sys.stderr)
    raise SystemExit(2)


def parse(argv: list[str]) -> tuple[dict[str, str], bool, str, list[str]]:
    """(options given before the program, is_module, target, the program's arguments)."""
    given: dict[str, str] = {}
    i = 0
    while i < len(argv) and argv[i].split("=", 1)[0] in OPTIONS:
        name, eq, value = argv[i].partition("=")
        if eq:
            i += 1
        elif i + 1 < len(argv):
            value = argv[i + 1]
            i += 2
        else:
            _die(f"{name} needs a value; {USAGE}")
        given[name] = value
    if i >= len(argv):
        _die(USAGE)
    if argv[i] == "-m":
        if i + 1 >= len(argv):
            _die(USAGE)
        return given, True, argv[i + 1], argv[i + 2 :]
    return given, False, argv[i], argv[i + 1 :]


def bounds(given: dict[str, str]) -> tuple[int | None, int, str]:
    """Bounded capture from the options, else the environment; exits 2 on a bad value."""
    env = os.environ
    values: list[str | None] = []
    names: list[str] = []
    for option, var in (
        ("--windows", ENV_WINDOWS),
        ("--skip-windows", ENV_SKIP_WINDOWS),
        ("--then", ENV_THEN),
    ):
        if option in given:
            values.append(given[option])
            names.append(option)
        else:
            values.append(env.get(var) or None)
            names.append(var)
    try:
        return check_bounds(values[0], values[1], values[2], (names[0], names[1], names[2]))
    except ValueError as exc:
        _die(str(exc))


def default_out(target: str) -> Path:
    stem = Path(target).stem
    # the launcher's --rdzv-id is user text: one path component, never ``..`` or a separator
    given = re.sub(r"[^A-Za-z0-9_.-]", "_", os.environ.get("TORCHELASTIC_RUN_ID", "")).strip(".")
    run_id = given or time.strftime("%Y%m%d-%H%M%S")
    return Path("syncscope-out") / f"{stem.split('.')[-1]}-{run_id}"


def _trace_windows() -> tuple[int, int] | bool | None:
    value = os.environ.get(ENV_TRACE)
    if value is None:
        return False
    if not value:
        return None
    start, _, stop = value.partition(":")
    return int(start or 0), int(stop or 10**9)


def _write_meta(
    run_dir: Path, target: str, is_module: bool, script_args: list[str], world_size: int
) -> None:
    """Under a foreign launcher nobody else describes the run: local rank 0 does, once."""
    import torch

    from syncscope.rundir import META_FILE, run_meta, write_meta

    if (run_dir / META_FILE).exists():
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    script = "" if is_module else str(Path(target).resolve())
    digest = ""
    if script:
        import hashlib

        digest = hashlib.sha256(Path(script).read_bytes()).hexdigest()
    launcher = {"attached": "true", "run_id": os.environ.get("TORCHELASTIC_RUN_ID", "")}
    meta = run_meta(
        target=target,
        module=is_module,
        script=script,
        script_sha256=digest,
        script_args=script_args,
        world_size=world_size,
        torch_version=str(torch.__version__),
        launcher=launcher,
    )
    write_meta(run_dir, meta)


def _env_count(name: str, default: int, least: int) -> int:
    text = os.environ.get(name, str(default)).strip()
    if not text.isdigit() or int(text) < least:
        _die(f"environment variable {name}={text!r}: must be a whole number >= {least}")
    return int(text)


def _ranks_from_env() -> tuple[int, int, int]:
    """(RANK, WORLD_SIZE, LOCAL_RANK) as torchrun sets them, checked: one line if not sane."""
    rank = _env_count("RANK", 0, 0)
    world_size = _env_count("WORLD_SIZE", 1, 1)
    local_rank = _env_count("LOCAL_RANK", 0, 0)
    if rank >= world_size:
        _die(f"RANK={rank} is not below WORLD_SIZE={world_size}")
    if local_rank >= world_size:
        _die(f"LOCAL_RANK={local_rank} is not below WORLD_SIZE={world_size}")
    return rank, world_size, local_rank


def main(argv: list[str] | None = None) -> int:
    given, is_module, target, script_args = parse(list(sys.argv[1:] if argv is None else argv))
    if "--out" in given and not given["--out"].strip():
        _die("--out needs a directory, not an empty string")
    out = Path(given["--out"]) if "--out" in given else None
    windows, skip_windows, then = bounds(given)
    if not is_module and not Path(target).is_file():
        _die(f"script not found: {target}")
    run_dir = out or (Path(os.environ[ENV_OUT]) if os.environ.get(ENV_OUT) else None)
    # absolute before the script runs: whatever it does with its working directory
    run_dir = Path(os.path.abspath(run_dir or default_out(target)))
    rank, world_size, local_rank = _ranks_from_env()
    from syncscope.capture.session import CaptureSession

    if os.environ.get(ENV_PROFILE_PID) and not (run_dir / "ranks").is_dir():
        # profile prepared RUN/ranks before starting this rank; gone now, it was removed
        # (an interrupted `fix --verify` cleaning up): never recreate it behind its back
        _die(f"the run directory {run_dir} was removed before this rank started; not run")
    if os.environ.get(ENV_PROFILE_PID):  # the monitor's view of this rank's main thread
        from syncscope.capture.heartbeat import start_heartbeat

        start_heartbeat(run_dir, rank)
    from syncscope.rundir import set_aside_attempt

    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    if restart.isdigit() and int(restart) > 0:  # a restarted job: this attempt, its own file
        try:
            set_aside_attempt(run_dir, rank, int(restart))
        except OSError as exc:
            _die(f"cannot set aside the last attempt's rank file in {run_dir}: {exc.strerror}")
        _store_per_attempt(int(restart))

    if local_rank == 0:
        _write_meta(run_dir, target, is_module, script_args, world_size)

    trace = _trace_windows()
    session = CaptureSession.to_run_dir(
        run_dir,
        rank=rank,
        world_size=world_size,
        local_rank=local_rank,
        trace_windows=trace if isinstance(trace, tuple) else None,
        trace=trace is not False,
        extra={"target": target, "module": is_module, "argv": script_args},
        skip_windows=skip_windows,
        windows=windows,
        then=then,
    )

    _close_on_signals(session)
    _watch_profile(session, rank)
    from syncscope.capture.flightdump import start_dumper

    start_dumper(run_dir, rank)  # under profile: the Flight Recorder's buffer on a hang
    sys.argv = [target, *script_args]
    seed_generators(rank)
    return _run(session, is_module, target)


def seed_generators(rank: int) -> None:
    """Under ``SYNCSCOPE_SEED=N`` (``fix --verify`` sets it): Python's, torch's (every device)
    and NumPy's global random generators seeded with N + rank before the script runs, so two
    runs of a script that seeds none start from the same parameters and data (a script that
    seeds its own overrides this)."""
    from syncscope.rundir import SEED_ENV

    value = os.environ.get(SEED_ENV, "").strip()
    if not value:
        return
    if not value.isdigit():
        _die(f"environment variable {SEED_ENV}={value!r}: must be a whole number >= 0")
    import random

    import torch

    seed = int(value) + rank
    random.seed(seed)
    torch.manual_seed(seed)
    numpy = sys.modules.get("numpy")  # imported by torch where installed
    if numpy is not None:
        with contextlib.suppress(Exception):
            numpy.random.seed(seed % 2**32)


def _store_per_attempt(restart: int) -> None:
    """A restarted attempt's ranks meet in torch's agent store, which keeps the attempt
    before's keys (torch 2.13 adds no prefix per attempt): a rank could read a dead rank's
    gloo address and fail to connect or hang, with plain torchrun too. Each attempt gets a
    prefix of its own in the store ``env://`` hands to ``init_process_group``."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return
    import importlib

    from torch.distributed.distributed_c10d import PrefixStore

    # the module (torch.distributed.rendezvous is also the name of a function there)
    rendezvous = importlib.import_module("torch.distributed.rendezvous")
    create = rendezvous._create_c10d_store  # type: ignore[attr-defined]

    def per_attempt(*args: Any, **kwargs: Any) -> Any:
        return PrefixStore(f"syncscope/attempt-{restart}", create(*args, **kwargs))

    rendezvous._create_c10d_store = per_attempt  # type: ignore[attr-defined]


def _close_on_signals(session: CaptureSession) -> None:
    """SIGTERM, SIGINT, SIGHUP: the rank's record is closed with the signal, then it dies of
    it as it would have without syncscope."""
    rank_pid = os.getpid()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        # a process the script forked (a multiprocessing pool worker) is not the rank and
        # has nothing to record, and closing the session there could block on state copied
        # mid-use from the rank (the profiler's), so it just ends
        if os.getpid() == rank_pid:
            _name_lingering_threads(signum)
            session.close(128 + signum, f"killed by signal {signal.Signals(signum).name}")
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    previous: dict[int, Any] = {}
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        with contextlib.suppress(ValueError, OSError):
            previous[sig] = signal.getsignal(sig)
            signal.signal(sig, on_signal)

    def restore_in_child() -> None:
        """A forked child (a pool worker) gets the handlers it would have had without
        syncscope: a Python handler runs only between bytecodes, and a worker stuck in C code
        (a lock copied held from the rank) must still die of the SIGTERM its pool sends."""
        for sig, handler in previous.items():
            with contextlib.suppress(ValueError, OSError, TypeError):
                if signal.getsignal(sig) is on_signal:  # not one the script set since
                    signal.signal(sig, signal.SIG_DFL if handler is None else handler)

    os.register_at_fork(after_in_child=restore_in_child)


def _run(session: CaptureSession, is_module: bool, target: str) -> int:
    """The script (or module) as ``__main__`` under the started session; its exit status,
    recorded with the reason in the rank's footer whatever way it ends."""
    status = 0
    reason = "finished"
    session.start()
    _close_on_os_exit(session)
    try:
        if is_module:
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            sys.path.insert(0, str(Path(target).resolve().parent))
            runpy.run_path(target, run_name="__main__")
    except SystemExit as exc:
        code = exc.code
        status = code if isinstance(code, int) else (0 if code is None else 1)
        reason = "exit" if status == 0 else f"exit status {status}"
        if status and not isinstance(code, int):
            print(code, file=sys.stderr)
    except KeyboardInterrupt:
        status, reason = 130, "interrupted"
    except BaseException as exc:
        sys.stderr.write(user_traceback(exc))
        status, reason = 1, f"{type(exc).__name__}: {exc}"[:500]
    finally:
        session.close(status, reason)
        _SCRIPT_ENDED.set()
        _release()
    return status


_SCRIPT_ENDED = threading.Event()  # the script has returned (or raised): its exit is recorded


def _name_lingering_threads(signum: int) -> None:
    """A signal after the script's end: say which of its threads kept the process alive
    (Python waits for every non-daemon thread before it exits)."""
    if not _SCRIPT_ENDED.is_set():
        return
    from syncscope.text import visible

    main = threading.main_thread()
    names = [t.name for t in threading.enumerate() if not t.daemon and t is not main]
    if names:
        with contextlib.suppress(OSError, ValueError):
            print(
                f"syncscope: {signal.Signals(signum).name} after the script ended (rank "
                f"{os.environ.get('RANK', '?')}): its non-daemon thread(s) "
                f"{visible(', '.join(map(repr, names)))} kept the process alive",
                file=sys.stderr,
                flush=True,
            )


def _close_on_os_exit(session: CaptureSession) -> None:
    """``os._exit`` skips atexit and every ``finally``: in this process (not a forked child),
    record the exit and flush every buffered event first, then exit as asked."""
    real_exit, pid = os._exit, os.getpid()

    def _exit(status: int) -> NoReturn:
        if os.getpid() == pid:
            code = status if isinstance(status, int) else 1
            reason = "exit" if code == 0 else f"exit status {code}"
            with contextlib.suppress(BaseException):  # the exit asked for comes first
                session.close(code, f"{reason} (os._exit)")
        real_exit(status)

    os._exit = _exit


def _ours(filename: str) -> bool:
    """A frame of syncscope's own wrappers (attach, instrumentation) or of runpy."""
    return (
        filename.startswith((_HERE, _HERE_REAL))
        or filename == runpy.__file__
        or filename == "<frozen runpy>"
    )


def user_traceback(exc: BaseException) -> str:
    """The script's traceback as Python prints it, without syncscope's and runpy's frames.

    An error raised inside syncscope itself (its last frame is ours) keeps every frame.
    """
    import traceback

    te = traceback.TracebackException.from_exception(exc)
    seen: set[int] = set()
    todo = [te]
    while todo:
        item = todo.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        frames = list(item.stack)
        if frames and not _ours(frames[-1].filename):
            kept = [f for f in frames if not _ours(f.filename)]
            item.stack = traceback.StackSummary.from_list(kept)
        todo.extend(t for t in (item.__cause__, item.__context__) if t is not None)
    return "".join(te.format())


def _watch_profile(session: object, rank: int) -> None:
    """End this rank when the `syncscope profile` that started it is gone (even SIGKILLed).

    The rank first gets SIGTERM (its handler records the exit, as for any signal); if the
    script does not come back to Python within GRACE_S (stuck in a collective), the exit is
    recorded from here and the process ends.
    """
    value = os.environ.get(ENV_PROFILE_PID, "")
    if not value.isdigit():
        return
    from syncscope.rundir import pid_alive

    pid = int(value)
    parent = os.getppid()

    def watch() -> None:
        while (parent == pid and os.getppid() == pid) or (parent != pid and pid_alive(pid)):
            time.sleep(WATCH_S)
        with contextlib.suppress(OSError, ValueError):
            print(
                f"syncscope: syncscope profile (pid {pid}) is gone; stopping rank {rank}",
                file=sys.stderr,
                flush=True,
            )
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(GRACE_S)
        with contextlib.suppress(Exception):
            session.close(143, "syncscope profile ended")  # type: ignore[attr-defined]
        os._exit(143)

    threading.Thread(target=watch, name="syncscope-watch-profile", daemon=True).start()


_RELEASE_PAUSE_S = 0.1  # seconds without the GIL before collecting (see _release)


def _release() -> None:
    """Free the script's objects while the interpreter is still whole.

    A DDP module or process group that outlives the script is otherwise destroyed during
    interpreter finalization, where torch's backend threads can abort the process
    (SIGABRT) after the job has finished. Collecting here, once everything is recorded,
    makes that teardown happen in order.

    Before collecting, the GIL is let go for a moment. torch stashes a Python object (the
    ``contextvars`` context) in the thread-local state of every backward, and a gloo
    worker thread that ran a collective issued there (DDP's buckets) takes the GIL to drop
    its copy after the work, holding the process group's work lock. If the collection
    destroys that process group meanwhile, the main thread waits for the lock with the GIL
    held: a deadlock after the script has finished (2 runs in about 17 of a short DDP job,
    two at a time on a 2-core machine; none in 20 with the pause). The pause lets such a
    thread finish first.
    """
    import gc

    sys.stdout.flush()
    sys.stderr.flush()
    time.sleep(_RELEASE_PAUSE_S)
    gc.collect()


if __name__ == "__main__":
    raise SystemExit(main())
