"""A per-step line of hours of steps is drawn as its envelope (emu.plots._envelope):
a bounded number of points that keeps every run of steps' lowest and highest value."""

import numpy as np

from emu.plots import MAX_LINE_POINTS, _envelope


def test_a_short_line_is_drawn_whole():
    x, y = np.arange(50), np.arange(50.0) ** 2
    drawn_x, drawn_y = _envelope(x, y)
    assert drawn_x.tolist() == x.tolist() and drawn_y.tolist() == y.tolist()


def test_a_long_line_keeps_each_runs_lowest_and_highest_step():
    rng = np.random.default_rng(5)
    n = 25 * MAX_LINE_POINTS + 17
    x, y = np.arange(n) * 0.5, rng.integers(0, 3_000, n)
    y[12_345], y[54_321] = 9_999, -7  # one spike each way

    drawn_x, drawn_y = _envelope(x, y)

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
