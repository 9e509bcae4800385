"""``syncscope profile``: run a script on N ranks, capture, diagnose and report."""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from syncscope.errors import SyncscopeError

if TYPE_CHECKING:
    from syncscope.cli import Parser
    from syncscope.model import Run

LAUNCH = "Launcher (torch.distributed.run)"

# torch.distributed.run's options, passed through as given: (spellings, metavar; None: a flag)
LAUNCHER_OPTIONS: tuple[tuple[tuple[str, ...], str | None], ...] = (
    (("--nproc-per-node", "--nproc_per_node"), "N"),
    (("--nnodes",), "NNODES"),
    (("--node-rank", "--node_rank"), "RANK"),
    (("--rdzv-backend", "--rdzv_backend"), "BACKEND"),
    (("--rdzv-endpoint", "--rdzv_endpoint"), "HOST[:PORT]"),
    (("--rdzv-id", "--rdzv_id"), "ID"),
    (("--rdzv-conf", "--rdzv_conf"), "CONF"),
    (("--master-addr", "--master_addr"), "ADDR"),
    (("--master-port", "--master_port"), "PORT"),
    (("--standalone",), None),
    (("--max-restarts", "--max_restarts"), "N"),
    (("--monitor-interval",), "SECONDS"),
    (("--start-method",), "METHOD"),
    (("--local-addr",), "ADDR"),
    (("--log-dir",), "DIR"),
)


def _check_script(target: str, module: bool) -> tuple[str, str]:
    """Validate the program before any process starts; returns (path, sha256)."""
    if module:
        try:
            spec = importlib.util.find_spec(target)
        except (ImportError, ValueError) as exc:
            raise SyncscopeError(f"cannot import module {target!r}: {exc}") from None
        if spec is None:
            raise SyncscopeError(f"no module named {target!r}")
        return "", ""
    path = Path(target)
    if not path.exists():
        raise SyncscopeError(f"script not found: {target}")
    if not path.is_file():
        raise SyncscopeError(f"not a file: {target}")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise SyncscopeError(f"cannot read {target}: {exc.strerror}") from None
    try:
        compile(data, str(path), "exec")
    except SyntaxError as exc:
        raise SyncscopeError(
            f"{target}:{exc.lineno}:{exc.offset or 0}: syntax error: {exc.msg}"
        ) from None
    except ValueError as exc:
        raise SyncscopeError(f"{target}: cannot compile: {exc}") from None
    import hashlib

    return str(path.resolve()), hashlib.sha256(data).hexdigest()


def _check_world(nproc: str | None) -> None:
    if nproc is None:
        return
    cores = os.cpu_count() or 1
    if nproc == "gpu":
        import torch

        if not torch.cuda.is_available():
            raise SyncscopeError("--nproc-per-node gpu: this machine has no CUDA GPU")
        return
    if nproc in ("auto", "cpu", "xpu"):
        return
    try:
        count = int(nproc)
    except ValueError:
        raise SyncscopeError(
            f"--nproc-per-node must be a number or auto/cpu/gpu, not {nproc!r}"
        ) from None
    if count < 1:
        raise SyncscopeError(f"--nproc-per-node must be at least 1, not {count}")
    limit = max(64, 8 * cores)
    if count > limit:
        raise SyncscopeError(
            f"--nproc-per-node {count}: this machine cannot host that many ranks "
            f"({cores} CPU cores; at most {limit} local processes)"
        )


def _default_out(target: str) -> Path:
    stem = Path(target).stem if target.endswith(".py") else target.rsplit(".", 1)[-1]
    return Path("syncscope-out") / f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}"


def profile(
    program: list[str] | None = None,
    module: str | None = None,
    out: Path | None = None,
    fail_on: str = "error",
    hang_timeout: float = 300.0,
    trace: bool = False,
    trace_windows: str | None = None,
    quiet: bool = False,
    windows: str | None = None,
    skip_windows: str | None = None,
    then: str | None = None,
    nproc_per_node: str | None = None,
    nnodes: str | None = None,
    node_rank: str | None = None,
    rdzv_backend: str | None = None,
    rdzv_endpoint: str | None = None,
    rdzv_id: str | None = None,
    rdzv_conf: str | None = None,
    master_addr: str | None = None,
    master_port: str | None = None,
    standalone: bool = False,
    max_restarts: str | None = None,
    monitor_interval: str | None = None,
    start_method: str | None = None,
    local_addr: str | None = None,
    log_dir: str | None = None,
) -> int:
    """Run SCRIPT on N ranks through torch's launcher and account for every gradient sync."""
    from syncscope.launch import LaunchOptions, launch
    from syncscope.render.outputs import FAIL_ON

    positional = list(program or [])
    if module is None and not positional:
        raise SyncscopeError("missing SCRIPT (or -m MODULE) to profile")
    target, script_args = (module, positional) if module else (positional[0], positional[1:])
    if fail_on not in FAIL_ON:
        raise SyncscopeError(f"--fail-on must be one of never, warning, error, not {fail_on!r}")
    if trace_windows is not None:
        start, sep, stop = trace_windows.partition(":")
        if not sep or not (start or "0").isdigit() or not (stop or "0").isdigit():
            raise SyncscopeError(f"--trace-windows must look like A:B, not {trace_windows!r}")
        if stop and int(stop) <= int(start or 0):
            raise SyncscopeError(
                f"--trace-windows {trace_windows}: B must be greater than A (windows A to B-1)"
            )
    if not 0 <= hang_timeout < float("inf"):  # NaN fails both comparisons
        raise SyncscopeError(
            f"--hang-timeout must be a number of seconds >= 0 (0: never), not {hang_timeout!r}"
        )
    from syncscope.attach import check_bounds

    try:
        max_windows, first_window, then = check_bounds(windows, skip_windows, then)
    except ValueError as exc:
        raise SyncscopeError(str(exc)) from None
    bounded = max_windows is not None or first_window > 0
    if bounded and trace and trace_windows:
        a, _, b = trace_windows.partition(":")
        lo, hi = max(int(a or 0), first_window), int(b) if b else 10**9
        if max_windows is not None:
            hi = min(hi, first_window + max_windows)
        if hi <= lo:
            raise SyncscopeError(
                f"--trace-windows {trace_windows} lies outside the captured windows "
                f"(--skip-windows {first_window}, --windows {max_windows})"
            )
    script_path, sha = _check_script(target, module is not None)
    _check_world(nproc_per_node)
    values = {
        k: v
        for k, v in dict(
            nproc_per_node=nproc_per_node,
            nnodes=nnodes,
            node_rank=node_rank,
            rdzv_backend=rdzv_backend,
            rdzv_endpoint=rdzv_endpoint,
            rdzv_id=rdzv_id,
            rdzv_conf=rdzv_conf,
            master_addr=master_addr,
            master_port=master_port,
            max_restarts=max_restarts,
            monitor_interval=monitor_interval,
            start_method=start_method,
            local_addr=local_addr,
            log_dir=log_dir,
        ).items()
        if v is not None
    }
    options = LaunchOptions(values, standalone)
    # absolute now: the ranks write there whatever the script does with its cwd
    run_dir = Path(os.path.abspath(out or _default_out(target)))
    if out is None:  # our own default place: create it (a user's --out parent must exist)
        try:
            run_dir.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise SyncscopeError(f"cannot create {run_dir.parent}: {exc.strerror}") from None

    from syncscope.rundir import prepare_run_dir, write_meta

    prepare_run_dir(run_dir)
    world = _world_size(values)
    meta = {
        "command": [target, *script_args],
        "module": module is not None,
        "script": script_path,
        "script_sha256": sha,
        "argv": ["syncscope", "profile", *sys.argv[2:]],
        "world_size": world,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "syncscope_version": _versions()[0],
        "torch_version": _versions()[1],
        "launcher": options.as_dict(),
        "hang_timeout_s": hang_timeout,
        "hung": False,
        "trace": trace,
    }
    write_meta(run_dir, meta)
    if bounded:
        meta["bounded"] = {"skip_windows": first_window, "windows": max_windows, "then": then}
        write_meta(run_dir, meta)
    attach_options = [] if not bounded else ["--skip-windows", str(first_window), "--then", then]
    if max_windows is not None:
        attach_options += ["--windows", str(max_windows)]
    early = _EarlyReport(run_dir, fail_on, quiet)
    progress = _Progress(quiet)
    try:
        result = launch(
            options,
            run_dir,
            target,
            script_args,
            module=module is not None,
            hang_timeout=hang_timeout,
            trace_windows=(trace_windows or "") if trace else None,
            on_progress=progress.update,
            attach_options=attach_options,
            on_captured=early if max_windows is not None and then == "run" else None,
            expected_ranks=_local_ranks(values),
        )
    finally:
        progress.close()
    early.wait()
    if early.code is not None:
        # the report was written when the windows were in; the job then ran on to its end
        if result.status:
            print(
                f"syncscope: the job ran on after the capture and ended with exit status "
                f"{result.status} (the report covers the captured windows)",
                file=sys.stderr,
            )
            return result.status
        print("syncscope: the job ran on to its end (exit status 0)", file=sys.stderr)
        return early.code
    if result.error:
        # the launcher failed or was stopped: say so in one line, and report what was captured
        print(f"syncscope: error: the launcher stopped: {result.error}", file=sys.stderr)
    if result.hung:
        meta["hung"] = True
        write_meta(run_dir, meta)
        print(
            f"syncscope: no rank made progress for {hang_timeout:g} s; the job was stopped "
            "(see the hang finding)",
            file=sys.stderr,
        )
    return _report(run_dir, result.status, result.first_failed, fail_on, quiet)


def _report(run_dir: Path, status: int, failed: int | None, fail_on: str, quiet: bool) -> int:
    from syncscope.analysis.inputs import findings_for, load
    from syncscope.render.outputs import exit_status, write_reports
    from syncscope.render.terminal import print_summary

    run, _ = load([run_dir], skip_bad=True, progress=False)  # with --trace: both sources
    findings = findings_for(run)
    paths = write_reports(run, findings, run_dir)
    if not quiet:
        print_summary(run, findings)
    print(
        f"syncscope: run directory {run_dir} ({', '.join(p.name for p in paths)})", file=sys.stderr
    )
    if failed is not None and _finished_everywhere(run):
        # every rank recorded the script's normal end; a process then died in shutdown
        print(
            f"syncscope: warning: rank {failed} finished the script (its exit is recorded, "
            f"nothing was lost) but its process then ended with exit status {status} while "
            "Python shut down; the measurements above are complete",
            file=sys.stderr,
        )
        return exit_status(findings, fail_on)
    if failed is not None:
        print(
            f"syncscope: the script failed on rank {failed} with exit status {status} "
            "(its output is above); the other ranks were stopped by the launcher",
            file=sys.stderr,
        )
    if status:
        return status
    return exit_status(findings, fail_on)


class _EarlyReport:
    """Bounded capture, run on: the report, written by the monitor once every rank is done."""

    def __init__(self, run_dir: Path, fail_on: str, quiet: bool) -> None:
        import threading

        self.run_dir, self.fail_on, self.quiet = run_dir, fail_on, quiet
        self.code: int | None = None
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._started = self._closed = False

    def __call__(self) -> None:
        with self._lock:
            if self._closed:  # the job has ended: the final report is written instead
                return
            self._started = True
        try:
            self.code = _report(self.run_dir, 0, None, self.fail_on, self.quiet)
            print(
                "syncscope: every rank captured its windows: report written; the job runs on "
                "without syncscope's hooks",
                file=sys.stderr,
                flush=True,
            )
        except Exception as exc:  # the final report below then says what it can
            print(f"syncscope: error: early report failed: {exc}", file=sys.stderr)
        finally:
            self._done.set()

    def wait(self) -> None:
        with self._lock:
            self._closed = True
            started = self._started
        if started:
            self._done.wait()


def _local_ranks(values: dict[str, str]) -> int:
    try:
        return max(1, int(values.get("nproc_per_node", "1")))
    except ValueError:
        return 1


def _finished_everywhere(run: Run) -> bool:
    """True when every rank of the job wrote an exit record saying the script ended well."""
    return (
        len(run.ranks) == run.world_size
        and bool(run.ranks)
        and all(r.finished and r.exit_status == 0 for r in run.ranks)
    )


def _world_size(values: dict[str, str]) -> int:
    try:
        nproc = int(values.get("nproc_per_node", "1"))
    except ValueError:
        nproc = os.cpu_count() or 1
    nnodes = values.get("nnodes", "1").split(":")[-1]
    return nproc * (int(nnodes) if nnodes.isdigit() else 1)


def _versions() -> tuple[str, str]:
    import torch

    import syncscope

    return syncscope.__version__, str(torch.__version__)


class _Progress:
    """A live status line on a terminal; nothing when output is not a TTY."""

    def __init__(self, quiet: bool) -> None:
        from rich.console import Console

        self.console = Console(stderr=True)
        self.status = None
        if not quiet and self.console.is_terminal:
            self.status = self.console.status("starting ranks ...")
            self.status.start()

    def update(self, steps: int, ranks: int, elapsed: float) -> None:
        if self.status is not None:
            self.status.update(
                f"running · {ranks} rank(s) reporting · {steps} optimizer steps on rank 0 · {elapsed:.0f} s"
            )

    def close(self) -> None:
        if self.status is not None:
            self.status.stop()
            self.status = None


def add_parser(subparsers: argparse._SubParsersAction[Parser]) -> None:
    summary = "Run SCRIPT on N ranks through torch's launcher and account for every gradient sync."
    parser = subparsers.add_parser(
        "profile",
        help=summary,
        description=summary,
        usage="%(prog)s [OPTIONS] SCRIPT [SCRIPT_ARGS...]\n"
        "       %(prog)s [OPTIONS] -m MODULE [ARGS...]",
        allow_abbrev=False,
    )
    # everything after SCRIPT, or after -m MODULE, belongs to the program, options included
    parser.program_options = ("-m", "--module")
    parser.add_argument(
        "program",
        nargs=argparse.REMAINDER,
        metavar="SCRIPT",
        help="SCRIPT [SCRIPT_ARGS...] (or, with -m, the module's arguments)",
    )
    parser.add_argument("-m", "--module", metavar="MODULE", help="Run a module, like python -m.")
    parser.add_argument(
        "--out",
        "-o",
        type=Path,
        metavar="DIR",
        help="Run directory (default syncscope-out/<name>-<timestamp>).",
    )
    parser.add_argument(
        "--fail-on",
        default="error",
        metavar="LEVEL",
        help="Exit 1 on findings of this severity: never, warning, error. (default: %(default)s)",
    )
    parser.add_argument(
        "--hang-timeout",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="Seconds without progress before the job is declared hung and stopped (0: never). "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--trace", action="store_true", help="Also record a torch.profiler trace on every rank."
    )
    parser.add_argument(
        "--trace-windows", metavar="A:B", help="Windows A:B to trace (with --trace)."
    )
    parser.add_argument("--quiet", "-q", action="store_true", help="No terminal summary.")
    bounded = parser.add_argument_group(
        "Bounded capture",
        "Capture N windows (optimizer steps) after skipping W, then remove every hook.",
    )
    bounded.add_argument(
        "--windows", metavar="N", help="Capture N complete windows, then detach (default: all)."
    )
    bounded.add_argument(
        "--skip-windows", metavar="W", help="Windows to run uncaptured first (default: 0)."
    )
    bounded.add_argument(
        "--then",
        metavar="run|stop",
        help="After the N windows: run on to the job's end without hooks (default; the report "
        "is written at once) or stop every rank cleanly (SystemExit(0) at that step).",
    )
    launcher = parser.add_argument_group(
        LAUNCH, "Passed through to torch.distributed.run (see its --help)."
    )
    for spellings, metavar in LAUNCHER_OPTIONS:
        if metavar is None:
            launcher.add_argument(*spellings, action="store_true")
        else:
            launcher.add_argument(*spellings, metavar=metavar)
    parser.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    dests = [spellings[0][2:].replace("-", "_") for spellings, _ in LAUNCHER_OPTIONS]
    launcher: dict[str, Any] = {dest: getattr(args, dest) for dest in dests}
    return profile(
        program=args.program,
        module=args.module,
        out=args.out,
        fail_on=args.fail_on,
        hang_timeout=args.hang_timeout,
        trace=args.trace,
        trace_windows=args.trace_windows,
        quiet=args.quiet,
        windows=args.windows,
        skip_windows=args.skip_windows,
        then=args.then,
        **launcher,
    )
