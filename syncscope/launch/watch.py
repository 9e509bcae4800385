"""What each rank's main thread is doing, as ``syncscope profile``'s monitor sees it.

The monitor (``syncscope.launch.torchrun.Monitor``) judges the job's progress on the ranks'
main threads and the work they hand off, never on their processes' whole CPU (torch's and
syncscope's own threads tick while a rank waits in a rendezvous or a collective):

- ``Beats`` reads each rank's heartbeat (``RUN/beats/rank-NNNNN.json``, written by
  ``syncscope.capture.heartbeat``): whether its main thread waits inside torch.distributed
  (a collective, a barrier, ``init_process_group``, the store), or runs the script, and
  whether that thread's CPU time advanced since the beat before (``busy``: computing, not
  sleeping or blocked), and whether the rank's work off its main thread did (``working``:
  the script's own threads, its DataLoader workers, pools and subprocesses). Where a rank's
  heartbeat is missing or stale, a local rank's main thread's CPU ticks and its child
  processes' are read from ``/proc`` instead.
- ``Waits`` keeps the episodes in which ranks waited in torch.distributed while another
  rank computed (an evaluation on rank 0, the others in a barrier): the report names them.
"""

from __future__ import annotations

import contextlib
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from syncscope.rundir import BEATS_DIR

STALE_S = 3.5  # a heartbeat not replaced for this long is stale (the rank beats every 1 s)
MIN_CPU_S = 0.02  # main-thread CPU seconds between two beats (1 s) that make a rank busy
MIN_WAIT_S = 3.0  # shorter waits for another rank are not reported
TICKS_FRESH_S = 2.0  # /proc ticks compared over at most this long (the monitor polls at 0.25 s)


@dataclass
class MainThread:
    """One rank's main thread at the last look."""

    rank: int
    pid: int
    state: str = ""  # "waiting" (in torch.distributed), "running", "" (no heartbeat)
    busy: bool = False  # running, and its CPU time advanced
    where: str = ""  # the script's innermost frame, file:line
    call: str = ""  # the torch.distributed function it waits in
    pg: bool | None = None  # has the default process group (None: no heartbeat)
    # its work off the main thread (the script's threads, child processes) used CPU
    working: bool = False

    @property
    def progressing(self) -> bool:
        """Something of the rank computes: its main thread, or work it handed off."""
        return self.busy or self.working

    def text(self) -> str:
        at = f" at {self.where}" if self.where else ""
        if self.state == "waiting":
            return f"waiting in {self.call or 'torch.distributed'}{at}"
        if self.state == "running" and self.busy:
            return f"running{at}"
        if self.state == "running" and self.working:
            return f"running{at} (in its threads or child processes)"
        if self.state == "running":
            return f"idle{at} (its main thread used no CPU)"
        if self.working:
            return "running (in its child processes; no heartbeat)"
        return "running (no heartbeat)" if self.busy else "idle or blocked (no heartbeat)"


@dataclass
class _Seen:
    seq: int
    pid: int
    cpu: float | None
    changed: float  # monotonic time the beat last changed
    busy: bool | None  # its main thread computed between this beat and the one before
    work: float | None = None  # the beat's work_cpu
    working: bool = False  # its threads or child processes computed meanwhile


_IDS = ("rank", "pid")


def _words(beat: dict[str, Any], key: str) -> str:
    """A beat's text field; anything else (a list, a number) says nothing."""
    value = beat.get(key, "")
    return value if isinstance(value, str) else ""


class Beats:
    """Reads the heartbeats of a run directory, poll after poll."""

    def __init__(self, run_dir: Path, stale_s: float = STALE_S) -> None:
        self.folder = run_dir / BEATS_DIR
        self.stale_s = stale_s
        self._seen: dict[int, _Seen] = {}
        self._ticks: dict[int, tuple[int, float]] = {}  # pid -> main-thread ticks, when read
        self._host = socket.gethostname()

    def read(
        self, live: dict[int, tuple[int, str]], now: float | None = None
    ) -> dict[int, MainThread]:
        """The main thread of each live rank (rank -> (pid, host) from its header)."""
        now = time.monotonic() if now is None else now
        beats = self._load()
        views: dict[int, MainThread] = {}
        for rank, (pid, host) in live.items():
            beat = beats.get(rank)
            if beat is not None and pid and int(beat.get("pid", 0) or 0) != pid:
                beat = None  # an earlier attempt's, not yet replaced
            local = not host or host == self._host  # /proc speaks of this host's processes
            view = self._from_beat(rank, beat, now, local) if beat is not None else None
            if view is None:
                busy = local and self._ticking(pid, now)
                view = MainThread(rank, pid, busy=busy, working=local and self._tree(pid, now))
            views[rank] = view
        return views

    def _load(self) -> dict[int, dict[str, Any]]:
        beats: dict[int, dict[str, Any]] = {}
        with contextlib.suppress(OSError):
            for path in self.folder.glob("rank-*.json"):
                with contextlib.suppress(OSError, orjson.JSONDecodeError, ValueError, TypeError):
                    data = orjson.loads(path.read_bytes())
                    # a beat names its rank and process as integers; any other is no beat
                    if isinstance(data, dict) and {type(data.get(k)) for k in _IDS} == {int}:
                        beats[data["rank"]] = data
        return beats

    def _from_beat(
        self, rank: int, beat: dict[str, Any], now: float, local: bool
    ) -> MainThread | None:
        """The view a heartbeat gives; None when it is stale (the monitor reads /proc)."""
        try:
            seq, pid = int(beat.get("seq", 0)), int(beat.get("pid", 0))
            cpu = beat.get("cpu")
            cpu = float(cpu) if isinstance(cpu, (int, float)) else None
            work = beat.get("work_cpu")
            work = float(work) if isinstance(work, (int, float)) else None
        except (TypeError, ValueError, OverflowError):
            return None
        seen = self._seen.get(rank)
        if seen is None or seen.seq != seq or seen.pid != pid:
            busy: bool | None = None  # nothing to compare with: the /proc ticks say
            working = False
            if seen is not None and seen.pid == pid:
                if cpu is not None and seen.cpu is not None:
                    busy = beat.get("state") == "running" and cpu - seen.cpu >= MIN_CPU_S
                if work is not None and seen.work is not None:
                    working = work - seen.work >= MIN_CPU_S
            seen = self._seen[rank] = _Seen(seq, pid, cpu, now, busy, work, working)
        if now - seen.changed > self.stale_s:
            return None
        pg, state = beat.get("pg"), _words(beat, "state")
        busy = seen.busy if seen.busy is not None else local and self._ticking(pid, now)
        if state == "running" and beat.get("call") == "backward" and not busy:
            state = "waiting"  # a backward whose thread computes nothing: DDP's all-reduce
        return MainThread(
            rank,
            pid,
            state=state,
            busy=busy and state != "waiting",
            where=_words(beat, "where"),
            call=_words(beat, "call"),
            pg=pg if isinstance(pg, bool) else None,
            working=seen.working,
        )

    def _tree(self, pid: int, now: float) -> bool:
        """The local process ``pid``'s child processes used CPU since the last look."""
        from syncscope.capture.heartbeat import descendants, process_ticks

        ticks = sum(process_ticks(child) or 0 for child in descendants(pid))
        key = -pid  # apart from the main thread's ticks
        before, then = self._ticks.get(key, (ticks, now))
        self._ticks[key] = (ticks, now)
        return ticks > before and now - then <= TICKS_FRESH_S

    def _ticking(self, pid: int, now: float) -> bool:
        """The local process ``pid``'s main thread used CPU since the last look (Linux); a
        look more than ``TICKS_FRESH_S`` old says nothing (ticks from long ago are no news)."""
        ticks = main_thread_ticks(pid)
        if ticks is None:
            return False
        before, then = self._ticks.get(pid, (ticks, now))
        self._ticks[pid] = (ticks, now)
        return ticks > before and now - then <= TICKS_FRESH_S


def main_thread_ticks(pid: int) -> int | None:
    """The user and system CPU time of process ``pid``'s main thread in clock ticks (Linux;
    None where /proc cannot say)."""
    if pid <= 0:
        return None
    try:
        stat = Path(f"/proc/{pid}/task/{pid}/stat").read_bytes()
    except OSError:
        return None
    fields = stat.rpartition(b")")[2].split()
    try:
        return int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    except (IndexError, ValueError):
        return None


def hang_state(threads: dict[int, MainThread]) -> dict[str, Any]:
    """What the monitor saw when it declared a hang: ``start_up`` when every rank still
    running said it has no process group yet (the job never reached it), and each rank's
    main thread in words."""
    known = [t.pg for t in threads.values()]
    return {
        "start_up": bool(known) and all(pg is False for pg in known),
        "main_threads": {str(r): t.text() for r, t in sorted(threads.items())},
    }


@dataclass
class _Episode:
    rank: int
    start: float  # monotonic
    wall: float
    last: float
    where: str
    others: dict[int, str] = field(default_factory=dict)  # the busy ranks, where they ran


class Waits:
    """Episodes in which a rank waited in torch.distributed while another rank computed."""

    def __init__(self, min_wait_s: float = MIN_WAIT_S) -> None:
        self.min_wait_s = min_wait_s
        self.episodes: list[dict[str, Any]] = []
        self._open: dict[int, _Episode] = {}

    def observe(self, views: dict[int, MainThread], grown: set[int], now: float) -> None:
        """One poll: ``grown``, the ranks whose event file grew since the last."""
        busy = {r: v.where for r, v in views.items() if v.progressing and v.state != "waiting"}
        for rank in list(self._open):
            view = views.get(rank)
            if view is None or view.state != "waiting" or rank in grown:
                self._close(rank)  # released (or gone)
            elif now - self._open[rank].last > self.min_wait_s:
                self._close(rank)  # no other rank computed for a while: a new wait follows
        for rank, view in views.items():
            others = {r: w for r, w in busy.items() if r != rank}
            if view.state != "waiting" or rank in grown:
                continue
            episode = self._open.get(rank)
            if episode is None and others:
                wall = time.time()
                episode = self._open[rank] = _Episode(rank, now, wall, now, view.text())
            if episode is not None and others:
                episode.last = now
                episode.where = view.text()  # where it waits now (a beat can be a second old)
                episode.others.update(others)

    def close(self) -> None:
        for rank in list(self._open):
            self._close(rank)

    def _close(self, rank: int) -> None:
        episode = self._open.pop(rank)
        seconds = episode.last - episode.start
        if seconds < self.min_wait_s or not episode.others:
            return
        self.episodes.append(
            {
                "rank": rank,
                "for": sorted(episode.others),
                "seconds": round(seconds, 1),
                "since": round(episode.wall, 3),
                "waiting": episode.where,
                "running": {str(r): w for r, w in sorted(episode.others.items())},
            }
        )
