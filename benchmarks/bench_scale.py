"""Benchmark: ``syncscope analyze`` on many ranks and on big files.

Sets (synthetic DDP jobs from ``tests.helpers.synth_traces``, in each of ``--layouts``:
``torch``, every event laid out as torch.profiler writes it on a GPU, about 220 bytes an event
as in the real GPU traces; ``compact``, the same events minimal and unspaced, about 145 bytes
an event, the most events a megabyte holds):

- ``ranks``: N ranks x ~600 KB (3 windows of the default shape; rank 0's file written once,
  the others copies with their rank put in the header), N from ``--ranks`` (1024,4096,16384);
- ``big``: ``--big-files`` files x ``--big-mb`` MB each (default 8 x 1024);
- ``run dir``: ``--run-dir-ranks`` N ranks of a real 2-rank capture (``--capture``), every
  collective on a group of all N ranks (``--v1-ranks``: as format 1 wrote it, the list on
  every collective);
- ``hta``: HTA's ``TraceAnalysis(trace_dir=...)`` load beside syncscope on ``--hta-files`` x
  ``--hta-mb`` (default 8 x 256; HTA holds every event in pandas, ~16x the file size).

Each measurement is the whole CLI in a fresh process (start-up and report writing included),
sampled every 20 ms: wall seconds, the CPU seconds of every process of the tree (``wait4``:
the workers included) and the peak of the tree's summed RSS; *MB/CPU-s* is the bytes parsed
(a gzip file's uncompressed size) over that CPU time, the figure a shared machine's load
does not inflate. ``--real DIR ...`` measures directories of real traces as they are;
``--hta`` runs HTA's load of the same files after each syncscope run (``--reps``: in turn),
on sets up to ``--hta-max-mb``. The machine's load average is printed beside each figure.

Start-up is measured once (the same command on a one-window trace) and shown beside each
figure: *MB/CPU-s past start-up* is the bytes over the CPU time less that. *events/CPU-s*
counts the trace's events (``"ph"`` keys), a figure that does not depend on the layout.
Modules are compiled to bytecode first (``compileall``), as an installed package is.

    python benchmarks/bench_scale.py --dir /tmp/scale [--ranks 1024,4096,16384] [--no-big]
"""

from __future__ import annotations

import argparse
import gzip
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_analyze import HTA_LOAD, _tree_kib  # noqa: E402

from syncscope.load.trace.read import is_trace_file  # noqa: E402
from tests.helpers.synth_traces import write_job, write_rank  # noqa: E402

RANK_WINDOWS = 3  # a many-rank file: ~600 KB compact, ~1 MB in torch's layout


def write_ranks(out: Path, ranks: int, windows: int = RANK_WINDOWS, layout: str = "torch") -> Path:
    """``ranks`` files: rank 0's written by the generator, the others its copies."""
    done = out / ".complete"
    if done.exists():
        return out
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    first = out / "rank-0.json"
    write_rank(first, 0, ranks, 0, layout=layout, windows=windows)
    data = first.read_bytes()
    head = b'"rank": 0,'
    at = data.index(head)
    for r in range(1, ranks):
        (out / f"rank-{r}.json").write_bytes(
            data[:at] + b'"rank": %d,' % r + data[at + len(head) :]
        )
    done.touch()
    return out


def write_run_dir(out: Path, source: Path, ranks: int, groups_once: bool = True) -> Path:
    """A ``ranks``-rank run directory from a real 2-rank capture (``source``): rank 0's
    events for every rank, its rank and world size rewritten and every process group made
    the whole job's (version 2: once per file in ``pg`` events; ``groups_once=False``:
    version 1, the list on every collective, as runs were written before)."""
    import json

    done = out / ".complete"
    if done.exists():
        return out
    shutil.rmtree(out, ignore_errors=True)
    (out / "ranks").mkdir(parents=True)
    meta = json.loads((source / "meta.json").read_text())
    meta["world_size"] = ranks
    (out / "meta.json").write_text(json.dumps(meta))
    events = [json.loads(line) for line in (source / "ranks" / "rank-00000.jsonl").open()]
    everyone = list(range(ranks))
    lines = []
    for ev in events:
        if ev["type"] == "pg" or (ev["type"] == "coll" and not groups_once):
            ev["group"] = everyone
        if ev["type"] == "coll" and groups_once:
            ev.pop("group", None)
        if ev["type"] == "pg" and not groups_once:
            continue
        lines.append(json.dumps(ev, separators=(",", ":")))
    text = "\n".join(lines) + "\n"
    for r in range(ranks):
        per_rank = text.replace('"rank":0,', f'"rank":{r},').replace(
            '"world_size":2', f'"world_size":{ranks}'
        )
        (out / "ranks" / f"rank-{r:05d}.jsonl").write_text(per_rank)
    done.touch()
    return out


def write_big(out: Path, files: int, mb: int, layout: str = "torch") -> Path:
    done = out / ".complete"
    if not done.exists():
        shutil.rmtree(out, ignore_errors=True)
        write_job(out, files, mb << 20, layout=layout)
        done.touch()
    return out


def measure(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, float, float]:
    """(wall s, peak tree RSS MiB, CPU s of the whole tree) of ``cmd`` in a fresh process.

    The CPU time is the command's user + system time with every process it waited for
    (its workers) included, as ``wait4`` reports it."""
    start = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak = 0
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        peak = max(peak, _tree_kib(proc.pid)[0])
        time.sleep(0.02)
    wall = time.monotonic() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode not in (0, 1):
        err = proc.stderr.read().decode() if proc.stderr else ""
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}): {err[-2000:]}")
    if proc.stderr:
        proc.stderr.close()
    return wall, peak / 1024, usage.ru_utime + usage.ru_stime


def analyze(traces: Path, out: Path, extra: tuple[str, ...] = ()) -> tuple[float, float, float]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "syncscope", "analyze", "-q", str(traces), "-o", str(out)]
    return measure([*cmd, "--fail-on", "never", *extra], env)


def _size_gb(path: Path) -> float:
    """The files' bytes as parsed (a gzip file's uncompressed size, from its trailer)."""
    return sum(_parsed_bytes(p) for p in path.iterdir() if _is_data(p)) / 1e9


def _parsed_bytes(path: Path) -> int:
    if not path.name.endswith(".gz"):
        return path.stat().st_size
    with path.open("rb") as f:  # ISIZE: the uncompressed size modulo 2**32
        f.seek(-4, os.SEEK_END)
        return int.from_bytes(f.read(4), "little")


def _is_data(p: Path) -> bool:
    return p.is_file() and (is_trace_file(p) or p.name.endswith(".jsonl"))


def _events(path: Path) -> int:
    """Trace events in the set: ``"ph"`` keys (a run directory's lines: 0, not counted);
    remembered in the set's ``.events`` where the set is ours to write."""
    memo = path / ".events"
    if memo.exists():
        return int(memo.read_text())
    count = 0
    for p in sorted(path.iterdir()):
        if p.is_file() and is_trace_file(p):
            with gzip.open(p) if p.name.endswith(".gz") else p.open("rb") as f:
                tail = b""
                while chunk := f.read(1 << 24):
                    count += (tail + chunk).count(b'"ph"')
                    tail = chunk[-3:]
    if (path / ".complete").exists():
        memo.write_text(str(count))
    return count


STARTUP = [0.0]  # CPU s of the command on a one-window trace (``measure_startup``)


def measure_startup(work: Path, reps: int = 3) -> float:
    """CPU seconds of ``analyze`` on a one-window, one-rank trace: the command's fixed cost
    (interpreter, imports, reports), the median of ``reps``."""
    tiny = work / "startup"
    if not (tiny / ".complete").exists():
        tiny.mkdir(parents=True, exist_ok=True)
        write_rank(tiny / "rank-0.json", 0, 1, 0, windows=1)
        (tiny / ".complete").touch()
    runs = sorted(analyze(tiny, work / "out")[2] for _ in range(reps))
    STARTUP[0] = runs[len(runs) // 2]
    print(f"start-up: {STARTUP[0]:.3f} CPU-s (analyze on one window of one rank)", flush=True)
    return STARTUP[0]


def compile_package() -> None:
    """Bytecode for the package, as an install writes it (this process may run with
    PYTHONDONTWRITEBYTECODE; a checkout then compiles every module on every start)."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(ROOT / "syncscope")], check=True)


# name, GB, tool, wall s, peak RSS MiB, CPU s, load, events, and the CPU s of every run
# where the row is the median of several
Row = tuple[str, float, str, float, float, float, float, int, list[float]]
ROWS: list[Row] = []  # what --doc writes
SYNCSCOPE_RUNS = [1]  # ``--syncscope-runs``: runs of syncscope analyze per set


def _line(
    name: str,
    traces: Path,
    wall: float,
    rss: float,
    cpu: float,
    tool: str = "syncscope",
    runs: list[float] | None = None,
) -> None:
    load = os.getloadavg()[0]
    size = _size_gb(traces)
    events = _events(traces)
    ROWS.append((name, size, tool, wall, rss, cpu, load, events, runs or []))
    past = (
        f"{_rate(size * 1e3, cpu - STARTUP[0]):>7} MB/CPU-s past start-up "
        if tool == "syncscope"
        else ""
    )
    print(
        f"{name:<40} {size * 1e3:8.1f} MB parsed | {tool:<12} {wall:8.2f} s wall {cpu:8.2f} CPU-s "
        f"{_mb_per_cpu(size, cpu, runs)} MB/CPU-s {past}"
        f"{_per_cpu(events, cpu):>7} events/CPU-s {rss:8.0f} MiB "
        f"| load {load:.1f} on {os.cpu_count()} cores",
        flush=True,
    )


def _mb_per_cpu(size: float, cpu: float, runs: list[float] | None) -> str:
    """MB per CPU-second of ``cpu`` (the median run), with the range over ``runs``."""
    rate = f"{size * 1e3 / max(cpu, 1e-9):7.1f}"
    if runs and len(runs) > 1:
        rates = sorted(size * 1e3 / max(c, 1e-9) for c in runs)
        rate += f" ({rates[0]:.1f}-{rates[-1]:.1f})"
    return rate


def _median_run(name: str, traces: Path, out: Path, given: Path | None = None) -> None:
    """``SYNCSCOPE_RUNS`` runs of syncscope analyze on ``given`` (default: ``traces``, the
    files measured), one after another: the median run (by CPU time) as the row, every
    run's CPU time beside it."""
    runs = [analyze(given or traces, out) for _ in range(SYNCSCOPE_RUNS[0])]
    wall, _, cpu = sorted(runs, key=lambda r: r[2])[(len(runs) - 1) // 2]
    _line(name, traces, wall, max(r[1] for r in runs), cpu, "syncscope", [r[2] for r in runs])


def _per_cpu(events: int, cpu: float) -> str:
    """Thousands of events per CPU-second; "-" for a set of no trace events (run directories)."""
    return f"{events / max(cpu, 1e-9) / 1e3:.0f}k" if events else "-"


def _rate(amount: float, cpu: float) -> str:
    return f"{amount / cpu:.1f}" if cpu > 0.01 else "-"


# The JSON alone: every file's events parsed by orjson into dicts, in the pieces syncscope
# parses, and dropped: what a reader that builds every event as a dict pays before it looks
# at one (syncscope's own parse builds only the keys it reads).
JSON_ALONE = (
    "import sys; from pathlib import Path\n"
    "from syncscope.load.trace.read import is_trace_file, read_trace\n"
    "for p in sorted(Path(sys.argv[1]).iterdir()):\n"
    "    if p.is_file() and is_trace_file(p): read_trace(p, lambda batch: None)\n"
)


JSON_ALONE_ROWS = [True]  # ``--no-json-alone``: False

# The reader alone: syncscope's reading of every file (``read_rank``: parse, keep, cut into
# windows) in one process, three passes, the median pass's CPU and wall time measured inside
# it: the parse speed with the command's start-up out, for files too small to show it
# beside the start-up (the real traces). Prints "wall cpu peak-RSS-MiB".
READER_ALONE = (
    "import resource, sys, time; from pathlib import Path\n"
    "from syncscope.load.trace.read import is_trace_file\n"
    "from syncscope.load.trace.rankfile import read_rank\n"
    "files = [p for p in sorted(Path(sys.argv[1]).iterdir()) if p.is_file() and is_trace_file(p)]\n"
    "passes = []\n"
    "for _ in range(3):\n"
    "    wall, cpu = time.perf_counter(), time.process_time()\n"
    "    for p in files: read_rank(p)\n"
    "    passes.append((time.process_time() - cpu, time.perf_counter() - wall))\n"
    "cpu, wall = sorted(passes)[1]\n"
    "print(wall, cpu, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)\n"
)


def reader_alone(traces: Path, env: dict[str, str]) -> tuple[float, float, float]:
    """(wall s, peak RSS MiB, CPU s) of the median of three in-process reading passes."""
    cmd = [sys.executable, "-c", READER_ALONE, str(traces)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    wall, cpu, rss = (float(x) for x in proc.stdout.split())
    return wall, rss, cpu


def _both(
    name: str, traces: Path, out: Path, hta: bool, reps: int = 1, reader: bool = False
) -> None:
    """syncscope analyze, the reader alone (``READER_ALONE``, where ``reader``) and the JSON
    alone (``JSON_ALONE``), ``reps`` times in turn (each meets the same machine load), every
    run printed; HTA's load of the same files (``hta``) is left to ``hta_loads``."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    for _ in range(reps):
        _median_run(name, traces, out)
        if reader:
            _line(name, traces, *reader_alone(traces, env), "reader alone")
        if JSON_ALONE_ROWS[0] and any(is_trace_file(p) for p in traces.iterdir()):
            got = measure([sys.executable, "-c", JSON_ALONE, str(traces)], env)
            _line(name, traces, *got, "JSON alone")
    if hta:
        HTA_LATER.append((name, traces, reps))


# Sets whose HTA load runs after every other row: in one run, the rows measured just after
# a load of minutes on both cores (and hundreds of MB) read a quarter slower than alone.
HTA_LATER: list[tuple[str, Path, int]] = []


def hta_loads() -> None:
    """HTA's load of each set ``_both`` left to it, ``reps`` times."""
    for name, traces, reps in HTA_LATER:
        for _ in range(reps):
            _line(name, traces, *measure([sys.executable, "-c", HTA_LOAD, str(traces)]), "HTA load")


def _shown(arg: str, work: Path) -> str:
    """A command-line argument as the page shows it: the work directory as DIR, paths in
    the checkout relative to it, those beside it as ../."""
    if arg == str(work):
        return "DIR"
    return arg.replace(f"{ROOT}/", "").replace(f"{ROOT.parent}/", "../")


def write_doc(path: Path, argv: list[str], windows: int = RANK_WINDOWS) -> None:
    """The figures as docs/benchmarks.md's parse-speed section (benchmarks/_report.py puts
    the file in the page as written)."""
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    lines = [
        "<!-- written by benchmarks/bench_scale.py --doc; benchmarks/_report.py puts it in -->",
        "### Parse speed: MB per CPU-second, many ranks, big files, real traces",
        "",
        f"`python benchmarks/bench_scale.py {' '.join(argv)}` on {when}, {os.cpu_count()} "
        "cores: the whole `syncscope analyze` CLI in a fresh process (reports written), its "
        "modules compiled to bytecode as an install has them; wall time, CPU time of every "
        "process of the tree (workers included) and the peak of the tree's summed RSS. "
        "*MB*: the bytes parsed (gzip files: uncompressed). *MB/CPU-s*: those over that CPU "
        f"time, start-up included; *past start-up*: over the CPU time less the command's "
        f"fixed cost, {STARTUP[0]:.2f} CPU-s here (interpreter, imports and reports: the same "
        "command on a one-window trace). *events/CPU-s*: the trace's events over the CPU "
        "time, a figure the layout does not change (run directories: -). *past start-up* is "
        "worth reading only where the CPU time is several times the start-up, whose own "
        "variation between runs otherwise dominates it. *load*: the 1-minute load average when "
        "the row ended (above the core count, other jobs were running: wall times are then "
        "upper bounds). *syncscope* rows: "
        + (
            f"the median of {SYNCSCOPE_RUNS[0]} runs one after another (by CPU time), the "
            "range of their MB/CPU-s in parentheses, the highest peak RSS; "
            if SYNCSCOPE_RUNS[0] > 1
            else "one run; "
        )
        + "*reader alone* (real traces): syncscope's reading of the same files "
        "(parse, keep, cut into windows) in one process, its start-up left out: the median of "
        "three passes, timed inside the process. *JSON alone*: the same files' events parsed by orjson in the pieces "
        "syncscope reads and dropped, in one fresh process (its start-up included): what "
        "a reader that builds every event as a dict pays before it looks at one (syncscope "
        "builds only the keys it reads, with msgspec, so its parse alone is faster). HTA's `TraceAnalysis` load of the same "
        "files beside it where asked, measured after every other row (in one run, the rows "
        "measured just after a load of minutes on both cores read a quarter slower than the "
        "same rows measured alone).",
        "",
        "Synthetic DDP traces come from `tests.helpers.synth_traces` in two layouts of the "
        "same training steps: *torch*, as torch.profiler writes a GPU trace (indented, its "
        "usual args, and the flow events it adds for each kernel launch; about 220 bytes an "
        "event, as in the real GPU traces above), and *compact*, minimal and unspaced, "
        "without flow events (about 145 bytes an event: the most work a megabyte can "
        "describe, so the lowest MB/CPU-s of any layout). Many-rank sets are "
        f"{windows} window(s) a rank; big files are filled to their size.",
        "",
        "| set | MB | tool | wall s | CPU s | MB/CPU-s | past start-up | events/CPU-s "
        "| peak RSS MiB | load |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    first: dict[str, int] = {}  # each set's rows together, sets in the order they were measured
    for row in ROWS:
        first.setdefault(row[0], len(first))
    for name, size, tool, wall, rss, cpu, load, events, runs in sorted(
        ROWS, key=lambda row: first[row[0]]
    ):
        past = _rate(size * 1e3, cpu - STARTUP[0]) if tool == "syncscope" else ""
        lines.append(
            f"| {name} | {size * 1e3:.1f} | {tool} | {wall:.2f} | {cpu:.2f} | "
            f"{_mb_per_cpu(size, cpu, runs).strip()} | {past} | "
            f"{_per_cpu(events, cpu)} | {rss:.0f} | {load:.1f} |"
        )
    path.write_text("\n".join(lines) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, required=True, help="where the sets are written")
    parser.add_argument("--ranks", default="1024,4096,16384")
    parser.add_argument("--rank-windows", type=int, default=RANK_WINDOWS,
                        help="windows in each many-rank file")  # fmt: skip
    parser.add_argument("--no-json-alone", action="store_true",
                        help="leave out the JSON-alone row of each set")  # fmt: skip
    parser.add_argument("--layouts", default="torch,compact",
                        help="synthetic sets in these layouts (torch, compact)")  # fmt: skip
    parser.add_argument("--no-big", action="store_true")
    parser.add_argument("--big-files", type=int, default=8)
    parser.add_argument("--big-mb", type=int, default=1024)
    parser.add_argument("--real", type=Path, nargs="*", default=[],
                        help="directories of real traces, measured as they are")  # fmt: skip
    parser.add_argument("--hta", action="store_true",
                        help="HTA's load beside syncscope on every set up to --hta-max-mb")  # fmt: skip
    parser.add_argument("--hta-max-mb", type=float, default=600.0,
                        help="HTA holds every event in pandas (~16x the files): larger sets "
                        "are left to syncscope alone")  # fmt: skip
    parser.add_argument("--reps", type=int, default=1, help="runs of each tool, in turn")
    parser.add_argument("--syncscope-runs", type=int, default=1,
                        help="runs of syncscope analyze per set, one after another: the row "
                        "is the median run, with the range of MB/CPU-s")  # fmt: skip
    parser.add_argument("--scheduler", help="also analyze on this Dask scheduler")
    parser.add_argument("--run-dir-ranks", default="", help="run directories of N ranks")
    parser.add_argument("--v1-ranks", default="", help="the same, as format 1 wrote them")
    parser.add_argument("--capture", type=Path, help="a 2-rank run directory to copy")
    parser.add_argument("--doc", type=Path, help="write the figures here as markdown")
    args = parser.parse_args()
    out = args.dir / "out"

    def hta_on(traces: Path) -> bool:
        return bool(args.hta) and _size_gb(traces) * 1e3 <= args.hta_max_mb

    layouts = [x for x in args.layouts.split(",") if x]
    JSON_ALONE_ROWS[0] = not args.no_json_alone
    SYNCSCOPE_RUNS[0] = max(1, args.syncscope_runs)
    compile_package()
    measure_startup(args.dir)
    for real in args.real:
        _both(f"{real.name} (real)", real, out, hta_on(real), args.reps, reader=True)
    for n in (int(x) for x in args.ranks.split(",") if x):
        for layout in layouts:
            where = args.dir / f"ranks-{n}x{args.rank_windows}w-{layout}"
            traces = write_ranks(where, n, args.rank_windows, layout)
            size_kb = _size_gb(traces) * 1e6 / n
            name = f"{n} ranks x {size_kb:.0f} KB, {layout}"
            _both(name, traces, out, hta_on(traces), args.reps)
            if args.scheduler:
                got = analyze(traces, out, ("--scheduler", args.scheduler))
                _line(name, traces, *got, "dask")
    for fmt, counts in (("v2", args.run_dir_ranks), ("v1", args.v1_ranks)):
        for n in (int(x) for x in counts.split(",") if x):
            if args.capture is None:
                raise SystemExit("--run-dir-ranks/--v1-ranks need --capture RUN_DIR")
            run = write_run_dir(args.dir / f"run-{fmt}-{n}", args.capture, n, fmt == "v2")
            _median_run(f"run dir {fmt}, {n} ranks", run / "ranks", out, run)
    if not args.no_big:
        for layout in layouts:
            where = args.dir / f"big-{args.big_files}x{args.big_mb}-{layout}"
            traces = write_big(where, args.big_files, args.big_mb, layout)
            name = f"{args.big_files} x {args.big_mb} MB, {layout}"
            _both(name, traces, out, hta_on(traces), args.reps)
    hta_loads()
    if args.doc is not None:
        argv = [_shown(a, args.dir) for a in sys.argv[1:]]
        write_doc(args.doc, argv, args.rank_windows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
