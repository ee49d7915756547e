"""The routers without a model of vLLM's API servers: round robin, and the least-loaded
rule of earlier vLLM front ends (``emu.routers`` registers them)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class Routed(Protocol):
    """What a router reads of a request (``emu.workload.TraceRequest`` has it)."""

    request_id: str
    rank: int | None


def check_dp_size(dp_size) -> None:
    """Raise ValueError unless ``dp_size`` is a DP size (an int >= 1)."""
    if not isinstance(dp_size, int) or isinstance(dp_size, bool) or dp_size < 1:
        raise ValueError(f"dp_size must be an integer >= 1, got {dp_size!r}")


class _OneServer:
    """What the routers without API servers share: no view of the engines, one server."""

    observes_engines = False
    api_servers = 1

    def observe(self, stats: Sequence, at_us: int) -> None:
        """Nothing: these routers do not read the lockstep."""

    def server_of(self, request_id: str) -> int:
        return 0


class RoundRobinRouter(_OneServer):
    """Unpinned requests go to ranks 0, 1, ..., dp-1, 0, ... in trace order; pinned
    requests do not advance the rotation."""

    name = "round_robin"

    def __init__(self, dp_size: int):
        check_dp_size(dp_size)
        self.dp_size = dp_size
        self._next = 0

    def route(self, request: Routed, counts=None) -> int:
        """Rank for `request`; `counts` is accepted for a uniform API and ignored."""
        if request.rank is not None:
            return request.rank
        rank = self._next
        self._next = (rank + 1) % self.dp_size
        return rank


class LeastLoadedRouter(_OneServer):
    """The DP front-end rule of earlier vLLM releases: the rank with the lowest
    `waiting * 4 + running`, ties to the lowest rank index, judged on counts one step
    old (vLLM 0.27.1's own balancer is ``--router vllm``, ``emu.routers.vllm_dp_lb``).

    The engine calls `route(request, counts)` for each arriving request with the
    per-rank `(waiting, running)` counts it gathered in the previous step's lockstep
    collective (None before the first step = all zero). The router keeps a local copy
    and adds 1 to the chosen rank's waiting count after each assignment, so a burst
    arriving within one step spreads out, as vLLM's load-balancing client does between
    stats updates. The local copy is re-based whenever `counts` differs from the counts
    last passed in; equal counts are treated as the same snapshot (vLLM's coordinator
    also republishes counts only when they change). Pinned requests return their rank
    and leave the local counts alone, as in vLLM.
    """

    name = "least_loaded"

    def __init__(self, dp_size: int):
        check_dp_size(dp_size)
        self.dp_size = dp_size
        self._snapshot: list[tuple[int, int]] = [(0, 0)] * dp_size
        self._local: list[list[int]] = [[0, 0] for _ in range(dp_size)]

    def route(self, request: Routed, counts=None) -> int:
        if counts is None:
            counts = [(0, 0)] * self.dp_size
        snapshot = [(int(w), int(r)) for w, r in counts]
        if len(snapshot) != self.dp_size:
            raise ValueError(
                f"least_loaded router: expected counts for {self.dp_size} ranks, "
                f"got {len(snapshot)}"
            )
        if snapshot != self._snapshot:
            self._snapshot = snapshot
            self._local = [[w, r] for w, r in snapshot]
        if request.rank is not None:
            return request.rank
        best_rank, best_score = 0, None
        for rank, (waiting, running) in enumerate(self._local):
            score = waiting * 4 + running
            if best_score is None or score < best_score:
                best_rank, best_score = rank, score
        self._local[best_rank][0] += 1
        return best_rank
