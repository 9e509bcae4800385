"""The GPU check in one call: install, GPU tests, capture-cost pair, rows for docs/gpu.md,
in under 6 minutes on one H100.

First, on a machine that reaches the package registry: ``python tools/gpu/gpu_prepare.py``
writes ``.whl/``. Copy the checkout with its ``.whl/`` to the GPU machine (which needs no
registry), then there (docs/dev/gpu-check.md gives the whole procedure)::

    python3 tools/gpu/gpu_check.py --out OUT_DIR

1. installs every wheel of ``--wheels`` (``.whl/``) with ``pip install --no-index --no-deps
   --target SITE`` and puts SITE on the path of everything it starts (the GPU image has
   torch and the rest; nothing can be downloaded there), then checks that syncscope, orjson,
   msgspec, libcst, plotly, hta and pydot import;
2. without CUDA stops there, saying so: "skipped", exit 0, no GPU figure printed;
3. runs ``pytest -m gpu --slow tests/gpu`` (``-n 6`` where pytest-xdist is installed);
4. runs ``benchmarks/bench_gpu.py`` (plain torchrun against ``syncscope profile``, paired,
   with the run-to-run noise) in the time left;
5. prints the rows for docs/gpu.md (device, driver, versions, date, each test's outcome and
   the first line of each failure, the capture-cost line) and writes them, the logs and the
   JUnit XML to ``--out``.

Exit status: 0 when every GPU test passed and the pair ran (or when skipped for want of a
GPU), 1 otherwise. ``--budget-s`` (default 330) is the whole run's: the tests get what the
pair (about 110 s) leaves.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import importlib.util
import os
import platform
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODULES = ("syncscope", "orjson", "msgspec", "libcst", "plotly", "hta", "pydot")
PAIR_S = 110  # bench_gpu.py's budget (100 s) and its last repetition's overrun
OUTCOME = re.compile(r"\b(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b")
NODE = re.compile(r"(tests/\S+::\S+)")
SUMMARY = re.compile(r"^(FAILED|ERROR) (tests/\S+::\S+?)(?: - (.*))?$")


def install(wheels: Path, site: Path) -> dict[str, str]:
    """Install ``wheels/*.whl`` into ``site`` offline; the environment for what runs next
    (raises RuntimeError, with pip's words, when it fails)."""
    env = dict(os.environ)
    found = sorted(wheels.glob("*.whl")) if wheels.is_dir() else []
    if found:
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
             "--no-compile", "--no-cache-dir", "--upgrade", "--target", str(site),
             *map(str, found)],
            capture_output=True, text=True,
        )  # fmt: skip
        if proc.returncode != 0:
            raise RuntimeError(f"pip install from {wheels} failed:\n{proc.stderr[-2000:]}")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), env.get("PYTHONPATH")) if p)
        sys.path.insert(0, str(site))
        importlib.invalidate_caches()
    print(f"installed {len(found)} wheels from {wheels} into {site}" if found else
          f"no wheels in {wheels}: using what is installed")  # fmt: skip
    return env


def imports(env: dict[str, str]) -> str:
    """Where each needed module comes from, as a child process sees it (raises RuntimeError
    naming the ones that do not import)."""
    code = (
        "import importlib, importlib.metadata as m\n"
        f"for name in {MODULES!r}:\n"
        "    try:\n"
        "        module = importlib.import_module(name)\n"
        "    except Exception as exc:\n"
        "        print(f'{name}: MISSING {type(exc).__name__}: {exc}')\n"
        "        continue\n"
        "    dist = {'hta': 'traceinsight'}.get(name, name)\n"
        "    print(f'{name}: {m.version(dist)} {module.__file__}')\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd="/"
    )
    if proc.returncode != 0 or "MISSING" in proc.stdout:
        raise RuntimeError(f"not importable:\n{proc.stdout}{proc.stderr[-2000:]}")
    return proc.stdout


def versions() -> list[str]:
    import torch

    smi = _run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"])
    nccl = ".".join(str(v) for v in torch.cuda.nccl.version())  # type: ignore[no-untyped-call]
    extra = []
    for name in ("accelerate", "transformers", "lightning"):
        if importlib.util.find_spec(name) is not None:
            extra.append(f"{name} {importlib.metadata.version(name)}")
    return [
        f"device: {torch.cuda.get_device_name(0)} x{torch.cuda.device_count()}"
        + (f" (nvidia-smi: {smi.strip().splitlines()[0]})" if smi.strip() else ""),
        f"torch {torch.__version__}, CUDA {torch.version.cuda}, NCCL {nccl}, "
        f"Python {platform.python_version()}" + (f", {', '.join(extra)}" if extra else ""),
    ]


def _run(command: list[str]) -> str:
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def run_logged(
    command: list[str], env: dict[str, str], timeout: float, log: Path
) -> tuple[int | None, str, float]:
    """Run ``command`` in the repository, in a process group of its own; its exit status
    (None: stopped at ``timeout``, the whole group killed, its ranks and workers with it),
    its output (also written to ``log``) and its seconds."""
    started = time.monotonic()
    with log.open("w") as sink:
        proc = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        try:
            code: int | None = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the group this call started, no other
            proc.wait()
            code = None
            sink.write(f"\n(stopped after {timeout:.0f} s)\n")
    return code, log.read_text(errors="replace"), time.monotonic() - started


def outcomes(text: str) -> dict[str, tuple[str, str]]:
    """Each test's outcome and, for a failure, the first line of its reason, from pytest's
    ``-v -rA`` output (with or without xdist)."""
    found: dict[str, tuple[str, str]] = {}
    for line in text.splitlines():
        summary = SUMMARY.match(line.strip())
        if summary:
            found[summary.group(2)] = (summary.group(1), (summary.group(3) or "").strip())
            continue
        node, outcome = NODE.search(line), OUTCOME.search(line)
        if node and outcome and node.group(1) not in found:
            found[node.group(1)] = (outcome.group(1), "")
    return found


def rows(
    header: list[str],
    tests: dict[str, tuple[str, str]],
    test_status: str,
    pair: str,
) -> str:
    """The Markdown docs/gpu.md takes: a heading with the date and device, the versions, the
    test outcomes and the capture-cost line."""
    today = datetime.datetime.now(datetime.timezone.utc).date().isoformat()
    lines = [f"### {today}: {header[0].removeprefix('device: ')}", "", f"- {header[1]}"]
    lines += [f"- `pytest -m gpu --slow tests/gpu`: {test_status}", f"- capture cost: {pair}", ""]
    lines += ["| GPU test | outcome | first line of the failure |", "|---|---|---|"]
    for node, (outcome, reason) in sorted(tests.items()):
        name = node.split("::", 1)[1]
        lines.append(f"| `{name}` | {outcome.lower()} | {reason.replace('|', '/')[:160]} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheels", type=Path, default=ROOT / ".whl")
    parser.add_argument("--site", type=Path, default=Path("/tmp/syncscope-site"))
    parser.add_argument("--out", type=Path, default=None, help="logs and rows (default: none)")
    parser.add_argument("--budget-s", type=float, default=330.0)
    parser.add_argument("--workers", type=int, default=6, help="pytest-xdist workers")
    args = parser.parse_args(argv)
    started = time.monotonic()
    out: Path = args.out or Path(os.environ.get("TMPDIR", "/tmp")) / "syncscope-gpu-check"
    out.mkdir(parents=True, exist_ok=True)
    try:
        env = install(args.wheels, args.site)
        print(imports(env), end="")
    except RuntimeError as exc:
        print(f"gpu_check: error: {exc}", file=sys.stderr)
        return 1

    import torch

    if not torch.cuda.is_available():
        print(
            f"gpu_check: skipped: no CUDA GPU is visible (torch {torch.__version__}, built "
            f"with CUDA {torch.version.cuda}): the GPU tests and the capture-cost pair need "
            "one; nothing here is a GPU result"
        )
        return 0
    header = versions()
    print("\n".join(header), flush=True)
    env["PYTHONUNBUFFERED"] = "1"

    command = [sys.executable, "-m", "pytest", "-m", "gpu", "--slow", "-v", "-rA", "-p",
               "no:cacheprovider", f"--junitxml={out / 'gpu-junit.xml'}", "tests/gpu"]  # fmt: skip
    if importlib.util.find_spec("xdist") is not None and args.workers > 1:
        command[3:3] = ["-n", str(args.workers)]
    left = args.budget_s - (time.monotonic() - started) - PAIR_S
    code, text, seconds = run_logged(command, env, max(left, 60.0), out / "gpu-tests.log")
    tests = outcomes(text)
    counts = {k: sum(1 for o, _ in tests.values() if o == k) for k in ("PASSED", "FAILED")}
    errors = sum(1 for o, _ in tests.values() if o == "ERROR")
    test_status = (
        f"{counts['PASSED']} passed, {counts['FAILED']} failed"
        + (f", {errors} errors" if errors else "")
        + f" in {seconds:.0f} s"
        + (" (stopped at its time limit)" if code is None else "")
    )
    print(test_status, flush=True)

    left = args.budget_s - (time.monotonic() - started)
    budget = max(min(100.0, left - 15), 30.0)
    bench = [
        sys.executable,
        str(ROOT / "benchmarks" / "bench_gpu.py"),
        "--budget-s",
        f"{budget:.0f}",
    ]
    bench_code, bench_text, _ = run_logged(bench, env, budget + 30, out / "bench-gpu.log")
    print(bench_text, end="")
    pair = next(
        (line.removeprefix("capture cost: ") for line in bench_text.splitlines()
         if line.startswith("capture cost:")),
        f"bench_gpu.py did not finish (exit {bench_code}): see bench-gpu.log",
    )  # fmt: skip
    text_rows = rows(header, tests, test_status, pair)
    (out / "gpu-rows.md").write_text(text_rows)
    print("\nrows for docs/gpu.md:\n")
    print(text_rows)
    print(f"gpu_check: {time.monotonic() - started:.0f} s in all; logs in {out}")
    return 0 if code == 0 and bench_code == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
