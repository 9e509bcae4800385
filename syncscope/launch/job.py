"""A profile run from start to end: ``syncscope profile``'s pipeline.

Check the request before any process starts (the script compiles, the world fits this
machine, the window bounds make sense), prepare the run directory and its ``meta.json``,
launch the ranks through torch's launcher (syncscope/launch/torchrun.py) with a live progress line,
then report: the report files, the terminal summary and the exit status. A bounded capture
that runs on (``--windows N --then run``) is reported as soon as every rank has captured its
windows, while the job goes on without syncscope's hooks.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from syncscope.errors import SyncscopeError
from syncscope.text import visible

if TYPE_CHECKING:
    from syncscope.launch.torchrun import LaunchOptions, LaunchResult
    from syncscope.model import Finding, Run


@dataclass(frozen=True)
class Request:
    """What to profile and how, as the command line gave it."""

    program: Sequence[str]  # SCRIPT [ARGS...], or the module's ARGS with ``module``
    module: str | None
    launcher: LaunchOptions
    out: Path | None = None
    fail_on: str = "error"
    hang_timeout: float = 300.0
    trace: bool = False
    trace_windows: str | None = None
    quiet: bool = False
    windows: str | None = None
    skip_windows: str | None = None
    then: str | None = None


@dataclass(frozen=True)
class _Plan:
    """A request checked: what runs, where the capture stops, where the run is written."""

    target: str
    script_args: list[str]
    script: str  # its resolved path ("" for a module)
    sha256: str
    max_windows: int | None
    first_window: int
    then: str
    run_dir: Path

    @property
    def bounded(self) -> bool:
        return self.max_windows is not None or self.first_window > 0


def profile(request: Request) -> int:
    """Run the program on N ranks through torch's launcher and account for every gradient
    sync; returns the exit status."""
    plan = _check(request)
    from syncscope.rundir import unlock_run_dir

    lock = _make_run_dir(plan.run_dir, request.out is None)
    try:
        return _profile(request, plan)
    finally:
        unlock_run_dir(lock)


def _profile(request: Request, plan: _Plan) -> int:
    if "nproc_per_node" not in request.launcher.values:  # said once every input is good
        print(  # torchrun's default, 1 rank per node, is seldom what a profile is run for
            "syncscope: no --nproc-per-node given: running 1 rank per node (world size 1 on "
            "one node); add --nproc-per-node N to run N",
            file=sys.stderr,
        )
    meta = _meta(request, plan)
    from syncscope.rundir import write_meta

    write_meta(plan.run_dir, meta)
    early = _EarlyReport(plan.run_dir, request.fail_on, request.quiet)
    build_after = _native_kernel(request.quiet)
    result = _launch(request, plan, early)
    early.wait()
    if build_after:  # the job's measurements never shared the CPU with the compiler
        _build_in_background()
    if early.code is not None:  # reported when the windows were in; the job then ran on
        return _ran_on(result.status, early.code)
    if result.error:
        # the launcher failed or was stopped: say so in one line, and report what was captured
        print(f"syncscope: error: the launcher stopped: {visible(result.error)}", file=sys.stderr)
    if not result.hung:
        _record_signals(plan.run_dir, result.signals)
    if result.hung or result.waits:
        _record_monitor(plan.run_dir, meta, result)
    if result.hung:
        never = "the job never reached its process group: " if result.hang.get("start_up") else ""
        print(
            f"syncscope: {never}no rank made progress for {request.hang_timeout:g} s; the job "
            "was stopped (see the hang finding)",
            file=sys.stderr,
        )
    code = report_run(
        plan.run_dir, result.status, result.first_failed, request.fail_on, request.quiet
    )
    if result.lingering:
        _note_lingering(result.lingering, request.hang_timeout)
    return code


def _record_monitor(run_dir: Path, meta: dict[str, Any], result: LaunchResult) -> None:
    """What the monitor saw into meta.json: a hang (``hung``, ``hang``), the ranks' waits for
    another rank (``waits``)."""
    from syncscope.rundir import write_meta

    update: dict[str, Any] = {**meta}
    if result.waits:
        update["waits"] = list(result.waits)
    if result.hung:
        update["hung"] = True
        update["hang"] = result.hang
    try:
        write_meta(run_dir, update)
    except SyncscopeError as exc:  # a full disk: the report below still says what it can
        print(visible(f"syncscope: warning: {exc}"), file=sys.stderr)


def _note_lingering(ranks: tuple[int, ...], hang_timeout: float) -> None:
    from syncscope.model import compress_ranks

    which = compress_ranks(ranks)
    print(
        f"syncscope: warning: rank(s) {which} finished the script (every window is captured: "
        f"the report is complete) but the process did not end for {hang_timeout:g} s: "
        "a non-daemon thread the script started keeps Python alive after the script's end "
        "(join it, or start it with daemon=True); syncscope stopped the process(es)",
        file=sys.stderr,
    )


def _record_signals(run_dir: Path, signals: dict[int, str]) -> None:
    """A rank killed by a signal it could not record (SIGSEGV, SIGKILL): its exit as the
    launcher saw it goes into its file, so every report names the real signal."""
    import signal

    from syncscope.rundir import record_launcher_exit

    for rank, name in signals.items():
        number = getattr(signal, name, None) if name.startswith("SIG") else None
        if number is not None:
            record_launcher_exit(run_dir, rank, name, 128 + int(number))


def _check(request: Request) -> _Plan:
    """Every check that can fail before a process starts, in the order the user reads them."""
    positional = list(request.program)
    if request.module is None and not positional:
        raise SyncscopeError("missing SCRIPT (or -m MODULE) to profile")
    module = request.module
    target, script_args = (module, positional) if module else (positional[0], positional[1:])
    _check_trace_windows(request.trace_windows)
    if request.trace_windows is not None and not request.trace:
        raise SyncscopeError(
            f"--trace-windows {request.trace_windows} picks the windows --trace records: add "
            "--trace (or leave --trace-windows out)"
        )
    _check_native()
    from syncscope.fields import SANE_MAX, check_bounds

    if not 0 <= request.hang_timeout <= SANE_MAX:  # NaN fails both; meta.json's reader's bound
        raise SyncscopeError(
            f"--hang-timeout must be a number of seconds from 0 (0: never) to {SANE_MAX:g}, "
            f"not {request.hang_timeout!r}"
        )

    try:
        max_windows, first_window, then = check_bounds(
            request.windows, request.skip_windows, request.then
        )
    except ValueError as exc:
        raise SyncscopeError(str(exc)) from None
    if request.trace and request.trace_windows:
        _check_traced_windows_captured(request.trace_windows, max_windows, first_window)
    script, sha = _check_script(target, module is not None)
    _check_world(request.launcher.values.get("nproc_per_node"))
    # absolute now: the ranks write there whatever the script does with its cwd
    run_dir = Path(os.path.abspath(request.out or _default_out(target)))
    return _Plan(target, script_args, script, sha, max_windows, first_window, then, run_dir)


def _check_native() -> None:
    """``SYNCSCOPE_NATIVE`` is a value it takes (a usual true or false word)."""
    from syncscope.capture.native import setting

    try:
        setting()
    except ValueError as exc:
        raise SyncscopeError(str(exc)) from None


def _check_trace_windows(trace_windows: str | None) -> None:
    if trace_windows is None:
        return
    start, sep, stop = trace_windows.partition(":")
    if not sep or not (start or "0").isdigit() or not (stop or "0").isdigit():
        raise SyncscopeError(f"--trace-windows must look like A:B, not {trace_windows!r}")
    if stop and int(stop) <= int(start or 0):
        raise SyncscopeError(
            f"--trace-windows {trace_windows}: B must be greater than A (windows A to B-1)"
        )


def _check_traced_windows_captured(
    trace_windows: str, max_windows: int | None, first_window: int
) -> None:
    """With a bounded capture, the traced windows must lie among the captured ones."""
    if max_windows is None and first_window == 0:
        return
    a, _, b = trace_windows.partition(":")
    lo, hi = max(int(a or 0), first_window), int(b) if b else 10**9
    if max_windows is not None:
        hi = min(hi, first_window + max_windows)
    if hi <= lo:
        raise SyncscopeError(
            f"--trace-windows {trace_windows} lies outside the captured windows "
            f"(--skip-windows {first_window}, --windows {max_windows})"
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


def _make_run_dir(run_dir: Path, default: bool) -> Path:
    if default:  # our own default place (a user's --out: prepare_run_dir creates parents)
        try:
            run_dir.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise SyncscopeError(f"cannot create {run_dir.parent}: {exc.strerror}") from None
    from syncscope.rundir import lock_run_dir, prepare_run_dir

    prepare_run_dir(run_dir)
    return lock_run_dir(run_dir)


def _meta(request: Request, plan: _Plan) -> dict[str, Any]:
    """The run's meta.json (docs/formats.md)."""
    import torch

    from syncscope.rundir import run_meta

    bounded = None
    if plan.bounded:
        bounded = {
            "skip_windows": plan.first_window,
            "windows": plan.max_windows,
            "then": plan.then,
        }
    return run_meta(
        target=plan.target,
        module=request.module is not None,
        script=plan.script,
        script_sha256=plan.sha256,
        script_args=plan.script_args,
        argv=["syncscope", "profile", *sys.argv[2:]],
        world_size=_world_size(request.launcher.values),
        torch_version=str(torch.__version__),
        launcher=request.launcher.values,
        hang_timeout_s=request.hang_timeout,
        trace=request.trace,
        bounded=bounded,
    )


def _launch(request: Request, plan: _Plan, early: _EarlyReport) -> LaunchResult:
    """The job under torch's launcher, with the live progress line."""
    from syncscope.launch.torchrun import launch

    attach_options = []
    if plan.bounded:
        attach_options = ["--skip-windows", str(plan.first_window), "--then", plan.then]
    if plan.max_windows is not None:
        attach_options += ["--windows", str(plan.max_windows)]
    run_on = plan.max_windows is not None and plan.then == "run"
    progress = _Progress(request.quiet)
    try:
        return launch(
            request.launcher,
            plan.run_dir,
            plan.target,
            plan.script_args,
            module=request.module is not None,
            hang_timeout=request.hang_timeout,
            trace_windows=(request.trace_windows or "") if request.trace else None,
            on_progress=progress.update,
            attach_options=attach_options,
            on_captured=early if run_on else None,
            expected_ranks=_local_ranks(request.launcher.values),
        )
    finally:
        progress.close()


def _native_kernel(quiet: bool) -> bool:
    """Hand the ranks the compiled collective kernel where it is built and verified, or say
    in one line why this run records with the Python kernel (syncscope.capture.native);
    waits on no compiler. True: build it in the background once the run ends."""
    from syncscope.capture import native

    native.hold_for_run()  # a background build pauses while this run is under way
    ready = native.readiness()
    if ready.path is not None:
        os.environ[native.NATIVE_PATH_ENV] = str(ready.path)
    if ready.note and not quiet:
        print(f"syncscope: note: {visible(ready.note)}", file=sys.stderr, flush=True)
    return ready.build


def _build_in_background() -> None:
    from syncscope.capture import native

    try:
        native.start_background()
    except OSError as exc:  # no process could be started: the next run says so again
        print(f"syncscope: note: the kernel build did not start: {exc}", file=sys.stderr)


def _ran_on(status: int, code: int) -> int:
    """A bounded capture that ran on: the report is written; say how the job ended."""
    if status:
        print(
            f"syncscope: the job ran on after the capture and ended with exit status "
            f"{status} (the report covers the captured windows)",
            file=sys.stderr,
        )
        return status
    print("syncscope: the job ran on to its end (exit status 0)", file=sys.stderr)
    return code


def report_run(run_dir: Path, status: int, failed: int | None, fail_on: str, quiet: bool) -> int:
    """Diagnose the run in ``run_dir``, write its reports, show the summary; the exit status
    (the job's own when it failed, else by ``fail_on``)."""
    from syncscope.analysis.findings import findings_for, with_flight_dumps
    from syncscope.fixes.proposals import with_fix_proposals
    from syncscope.load.inputs import load, run_dumps
    from syncscope.render.outputs import finish, show_summary

    run, _ = load([run_dir], skip_bad=True, progress=False)  # with --trace: both sources
    dumps, problem = run_dumps([run_dir])  # the ranks' Flight Recorder dumps of a hang
    run, findings = with_flight_dumps(run, findings_for(run), dumps, str(run_dir), problem)
    findings = with_fix_proposals(run, findings, run_dir)
    try:
        code = finish(
            run, findings, run_dir, fail_on, quiet, summary="terminal", where="run directory"
        )
    except SyncscopeError as exc:  # a full disk: the summary is all there is, then the error
        show_summary(run, findings, "terminal")
        _note_attempts(run_dir)
        _note_nothing_captured(run)
        print(visible(f"syncscope: error: {exc}; {_kept(run, run_dir)}"), file=sys.stderr)
        return status or 2
    _note_attempts(run_dir)
    _note_nothing_captured(run)
    if failed is not None and _finished_everywhere(run):
        # every rank recorded the script's normal end; a process then died in shutdown
        print(
            f"syncscope: warning: rank {failed} finished the script (its exit is recorded, "
            f"nothing was lost) but its process then ended with exit status {status} while "
            "Python shut down; the measurements above are complete",
            file=sys.stderr,
        )
        return code
    if failed is not None:
        print(_failed_line(run, findings, failed, status), file=sys.stderr)
    return status or code


def _failed_line(run: Run, findings: Sequence[Finding], failed: int, status: int) -> str:
    """Which rank failed first, as the run-failed finding (the terminal card, report.json)
    says from the ranks' own exit records; the launcher's ``failed`` only where the run has
    no such finding (torchrun's first failure ties at one-second resolution, and then names
    the lowest rank, not the first)."""
    from syncscope.model import compress_ranks

    finding = next((f for f in findings if f.kind == "run-failed"), None)
    first = finding.evidence.get("first_failed_rank") if finding else None
    if finding is None or not isinstance(first, int):
        return (
            f"syncscope: the script failed on rank {failed} with exit status {status} "
            "(its output is above); the other ranks were stopped by the launcher"
        )
    own = [r for r in finding.ranks if r != first]
    exit_status = finding.evidence.get("exit_status")
    shown = exit_status if isinstance(exit_status, int) and exit_status else status
    after = f"; rank(s) {compress_ranks(own)} failed after it" if own else ""
    if any(r.rank not in finding.ranks for r in run.ranks):
        after += "; the other ranks were stopped by the launcher"
    return (
        f"syncscope: the script failed on rank {first} first, with exit status {shown} "
        f"(its output is above){after}"
    )


def _kept(run: Run, run_dir: Path) -> str:
    """What a failed report write leaves: the capture, and how to report it later."""
    windows = max((len(rank.windows) for rank in run.ranks), default=0)
    return (
        f"the summary above covers what was captured ({windows} window(s) on "
        f"{len(run.ranks)} rank(s)); the rank files in {run_dir / 'ranks'} are kept: "
        f"'syncscope report {run_dir}' writes report.html once there is room"
    )


def _note_nothing_captured(run: Run) -> None:
    """No window on any rank: nothing was judged, which must not read as clean."""
    if any(rank.windows for rank in run.ranks):
        return
    print(
        "syncscope: warning: nothing was captured: no rank recorded a micro-batch or an "
        "optimizer step (the script made none, or --skip-windows passed its end); no finding "
        "above means nothing was checked, not a clean run",
        file=sys.stderr,
    )


def _note_attempts(run_dir: Path) -> None:
    from syncscope.rundir import earlier_attempts

    attempts = earlier_attempts(run_dir)
    if attempts:
        print(
            f"syncscope: note: the job was restarted {len(attempts)} time(s) (torchrun "
            "--max-restarts); the report covers the last attempt; each earlier one is a run "
            f"of its own: {', '.join(str(p) for p in attempts)}",
            file=sys.stderr,
        )


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
            self.code = report_run(self.run_dir, 0, None, self.fail_on, self.quiet)
            print(
                "syncscope: every rank captured its windows: report written; the job runs on "
                "without syncscope's hooks",
                file=sys.stderr,
                flush=True,
            )
        except Exception as exc:  # the final report below then says what it can
            print(visible(f"syncscope: error: early report failed: {exc}"), file=sys.stderr)
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
                f"running · {ranks} rank(s) reporting · {steps} optimizer steps on rank 0 · "
                f"{elapsed:.0f} s"
            )

    def close(self) -> None:
        if self.status is not None:
            self.status.stop()
            self.status = None
