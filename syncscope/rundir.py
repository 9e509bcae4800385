"""The run directory: a versioned on-disk format written by capture and read by everything else.

Layout (format ``syncscope-run``, version 1; see docs/formats.md)::

    RUN/
      meta.json                 run metadata (command, world size, launcher options, versions)
      ranks/rank-00000.jsonl    one JSON object per line per rank, appended as things happen
      beats/rank-00000.json     profile only: a rank's heartbeat, replaced about once a second
      report.json, report.html  rendered outputs (derived; can be regenerated)

Event files are written one line per event with a single ``write(2)``, so a crash, a kill
or a hang keeps every event up to then; a torn last line is ignored on reading.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import orjson

from syncscope.atomic import NotRegularFile, atomic_write, open_regular, read_regular
from syncscope.errors import BadRunDirectory

RUN_FORMAT = "syncscope-run"
RUN_FORMAT_VERSION = 1
EVENTS_FORMAT = "syncscope-events"
EVENTS_FORMAT_VERSION = 2  # 2: a group's ranks once, in a ``pg`` event (1: on every ``coll``)
META_FILE = "meta.json"
# set to "1" in the ranks' environment: they write ``params`` and ``pfp`` events (parameter
# fingerprints; ``syncscope fix --verify`` sets it)
PARAM_FINGERPRINTS_ENV = "SYNCSCOPE_PARAM_FINGERPRINTS"
# a whole number N: each rank seeds Python's, torch's and NumPy's random generators with
# N + its rank before the script runs (``syncscope fix --verify`` sets it)
SEED_ENV = "SYNCSCOPE_SEED"
META_MAX_BYTES = 16 << 20  # meta.json: a command line and notes; more is not one
EVENT_MAX_BYTES = 16 << 20  # one event line (a huge group list was ~100 KB a line)
RANKS_DIR = "ranks"
BEATS_DIR = "beats"  # RUN/beats/rank-NNNNN.json: a rank's heartbeat (profile only)


def rank_events_path(run_dir: Path, rank: int) -> Path:
    return run_dir / RANKS_DIR / f"rank-{rank:05d}.jsonl"


def rank_beat_path(run_dir: Path, rank: int) -> Path:
    """A rank's heartbeat file (``syncscope.capture.heartbeat``), replaced about once a second
    under ``syncscope profile``: what its main thread is doing."""
    return run_dir / BEATS_DIR / f"rank-{rank:05d}.json"


def is_run_dir(path: Path) -> bool:
    return (path / META_FILE).is_file() or (path / RANKS_DIR).is_dir()


def prepare_run_dir(run_dir: Path) -> None:
    """Create RUN/ and RUN/ranks/ (its missing parents too, like ``mkdir -p``), with one
    clear error when that is impossible."""
    for parent in run_dir.parents:
        if parent.exists():
            if not parent.is_dir():
                raise BadRunDirectory(
                    f"--out {run_dir}: cannot create ({parent} is not a directory)"
                )
            break
    try:
        (run_dir / RANKS_DIR).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BadRunDirectory(f"--out {run_dir}: cannot create ({exc.strerror})") from None
    if not os.access(run_dir / RANKS_DIR, os.W_OK):
        raise BadRunDirectory(f"--out {run_dir}: not writable")
    if any((run_dir / RANKS_DIR).iterdir()):
        raise BadRunDirectory(f"--out {run_dir}: already holds a run; choose a new directory")


LOCK_FILE = ".syncscope-profile.lock"


def lock_run_dir(run_dir: Path) -> Path:
    """Claim RUN/ for one ``profile`` (a file made with O_EXCL, holding this process's id), so
    a second run started on the same ``--out`` is refused instead of interleaving its ranks'
    files with the first's. A lock left by a process that has died is taken over."""
    path = run_dir / LOCK_FILE
    for _ in range(3):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            holder = _lock_holder(path)
            if _lock_held(path, holder):
                raise BadRunDirectory(
                    f"--out {run_dir}: another syncscope profile (pid {holder}) is writing "
                    "there; choose a new directory"
                ) from None
            with contextlib.suppress(FileNotFoundError):
                path.unlink()  # stale: its process is gone
            continue
        except OSError as exc:
            raise BadRunDirectory(f"--out {run_dir}: cannot lock ({exc.strerror})") from None
        with os.fdopen(fd, "w") as f:
            f.write(str(os.getpid()))
        return path
    raise BadRunDirectory(f"--out {run_dir}: another syncscope profile is starting there")


def unlock_run_dir(lock: Path) -> None:
    with contextlib.suppress(OSError):
        if _lock_holder(lock) == os.getpid():
            lock.unlink()


def running_profile(run_dir: Path) -> int | None:
    """The pid of another ``syncscope profile`` still writing ``run_dir``, or None."""
    path = run_dir / LOCK_FILE
    holder = _lock_holder(path)
    if holder is None or holder == os.getpid() or not pid_alive(holder):
        return None
    return holder


def _lock_held(path: Path, holder: int | None) -> bool:
    if holder is None:  # just created, its id not yet written: held unless it is old
        try:
            return time.time() - path.stat().st_mtime < 10
        except OSError:
            return False
    return pid_alive(holder)


def _lock_holder(path: Path) -> int | None:
    try:
        text = path.read_text()[:32].strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (a zombie has ended): the one check of the
    package, for a lock's holder, a rank's launcher and the ranks left to stop."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (OSError, OverflowError):  # not ours to signal (EPERM), or no such id: not known dead
        return True
    try:  # a zombie has ended
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[:1] != ["Z"]


ATTEMPTS_DIR = "attempts"


def set_aside_attempt(run_dir: Path, rank: int, restart: int) -> None:
    """A restarted job (torchrun ``--max-restarts``; ``restart`` is TORCHELASTIC_RESTART_COUNT):
    move this rank's file of the attempt before into RUN/attempts/attempt-K/ranks/ (with a copy
    of meta.json, so it reads as a run of its own), so each attempt's file has one header and
    RUN/ranks/ holds the last attempt only."""
    path = rank_events_path(run_dir, rank)
    if restart < 1 or not path.is_file():
        return
    attempt = run_dir / ATTEMPTS_DIR / f"attempt-{restart - 1}"
    with contextlib.suppress(FileExistsError):
        (attempt / RANKS_DIR).mkdir(parents=True, exist_ok=True)
    os.replace(path, attempt / RANKS_DIR / path.name)
    meta = run_dir / META_FILE
    if meta.is_file() and not (attempt / META_FILE).exists():
        with contextlib.suppress(OSError):
            atomic_write(attempt / META_FILE, meta.read_bytes())


def record_launcher_exit(run_dir: Path, rank: int, signal_name: str, status: int) -> bool:
    """A rank killed by a signal it could not record (SIGSEGV, SIGKILL, SIGABRT): append the
    exit the launcher saw to its file, unless the rank recorded its own. True if written."""
    path = rank_events_path(run_dir, rank)
    try:
        if not path.is_file() or path.stat().st_size > 1 << 30:
            return False
        with path.open("rb") as fh:
            data = fh.read()
        if b'"type":"exit"' in data:
            return False
        record = {
            "type": "exit",
            "t": _last_time(data),  # when it was last seen: the order of failures holds
            "status": status,
            "reason": f"killed by signal {signal_name} (seen by the launcher)",
            "by": "launcher",
        }
        with path.open("ab") as fh:
            fh.write(
                (b"" if data.endswith(b"\n") or not data else b"\n") + orjson.dumps(record) + b"\n"
            )
    except OSError:
        return False
    return True


def _last_time(data: bytes) -> int:
    for line in reversed(data.splitlines()[-50:]):
        with contextlib.suppress(orjson.JSONDecodeError, LookupError, TypeError, ValueError):
            return int(orjson.loads(line)["t"])
    return 0


def earlier_attempts(run_dir: Path) -> list[Path]:
    """The earlier attempts of a restarted job set aside by ``set_aside_attempt``."""
    root = run_dir / ATTEMPTS_DIR
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.name.startswith("attempt-") and p.is_dir())


def utf8(value: Any) -> Any:
    """``value`` with every string UTF-8 can encode: the bytes of a name Python could not
    decode (kept as surrogates: a script file name in Latin-1) written as ``\\xNN``."""
    if isinstance(value, str):
        return value.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    if isinstance(value, dict):
        return {utf8(k): utf8(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [utf8(v) for v in value]
    return value


def run_meta(
    *,
    target: str,
    module: bool,
    script: str,
    script_sha256: str,
    script_args: list[str],
    world_size: int,
    torch_version: str,
    launcher: dict[str, Any],
    argv: list[str] | None = None,
    hang_timeout_s: float | None = None,
    trace: bool | None = None,
    bounded: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """meta.json's fields (docs/formats.md), from ``syncscope profile`` and from a rank that
    describes its run under a foreign launcher (``attach``); the optional ones only where
    given: profile's own command line, hang timeout, ``--trace`` and bounded capture."""
    from datetime import datetime, timezone

    from syncscope._version import __version__

    meta: dict[str, Any] = {
        "command": [target, *script_args],
        "module": module,
        "script": script,
        "script_sha256": script_sha256,
    }
    if argv is not None:
        meta["argv"] = argv
    meta.update(
        {
            "world_size": world_size,
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "syncscope_version": __version__,
            "torch_version": torch_version,
            "launcher": launcher,
        }
    )
    if hang_timeout_s is not None:
        meta["hang_timeout_s"] = hang_timeout_s
    meta["hung"] = False
    if trace is not None:
        meta["trace"] = trace
    if bounded is not None:
        meta["bounded"] = bounded
    return meta


def write_meta(run_dir: Path, meta: dict[str, Any]) -> None:
    data = utf8({"format": RUN_FORMAT, "format_version": RUN_FORMAT_VERSION, **meta})
    atomic_write(run_dir / META_FILE, (json.dumps(data, indent=2) + "\n").encode("utf-8"))


def read_meta(run_dir: Path) -> dict[str, Any]:
    path = run_dir / META_FILE
    if not path.exists():
        return {}
    try:
        data = json.loads(read_regular(path, META_MAX_BYTES))
    except NotRegularFile as exc:
        raise BadRunDirectory(f"{path}: {exc.args[0].split(' is ', 1)[1]}") from None
    except OSError as exc:
        raise BadRunDirectory(f"{path}: cannot read ({exc.strerror})") from None
    except ValueError as exc:
        raise BadRunDirectory(f"{path}: not valid JSON ({exc})") from None
    except RecursionError:
        raise BadRunDirectory(f"{path}: not a syncscope run (JSON nested too deeply)") from None
    if not isinstance(data, dict) or data.get("format") != RUN_FORMAT:
        raise BadRunDirectory(f"{path}: not a syncscope run (format is not {RUN_FORMAT!r})")
    version = data.get("format_version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise BadRunDirectory(
            f"{path}: format_version is {version!r}, not a whole number from 1 (the file was "
            "edited or written by something else)"
        )
    if version > RUN_FORMAT_VERSION:
        raise BadRunDirectory(
            f"{path}: run format version {version!r} is newer than this syncscope reads "
            f"({RUN_FORMAT_VERSION}); upgrade syncscope"
        )
    return data


STOPPED_SUFFIX = ".stopped"  # RUN/ranks/rank-NNNNN.jsonl.stopped: why capture stopped there


def stopped_reason(events_file: Path) -> str:
    """Why capture stopped early on a rank, when its writer could leave the marker."""
    marker = events_file.with_name(events_file.name + STOPPED_SUFFIX)
    try:
        return read_regular(marker, 4096).decode(errors="replace").strip()[:300]
    except (OSError, ValueError):
        return ""


def read_events(path: Path) -> Iterator[dict[str, Any]]:
    """Yield a rank's events; a torn final line (the process died mid-write) is skipped, and
    so is a line longer than EVENT_MAX_BYTES (no event is: it is not one). Read as a stream
    of lines, from a regular file only (NotRegularFile otherwise, raised before reading)."""
    try:
        file = open_regular(path)
    except NotRegularFile:
        raise
    except OSError as exc:
        raise BadRunDirectory(f"{path}: cannot read ({exc.strerror})") from None
    with file:
        yield from _events_of(file)


DROPPED = "dropped"  # the event read in place of a line that is no event


def _events_of(file: IO[bytes]) -> Iterator[dict[str, Any]]:
    """Events in file order. A complete line that is no event (not JSON, ``NaN`` among its
    numbers, not an object, overlong) is read as a ``dropped`` event in its place, so the
    window it fell in knows a record is missing; a torn last line (no newline: the process
    died while writing it) is what a kill leaves and is skipped."""
    number = 0
    while True:
        raw = file.readline(EVENT_MAX_BYTES + 1)
        if not raw:
            return
        number += 1
        if len(raw) > EVENT_MAX_BYTES:  # skip the rest of an overlong line, bounded reads
            while raw and not raw.endswith(b"\n"):
                raw = file.readline(EVENT_MAX_BYTES)
            yield {"type": DROPPED, "line": number, "why": "longer than an event can be"}
            continue
        if not raw.strip():
            continue
        try:
            event = orjson.loads(raw)
        except orjson.JSONDecodeError:
            if raw.endswith(b"\n"):
                yield {"type": DROPPED, "line": number, "why": "not JSON (or NaN/Infinity)"}
            continue
        if isinstance(event, dict):
            yield event
        else:
            yield {"type": DROPPED, "line": number, "why": "not a JSON object"}


def rank_files(run_dir: Path) -> list[Path]:
    directory = run_dir / RANKS_DIR
    if not directory.is_dir():
        return []
    return sorted(directory.glob("rank-*.jsonl"))
