"""The distribution of a column read over several passes (emu.records.selection): the
same floats as emu.metrics.distribution of the whole column in one array, whatever the
chunks, when buckets must be split again and again, with ties, negative values and a
single value."""

import numpy as np
import pytest

from emu.metrics import distribution as whole
from emu.records import selection

RNG = np.random.default_rng(51)
COLUMNS = {
    "wall-like": RNG.lognormal(0.5, 0.8, 20_001),
    "ties": np.repeat([1.5, 2.5, -3.0, 0.0, 1e-300], 611),
    "few values": RNG.integers(0, 3, 9_000) * 0.1,
    "signed": RNG.normal(0.0, 1.0, 4_999),
    "one": np.array([4.2]),
}


@pytest.mark.parametrize("keep", [1 << 20, 64, 3])
@pytest.mark.parametrize("name", COLUMNS)
def test_a_distribution_read_in_passes_is_that_of_the_whole_column(name, keep, monkeypatch):
    monkeypatch.setattr(selection, "KEEP", keep)
    values = COLUMNS[name]
    passes = []

    def chunks():
        passes.append(1)
        return (values[i:i + 997] for i in range(0, len(values), 997))

    got = selection.distribution(chunks, len(values), float(values.max()))

    assert got == whole(values)
    if keep < len(values) and name != "one":
        assert len(passes) > 1  # a bucket too large was split by its next bits


def test_no_values():
    assert selection.distribution(lambda: iter(()), 0, -np.inf) == whole([])
