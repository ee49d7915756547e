"""The trace as it reaches the ranks: what a rank's input queue holds at a virtual time.

Every rank holds the whole trace and routes each arrival with the same deterministic
router, so all ranks agree on every assignment and on the moment a new wave starts
without talking to each other. Both engine implementations read arrivals through
``Arrivals``: the kit's loop takes them directly, the vllm-ascend engine through a stub
of vLLM's input queue.
"""

from __future__ import annotations

from collections.abc import Sequence

from emu.workload import TraceRequest, arrival_us, make_router


class Arrivals:
    """The trace in arrival order, consumed as the virtual clock passes each arrival."""

    def __init__(self, trace: Sequence[TraceRequest], router: str, dp_size: int):
        self.trace = list(trace)
        self._times = [arrival_us(r) for r in self.trace]
        self._next = 0
        self._router = make_router(router, dp_size)

    def exhausted(self) -> bool:
        return self._next >= len(self.trace)

    def next_arrival_us(self) -> int:
        """Virtual time of the next arrival; only while not ``exhausted()``."""
        return self._times[self._next]

    def due(self, clock_us: int) -> bool:
        """Whether a request has arrived by ``clock_us`` and was not taken yet."""
        return self._next < len(self._times) and self._times[self._next] <= clock_us

    def take(self, clock_us: int, counts) -> list[tuple[TraceRequest, int]]:
        """Every request arrived by ``clock_us``, each with the DP rank it is routed to.

        ``counts`` is every rank's ``(waiting, running)`` as of the last lockstep step
        (one step old, as vLLM's front-end sees them); the least-loaded router reads it.
        """
        taken = []
        while self.due(clock_us):
            request = self.trace[self._next]
            self._next += 1
            taken.append((request, self._router.route(request, counts)))
        return taken
