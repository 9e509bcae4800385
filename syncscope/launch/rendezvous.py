"""Say what a multi-node rendezvous waits for, while no rank has started.

torch's elastic agent starts no rank until every node has joined the rendezvous: with a node
missing, ``syncscope profile --nnodes 2 ...`` would print nothing until the join timeout
(600 s by default). ``RendezvousWatch`` keeps the rendezvous handler the agent builds (by
wrapping ``get_rendezvous_handler`` while the launcher runs) and, once no rank file has
appeared for a few seconds, reads how many nodes have joined (the c10d and etcd-v2 backends'
state; the static backend tells nothing, so only the wait itself is said), then says it again
when that count changes or a minute has passed.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

FIRST_S = 5.0  # no rank after this long: say what the launcher waits for
EVERY_S = 60.0  # then again when the count of nodes changes, or after this long


class RendezvousWatch:
    """Called by the monitor with the seconds since the start while no rank file exists."""

    def __init__(self, values: dict[str, str], first_s: float = FIRST_S) -> None:
        self.values = values
        self.first_s = first_s
        self.handlers: list[Any] = []
        self._said: tuple[object, float] | None = None  # (what was said, when)
        self.last: tuple[int, int, float | None] | None = None  # the last count read

    @contextlib.contextmanager
    def hooked(self) -> Iterator[None]:
        """While the launcher runs, keep each rendezvous handler it builds."""
        import torch.distributed.elastic.rendezvous.registry as registry

        original = registry.get_rendezvous_handler

        def get_rendezvous_handler(params: Any) -> Any:
            handler = original(params)
            self.handlers.append(handler)
            return handler

        registry.get_rendezvous_handler = get_rendezvous_handler
        try:
            yield
        finally:
            registry.get_rendezvous_handler = original

    def __call__(self, elapsed: float) -> None:
        if elapsed < self.first_s:
            return
        joined = self.joined()
        if joined is not None and joined[0] == 0:
            return  # this node has not joined yet, or has left (a timeout): nothing to say
        self.last = joined or self.last
        if joined is None and _max_nodes(self.values) <= 1:
            return  # one node, no state to read: its ranks are just slow to start
        if joined is not None and joined[0] >= joined[1]:
            return  # every node is in: the ranks are starting
        if self._said is not None:
            said, at = self._said
            if said == joined and elapsed - at < EVERY_S:
                return
        self._said = (joined, elapsed)
        print(self.message(joined, elapsed), file=sys.stderr, flush=True)

    def joined(self) -> tuple[int, int, float | None] | None:
        """(nodes joined, nodes needed, the join timeout in seconds) from the last handler's
        state; None where the backend does not say (static) or torch's internals differ."""
        if not self.handlers:
            return None
        handler = self.handlers[-1]
        try:
            state = handler._state_holder.state
            settings = handler.settings
            joined = len(state.participants)
            join_s = float(settings.timeout.join.total_seconds())
            return joined, int(settings.min_nodes), join_s
        except (AttributeError, TypeError, ValueError):
            return None

    def message(self, joined: tuple[int, int, float | None] | None, elapsed: float) -> str:
        from syncscope.text import visible

        endpoint = self.values.get("rdzv_endpoint") or "{}:{}".format(
            self.values.get("master_addr", "127.0.0.1"), self.values.get("master_port", "29500")
        )
        backend = self.values.get("rdzv_backend", "static")
        where = f"syncscope: waiting for the rendezvous at {endpoint} ({backend})"
        if joined is None:
            nodes = self.values.get("nnodes", "1")
            return visible(
                f"{where}: no rank has started after {elapsed:.0f} s; every node of --nnodes "
                f"{nodes} must start its launcher (each its own --node-rank) before any rank runs"
            )
        count, needed, join_s = joined
        limit = f"torch gives up after {join_s:g} s" if join_s else "torch waits"
        return visible(
            f"{where}: {count} of {needed} node(s) joined after {elapsed:.0f} s; no rank starts "
            f"until every node has joined ({limit}: --rdzv-conf join_timeout=SECONDS)"
        )

    def explain(self, error: str) -> str:
        """The launcher's error, with the nodes that had joined when it was a rendezvous's
        (a timeout says nothing else: torch's message is empty)."""
        if self.last is None or "Rendezvous" not in error.partition(":")[0]:
            return error
        count, needed, _ = self.last
        if count >= needed:
            return error
        endpoint = self.values.get("rdzv_endpoint", "")
        return f"{error}: {count} of {needed} node(s) had joined the rendezvous at {endpoint}"


def _max_nodes(values: dict[str, str]) -> int:
    nnodes = values.get("nnodes", "1").split(":")[-1]
    return int(nnodes) if nnodes.isdigit() else 1
