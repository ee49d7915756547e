"""Which part of a trace is replayed, and how fast: ``--window START:END``,
``--limit N`` and ``--time-scale F``, the same for every format."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from emu.workload import Row


@dataclass(frozen=True)
class Replay:
    """How a trace is replayed, applied in this order:

    - ``window``: only the requests with ``START <= t < END`` on the format's clock (in
      seconds; END may be infinite), and the replay starts at START;
    - ``limit``: only the first N of those;
    - ``time_scale``: each arrival, counted from the replay's start, times F (0.5
      replays twice as fast, 2 half as fast).

    Without a window, a trace on its own clock (every format but ours) starts at its
    first request, and ours at 0, where its ``arrival_s`` start."""

    time_scale: float = 1.0
    window: tuple[float, float] | None = None
    limit: int | None = None

    def keeps(self, time: float) -> bool:
        """Whether a request at ``time`` on the format's clock is in the window."""
        return self.window is None or self.window[0] <= time < self.window[1]

    def apply(self, rows: list[Row], rebase: bool) -> list[Row]:
        """The ``rows`` kept by the window (sorted by time), cut to the limit, each
        request's arrival moved to the replay's clock."""
        rows = rows[:self.limit]
        if self.window is not None:
            origin = self.window[0]
        else:
            origin = rows[0].request.arrival_s if rebase and rows else 0.0
        if origin == 0.0 and self.time_scale == 1.0:
            return rows
        # to the engine's whole microseconds (emu.workload.arrival_us), without the
        # float noise of the subtraction
        return [dataclasses.replace(row, request=dataclasses.replace(
            row.request, arrival_s=round((row.request.arrival_s - origin) * self.time_scale, 6)))
            for row in rows]

    def label(self, name: str) -> str:
        """What ``RunSpec.workload`` calls the trace ``name`` replayed this way."""
        shaped = self.describe()
        return f"{name} ({shaped})" if shaped else name

    def describe(self) -> str:
        """What differs from replaying the whole trace as it is ("" when nothing)."""
        parts = []
        if self.window is not None:
            parts.append(f"window {window_text(self.window)}")
        if self.limit is not None:
            parts.append(f"limit {self.limit}")
        if self.time_scale != 1.0:
            parts.append(f"time-scale {self.time_scale:g}")
        return ", ".join(parts)


def parse_window(text: str) -> tuple[float, float]:
    """``START:END`` in seconds (either may be left out: from 0, to the end). Raises
    ValueError saying what was expected."""
    start_text, colon, end_text = text.partition(":")
    try:
        if not colon:
            raise ValueError
        start = float(start_text) if start_text.strip() else 0.0
        end = float(end_text) if end_text.strip() else math.inf
    except ValueError:
        raise ValueError(f"expected START:END in seconds, e.g. 600:1200, got {text!r}") from None
    if not (math.isfinite(start) and start >= 0 and end > start):
        raise ValueError(f"expected 0 <= START < END, got {text!r}")
    return start, end


def parse_time_scale(text: str) -> float:
    """A finite factor > 0. Raises ValueError saying what was expected."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"expected a factor > 0 (0.5 = twice as fast), got {text!r}")
    return value


def window_text(window: tuple[float, float]) -> str:
    start, end = window
    return f"{start:g}:{'' if math.isinf(end) else f'{end:g}'}"
