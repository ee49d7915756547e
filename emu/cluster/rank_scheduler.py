"""The rank threads of the thread transport: every rank of a run is a green thread (a
greenlet) of one OS thread, the runner, and ranks switch only where one waits in a
collective.

Why not one OS thread per rank: under the GIL only one rank runs at a time anyway, and
a rank that waits in a collective would hand the interpreter to the next through the
operating system (a lock released, a thread woken, the GIL taken over), several times
per rank and step, a large share of a run once ranks are many (benchmarks/RESULTS.md,
"Transport"). A greenlet switch hands it over inside the interpreter.

``RankScheduler.run(bodies)`` is the runner: it starts one greenlet per rank and then
resumes the ready ones, first in first out, until every body has returned. A rank in a
collective (``emu.cluster.thread_collectives.Hub``) calls ``park``: the runner goes on
with the next ready rank until the collective's last rank ``wake``s it, its collective
timeout passes (``park`` returns False) or the run is aborted (``park`` raises
``CollectiveAborted``). When every live rank is parked, the runner sleeps until the
first timeout or the abort.

``abort(reason)`` is the one call made from another OS thread (the launching thread of
``emu.cluster.threads``): every parked rank, and every rank that parks later, raises
``CollectiveAborted``, so each unwinds at its next collective, as a gloo rank does when
a peer's connection closes.

Module-level state an engine sets for itself alone (``keep``: a config singleton of the
code a rank runs) is swapped as the ranks take turns: a rank's values are put in place
before it resumes and read back when it parks or ends; after the run the values from
before the first rank kept them are back.

A rank that blocks the runner outside a collective (the sleep of a ``delay`` fault, a
rank stuck in its own code) holds back every other rank until it returns. They could
not have passed their next collective without it anyway, but their collective timeouts
can only fire when it returns (and do not, if it completes their collective first); the
watchdog, in the launching thread, names it meanwhile.
"""

from __future__ import annotations

import collections
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType, ModuleType
from typing import Any

import greenlet


class CollectiveAborted(RuntimeError):
    """The run failed elsewhere; this rank's collective was cancelled."""


class RankScheduler:
    """The ranks of one thread run. ``run`` is called once, in the runner thread; ``park``
    and ``wake`` by the ranks, in it; ``abort`` and ``frame`` from any thread."""

    def __init__(self) -> None:
        self.reason: str | None = None  # why the run was aborted; set once
        self._greenlets: list[greenlet.greenlet] = []  # by rank
        self._ready: collections.deque[greenlet.greenlet] = collections.deque()
        # Parked ranks and their deadlines, in the order they parked. Every collective
        # of a run has the run's timeout, so that is also the order of the deadlines.
        self._parked: dict[greenlet.greenlet, float] = {}
        self._live = 0
        self._runner: greenlet.greenlet | None = None
        self._running: greenlet.greenlet | None = None
        self._thread_id: int | None = None
        self._alarm = threading.Event()  # wakes a sleeping runner: the run was aborted
        # Module-level state kept per rank: rank greenlet -> {(module, name): its value};
        # and each (module, name)'s value before the run.
        self._kept: dict[greenlet.greenlet, dict[tuple[ModuleType, str], Any]] = {}
        self._before: dict[tuple[ModuleType, str], Any] = {}

    # ------------------------------------------------------------------ the runner

    def run(self, bodies: list[Callable[[], None]]) -> None:
        """Run ``bodies[r]`` as rank r's green thread until every one has returned. A
        body reports its own errors: one that raises ends the runner with its error."""
        self._runner = greenlet.getcurrent()
        self._thread_id = threading.get_ident()
        for body in bodies:
            self._greenlets.append(greenlet.greenlet(body))
        self._ready.extend(self._greenlets)
        self._live = len(bodies)
        ready, parked = self._ready, self._parked
        try:
            while self._live:
                if ready:
                    self._resume(ready.popleft())
                else:  # every live rank waits in a collective
                    self._alarm.wait(max(0.0, next(iter(parked.values())) - time.monotonic()))
                if parked and (self.reason is not None
                               or next(iter(parked.values())) <= time.monotonic()):
                    self._end_waits()
        finally:
            for (module, name), value in self._before.items():
                setattr(module, name, value)

    def _resume(self, rank_greenlet: greenlet.greenlet) -> None:
        """Run one rank until it parks again or returns, with its own module state."""
        kept = self._kept.get(rank_greenlet)
        if kept:
            for (module, name), value in kept.items():
                setattr(module, name, value)
        self._running = rank_greenlet
        rank_greenlet.switch()
        self._running = None
        kept = self._kept.get(rank_greenlet)  # it may have begun keeping just now
        if kept is not None:
            for key in kept:
                kept[key] = getattr(*key)
        if rank_greenlet.dead:
            self._live -= 1

    def _end_waits(self) -> None:
        """Resume the parked ranks whose wait is over: all of them once the run is
        aborted, else those whose deadline has passed."""
        now = time.monotonic()
        for rank_greenlet, deadline in list(self._parked.items()):
            if self.reason is None and deadline > now:
                break
            if rank_greenlet in self._parked:  # an earlier one may have woken it
                self._resume(rank_greenlet)

    # ------------------------------------------------------------------ the ranks

    def park(self, timeout_s: float) -> bool:
        """In a rank: wait until ``wake`` (True) or for ``timeout_s`` (False); raises
        ``CollectiveAborted`` once the run is aborted."""
        current = greenlet.getcurrent()
        self._parked[current] = time.monotonic() + timeout_s
        self._runner.switch()
        timed_out = self._parked.pop(current, None) is not None
        if self.reason is not None:
            raise CollectiveAborted(
                f"rank {self._greenlets.index(current)}: {self.reason}")
        return not timed_out

    def keep(self, module: ModuleType, name: str) -> None:
        """In a rank: from now on ``module.name`` holds this rank's own value while it
        runs (the value it has now, then whatever the rank sets)."""
        key = (module, name)
        self._before.setdefault(key, getattr(module, name))
        self._kept.setdefault(greenlet.getcurrent(), {})[key] = getattr(module, name)

    def wake(self, ranks: list[greenlet.greenlet]) -> None:
        """In a rank: ``ranks`` (parked) run again after the ready ones."""
        parked = self._parked
        for rank_greenlet in ranks:
            del parked[rank_greenlet]
        self._ready.extend(ranks)

    # ------------------------------------------------------------------ other threads

    def abort(self, reason: str) -> None:
        """From any thread: end every wait of the run with ``CollectiveAborted``."""
        if self.reason is None:
            self.reason = reason
        self._alarm.set()

    def running_rank(self) -> int | None:
        """From any thread: the rank the runner is executing now, if any."""
        running = self._running
        return None if running is None else self._greenlets.index(running)

    def frame(self, rank: int) -> FrameType | None:
        """Rank ``rank``'s innermost frame (for a stack dump from another thread): where it
        runs or where it waits; None before it started and after it ended."""
        if rank >= len(self._greenlets):
            return None
        rank_greenlet = self._greenlets[rank]
        if rank_greenlet is self._running:
            return sys._current_frames().get(self._thread_id)
        return rank_greenlet.gr_frame
