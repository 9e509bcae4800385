"""The first ``syncscope profile`` on a fresh machine against the later ones.

    python benchmarks/bench_first_profile.py [--runs 3] [--wait-build]

From a fresh ``git clone`` of this repository's HEAD (committed work only) into a temp dir,
with torch's extension directory (``TORCH_EXTENSIONS_DIR``, where the compiled collective
kernel is built and kept) pointed at an empty temp dir, it runs README.md's main command
(``syncscope profile --nproc-per-node 2 examples/...``) ``--runs`` times one after another and
prints, side by side, each run's wall time, the collective kernel its ranks used and the
state of the kernel's build when it started: not built, being built in the background
(with the scheduling class and nice value of every process of the build, as ``ps`` shows
them, and the CPU-seconds the build had used so far) or built. The first run starts the
build in the background as it ends; nothing should wait on it, and it should take only CPU
time the later runs leave. The load average is printed with each run: on a loaded machine
the idle-only build may not progress at all, and the runs' times are upper bounds.

At the end the background build is stopped (its temp dir is removed) unless ``--wait-build``,
which waits for it and prints how long it took. ``--control`` also runs the same profiles
with nothing built (``SYNCSCOPE_NATIVE=0``), in turn with them: how much later runs differ
from the first on this machine when no build runs at all. ``--reps N`` repeats both, each
with an empty cache, the order alternating, and prints each later run over the first
(median, min-max) with the build and without: on a shared machine whose load comes and goes,
the difference of the two is the build's share.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MAIN_COMMAND = re.compile(r"syncscope profile (--nproc-per-node \d+ examples/[^`\n]*)")
_TICKS = os.sysconf("SC_CLK_TCK")


def readme_command(readme: Path) -> list[str]:
    """The arguments of README.md's main ``syncscope profile`` command."""
    found = MAIN_COMMAND.search(readme.read_text(encoding="utf-8"))
    if found is None:
        raise SystemExit(f"bench_first_profile: no 'syncscope profile ...' command in {readme}")
    return shlex.split(found.group(1))


def clone(into: Path) -> str:
    """A fresh clone of this repository's HEAD into ``into``; the commit."""
    commit = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    subprocess.run(["git", "clone", "--quiet", "--no-checkout", str(ROOT), str(into)], check=True)
    subprocess.run(["git", "checkout", "--quiet", "--detach", commit], cwd=into, check=True)
    return commit


POLICIES = {0: "normal", 3: "SCHED_BATCH", 5: "SCHED_IDLE"}


def _session_of(sid: int) -> list[tuple[int, str, str, int]]:
    """(pid, command, scheduling, CPU ticks) of every process in session ``sid`` (the
    build's); scheduling: its policy and nice value, from /proc (``ps`` shows no nice
    value under ``SCHED_IDLE``)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        if len(fields) > 38 and fields[3] == str(sid):
            policy = POLICIES.get(int(fields[38]), f"policy {fields[38]}")
            stopped = ", stopped" if fields[0] == "T" else ""
            scheduling = f"{policy} nice {fields[16]}{stopped}"
            found.append((int(entry.name), comm, scheduling, int(fields[11]) + int(fields[12])))
    return found


def build_state(env: dict[str, str]) -> dict[str, object]:
    """What the kernel's build is doing now, asked of the clone's syncscope."""
    code = (
        "import json; from syncscope.capture.native import cache; w = cache.place(); "
        "print(json.dumps({'pid': cache.builder_pid(w), 'why': cache.verify(w), "
        "'failed': cache.remembered_failure(w), 'stamp': cache.read_json(w.file(cache.STAMP))}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    state: dict[str, object] = json.loads(out.stdout)
    pid = state["pid"]
    if isinstance(pid, int) and pid:
        members = _session_of(pid)
        state["cpu_s"] = sum(ticks for *_, ticks in members) / _TICKS
        state["scheduling"] = [f"{comm}: {scheduling}" for _, comm, scheduling, _ in members]
        ps = subprocess.run(
            ["ps", "-o", "pid,cls,ni,comm", "-p", ",".join(str(m[0]) for m in members)],
            capture_output=True,
            text=True,
            check=False,
        )
        state["ps"] = ps.stdout.rstrip()
    return state


def describe(state: dict[str, object]) -> str:
    if not state["why"]:
        return "built"
    if state["pid"]:
        classes = sorted({str(x) for x in state.get("scheduling", [])})
        return (
            f"being built (pid {state['pid']}, {state.get('cpu_s', 0):.1f} CPU-s so far; "
            f"{'; '.join(classes) or 'no process seen'})"
        )
    if state["failed"]:
        return f"build failed: {state['failed']}"
    return "not built"


def profile_once(
    args: list[str], env: dict[str, str], clone_dir: Path, out: Path
) -> dict[str, object]:
    before = os.times()
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "syncscope", "profile", "--out", str(out), *args],
        cwd=clone_dir,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    wall = time.perf_counter() - start
    after = os.times()
    kernel = "?"
    header = out / "ranks" / "rank-00000.jsonl"
    if header.is_file():
        with header.open() as f:
            kernel = str(json.loads(f.readline()).get("collective_kernel", "?"))
    notes = [line for line in proc.stderr.splitlines() if "collective kernel" in line]
    return {
        "wall_s": wall,
        "cpu_s": (after.children_user - before.children_user)
        + (after.children_system - before.children_system),
        "status": proc.returncode,
        "kernel": kernel,
        "note": notes[0] if notes else "",
        "stderr_tail": proc.stderr.strip().splitlines()[-3:],
    }


def load() -> str:
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def sequence(
    args: list[str], env: dict[str, str], clone_dir: Path, work: Path, count: int
) -> list[dict[str, object]]:
    """``count`` profiles one after another, each with the build's state at its start."""
    runs = []
    for i in range(count):
        state = build_state(env)
        start_load = load()
        run = profile_once(args, env, clone_dir, work / f"run-{i + 1}")
        run.update(build=describe(state), ps=state.get("ps", ""), load_start=start_load,
                   load_end=load())  # fmt: skip
        runs.append(run)
        print(f"run {i + 1}: {run['wall_s']:.1f} s wall (exit {run['status']}), "
              f"kernel {run['kernel']}; build at its start: {run['build']}; "
              f"load {start_load} -> {run['load_end']}", flush=True)  # fmt: skip
        if run["ps"]:
            print("  " + str(run["ps"]).replace("\n", "\n  "), flush=True)
        if run["status"]:
            print("  " + "\n  ".join(map(str, run["stderr_tail"])), flush=True)
    return runs


def end_build(env: dict[str, str], wait: bool) -> str:
    """The build's state after the runs; waited for (``wait``) or stopped."""
    final = build_state(env)
    while wait and final["pid"]:
        time.sleep(2)
        final = build_state(env)
    stamp = final.get("stamp")
    built_in = f", built in {stamp['build_s']:.1f} s" if isinstance(stamp, dict) else ""
    said = f"{describe(final)}{built_in}"
    if final["pid"]:
        os.kill(int(str(final["pid"])), signal.SIGTERM)  # it stops its whole build
        said += "; stopped now"
    return said


def table(runs: list[dict[str, object]], control: list[dict[str, object]]) -> list[str]:
    head = "| run | wall s | x run 1 | profile CPU s | kernel | build at the start | load |"
    rule = "|---:|---:|---:|---:|---|---|---|"
    if control:
        head += " control wall s | control x run 1 |"
        rule += "---:|---:|"
    lines = [head, rule]
    first = float(str(runs[0]["wall_s"]))
    for i, run in enumerate(runs):
        wall = float(str(run["wall_s"]))
        line = (f"| {i + 1} | {wall:.1f} | {wall / first:.3f} | {float(str(run['cpu_s'])):.1f} | "
                f"{run['kernel']} | {run['build']} | {run['load_start']} |")  # fmt: skip
        if control and i < len(control):
            other = float(str(control[i]["wall_s"]))
            line += f" {other:.1f} | {other / float(str(control[0]['wall_s'])):.3f} |"
        lines.append(line)
    return lines


def summary(reps: list[dict[str, Any]]) -> list[str]:
    """Each later run over the first of its sequence, median and min-max over repetitions,
    with the build and (where run) without."""
    lines = []
    for kind in ("fresh", "control"):
        seqs = [rep[kind] for rep in reps if rep.get(kind)]
        if not seqs:
            continue
        for k in range(1, len(seqs[0])):
            ratios = [seq[k]["wall_s"] / seq[0]["wall_s"] for seq in seqs]
            what = "fresh cache, the build in the background" if kind == "fresh" else "control"
            lines.append(
                f"{what}: run {k + 1} / run 1 x{statistics.median(ratios):.3f} "
                f"(min-max {min(ratios):.3f}-{max(ratios):.3f}, {len(ratios)} repetitions)"
            )
    return lines


def one_rep(
    opts: argparse.Namespace, args: list[str], env: dict[str, str], work: Path, rep: int
) -> dict[str, Any]:
    """A fresh kernel cache and its profiles (the build left running between them), and
    with ``--control`` the same profiles with nothing built, in turn (order alternating)."""
    kinds = ["fresh", "control"] if opts.control else ["fresh"]
    found: dict[str, Any] = {}
    for kind in kinds[rep % len(kinds) :] + kinds[: rep % len(kinds)]:
        where = work / f"rep-{rep}-{kind}"
        if kind == "fresh":
            print(f"\nrepetition {rep + 1}: a fresh kernel cache", flush=True)
            fresh = dict(env, TORCH_EXTENSIONS_DIR=str(where / "ext"))
            found["fresh"] = sequence(args, fresh, work / "clone", where, opts.runs)
            found["after"] = end_build(fresh, opts.wait_build)
            print(f"after the runs: {found['after']}", flush=True)
        else:
            print(f"\nrepetition {rep + 1}: control, SYNCSCOPE_NATIVE=0 (nothing built)")
            control = dict(env, SYNCSCOPE_NATIVE="0", TORCH_EXTENSIONS_DIR=str(where / "ext"))
            found["control"] = sequence(args, control, work / "clone", where, opts.runs)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="profiles one after another (3)")
    parser.add_argument(
        "--wait-build", action="store_true", help="at the end, wait for the background build"
    )
    parser.add_argument(
        "--control",
        action="store_true",
        help="also the same runs with no build at all (SYNCSCOPE_NATIVE=0), in turn: how much "
        "later runs differ from the first on this machine anyway",
    )
    parser.add_argument("--reps", type=int, default=1, help="repetitions of it all (1)")
    parser.add_argument("--json", type=Path, help="write every figure here")
    opts = parser.parse_args(argv)
    args = readme_command(ROOT / "README.md")
    with tempfile.TemporaryDirectory(prefix="syncscope-first-profile-") as tmp:
        work = Path(tmp)
        commit = clone(work / "clone")
        env = dict(os.environ, PYTHONPATH=str(work / "clone"))
        env.pop("SYNCSCOPE_NATIVE", None)
        env.pop("SYNCSCOPE_NATIVE_PATH", None)
        print(f"fresh clone of {commit[:10]}; an empty kernel cache (TORCH_EXTENSIONS_DIR) "
              f"each repetition; syncscope profile {shlex.join(args)}; {os.cpu_count()} cores",
              flush=True)  # fmt: skip
        reps = [one_rep(opts, args, env, work, rep) for rep in range(opts.reps)]
        for i, rep in enumerate(reps):
            print(
                f"\nrepetition {i + 1}:\n" + "\n".join(table(rep["fresh"], rep.get("control", [])))
            )
        print("\n" + "\n".join(summary(reps)))
        if opts.json:
            opts.json.write_text(
                json.dumps({"commit": commit, "args": args, "reps": reps}, indent=1)
            )
    return (
        1
        if any(r["status"] for rep in reps for r in [*rep["fresh"], *rep.get("control", [])])
        else 0
    )


if __name__ == "__main__":
    raise SystemExit(main())
