"""Launch a script on N ranks through torch's own launcher, watching it as it runs.

``syncscope profile`` takes torchrun's options from torch's own parser
(``add_launcher_options``) and builds a torchrun command line from them (every option as the
user gave it, multi-node rendezvous included), with ``-m syncscope.launch.attach`` as the program so
each rank runs the user's script instrumented, and calls ``torch.distributed.run.run`` in
this process. A monitor thread reads the rank event files as they grow: it shows progress
and, when the job makes no progress for ``hang_timeout`` seconds (no rank wrote anything and
no rank's main thread computed: each waits in torch.distributed or is idle, as the ranks'
heartbeats say, ``syncscope.launch.watch``), stops the workers so the run can be reported
instead of hanging forever. A rank computing while the others wait for it is not hung: the
waits are kept (``LaunchResult.waits``) for the report. When every rank has recorded the
script's end but a process lives on (a non-daemon thread of the script's keeps Python
alive), it waits while that thread computes (at most ``LINGER_GRACE_S``, said in one line),
and once it is idle for ``hang_timeout`` stops those processes and says which
(``LaunchResult.lingering``).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from syncscope.launch.watch import Beats, MainThread, Waits, hang_state
from syncscope.rundir import pid_alive, rank_files

# torchrun's options that make no sense under syncscope: option -> why (the one-line error)
REFUSED = {
    "--no-python": "each rank runs 'python -m syncscope.launch.attach SCRIPT': SCRIPT must be Python",
    "--run-path": "each rank runs 'python -m syncscope.launch.attach SCRIPT' in a process of its own, "
    "not with runpy in the launcher's",
    # torch 2.15 on: prints torchrun's shell completion (with shtab) and exits
    "--print-completion": "it prints torchrun's shell completion and exits: nothing would run",
}


def add_launcher_options(parser: argparse.ArgumentParser, group: argparse._ArgumentGroup) -> None:
    """Add to ``group`` every option of torch.distributed.run (read from torch's own parser)
    that ``parser`` does not declare itself: checked as torchrun checks it and passed
    through unchanged (``LaunchOptions``), or refused with its reason (``REFUSED``).

    torch (seconds to import) is imported here, when a ``profile`` command line is parsed
    or its help shown, never to build the command line.
    """
    from torch.distributed.run import get_args_parser

    parser.set_defaults(launcher=LaunchOptions())
    own = parser._option_string_actions
    for action in get_args_parser()._actions:
        names = [name for name in action.option_strings if name not in own]
        if not names or isinstance(action, argparse._HelpAction):
            continue  # SCRIPT and its arguments, -h, and -m (syncscope's own -m MODULE)
        reason = next((REFUSED[name] for name in names if name in REFUSED), None)
        if reason is not None:
            group.add_argument(
                *names, action=_Refused, reason=reason, help=f"Not under syncscope: {reason}."
            )
        else:
            group.add_argument(*names, action=_Forwarded, launcher=action)


class _Forwarded(argparse.Action):
    """One of torchrun's options: its value checked with torchrun's own type and choices,
    stored under torchrun's name, and kept as the user gave it in ``namespace.launcher``."""

    def __init__(
        self, option_strings: list[str], dest: str, launcher: argparse.Action, **_: Any
    ) -> None:
        metavar = launcher.metavar
        if metavar is None and launcher.choices is not None:
            metavar = "{" + ",".join(str(c) for c in launcher.choices) + "}"
        super().__init__(
            option_strings,
            launcher.dest,
            nargs=launcher.nargs,
            const=launcher.const,
            default=argparse.SUPPRESS,
            help=launcher.help,
            metavar=metavar,
        )
        self.launcher = launcher

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        given = values if isinstance(values, str) else None  # None: a flag
        value = self.const
        if given is not None:
            value = parser._get_value(self.launcher, given)  # torchrun's own messages
            parser._check_value(self.launcher, value)
        setattr(namespace, self.dest, value)
        before: LaunchOptions = getattr(namespace, "launcher", LaunchOptions())
        option = (self.dest, option_string or self.option_strings[0], given)
        namespace.launcher = LaunchOptions((*before.given, option))


class _Refused(argparse.Action):
    """One of torchrun's options that makes no sense under syncscope: a one-line usage error."""

    def __init__(self, option_strings: list[str], dest: str, reason: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)
        self.reason = reason

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        raise argparse.ArgumentError(self, f"not under syncscope: {self.reason}")


@dataclass(frozen=True)
class LaunchOptions:
    """torchrun's options as given on syncscope's command line, in order:
    (torchrun's name for it, the option as spelled, its value; None for a flag)."""

    given: tuple[tuple[str, str, str | None], ...] = ()

    @property
    def values(self) -> dict[str, str]:
        """Each option given, by torchrun's name (the last one given wins, as in torchrun);
        a flag is ``"true"``. As recorded in meta.json's ``launcher``."""
        return {dest: "true" if value is None else value for dest, _, value in self.given}

    def torchrun_args(self) -> list[str]:
        """The options for torchrun: each as the user gave it, in order, after
        ``--standalone`` where nothing says where to meet (a free port on this host, so runs
        never collide)."""
        values = self.values
        single_node = values.get("nnodes", "1") in ("1", "1:1")
        rendezvous = ("standalone", "rdzv_endpoint", "master_addr", "master_port", "rdzv_backend")
        args = [] if not single_node or any(k in values for k in rendezvous) else ["--standalone"]
        for _, option, value in self.given:
            if value is None:
                args.append(option)
            elif option.startswith("--"):
                args.append(f"{option}={value}")
            else:  # -t3; -t "" as two arguments (a bare -t would take the next one)
                args += [option + value] if value else [option, value]
        return args


# after every rank ended its script, how long syncscope waits for the script's non-daemon
# threads that still compute (a checkpoint being written), and when it says so
LINGER_GRACE_S = 600.0
NOTE_S = 2.0


@dataclass
class LaunchResult:
    status: int  # 0, or the first failing rank's exit status
    first_failed: int | None
    hung: bool
    error: str = ""  # the launcher itself failed or was stopped (one line)
    # ranks that finished the script but whose process lived on (a non-daemon thread of the
    # script's) for the hang timeout: syncscope stopped them; every window is captured
    lingering: tuple[int, ...] = ()
    # global rank -> the signal that killed it, as torch's launcher saw it (SIGSEGV, ...)
    signals: dict[int, str] = field(default_factory=dict)
    # ranks that waited in torch.distributed while another computed (Waits.episodes)
    waits: tuple[dict[str, Any], ...] = ()
    # a hang: {"start_up": no rank had its process group, "main_threads": rank -> text}
    hang: dict[str, Any] = field(default_factory=dict)


@contextlib.contextmanager
def _quiet_elastic() -> Iterator[None]:
    logger = logging.getLogger("torch.distributed.elastic")
    previous = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(previous)


class Monitor(threading.Thread):
    """Follows the rank files: progress for the user, and hang detection."""

    def __init__(
        self,
        run_dir: Path,
        hang_timeout: float,
        on_progress: Callable[[int, int, float], None] | None = None,
        poll_s: float = 0.25,
        on_captured: Callable[[], None] | None = None,
        expected_ranks: int = 1,
        on_waiting: Callable[[float], None] | None = None,
    ) -> None:
        super().__init__(name="syncscope-monitor", daemon=True)
        self.run_dir = run_dir
        self.hang_timeout = hang_timeout
        self.on_progress = on_progress
        self.poll_s = poll_s
        self.hung = False
        self.lingering: tuple[int, ...] = ()
        self.steps = 0
        self._stop_event = threading.Event()
        self._sizes: dict[Path, int] = {}
        self._pids: dict[Path, int] = {}
        self._ranks: dict[Path, int] = {}
        self._exited: set[Path] = set()
        self._inodes: dict[Path, int] = {}
        # bounded capture: called once every rank has written its record (the job runs on)
        self.on_captured = on_captured
        self.expected_ranks = expected_ranks
        self._captured: set[Path] = set()
        self.on_waiting = on_waiting  # no rank file yet: called with the seconds waited
        self._hosts: dict[Path, str] = {}
        self._grown: set[Path] = set()  # the files that grew at the last poll
        # the ranks' main threads: the job progresses while one computes (never judged on
        # the process's CPU: its other threads tick while the main one waits)
        self.beats = Beats(run_dir)
        self.waits = Waits()
        self.hang: dict[str, Any] = {}  # what the ranks' main threads did when it hung
        self._lingering_since: float | None = None  # every rank ended; one lived on since
        self._said_lingering = False

    def stop(self) -> None:
        self._stop_event.set()

    def _read_new(self) -> bool:
        changed = False
        self._grown = set()
        for path in rank_files(self.run_dir):
            stat = path.stat()
            if self._inodes.setdefault(path, stat.st_ino) != stat.st_ino:
                self._new_attempt(path, stat.st_ino)
            size = stat.st_size
            if size == self._sizes.get(path, 0):
                continue
            changed = True
            self._grown.add(path)
            old = self._sizes.get(path, 0)
            self._sizes[path] = size
            with path.open("rb") as fh:
                fh.seek(old)
                chunk = fh.read(size - old)
            if path not in self._pids:
                first = chunk.split(b"\n", 1)[0]
                with contextlib.suppress(
                    orjson.JSONDecodeError, AttributeError, TypeError, ValueError
                ):
                    header = orjson.loads(first)
                    self._pids[path] = int(header.get("pid", 0))
                    self._ranks[path] = int(header.get("rank", -1))
                    self._hosts[path] = str(header.get("host", ""))
            if b'"type":"exit"' in chunk:
                self._exited.add(path)
                if b'"reason":"capture complete' in chunk:
                    self._captured.add(path)
            if path.name.endswith("00000.jsonl"):
                self.steps += chunk.count(b'"type":"step_end"')
        return changed

    def _new_attempt(self, path: Path, inode: int) -> None:
        """torchrun restarted the job (``--max-restarts``): attach moved the attempt before
        aside and this rank file is the new attempt's, read from its start, with its pid."""
        self._inodes[path] = inode
        self._sizes.pop(path, None)
        self._pids.pop(path, None)
        self._ranks.pop(path, None)
        self._hosts.pop(path, None)
        self._exited.discard(path)
        self._captured.discard(path)
        if path.name.endswith("00000.jsonl"):
            self.steps = 0

    def run(self) -> None:
        try:
            self._watch()
        finally:
            self.waits.close()

    def _watch(self) -> None:
        start = last_change = time.monotonic()
        while not self._stop_event.wait(self.poll_s):
            try:
                grew = self._read_new()
                threads = self._main_threads()
            except OSError:
                continue
            now = time.monotonic()
            self.waits.observe(threads, {self._ranks.get(p, -1) for p in self._grown}, now)
            if grew or any(t.progressing for t in threads.values()):  # a rank computes
                last_change = now
            if (
                self.on_captured is not None
                and len(self._sizes) >= self.expected_ranks
                and set(self._sizes) <= self._captured
            ):
                callback, self.on_captured = self.on_captured, None
                callback()
            if self.on_progress is not None:
                self.on_progress(self.steps, len(self._sizes), now - start)
            if self.on_waiting is not None and not self._sizes:
                self.on_waiting(now - start)
            running = [p for p in self._pids if p not in self._exited]
            if not running and self._threads_work(now):
                last_change = now  # the script ended; a thread of it still works
            if self.hang_timeout <= 0 or now - last_change <= self.hang_timeout:
                continue
            if running:
                self.hung = True
                self.hang = hang_state(threads)
                from syncscope.launch.flight import request_dumps

                if not self.hang["start_up"]:  # the recorder holds nothing before the group
                    request_dumps(self.run_dir, [self._ranks.get(p, -1) for p in running])
                self._stop_workers(running)
                return
            if self._stop_lingering():
                return

    def _main_threads(self) -> dict[int, MainThread]:
        """What the main thread of each rank still running is doing."""
        live = {
            self._ranks.get(p, -1): (pid, self._hosts.get(p, ""))
            for p, pid in self._pids.items()
            if p not in self._exited
        }
        return self.beats.read(live)

    def _ended_alive(self) -> list[Path]:
        """Ranks that recorded the script's end (not a bounded capture's) yet live on."""
        ended = [p for p in self._pids if p in self._exited and p not in self._captured]
        return [p for p in ended if pid_alive(self._pids[p])]  # a zombie has ended

    def _threads_work(self, now: float) -> bool:
        """Every rank ended its script, and a rank still alive computes: Python waits for
        the script's non-daemon threads (a checkpoint being written), and so does syncscope,
        up to ``LINGER_GRACE_S`` after the first such look (said once on stderr)."""
        alive = self._ended_alive()
        if not alive:
            return False
        if self._lingering_since is None:
            self._lingering_since = now
        if now - self._lingering_since > LINGER_GRACE_S:
            return False
        live = {self._ranks.get(p, -1): (self._pids[p], self._hosts.get(p, "")) for p in alive}
        views = self.beats.read(live, now).values()
        working = any(view.progressing for view in views)
        # said only of work off the main thread: a main thread busy after the script's end is
        # the interpreter shutting down (torch's teardown), which is not the script's threads
        threads = any(view.working for view in views)
        if threads and not self._said_lingering and now - self._lingering_since >= NOTE_S:
            self._said_lingering = True
            which = ", ".join(str(r) for r in sorted(live))
            print(
                f"syncscope: rank(s) {which} ended the script but their non-daemon thread(s) "
                f"still work: waiting for them (at most {LINGER_GRACE_S:g} s while they "
                f"compute, {self.hang_timeout:g} s once idle)",
                file=sys.stderr,
                flush=True,
            )
        return working

    def _stop_lingering(self) -> bool:
        """Every rank recorded the script's end, yet a process lives on: Python waits for a
        non-daemon thread the script started. Stop those processes (the record is complete);
        True when there were any. A rank that ran on after a bounded capture is left alone
        (it is still training, without hooks)."""
        alive = self._ended_alive()
        if not alive:
            return False
        self.lingering = tuple(sorted(self._ranks.get(p, -1) for p in alive))
        self._stop_workers(alive)
        return True

    def _stop_workers(self, paths: list[Path]) -> None:
        here = socket.gethostname()  # a rank of another node (a shared run directory): its
        # pid means nothing here
        pids = [
            self._pids[p]
            for p in paths
            if self._pids.get(p) and self._hosts.get(p, here) in ("", here)
        ]
        groups = [pid for pid in pids if _leads_group(pid)]  # torch starts each in its own
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)
            deadline = time.monotonic() + 3.0
            while time.monotonic() < deadline and any(pid_alive(pid) for pid in pids):
                time.sleep(0.05)
        for pgid in groups:  # what the rank started (a pool's workers, a DataLoader's): no
            for sig in (signal.SIGTERM, signal.SIGKILL):  # orphan lives on
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pgid, sig)
                    time.sleep(0.5 if sig == signal.SIGTERM else 0.0)


def _leads_group(pid: int) -> bool:
    """``pid`` leads its process group (torch's launcher starts each rank in a session of
    its own): the group is the rank's, safe to end whole."""
    try:
        return os.getpgid(pid) == pid and pid != os.getpgid(0)
    except (ProcessLookupError, PermissionError):
        return False


def launch(
    options: LaunchOptions,
    run_dir: Path,
    target: str,
    script_args: list[str],
    *,
    module: bool = False,
    hang_timeout: float = 300.0,
    trace_windows: str | None = None,
    on_progress: Callable[[int, int, float], None] | None = None,
    attach_options: list[str] | None = None,
    on_captured: Callable[[], None] | None = None,
    expected_ranks: int = 1,
) -> LaunchResult:
    """Run ``target`` on every rank under syncscope.launch.attach; never raises for a rank's failure."""
    from torch.distributed.run import parse_args

    program = (
        ["--out", str(run_dir), *(attach_options or [])]
        + (["-m", target] if module else [target])
        + script_args
    )
    args = parse_args([*options.torchrun_args(), "-m", "syncscope.launch.attach", *program])
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ["SYNCSCOPE_PROFILE_PID"] = str(os.getpid())  # ranks end when this process does
    from syncscope.launch.flight import enable

    enable()  # torch's Flight Recorder in the ranks, dumped on a hang (unless the user chose)
    if trace_windows is not None:
        os.environ["SYNCSCOPE_TRACE_WINDOWS"] = trace_windows
    from syncscope.launch.rendezvous import RendezvousWatch

    watch = RendezvousWatch(options.values)
    monitor = Monitor(
        run_dir,
        hang_timeout,
        on_progress,
        on_captured=on_captured,
        expected_ranks=expected_ranks,
        on_waiting=watch,
    )
    monitor.start()
    try:
        with watch.hooked():
            status, first_failed, error, signals = _run_torchrun(args)
    finally:
        monitor.stop()
        monitor.join(timeout=5)
    error = watch.explain(error)
    if monitor.hung:
        status, first_failed = 1, None  # syncscope stopped the job itself
    if monitor.lingering:
        status, first_failed = 0, None  # the script ended everywhere; syncscope stopped it
    sys.stdout.flush()
    return LaunchResult(
        status,
        first_failed,
        monitor.hung,
        error,
        monitor.lingering,
        signals,
        tuple(monitor.waits.episodes),
        monitor.hang,
    )


def _run_torchrun(args: Any) -> tuple[int, int | None, str, dict[int, str]]:
    """torchrun's ``run(args)``: (exit status, the first rank that failed, the launcher's
    own error in one line, the signal that killed each rank killed by one)."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import run

    try:
        with _quiet_elastic():
            run(args)
    except ChildFailedError as exc:
        # the root cause is the first rank to fail; the launcher then stops the others
        first_failed, failure = exc.get_first_failure()
        code = failure.exitcode
        signals = {rank: f.signal_name() for rank, f in exc.failures.items() if f.exitcode < 0}
        return (128 - code if code < 0 else code) or 1, first_failed, "", signals
    except SystemExit as exc:  # the launcher's own argument or rendezvous errors
        return exc.code if isinstance(exc.code, int) else 1, None, "", {}
    except KeyboardInterrupt:
        return 130, None, "interrupted", {}
    except Exception as exc:  # rendezvous failures, a signal to the agent (SignalException)
        sigval = getattr(exc, "sigval", None)
        status = 128 + int(sigval) if sigval is not None else 1
        text = f"{type(exc).__name__}: {exc}".strip().rstrip(":")  # a timeout's is empty
        return status, None, text.splitlines()[0][:300], {}
    return 0, None, "", {}
