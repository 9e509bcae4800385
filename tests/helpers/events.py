"""Hand-built event streams, as a rank's recorder would write them (docs/formats.md).

They let diagnoses be tested on runs no CPU can produce (FSDP1, CUDA) and on exact shapes.
"""

from __future__ import annotations

from typing import Any

from syncscope.load.runs import build_run
from syncscope.model import Run, RunMeta


class Rank:
    def __init__(
        self, rank: int = 0, world_size: int = 2, wrappers: tuple[str, ...] = ("ddp",)
    ) -> None:
        self.t = 1_000_000
        self.seq = 0
        self.rank = rank
        self.events: list[dict[str, Any]] = [
            {
                "type": "header",
                "rank": rank,
                "world_size": world_size,
                "t": self.t,
                "host": "h",
                "pid": 1,
            },
            {
                "type": "dist",
                "t": self.t,
                "backend": "gloo",
                "world_size": world_size,
                "rank": rank,
            },
        ]
        for i, kind in enumerate(wrappers):
            self.add(
                "wrapper",
                kind=kind,
                label=f"{kind}:M#{i}",
                params=4,
                param_bytes=4096,
                shard_world=world_size if kind == "fsdp" else 1,
            )

    def add(self, event_type: str, **fields: Any) -> Rank:
        self.t += 1000
        self.events.append({"type": event_type, "t": self.t, **fields})
        return self

    def coll(
        self,
        op: str = "all_reduce",
        nbytes: int = 4096,
        phase: str = "backward",
        issuer: str = "ddp",
        group: tuple[int, ...] = (0, 1),
        call_ns: int | None = None,  # the call's time, issue to return (None: as before, 10 ns)
        **extra: Any,
    ) -> Rank:
        self.add(
            "coll",
            seq=self.seq,
            t_end=self.t + 10 if call_ns is None else self.t + 1000 + call_ns,
            op=op,
            raw=op,
            bytes=nbytes,
            dtype="float32",
            pg="0",
            group=list(group),
            phase=phase,
            issuer=issuer,
            **extra,
        )
        self.t += call_ns or 0  # the call returns call_ns after its issue
        self.add("done", seq=self.seq)
        self.seq += 1
        return self

    def micro_batch(
        self,
        *,
        wrapper: str = "ddp",
        fwd_sync: bool = True,
        bwd_sync: bool = True,
        syncs: int = 1,
        op: str = "all_reduce",
        accelerate: dict[str, Any] | None = None,
        labels: tuple[str, ...] = ("ddp:M#0",),
    ) -> Rank:
        fwd: dict[str, Any] = {
            "wrapper": wrapper,
            "module": labels[0],
            "sync": fwd_sync,
            "depth": 0,
            "site": {"file": "/u/train.py", "line": 10},
        }
        if accelerate is not None:
            fwd["accelerate"] = accelerate
        self.add("fwd", **fwd)
        self.add("fwd_end", depth=0)
        self.add(
            "bwd",
            sync={label: bwd_sync for label in labels},
            site={"file": "/u/train.py", "line": 11},
        )
        for _ in range(syncs):
            self.coll(op=op, issuer="fsdp" if wrapper == "fsdp" else "ddp")
        return self.add("bwd_end", mem=1000)

    def step(
        self, fp: tuple[float, ...] | None = (1.0, 2.0), sharded: bool = False, cuda_peak: int = 0
    ) -> Rank:
        self.add(
            "step",
            site={"file": "/u/train.py", "line": 13},
            mem=2000,
            cuda_peak=cuda_peak,
            fp=list(fp) if fp else None,
            fp_sharded=sharded,
        )
        return self.add("step_end")

    def window(self, positions: list[int], n: int = 4, **kw: Any) -> Rank:
        for i in range(n):
            self.micro_batch(syncs=1 if i in positions else 0, **kw)
        return self.step()

    def finish(self, status: int = 0) -> Rank:
        return self.add("exit", status=status, reason="finished", dist_initialized=True)


def run_of(*ranks: Rank, world_size: int | None = None, **meta: Any) -> Run:
    return build_run(
        RunMeta(world_size=world_size or len(ranks), command=("train.py",), **meta),
        {r.rank: r.events for r in ranks},
    )
