"""``syncscope profile``: run a script on N ranks, capture, diagnose and report."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from syncscope.errors import SyncscopeError

if TYPE_CHECKING:
    from syncscope.model import Run

LAUNCH = "Launcher (torch.distributed.run)"


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
    program: Annotated[
        list[str] | None,
        typer.Argument(help="SCRIPT [SCRIPT_ARGS...] (or, with -m, the module's arguments)"),
    ] = None,
    module: Annotated[
        str | None, typer.Option("-m", "--module", help="Run a module, like python -m.")
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out", "-o", help="Run directory (default syncscope-out/<name>-<timestamp>)."
        ),
    ] = None,
    fail_on: Annotated[
        str, typer.Option(help="Exit 1 on findings of this severity: never, warning, error.")
    ] = "error",
    hang_timeout: Annotated[
        float,
        typer.Option(
            help="Seconds without progress before the job is declared hung and stopped (0: never)."
        ),
    ] = 300.0,
    trace: Annotated[
        bool, typer.Option("--trace", help="Also record a torch.profiler trace on every rank.")
    ] = False,
    trace_windows: Annotated[
        str | None, typer.Option(help="Windows A:B to trace (with --trace).")
    ] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No terminal summary.")] = False,
    nproc_per_node: Annotated[
        str | None, typer.Option("--nproc-per-node", "--nproc_per_node", rich_help_panel=LAUNCH)
    ] = None,
    nnodes: Annotated[str | None, typer.Option(rich_help_panel=LAUNCH)] = None,
    node_rank: Annotated[
        str | None, typer.Option("--node-rank", "--node_rank", rich_help_panel=LAUNCH)
    ] = None,
    rdzv_backend: Annotated[
        str | None, typer.Option("--rdzv-backend", "--rdzv_backend", rich_help_panel=LAUNCH)
    ] = None,
    rdzv_endpoint: Annotated[
        str | None, typer.Option("--rdzv-endpoint", "--rdzv_endpoint", rich_help_panel=LAUNCH)
    ] = None,
    rdzv_id: Annotated[
        str | None, typer.Option("--rdzv-id", "--rdzv_id", rich_help_panel=LAUNCH)
    ] = None,
    rdzv_conf: Annotated[
        str | None, typer.Option("--rdzv-conf", "--rdzv_conf", rich_help_panel=LAUNCH)
    ] = None,
    master_addr: Annotated[
        str | None, typer.Option("--master-addr", "--master_addr", rich_help_panel=LAUNCH)
    ] = None,
    master_port: Annotated[
        str | None, typer.Option("--master-port", "--master_port", rich_help_panel=LAUNCH)
    ] = None,
    standalone: Annotated[bool, typer.Option("--standalone", rich_help_panel=LAUNCH)] = False,
    max_restarts: Annotated[
        str | None, typer.Option("--max-restarts", "--max_restarts", rich_help_panel=LAUNCH)
    ] = None,
    monitor_interval: Annotated[
        str | None, typer.Option("--monitor-interval", rich_help_panel=LAUNCH)
    ] = None,
    start_method: Annotated[
        str | None, typer.Option("--start-method", rich_help_panel=LAUNCH)
    ] = None,
    local_addr: Annotated[str | None, typer.Option("--local-addr", rich_help_panel=LAUNCH)] = None,
    log_dir: Annotated[str | None, typer.Option("--log-dir", rich_help_panel=LAUNCH)] = None,
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
    run_dir = out or _default_out(target)
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
        )
    finally:
        progress.close()
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
    from syncscope.analysis.sources import findings_for, load
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


def register(app: typer.Typer) -> None:
    app.command(
        "profile",
        context_settings={"allow_interspersed_args": False, "ignore_unknown_options": False},
    )(profile)
