"""The distribution of a column too long to hold at once (a run's wall-clock times: one
per rank and step, nearly all distinct, so no tally shrinks them), read chunk after
chunk over several passes: the count and maximum, the sum as ``np.add.reduce`` adds one
array (emu.records.tally.pairwise_sum), and the values at the percentiles' positions by
an exact selection. A value's float64 bits, made to sort as the floats do, are its key;
a histogram of the keys' leading 16 bits tells which bucket holds a wanted position,
and the next pass keeps that bucket's values (or, while it has more than ``KEEP``, a
histogram of its next 16 bits). ``distribution`` is then what emu.metrics.distribution
gives of all the values in one array, float for float; at most ``KEEP`` values of a
bucket and a 65,536-bin histogram are held at a time."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence

import numpy as np

from emu.records.tally import PERCENTILES, interpolate, pairwise_sum, percentile_positions

# The most values of one bucket a pass keeps (8 MB); a larger bucket is split by its
# next bits.
KEEP = 1 << 20
_BITS = 16
_SIGN = np.uint64(1 << 63)


def distribution(chunks: Callable[[], Iterable[np.ndarray]], n: int, top: float) -> dict:
    """``count``, ``mean``, ``p50``, ``p90``, ``p99`` and ``max`` of the ``n`` float64
    values (no NaN) ``chunks()`` yields, in order, whose maximum is ``top`` (the caller
    counted them in a pass of its own); ``chunks`` is called once per pass: once, and
    once more for each bucket still larger than ``KEEP``."""
    if n == 0:
        return {"count": 0, "mean": None, "p50": None, "p90": None, "p99": None, "max": None}
    previous, following, gamma = percentile_positions(n, PERCENTILES)
    search = _Search(n, [*previous.tolist(), *following.tolist()])
    # the first pass adds the values up and takes the search's first step
    mean = float(np.float64(pairwise_sum(search.watch(chunks()), n)) / n)
    while search.step():
        for _ in search.watch(chunks()):
            pass
    at = search.found
    p50, p90, p99 = interpolate(np.array([at[i] for i in previous.tolist()]),
                                np.array([at[i] for i in following.tolist()]), gamma)
    return {"count": n, "mean": mean, "p50": float(p50), "p90": float(p90),
            "p99": float(p99), "max": top}


class _Search:
    """The values at some positions, sought pass after pass: ``watch`` a pass's chunks
    (they go through unchanged), then ``step`` (False once every position is found)."""

    def __init__(self, n: int, positions: Sequence[int]):
        # each position still sought: (its bucket's key prefix, the prefix's bits, the
        # bucket's size, the position within the bucket)
        self.sought = {p: (0, 0, n, p) for p in set(positions)}
        self.found: dict[int, float] = {}
        self._plan()

    def _plan(self) -> None:
        """What the next pass keeps of each bucket sought: its values, or its histogram."""
        self._kept: dict[tuple[int, int], list[np.ndarray]] = {}
        self._counts: dict[tuple[int, int], np.ndarray] = {}
        for p, (prefix, bits, size, _) in list(self.sought.items()):
            if bits == 64:  # one key: one value
                self.found[p] = float(_value(np.uint64(prefix)))
                del self.sought[p]
            elif size <= KEEP:
                self._kept[(prefix, bits)] = []
            else:
                self._counts[(prefix, bits)] = np.zeros(1 << _BITS, np.int64)

    def watch(self, chunks: Iterable[np.ndarray]) -> Iterator[np.ndarray]:
        for chunk in chunks:
            if self.sought:
                keys = _keys(chunk)
                for (prefix, bits), held in self._kept.items():
                    held.append(chunk[_inside(keys, prefix, bits)])
                for (prefix, bits), histogram in self._counts.items():
                    inside = keys[_inside(keys, prefix, bits)]
                    histogram += np.bincount(_digit(inside, bits), minlength=1 << _BITS)
            yield chunk

    def step(self) -> bool:
        """Narrow each position sought by what the last pass kept; whether a pass is
        still needed."""
        for p, (prefix, bits, _, within) in list(self.sought.items()):
            if (prefix, bits) in self._kept:
                values = np.sort(np.concatenate([np.zeros(0), *self._kept[(prefix, bits)]]))
                self.found[p] = float(values[within])
                del self.sought[p]
            else:
                ends = np.cumsum(self._counts[(prefix, bits)])
                digit = int(np.searchsorted(ends, within, side="right"))
                before = int(ends[digit - 1]) if digit else 0
                self.sought[p] = ((prefix << _BITS) | digit, bits + _BITS,
                                  int(ends[digit]) - before, within - before)
        self._plan()
        return bool(self.sought)


def _keys(values: np.ndarray) -> np.ndarray:
    """float64 values as unsigned keys in the same order (negative floats' bits
    inverted, positive floats' sign bit set)."""
    bits = np.ascontiguousarray(values, dtype=np.float64).view(np.uint64)
    return np.where(bits & _SIGN, ~bits, bits | _SIGN)


def _value(key: np.uint64) -> np.float64:
    bits = key & ~_SIGN if key & _SIGN else ~key
    return np.array([bits], np.uint64).view(np.float64)[0]


def _inside(keys: np.ndarray, prefix: int, bits: int) -> np.ndarray:
    """Which keys start with the ``bits`` leading bits ``prefix``."""
    if bits == 0:
        return np.ones(len(keys), bool)
    return (keys >> np.uint64(64 - bits)) == np.uint64(prefix)


def _digit(keys: np.ndarray, bits: int) -> np.ndarray:
    """The 16 bits that follow the leading ``bits`` of each key."""
    return ((keys >> np.uint64(64 - bits - _BITS)) & np.uint64((1 << _BITS) - 1)).astype(np.intp)
