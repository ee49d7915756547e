"""The trace as it reaches the ranks: what a rank's input queue holds at a virtual time.

Every rank holds the whole trace and routes each arrival with the same deterministic
router, so all ranks agree on every assignment and on the moment a new wave starts
without talking to each other. Both engine implementations read arrivals through
``Arrivals``: the kit's loop takes them directly, the vllm-ascend engine through a stub
of vLLM's input queue.

Closed-loop clients (``RunSpec.max_concurrency`` N) follow vLLM 0.27.1's serving
benchmark (``vllm bench serve --max-concurrency``, ``vllm/benchmarks/serve.py``): there
the client creates one task per request at its scheduled arrival, in trace order, and
each task must take a slot of one ``asyncio.Semaphore(N)`` before it sends; the slot is
given back when the response is complete. Python's semaphore wakes waiters in the order
they queued, so a request is sent at the later of its arrival and the moment an earlier
request's completion frees a slot, never more than N are outstanding, and the client
starts its latency clock (``start_time``, from which TTFT counts) only once it holds the
slot. Here a request's send time becomes its ``arrival_s``, so TTFT and end-to-end
latency count from the send, as in vLLM's numbers.

A slot frees on a finish on any rank. Every rank learns the instance's finished count at
the same point: the lockstep collective of each non-idle step carries each rank's
cumulative finished count (``emu.rank.clock.LockstepClock``), covering every finish up to that
step's start, so the ranks release the same requests with the same send times (the
finish times). When a wave ends, no rank holds an unfinished request, so nothing sent is
in flight.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from emu.routers import make_router
from emu.workload import TraceRequest, arrival_us


class Arrivals:
    """The trace in arrival order, consumed as the virtual clock passes each arrival.

    With ``max_concurrency`` N, request j may only be sent once j - N requests have
    finished; ``_send_us`` holds the send times of the requests that have their slot.
    """

    def __init__(self, trace: Sequence[TraceRequest], router: str, dp_size: int,
                 max_concurrency: int | None = None, *, api_servers: int = 1,
                 seed: int = 0):
        self.trace = list(trace)
        self._times = [arrival_us(r) for r in self.trace]
        self._next = 0
        self._router = make_router(router, dp_size, api_servers=api_servers, seed=seed)
        self._limit = max_concurrency
        if max_concurrency is None:
            self._send_us = self._times
        else:
            self._send_us = self._times[:max_concurrency]
        self._finished = 0

    @property
    def observes_engines(self) -> bool:
        """Whether the router reads every lockstep step (``observe``): then the lockstep
        must carry each rank's finished count and KV usage."""
        return self._router.observes_engines

    @property
    def api_servers(self) -> int:
        """How many API servers route (each learns only its own requests' finishes)."""
        return self._router.api_servers

    def server_of(self, request_id: str) -> int:
        """The API server that took request ``request_id``."""
        return self._router.server_of(request_id)

    def observe(self, stats, at_us: int) -> None:
        """Every rank's numbers of the lockstep step that started at ``at_us``
        (``emu.rank.clock.RankStats``), for a router that observes the engines."""
        self._router.observe(stats, at_us)

    def exhausted(self) -> bool:
        return self._next >= len(self.trace)

    def next_arrival_us(self) -> int:
        """Virtual time of the next arrival (its send time under a concurrency limit);
        only while not ``exhausted()`` and, under a limit, after ``nothing_in_flight``
        when every rank is idle."""
        return self._send_us[self._next]

    def due(self, clock_us: int) -> bool:
        """Whether a request has arrived by ``clock_us`` and was not taken yet."""
        return self._next < len(self._send_us) and self._send_us[self._next] <= clock_us

    def take(self, clock_us: int, counts) -> list[tuple[TraceRequest, int]]:
        """Every request arrived by ``clock_us``, each with the DP rank it is routed to.

        ``counts`` is every rank's ``(waiting, running)`` as of the last lockstep step
        (one step old, as vLLM's front-end sees them); the least-loaded router reads it.
        Under a concurrency limit a request's ``arrival_s`` is its send time.
        """
        taken = []
        while self.due(clock_us):
            request = self.trace[self._next]
            if self._limit is not None and self._send_us[self._next] != self._times[self._next]:
                request = replace(request, arrival_s=self._send_us[self._next] / 1e6)
            self._next += 1
            taken.append((request, self._router.route(request, counts)))
        return taken

    def finished(self, total: int, at_us: int) -> None:
        """The instance has finished ``total`` requests by virtual time ``at_us`` (from
        a lockstep step that started at ``at_us``): each slot freed since the last call
        lets the next request in trace order be sent, at ``at_us`` or at its arrival."""
        if self._limit is None or total <= self._finished:
            return
        self._finished = total
        end = min(total + self._limit, len(self._times))
        self._send_us.extend(max(t, at_us) for t in self._times[len(self._send_us):end])

    def nothing_in_flight(self, at_us: int) -> None:
        """Every rank is idle at ``at_us`` (the wave ended): every request taken so far
        has finished, including those of the wave's last step, which no lockstep step
        has reported yet."""
        self.finished(self._next, at_us)
