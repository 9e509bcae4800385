"""run_all.py's trace-speed sections, each measured by benchmarks/bench_scale.py in a process
of its own, its ``--doc`` table kept as written (with its command and when it ran):

- parse speed: MB per CPU-second of ``syncscope analyze`` on real traces (sample_traces/
  always, ../shared/data/kineto's where that folder is beside the checkout), many ranks and
  big files, HTA's load of the same files beside it;
- scale: 16,384 ranks, 8 x 1 GB files and run directories of 16,384 ranks (format 2) and
  2,048 (format 1), syncscope alone: HTA's load of 8 x 256 MB (about 15 minutes and 6 GB
  on 2 cores) is left to a separate run of bench_scale.py, named on the page.

``--quick`` sizes (a few MB each) only check that every part runs.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from _harness import ROOT, Launch, workload

KINETO = ROOT.parent / "shared" / "data" / "kineto"
SAMPLES = ("nccl_parser_config", "trace_filter")
SHARED = ("df_index_resolver", "ns_resolution_trace")
SCALE_TITLE = "### Scale: 16k ranks and 1 GB files"
SYNCSCOPE_RUNS = 3  # runs of syncscope analyze per set: a row is the median, with the range
# what the scale table leaves out (HTA's load of 8 x 256 MB), as the page names it
HTA_BIG = (
    "python benchmarks/bench_scale.py --dir DIR --ranks '' --big-files 8 --big-mb 256 "
    "--hta --hta-max-mb 2200"
)


def real_traces(quick: bool) -> list[str]:
    """The real trace directories, as paths from the checkout's root."""
    if quick:
        return ["sample_traces/trace_filter"]
    shared = [f"../shared/data/kineto/{n}" for n in SHARED if (KINETO / n).is_dir()]
    return [*(f"sample_traces/{n}" for n in SAMPLES), *shared]


def parse_speed_args(quick: bool) -> list[str]:
    """docs/benchmarks.md's parse-speed table: bench_scale.py's arguments (``--dir`` and
    ``--doc`` apart)."""
    if quick:
        sets = ["--ranks", "16", "--rank-windows", "1", "--big-files", "2", "--big-mb", "4"]
        return [*sets, "--real", *real_traces(quick), "--hta", "--hta-max-mb", "4"]
    sets = ["--ranks", "512", "--rank-windows", "3", "--big-files", "8", "--big-mb", "256"]
    runs = ["--syncscope-runs", str(SYNCSCOPE_RUNS)]
    return [*sets, *runs, "--real", *real_traces(quick), "--hta", "--hta-max-mb", "350"]


def scale_args(quick: bool, capture: Path) -> list[str]:
    """The scale table's arguments (``--dir`` and ``--doc`` apart); ``capture``: a 2-rank
    run directory the run-directory sets copy."""
    if quick:
        sets = [
            "--ranks",
            "64",
            "--big-files",
            "1",
            "--big-mb",
            "8",
            "--layouts",
            "compact",
            "--no-json-alone",
        ]
        return [*sets, "--run-dir-ranks", "64", "--v1-ranks", "16", "--capture", str(capture)]
    sets = [
        "--ranks",
        "16384",
        "--big-files",
        "8",
        "--big-mb",
        "1024",
        "--layouts",
        "compact",
        "--no-json-alone",
    ]
    runs = ["--syncscope-runs", str(SYNCSCOPE_RUNS)]
    return [
        *sets,
        *runs,
        "--run-dir-ranks",
        "16384",
        "--v1-ranks",
        "2048",
        "--capture",
        str(capture),
    ]


def _bench_scale(
    work: Path, name: str, args: list[str], shown: dict[str, str] | None = None
) -> dict[str, Any]:
    """bench_scale.py with ``args`` writing its sets under ``work/name`` (removed after:
    they are gigabytes) and its table to ``work/name.md``; what it printed and wrote, the
    paths in ``shown`` (and ``work``) named as the page names them."""
    sets, doc = work / name, work / f"{name}.md"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_scale.py"), "--dir", str(sets)]
    cmd += [*args, "--doc", str(doc)]
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    finally:
        shutil.rmtree(sets, ignore_errors=True)
    table = doc.read_text() if doc.is_file() else ""
    if table.startswith("<!--"):  # bench_scale's note that a script puts the file in
        table = table[table.index("-->") + 3 :].lstrip("\n")
    command = f"python benchmarks/bench_scale.py --dir DIR {' '.join(args)} --doc FILE"
    for path, name_shown in {str(doc): "FILE", **(shown or {}), str(work): "<tmp>"}.items():
        command, table = command.replace(path, name_shown), table.replace(path, name_shown)
    return {
        "command": command,
        "markdown": table,
        "stdout": proc.stdout,
        "status": proc.returncode,
        "stderr_tail": proc.stderr.strip().splitlines()[-3:],
    }


def parse_speed(work: Path, quick: bool) -> dict[str, Any]:
    return _bench_scale(work, "parse-speed", parse_speed_args(quick))


def scale(work: Path, quick: bool) -> dict[str, Any]:
    """The scale table, its run directories copied from a 2-rank capture made here."""
    record = Launch("profile").run(
        workload("no_sync"), ["--layers", "2", "--hidden", "256", "--windows", "2"], work
    )
    run = str(record["run_dir"])
    shown = {run: "RUN"}  # the page's note says what RUN is
    result = _bench_scale(work, "scale", scale_args(quick, Path(run)), shown)
    lines = result["markdown"].split("\n")
    heading = next((i for i, line in enumerate(lines) if line.startswith("### ")), None)
    if heading is not None:  # bench_scale.py titles every table it writes for parse speed
        lines[heading] = SCALE_TITLE
    result["markdown"] = "\n".join(lines)
    return result
