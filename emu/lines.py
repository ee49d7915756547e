"""A run's per-step lines as the plots (emu.plots) draw them, made while its steps stream
by a window at a time (emu.step_passes), so that a run of hours keeps a few thousand
points a line, not one per step: a line of more than ``MAX_LINE_POINTS`` points is kept
as its envelope (``Envelope``), the DP bubble is smoothed over ``BUBBLE_WINDOW`` steps
(``RollingMean``), and the steps in which a plan was applied are kept as spans
(``Spans``). Each gives what it would give of the whole line in one array."""

from __future__ import annotations

import numpy as np

# A per-step line of more points than this is drawn as the lowest and the highest value
# of each of ``MAX_LINE_POINTS / 2`` runs of consecutive steps: a plot is about 1,200
# pixels wide, and a line of hours of steps would otherwise hold every step (16 bytes a
# point, several times over, in matplotlib) while the picture stays the same.
MAX_LINE_POINTS = 4000
# Steps averaged in the smoothed bubble curve.
BUBBLE_WINDOW = 32


class Envelope:
    """The points to draw of a line of ``size`` points given in pieces (``add``): all of
    them up to ``points``, else, for each of ``points / 2`` runs of consecutive points,
    its lowest and its highest, in the order they came (every peak and trough stays
    visible)."""

    def __init__(self, size: int, points: int = MAX_LINE_POINTS):
        self._whole = size <= points
        self._width = -(-size // (points // 2)) if size else 1
        self._x: np.ndarray | None = None  # the points of a run not yet complete
        self._y: np.ndarray | None = None
        self._drawn: list[tuple[np.ndarray, np.ndarray]] = []

    def add(self, x: np.ndarray, y: np.ndarray) -> None:
        x, y = np.asarray(x), np.asarray(y)
        self._x = x if self._x is None else np.concatenate([self._x, x])
        self._y = y if self._y is None else np.concatenate([self._y, y])
        if not self._whole:
            self._pick(len(self._y) // self._width)

    def _pick(self, runs: int) -> None:
        """Keep the lowest and highest point of the first ``runs`` runs held."""
        if runs == 0:
            return
        width = min(self._width, len(self._y))
        blocks = self._y[:runs * width].reshape(runs, width)
        low, high = np.argmin(blocks, axis=1), np.argmax(blocks, axis=1)
        starts = np.arange(runs) * width
        picks = np.stack([starts + np.minimum(low, high),
                          starts + np.maximum(low, high)], axis=1).ravel()
        self._drawn.append((self._x[picks], self._y[picks]))
        self._x, self._y = self._x[runs * width:], self._y[runs * width:]

    def finish(self) -> tuple[np.ndarray, np.ndarray]:
        """The points to draw, x and y."""
        if self._y is None:
            return np.zeros(0), np.zeros(0)
        if self._whole:
            return self._x, self._y
        if len(self._y):
            self._pick(1)  # the last run, shorter
        return (np.concatenate([x for x, _ in self._drawn]),
                np.concatenate([y for _, y in self._drawn]))


class RollingMean:
    """The mean of a line of ``size`` values over a window of ``window`` points centred
    on each (narrower at the ends, so the smoothed curve does not lag the raw one), given
    in pieces: ``add`` returns the means (with their x) it can tell so far."""

    def __init__(self, size: int, window: int = BUBBLE_WINDOW):
        self._size, self._half = size, window // 2
        self._sums = np.zeros(1)  # cumulative sums from position self._base
        self._base = 0
        self._xs = np.zeros(0)  # x of the positions not yet told, from self._next
        self._next = 0

    def add(self, x: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        sums = np.cumsum(np.concatenate([self._sums[-1:], values]))[1:]
        self._sums = np.concatenate([self._sums, sums])
        self._xs = np.concatenate([self._xs, x]) if len(self._xs) else np.asarray(x)
        known = self._base + len(self._sums) - 1  # values seen
        return self._tell(self._size if known == self._size else known - self._half)

    def _tell(self, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """The means of positions ``self._next`` to ``stop``."""
        index = np.arange(self._next, max(stop, self._next))
        lo = np.maximum(index - self._half, 0)
        hi = np.minimum(index + self._half + 1, self._size)
        means = (self._sums[hi - self._base] - self._sums[lo - self._base]) / (hi - lo)
        told, self._xs = self._xs[:len(index)], self._xs[len(index):]
        self._next += len(index)
        drop = max(self._next - self._half, 0) - self._base
        self._sums, self._base = self._sums[drop:], self._base + drop
        return told, means


class Spans:
    """Runs of consecutive steps flagged (a plan applied), as (first iter, last iter),
    given in pieces."""

    def __init__(self):
        self.spans: list[tuple[int, int]] = []
        self._open: tuple[int, int] | None = None

    def add(self, iters: np.ndarray, flagged: np.ndarray) -> None:
        its = np.asarray(iters)[np.asarray(flagged, dtype=bool)]
        if not its.size:
            return
        breaks = np.flatnonzero(np.diff(its) != 1)
        starts = np.concatenate([its[:1], its[breaks + 1]]).tolist()
        stops = np.concatenate([its[breaks], its[-1:]]).tolist()
        if self._open is not None:
            if starts[0] == self._open[1] + 1:
                starts[0] = self._open[0]
            else:
                self.spans.append(self._open)
        self.spans += list(zip(starts[:-1], stops[:-1], strict=True))
        self._open = (starts[-1], stops[-1])

    def finish(self) -> list[tuple[int, int]]:
        if self._open is not None:
            self.spans.append(self._open)
            self._open = None
        return self.spans
