"""Many values held as a tally (each distinct value and how often it came) with their
sum, instead of one float per value: a run of hours emits tens of millions of
inter-token latencies but a few hundred thousand distinct ones, since every gap lies
between two lockstep steps. ``Tally.distribution`` gives what ``np.percentile``,
``np.mean`` and ``np.max`` of the values themselves give, float for float, so
metrics.json does not change.

Built from the values chunk after chunk (``tally``): the chunks are walked twice, once
to count and tally them and once to add them as ``np.add.reduce`` adds one contiguous
array (pairwise: blocks of up to 128 values, 8 running sums in each, halves split at a
multiple of 8), which needs the count first.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import numpy as np

# numpy's pairwise summation: the largest block added without splitting, and its lanes.
_BLOCK = 128
_LANES = 8
# The percentiles metrics.json reports (see emu.metrics.distribution).
PERCENTILES = (50, 90, 99)


@dataclass(frozen=True)
class Tally:
    """Distinct values (ascending), how often each came, and the sum of all of them."""

    values: np.ndarray
    counts: np.ndarray
    total: float

    @property
    def count(self) -> int:
        return int(self.counts.sum())

    def distribution(self) -> dict:
        """``count``, ``mean``, ``p50``, ``p90``, ``p99`` and ``max``, as
        emu.metrics.distribution computes them from the values."""
        n = self.count
        if n == 0:
            return {"count": 0, "mean": None, "p50": None, "p90": None, "p99": None,
                    "max": None}
        p50, p90, p99 = self.percentiles(PERCENTILES)
        return {"count": n, "mean": float(np.float64(self.total) / n), "p50": float(p50),
                "p90": float(p90), "p99": float(p99), "max": float(self.values[-1])}

    def percentiles(self, q) -> np.ndarray:
        """``np.percentile(values, q)`` (linear interpolation) from the counts: the same
        virtual indexes, neighbours and interpolation as numpy's."""
        previous, following, gamma = percentile_positions(self.count, q)
        ends = np.cumsum(self.counts)
        return interpolate(self.values[np.searchsorted(ends, previous, side="right")],
                           self.values[np.searchsorted(ends, following, side="right")],
                           gamma)


def percentile_positions(n: int, q) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Where ``np.percentile`` of ``n`` sorted values (linear interpolation) reads each
    percentile of ``q``: the positions of the two neighbours, and the weight of the
    second (numpy's virtual indexes; at the end both neighbours are the last value)."""
    quantiles = np.true_divide(np.asanyarray(q), 100)
    virtual = (n - 1) * quantiles
    previous = np.floor(virtual)
    following = previous + 1
    above = virtual >= n - 1
    previous[above] = following[above] = n - 1
    gamma = virtual - np.where(above, -1, previous)
    return previous.astype(np.intp), following.astype(np.intp), gamma


def interpolate(a: np.ndarray, b: np.ndarray, gamma: np.ndarray) -> np.ndarray:
    """numpy's linear interpolation between neighbours ``a`` and ``b`` (its ``_lerp``)."""
    diff = b - a
    out = np.add(a, diff * gamma)
    np.subtract(b, diff * (1 - gamma), out=out, where=gamma >= 0.5)
    return out


class TallyBuilder:
    """Values added chunk after chunk, in order; ``finish`` adds them up a second time,
    given the same chunks again."""

    # Values of chunks held (as their distinct values) before they join the tally: a
    # merge sorts them with the tally's, so this bounds its temporaries (a few MiB).
    MERGE_VALUES = 1 << 17

    def __init__(self):
        self._values, self._counts = np.zeros(0), np.zeros(0, np.int64)
        self._pending: list[tuple[np.ndarray, np.ndarray]] = []
        self._pending_size = 0
        self.n = 0

    def add(self, chunk: np.ndarray) -> None:
        distinct, seen = np.unique(chunk, return_counts=True)
        self._pending.append((distinct, seen))
        self._pending_size += len(distinct)
        self.n += len(chunk)
        if self._pending_size >= self.MERGE_VALUES:
            self._merge()

    def _merge(self) -> None:
        values = np.concatenate([self._values, *(v for v, _ in self._pending)])
        counts = np.concatenate([self._counts, *(c for _, c in self._pending)])
        self._values, where = np.unique(values, return_inverse=True)
        self._counts = np.bincount(where, counts, minlength=len(self._values)).astype(np.int64)
        self._pending, self._pending_size = [], 0

    def finish(self, chunks: Iterable[np.ndarray]) -> Tally:
        """The tally, ``chunks`` being the values added, in the same order, again."""
        self._merge()
        return Tally(self._values, self._counts,
                     pairwise_sum(chunks, self.n) if self.n else 0.0)


def tally(chunks: Callable[[], Iterable[np.ndarray]]) -> Tally:
    """The tally of the float64 values ``chunks()`` yields, in order (called twice)."""
    builder = TallyBuilder()
    for chunk in chunks():
        builder.add(chunk)
    return builder.finish(chunks())


def pairwise_sum(chunks: Iterable[np.ndarray], n: int) -> float:
    """``np.add.reduce`` of the ``n`` values ``chunks`` yields, as if they were one
    contiguous float64 array."""
    return _pairwise(_Stream(iter(chunks)), n)


def _pairwise(stream: _Stream, n: int) -> float:
    if n <= _BLOCK:
        return _block_sum(stream.take(n))
    half = n // 2
    half -= half % _LANES
    return _pairwise(stream, half) + _pairwise(stream, n - half)


def _block_sum(block: np.ndarray) -> float:
    n = len(block)
    if n < _LANES:
        return sum(block.tolist(), -0.0)
    whole = n - n % _LANES
    r = np.add.reduce(block[:whole].reshape(-1, _LANES), axis=0).tolist()
    total = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]))
    return sum(block[whole:].tolist(), total)


class _Stream:
    """The values of a chunk iterator, taken ``n`` at a time as one array."""

    def __init__(self, chunks: Iterator[np.ndarray]):
        self._chunks = chunks
        self._buffer = np.zeros(0)

    def take(self, n: int) -> np.ndarray:
        while len(self._buffer) < n:
            self._buffer = np.concatenate([self._buffer, next(self._chunks)])
        block, self._buffer = self._buffer[:n], self._buffer[n:]
        return block
