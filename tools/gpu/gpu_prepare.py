"""Wheels for the GPU check, built on a machine with registry access, copied to the GPU machine.

    python tools/gpu/gpu_prepare.py [--dest .whl] [--python-version 3.12]

The GPU machine reaches no package registry, and its image has torch, CUDA, pytest,
pytest-xdist, numpy, pandas, narwhals, pyparsing, networkx, rich, pygments, ninja,
accelerate, transformers and lightning, but not the rest of what syncscope and its tests
import. This writes into ``--dest`` (``.whl/``, ignored by git, copied to the GPU machine
with the checkout) syncscope's own wheel (``pip wheel --no-deps`` of this tree) and
``pip download --no-deps`` wheels of the packages the image lacks, for the image's Python
(3.12, x86-64 manylinux): orjson, msgspec, libcst, plotly, traceinsight (HTA, ``analyze --hta``) and
pydot (HTA imports it). tools/gpu/gpu_check.py installs them there with ``--no-index``. The
folder is emptied first: two versions of one package stop the whole install. Needs PyPI
here; prints the wheels and their size (``LIMIT_MIB`` at most, to keep the copy small).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# what the GPU image lacks, with the floors pyproject.toml states (pydot: HTA's own need)
MISSING = [
    "orjson>=3.9",
    "msgspec>=0.18",
    "libcst>=1.0",
    "plotly>=5.20",
    "traceinsight>=0.6",
    "pydot",
]
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in (39, 35, 34, 31, 28, 27, 24, 17)]
PLATFORMS += ["manylinux2014_x86_64", "manylinux1_x86_64"]
LIMIT_MIB = 48  # with the working tree, a copy of at most 64 MiB


def download_command(dest: Path, python_version: str) -> list[str]:
    """``pip download`` of MISSING's binary wheels for the GPU image's Python."""
    command = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--python-version", python_version, "--implementation", "cp", "-d", str(dest),
    ]  # fmt: skip
    for platform in PLATFORMS:
        command += ["--platform", platform]
    return [*command, *MISSING]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dest", type=Path, default=ROOT / ".whl")
    parser.add_argument("--python-version", default="3.12", help="the GPU image's Python")
    args = parser.parse_args(argv)
    dest: Path = args.dest
    dest.mkdir(parents=True, exist_ok=True)
    for old in dest.glob("*.whl"):
        old.unlink()
    steps = [
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dest), str(ROOT)],
        download_command(dest, args.python_version),
    ]
    for command in steps:
        proc = subprocess.run(command, capture_output=True, text=True)
        if proc.returncode != 0:
            print(f"gpu_prepare: error: {' '.join(command[:5])} ...:", file=sys.stderr)
            print(proc.stderr[-3000:], file=sys.stderr)
            return 1
    wheels = sorted(dest.glob("*.whl"))
    total = sum(w.stat().st_size for w in wheels)
    for wheel in wheels:
        print(f"{wheel.stat().st_size / 2**20:7.2f} MiB  {wheel.name}")
    print(f"{total / 2**20:7.2f} MiB  in {dest} ({len(wheels)} wheels)")
    if total > LIMIT_MIB * 2**20:
        print(f"gpu_prepare: error: more than {LIMIT_MIB} MiB to carry", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
