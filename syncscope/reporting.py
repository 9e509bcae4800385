"""Reports of saved runs and traces: what ``analyze``, ``report`` and ``diff`` do.

Every one reads and diagnoses its input the same way (analysis/inputs.py: a run directory
with its traces, or Kineto trace files), so a page re-rendered later, an analysis of the
same run directory and the page written at the time show the same windows and findings.
Output goes through render/outputs.py (one module per format) and syncscope/files.py (every
file written whole or not at all).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from syncscope.errors import BadRunDirectory, SyncscopeError
from syncscope.render.safe import visible

if TYPE_CHECKING:
    from syncscope.model import Finding, Run, RunMeta


def load_and_diagnose(run_dir: Path) -> tuple[Run, list[Finding]]:
    """Read a saved run and diagnose it: the one path every re-rendering command takes."""
    if not run_dir.exists():
        raise BadRunDirectory(f"{run_dir}: no such run directory")
    from syncscope.analysis.inputs import findings_for, load

    run, _files = load([run_dir], skip_bad=False, progress=False)
    return run, findings_for(run)


def analyze(
    paths: Sequence[Path | str],
    out: Path | None = None,
    skip_bad: bool = False,
    hta: bool = False,
    fail_on: str = "error",
    quiet: bool = False,
    scheduler: str | None = None,
) -> int:
    """Report on saved runs or torch.profiler (Kineto) traces: report files in ``out``, the
    summary on stdout; the exit status by ``fail_on``. ``scheduler``: read the traces on
    that Dask cluster (``local``, an address or a scheduler file; paths may be URLs)."""
    from syncscope.analysis.inputs import findings_for, load
    from syncscope.render.outputs import exit_status, write_reports

    run, files = load(paths, skip_bad, progress=not quiet, scheduler=scheduler)
    extra = None
    if hta:
        from syncscope.trace.overlap import hta_overlap

        if not files:
            extra = {"error": "--hta needs trace files"}
        elif all(r.device == "cpu" for r in run.ranks):
            extra = {"error": "HTA's analyses need GPU kernels; these are CPU-only traces"}
        else:
            extra = hta_overlap(files)
        if isinstance(extra, dict) and isinstance(extra.get("error"), str):
            print(
                visible(f"syncscope: warning: --hta not applied: {extra['error']}"), file=sys.stderr
            )
    findings = findings_for(run, extra)
    out_dir = out or new_folder(Path("syncscope-out") / f"analyze-{time.strftime('%Y%m%d-%H%M%S')}")
    written = write_reports(run, findings, out_dir)
    if not quiet:
        from syncscope.render.terminal import render_text  # rich: only when it prints

        print(render_text(run, findings))
    names = ", ".join(p.name for p in written)
    print(visible(f"syncscope: reports in {out_dir} ({names})"), file=sys.stderr)
    return exit_status(findings, fail_on)


def new_folder(base: Path) -> Path:
    """Create ``base``, or ``base-2``, ``base-3``... when it exists: atomically (mkdir fails
    on an existing folder), so concurrent analyses started in the same second never share
    one."""
    try:
        base.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SyncscopeError(f"cannot create {base.parent}: {exc.strerror}") from None
    for n in range(1, 10_000):
        path = base if n == 1 else base.with_name(f"{base.name}-{n}")
        try:
            path.mkdir()
        except FileExistsError:
            continue
        except OSError as exc:
            raise SyncscopeError(f"cannot create {path}: {exc.strerror}") from None
        return path
    raise SyncscopeError(f"cannot create {base}: 10,000 folders of that name exist")


def report(run_dir: Path, fmt: str = "html", output: str | None = None) -> None:
    """Render a saved run again in format ``fmt`` (render/outputs.py's ``FORMATS``) to
    ``output``: a file, or ``-`` for stdout; by default RUN_DIR/report.html for html and
    stdout for the others."""
    from syncscope.render.outputs import render, writer

    run, findings = load_and_diagnose(run_dir)
    if output is None and fmt == "html":
        output = str(run_dir / "report.html")
    if output is None or output == "-":
        sys.stdout.write(render(run, findings, fmt))
        return
    from functools import partial

    from syncscope.files import write_output

    try:
        write_output(Path(output), partial(writer(fmt), run, findings))
    except OSError as exc:
        raise SyncscopeError(f"{output}: cannot write it ({exc.strerror or exc})") from None
    print(visible(f"syncscope: wrote {output}"), file=sys.stderr)


def diff(run_a: Path, run_b: Path, html: Path | None = None, color: bool | None = None) -> None:
    """Compare two runs on stdout (coloured on a terminal by default), and as an HTML page
    in ``html``."""
    from syncscope.render.diff import compare, render_diff_html, render_diff_text

    run_1, findings_1 = load_and_diagnose(run_a)
    run_2, findings_2 = load_and_diagnose(run_b)
    for warning in _mismatches(run_1.meta, run_2.meta):
        print(visible(f"syncscope: warning: {warning}"), file=sys.stderr)
    result = compare(run_1, findings_1, run_2, findings_2, labels=_labels(run_a, run_b))
    use_color = sys.stdout.isatty() if color is None else color
    sys.stdout.write(render_diff_text(result, color=use_color))
    if html is not None:
        from syncscope.files import write_output

        write_output(html, render_diff_html(result).encode("utf-8"))
        print(visible(f"syncscope: wrote {html}"), file=sys.stderr)


def _labels(a: Path, b: Path) -> tuple[str, str]:
    """Short names for the two runs: directory names, or the paths as given where those clash."""
    return (a.name, b.name) if a.name and b.name and a.name != b.name else (str(a), str(b))


_MEASURED = {
    "live": "a live capture (syncscope profile: its hooks' clocks)",
    "trace": "a torch.profiler trace set (the profiler's events)",
}


def _mismatches(a: RunMeta, b: RunMeta) -> list[str]:
    """What makes the two runs' figures not directly comparable (said before the diff)."""
    out: list[str] = []
    if a.world_size != b.world_size:
        out.append(
            f"the runs have different world sizes ({a.world_size} vs {b.world_size}): "
            "time and bytes differences are not a like-for-like speed-up"
        )
    if a.source != b.source:
        out.append(
            f"the first is {_MEASURED[a.source]}, the second {_MEASURED[b.source]}: the two "
            "are measured differently, and traces name no script, so nothing shows they are "
            "the same job"
        )
    name_a, name_b = Path(a.script).name, Path(b.script).name
    if name_a and name_b and name_a != name_b and not name_b.endswith(name_a):
        out.append(f"the runs are of different scripts ({name_a} vs {name_b})")
    return out
