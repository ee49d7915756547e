"""Where ``--split N`` cuts a trace: N consecutive windows with an equal share of the
requests (by arrival), each owning the requests that arrive inside it and replaying, before
them, the ones that arrived in the ``warmup_s`` seconds before it (the warm-up) and, after
them, those of the ``warmup_s`` seconds after it (the cool-down: the window's last
requests finish under the load they would have met, not in an emptied cluster).

Called by the commands (emu/cli/split.py) before any run starts, to make each window's
trace, and by the stitch (emu/split/stitch.py) afterwards, to know which requests and
which steps of each window's run are measured. Windows hold equal shares of requests, not
of time: a window's cost is its requests' work, so equal shares keep the windows about
equally long when they run side by side, where equal times would leave the busy hour's
window running long after the quiet ones.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass

from emu.workload import TraceRequest, arrival_us

# Windows a trace is cut into at most (each is a cluster run of its own).
MAX_WINDOWS = 64


@dataclass(frozen=True)
class Window:
    """Window ``index`` of a split: it owns the requests arriving in
    [``start_s``, ``end_s``) (the last window: from ``start_s`` on, ``end_s`` None) and
    replays first the ``warmup`` requests that arrived in the warm-up before ``start_s``,
    last the ``cooldown`` ones that arrived in as long after ``end_s``. Neither is
    reported. Its measured span is the same interval of virtual time (the last: until its run
    ends); the first window starts at 0, the run's own start."""

    index: int
    start_s: float
    end_s: float | None
    warmup: tuple[TraceRequest, ...]
    owned: tuple[TraceRequest, ...]
    cooldown: tuple[TraceRequest, ...] = ()

    @property
    def trace(self) -> list[TraceRequest]:
        """What the window's run replays: the warm-up, its own requests, the cool-down."""
        return [*self.warmup, *self.owned, *self.cooldown]

    @property
    def name(self) -> str:
        """The window's directory and its name in messages: ``w<index>``."""
        return f"w{self.index}"

    def describe(self) -> str:
        """The window in a message: its requests and its arrivals."""
        end = "the end" if self.end_s is None else f"{self.end_s:.3f} s"
        return (f"window {self.index} ({len(self.owned)} requests arriving "
                f"{self.start_s:.3f} s to {end})")


def cut(trace: Sequence[TraceRequest], windows: int, warmup_s: float) -> list[Window]:
    """``trace`` cut into ``windows`` consecutive windows of about ``len(trace) /
    windows`` requests each, in arrival order. Window k starts at the arrival of request
    ceil(k n / N) (window 0 at 0); requests arriving at the same microsecond stay in one
    window, the later. ValueError when ``windows`` is not 1..MAX_WINDOWS, the warm-up is
    negative or the trace has fewer distinct arrival times than windows (a window would be
    empty)."""
    if not 1 <= windows <= MAX_WINDOWS:
        raise ValueError(f"{windows} windows: expected 1 to {MAX_WINDOWS}")
    if not warmup_s >= 0 or math.isinf(warmup_s):
        raise ValueError(f"warm-up {warmup_s} s: expected a finite number of seconds >= 0")
    ordered = sorted(trace, key=arrival_us)
    times = [arrival_us(r) for r in ordered]
    n = len(ordered)
    if n == 0:
        raise ValueError("an empty trace cannot be cut into windows")
    starts_us = [0]
    for k in range(1, windows):
        start = times[min(n - 1, math.ceil(k * n / windows))] if n else 0
        if start <= max(starts_us[-1], times[0]):
            raise ValueError(f"{n} requests with {len(set(times))} distinct arrival times "
                             f"cannot be cut into {windows} windows (one would be empty)")
        starts_us.append(start)
    ends_us: list[int | None] = [*starts_us[1:], None]
    warm_us = round(warmup_s * 1e6)
    out = []
    for index, (start, end) in enumerate(zip(starts_us, ends_us, strict=True)):
        first = bisect.bisect_left(times, start)
        stop = n if end is None else bisect.bisect_left(times, end)
        warm = bisect.bisect_left(times, start - warm_us)
        cool = n if end is None else bisect.bisect_left(times, end + warm_us)
        out.append(Window(index, start / 1e6, None if end is None else end / 1e6,
                          tuple(ordered[warm:first]), tuple(ordered[first:stop]),
                          tuple(ordered[stop:cool])))
    return out
