"""Both planners (the Python one and, with numba, the compiled one) equal the literal
oracle of docs/planner.md (tests/literal_planner.py) on generated snapshots: dp 1-16, ranks
missing from the input, zeros in the payload, split values outside the list, duplicate
and long-tail sizes, sizes beyond the Python planner's bitset range, max_num_seqs None
or 1-256, thresholds below and above 1 (and NaN / inf), lowered max_iters. Sizes are
bounded so the O(rounds * running * waiting) oracle stays fast."""

import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from dyntra_lb.planner import front as planner
from dyntra_lb.planner.front import balance_load

_spec = importlib.util.spec_from_file_location(
    "literal_planner", Path(__file__).resolve().parents[1] / "literal_planner.py")
literal_planner = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(literal_planner)



def _compiled(requests_by_rank, dp, **kw):
    plans = planner.balance_load_native(requests_by_rank, dp, **kw)
    # Every generated input is payload-typed, so the compiled planner must take it.
    assert plans is not None
    return plans


# The implementations every property compares with the oracle (and so with each other).
IMPLEMENTATIONS = [planner.balance_load_python]
if planner.IMPLEMENTATION == "numba":
    IMPLEMENTATIONS.append(_compiled)


def _all_plans(requests_by_rank, dp, **kw):
    """The plans of every implementation, as dicts."""
    return [[p.to_dict() for p in impl(requests_by_rank, dp, **kw)] for impl in IMPLEMENTATIONS]


# Size profiles: each example draws its sizes from one of these, so duplicates, dense
# small sizes (ties, oscillation), long tails and sparse large sizes all occur.
_SIZES = {
    "tiny": st.integers(1, 6),
    "small": st.integers(1, 40),
    "lognormal": st.floats(0.0, 6.5).map(lambda x: max(1, round(math.exp(x)))),
    "skewed": st.one_of(st.integers(1, 60), st.integers(700, 2500)),
    "long_tail": st.one_of(st.integers(1, 50), st.integers(51, 5000),
                           st.integers(5001, 2**31 - 1)),
    "sparse": st.integers(1, 40).map(lambda k: 1000 * k + k % 7),
    "huge": st.integers(60000, 2**31 - 1),
}

_THRESHOLDS = st.one_of(
    st.sampled_from([1e-9, 0.01, 0.1, 0.5, 0.999, 1, 1.0, 2, 5, 5.0, 37.5, 1e6,
                     math.nan, math.inf]),
    st.floats(0.001, 0.999),
    st.floats(1.0, 300.0),
    st.integers(1, 200),
)


@st.composite
def tie_snapshots(draw):
    """Few ranks, a handful of tiny sizes, small max_num_seqs: exact distance ties,
    zero-gain swaps of newly added items (quirk Q4), oscillation to max_iters, one rank."""
    dp = draw(st.sampled_from([1, 2, 2, 2, 3]))
    rows = []
    for _ in range(draw(st.integers(1, dp))):
        blks = draw(st.lists(st.integers(1, 6), min_size=1, max_size=7))
        rows.append((blks, draw(st.integers(0, len(blks)))))
    return (rows, dp, draw(st.integers(1, 3)),
            draw(st.sampled_from([0.5, 1, 1.0, 2, math.nan])),
            draw(st.sampled_from([1000, 1000, 7, 8])))


@st.composite
def any_snapshots(draw):
    dp = draw(st.integers(1, 16))
    profile = draw(st.sampled_from(sorted(_SIZES)))
    size = _SIZES[profile]
    # Most cases are small; a few are large with fewer rounds so the oracle stays fast.
    big = draw(st.integers(0, 9)) == 0
    max_len = 64 if big else 16
    size_or_zero = st.one_of(size, st.just(0)) if draw(st.booleans()) else size
    requests_by_rank = []
    for _ in range(draw(st.integers(0, dp))):
        blks = draw(st.lists(size_or_zero, max_size=max_len))
        split = draw(st.one_of(st.integers(0, len(blks)), st.integers(-2, len(blks) + 3)))
        if draw(st.integers(0, 4)) == 0:
            blks = np.array(blks, dtype=np.int64 if profile in ("long_tail", "huge")
                            else np.int32)
        requests_by_rank.append((blks, split))
    max_num_seqs = draw(st.one_of(st.none(), st.integers(1, 8), st.integers(1, 256)))
    threshold = draw(_THRESHOLDS)
    max_iters = draw(st.sampled_from([30, 100]) if big else
                     st.one_of(st.just(1000), st.integers(0, 12)))
    return requests_by_rank, dp, max_num_seqs, threshold, max_iters


snapshots = st.one_of(any_snapshots(), any_snapshots(), any_snapshots(), tie_snapshots())


@settings(max_examples=2000, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(snapshots)
# docs/planner.md, worked examples 7 (zero-gain swap, newly added) and 7b (no fill: rejected).
@example(([([10], 1), ([2, 18], 0)], 2, 1, 1, 1000))
@example(([([10], 1), ([2, 18], 1)], 2, None, 1, 1000))
def test_planner_equals_literal_oracle(case):
    requests_by_rank, dp, max_num_seqs, threshold, max_iters = case
    oracle = literal_planner.literal_balance_load(
        requests_by_rank, dp, max_num_seqs=max_num_seqs, max_iters=max_iters,
        threshold=threshold)
    for plans in _all_plans(requests_by_rank, dp, max_num_seqs=max_num_seqs,
                            threshold=threshold, max_iters=max_iters):
        assert plans == oracle


@st.composite
def full_snapshots(draw):
    """Payload-shaped snapshots like the benchmark's: running and waiting full, a quarter
    of the ranks holding long requests (or none, for the uniform case)."""
    dp = draw(st.integers(2, 8))
    max_num_seqs = draw(st.integers(1, 32))
    skewed = draw(st.booleans())
    heavy = set(draw(st.lists(st.integers(0, dp - 1), max_size=max(1, dp // 4))))
    rows = []
    for rank in range(dp):
        long_size = st.integers(700, 2500) if skewed and rank in heavy else st.nothing()
        sizes = st.one_of(st.floats(0.0, 5.0).map(lambda x: max(1, round(math.exp(x)))),
                          long_size)
        running = draw(st.integers(0, max_num_seqs))
        waiting = draw(st.integers(0, max_num_seqs))
        blks = draw(st.lists(sizes, min_size=running + waiting, max_size=running + waiting))
        rows.append((blks + [0] * (2 * max_num_seqs - len(blks)), running))
    threshold = draw(st.sampled_from([0.05, 1, 5.0, 20]))
    return rows, dp, max_num_seqs, threshold


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(full_snapshots())
def test_planner_equals_literal_oracle_on_payload_shaped_snapshots(case):
    rows, dp, max_num_seqs, threshold = case
    oracle = literal_planner.literal_balance_load(rows, dp, max_num_seqs=max_num_seqs,
                                                  threshold=threshold)
    for plans in _all_plans(rows, dp, max_num_seqs=max_num_seqs, threshold=threshold):
        assert plans == oracle
    # As the coordinator passes them: int32 rows (views of the gathered buffers).
    gathered = [(np.array(blks, np.int32), split) for blks, split in rows]
    for plans in _all_plans(gathered, dp, max_num_seqs=max_num_seqs, threshold=threshold):
        assert plans == oracle


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snapshots)
def test_observer_sees_the_result_and_changes_nothing(case):
    # With numba the call with an observer runs the Python planner and the plain one
    # the compiled planner: their plans must agree.
    requests_by_rank, dp, max_num_seqs, threshold, max_iters = case
    events = []
    watched = balance_load(requests_by_rank, dp, max_num_seqs=max_num_seqs,
                           threshold=threshold, max_iters=max_iters, observer=events.append)
    plain = balance_load(requests_by_rank, dp, max_num_seqs=max_num_seqs,
                         threshold=threshold, max_iters=max_iters)
    assert watched == plain
    assert events[0]["kind"] == "parsed" and events[-1]["kind"] == "plans"
    assert events[-1]["plans"] == [p.to_dict() for p in plain]
    assert sum(e["kind"] == "stop" for e in events) == 1
    # Every out/in before cancellation is one fill, swap or drop event.
    outs = [0] * dp
    for e in events:
        if e["kind"] in ("swap", "drop"):
            outs[e["rank"]] += 1
    cancelled = {e["rank"]: len(e["cancelled"]) for e in events if e["kind"] == "cancel"}
    assert [len(p.out_blk) + cancelled.get(r, 0) for r, p in enumerate(plain)] == outs


@pytest.mark.parametrize("seed", range(4))
def test_planner_equals_literal_oracle_on_long_skewed_runs(seed):
    """The benchmark's skewed shape at reduced size: a hundred-odd rounds of swaps on
    bitset-indexed cards, with full running and waiting lists."""
    rng = np.random.default_rng(seed)
    dp, max_num_seqs = 8, 40
    heavy = set(rng.choice(dp, size=2, replace=False).tolist())
    rows = []
    for rank in range(dp):
        blks = np.maximum(1, np.rint(rng.lognormal(np.log(30), 0.8, 2 * max_num_seqs)))
        if rank in heavy:
            long = rng.random(blks.size) < 0.5
            blks[long] = rng.integers(700, 2501, size=int(long.sum()))
        rows.append((blks.astype(np.int64).tolist(), max_num_seqs))
    oracle = literal_planner.literal_balance_load(rows, dp, max_num_seqs=max_num_seqs)
    for plans in _all_plans(rows, dp, max_num_seqs=max_num_seqs):
        assert plans == oracle
