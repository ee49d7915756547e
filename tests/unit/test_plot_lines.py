"""A per-step line of hours of steps is drawn as its envelope (emu.lines): a bounded
number of points that keeps every run of steps' lowest and highest value; the lines are
made while the steps stream by a window at a time, and give what the whole line in one
array gives."""

import numpy as np
import pytest

from emu.lines import MAX_LINE_POINTS, Envelope, RollingMean, Spans


def envelope(x, y) -> tuple[np.ndarray, np.ndarray]:
    """The points drawn of a whole line, given to ``Envelope`` at once."""
    line = Envelope(len(y))
    line.add(x, y)
    return line.finish()


def test_a_short_line_is_drawn_whole():
    x, y = np.arange(50), np.arange(50.0) ** 2
    drawn_x, drawn_y = envelope(x, y)
    assert drawn_x.tolist() == x.tolist() and drawn_y.tolist() == y.tolist()


def test_a_long_line_keeps_each_runs_lowest_and_highest_step():
    rng = np.random.default_rng(5)
    n = 25 * MAX_LINE_POINTS + 17
    x, y = np.arange(n) * 0.5, rng.integers(0, 3_000, n)
    y[12_345], y[54_321] = 9_999, -7  # one spike each way

    drawn_x, drawn_y = envelope(x, y)

    assert len(drawn_y) <= MAX_LINE_POINTS
    assert np.all(np.diff(drawn_x) >= 0)  # in step order
    # every point drawn is a real step, at its own x
    assert np.array_equal(y[(drawn_x / 0.5).astype(int)], drawn_y)
    # each run of consecutive steps shows its lowest and highest value
    width = -(-n // (MAX_LINE_POINTS // 2))
    for start in range(0, n, width):
        inside = (drawn_x >= x[start]) & (drawn_x <= x[min(start + width, n) - 1])
        assert drawn_y[inside].max() == y[start:start + width].max()
        assert drawn_y[inside].min() == y[start:start + width].min()


def _rolling_mean(values, window=32):
    """The smoothed line of the whole line in one array (the centred means from its
    cumulative sums, as the plots took them before the lines streamed)."""
    sums = np.cumsum(np.insert(values, 0, 0.0))
    index = np.arange(len(values))
    lo = np.maximum(index - window // 2, 0)
    hi = np.minimum(index + window // 2 + 1, len(values))
    return (sums[hi] - sums[lo]) / (hi - lo)


# One point at a time only on the short lines (they tell; the long one would take long).
@pytest.mark.parametrize("n, piece", [
    (n, piece) for n in (3, 4_000, 4_001, 9 * MAX_LINE_POINTS + 5) for piece in (1, 37, 4_096)
    if piece > 1 or n <= 5_000])
def test_lines_made_piece_by_piece_are_those_of_the_whole_line(n, piece):
    rng = np.random.default_rng(n + piece)
    x, y = np.arange(n) * 0.25, rng.integers(0, 500, n) * 0.37
    flagged = rng.random(n) < 0.2
    line, smooth, spans = Envelope(n), RollingMean(n), Spans()
    told_x, told = [], []
    for start in range(0, n, piece):
        line.add(x[start:start + piece], y[start:start + piece])
        got_x, got = smooth.add(x[start:start + piece], y[start:start + piece] * 1.0)
        told_x.append(got_x)
        told.append(got)
        spans.add(np.arange(start, min(start + piece, n)) + 7, flagged[start:start + piece])

    whole_x, whole_y = envelope(x, y)
    drawn_x, drawn_y = line.finish()
    assert np.array_equal(drawn_x, whole_x) and np.array_equal(drawn_y, whole_y)
    assert np.array_equal(np.concatenate(told_x), x)
    assert np.array_equal(np.concatenate(told), _rolling_mean(y * 1.0))
    its = np.flatnonzero(flagged) + 7
    runs = np.split(its, np.flatnonzero(np.diff(its) != 1) + 1) if its.size else []
    assert spans.finish() == [(int(r[0]), int(r[-1])) for r in runs]
