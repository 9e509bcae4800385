"""What a torch Flight Recorder dump holds, as plain records: read by
``syncscope.load.flight``, aligned and diagnosed by ``syncscope.analysis.flight``."""

from __future__ import annotations

from dataclasses import dataclass

# element sizes of c10's ScalarType names, as the recorder writes them
ITEMSIZE = {
    "Byte": 1, "Char": 1, "Bool": 1, "Float8_e4m3fn": 1, "Float8_e5m2": 1,
    "Float8_e4m3fnuz": 1, "Float8_e5m2fnuz": 1, "QInt8": 1, "QUInt8": 1,
    "Short": 2, "Half": 2, "BFloat16": 2, "ComplexHalf": 4,
    "Int": 4, "Float": 4, "QInt32": 4, "UInt32": 4,
    "Long": 8, "Double": 8, "ComplexFloat": 8, "UInt64": 8,
    "ComplexDouble": 16,
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class Frame:
    name: str
    file: str
    line: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line} in {self.name}"


@dataclass(frozen=True, slots=True)
class FlightEntry:
    """One collective (or one op of a coalesced group) as one rank's recorder kept it."""

    record_id: int
    pg_name: str
    pg_desc: str
    pg_id: int
    collective_seq_id: int
    p2p_seq_id: int
    op_id: int
    profiling_name: str  # "nccl:all_reduce", "gloo:broadcast", "nccl:send 0->1"
    backend: str  # "nccl", "gloo", ...
    name: str  # "all_reduce", "send", "coalesced", ... (as the recorder names it)
    op: str  # normalized: one of syncscope.model.OPS
    is_p2p: bool
    input_sizes: tuple[tuple[int, ...], ...]
    input_dtypes: tuple[str, ...]
    output_sizes: tuple[tuple[int, ...], ...]
    output_dtypes: tuple[str, ...]
    state: str  # "scheduled", "started", "completed"
    time_created_ns: int
    time_started_ns: int | None
    time_completed_ns: int | None
    duration_ms: float | None
    retired: bool
    timeout_ms: int | None
    thread_name: str
    frames: tuple[Frame, ...]  # innermost first, as the recorder keeps them

    @property
    def bytes(self) -> int:
        """Bytes of the input tensors (the element size of an unknown dtype taken as 4)."""
        total = 0
        for i, sizes in enumerate(self.input_sizes):
            numel = 1
            for d in sizes:
                numel *= d
            dtype = self.input_dtypes[i] if i < len(self.input_dtypes) else ""
            total += numel * ITEMSIZE.get(dtype, 4)
        return total

    @property
    def dtype(self) -> str:
        return ",".join(sorted(set(self.input_dtypes))) or "?"


@dataclass(frozen=True, slots=True)
class FlightDump:
    rank: int
    path: str
    version: str
    groups: dict[str, tuple[str, tuple[int, ...]]]  # name -> (desc, global ranks)
    status: dict[str, dict[str, int]]  # pg id -> last_enqueued/started/completed_collective
    entries: tuple[FlightEntry, ...]
    has_frames: bool  # pickles carry stacks; JSON dumps never do
    host: str = ""  # from the file name, where it names one
