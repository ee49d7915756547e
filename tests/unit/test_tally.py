"""emu.records.tally against numpy itself: the tally's distribution and sum must be
numpy's over the values, float for float, however the values come in chunks."""

import numpy as np
import pytest

from emu.metrics import distribution
from emu.records import tally as tally_module
from emu.records.tally import pairwise_sum, tally

SIZES = [0, 1, 2, 7, 8, 9, 16, 17, 127, 128, 129, 130, 255, 257, 1000, 8193, 65_537,
         300_007]


def _values(rng, n, kind):
    if kind == "continuous":
        return rng.exponential(30.0, n)
    # few distinct values, as inter-token latencies between lockstep steps are
    return rng.integers(1, 40, n) * 12.5 + rng.integers(0, 3, n) * 0.1


def _chunks(rng, values):
    cuts = np.sort(rng.integers(0, values.size + 1, 6)) if values.size else []
    return np.split(values, cuts)  # some chunks empty


@pytest.mark.parametrize("kind", ["continuous", "repeated"])
@pytest.mark.parametrize("n", SIZES)
def test_tally_gives_numpys_distribution_and_sum(n, kind):
    rng = np.random.default_rng(n)
    values = _values(rng, n, kind)
    chunks = _chunks(rng, values)

    assert pairwise_sum(iter(chunks), n) == (values.sum() if n else 0.0)
    assert tally(lambda: iter(chunks)).distribution() == distribution(values)


def test_merging_chunks_keeps_the_counts(monkeypatch):
    """Chunks merged into the tally every few values (not only at the end)."""
    monkeypatch.setattr(tally_module.TallyBuilder, "MERGE_VALUES", 5)
    rng = np.random.default_rng(7)
    values = _values(rng, 5_000, "repeated")
    chunks = np.array_split(values, 97)

    result = tally(lambda: iter(chunks))

    assert np.repeat(result.values, result.counts).tolist() == np.sort(values).tolist()
    assert result.distribution() == distribution(values)


def test_a_median_between_two_values_interpolates_from_the_upper_one():
    """At a weight of exactly 0.5 numpy interpolates down from the upper neighbour; from
    the lower one these two values give a median one unit in the last place higher."""
    low, high = 0.02738500170148095, 8.158535541215322
    assert low + (high - low) * 0.5 != high - (high - low) * 0.5
    values = np.array([high, low, low, high, 9.0, 0.01])

    assert tally(lambda: [values]).distribution() == distribution(values)
