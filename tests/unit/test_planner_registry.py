"""The planner registry (dyntra_lb.planner.registry) and its opt-in planner, fill-protect.

``reference`` must be today's planner object itself (the oracle property tests in
test_planner_properties.py cover it). ``fill-protect`` must equal the literal oracle
with its one change (tests/literal_planner.py, ``protect_fill=True``), equal the
reference whenever no fill happens, and differ from it exactly where the reference's
drop takes back what the fill admitted (quirk Q5, planner example 6)."""

import importlib.util
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from dyntra_lb.planner import front, registry
from tests.unit.test_planner_properties import full_snapshots, snapshots

_spec = importlib.util.spec_from_file_location(
    "literal_planner", Path(__file__).resolve().parents[1] / "literal_planner.py")
literal_planner = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(literal_planner)

fill_protect = registry.get("fill-protect")

# A paused 800-block request heads rank 0's waiting list; its slot is free. The
# reference's fill admits it, its drop takes it out again and cancellation leaves
# nothing: rank 0 admits nothing (and would again on the next step).
STARVED = [([10, 800], 1), ([20, 20], 2)]


def _dicts(plans):
    return [p.to_dict() for p in plans]


def test_reference_is_todays_planner():
    assert registry.get("reference") is front.balance_load
    assert registry.NAMES[0] == registry.REFERENCE == "reference"


@pytest.mark.parametrize("name", [None, "", "kit", "Reference", "vllm-ascend"])
def test_an_unknown_name_is_refused_with_the_choices(name):
    with pytest.raises(ValueError, match=r"unknown planner .*\['reference', 'fill-protect'\]"):
        registry.get(name)


def test_the_reference_starves_the_paused_request():
    plans = _dicts(front.balance_load(STARVED, 2, max_num_seqs=2, threshold=5.0))
    assert plans[0] == {"out_blk": [], "in_blk": [], "freeze": True}


def test_fill_protect_admits_it():
    plans = _dicts(fill_protect(STARVED, 2, max_num_seqs=2, threshold=5.0))
    assert plans[0] == {"out_blk": [], "in_blk": [800], "freeze": False}
    assert plans[1] == {"out_blk": [], "in_blk": [], "freeze": True}


def test_fill_protect_still_drops_a_request_that_ran():
    # Spec Ex.3: nothing is filled, so the drop of the running 4000 happens as before.
    snapshot = [([4000, 1000], 2), ([1000], 1)]
    plans = _dicts(fill_protect(snapshot, 2, threshold=1.0))
    assert plans == _dicts(front.balance_load(snapshot, 2, threshold=1.0))
    assert plans[0]["out_blk"] == [4000]


def test_spec_ex6_keeps_the_filled_request_and_drops_one_that_ran():
    # Ex.6: the reference drops the newly filled 4000 (tie rule), then the other one,
    # and cancellation leaves "pause the running 4000, admit nothing": rank 0 idles.
    # fill-protect may only drop the 4000 that ran; the filled one would take its
    # place, which cancellation turns into no change: the running 4000 keeps running.
    snapshot = [([4000, 4000], 1), ([100, 100], 2)]
    assert _dicts(front.balance_load(snapshot, 2, max_num_seqs=2, threshold=1))[0] == {
        "out_blk": [4000], "in_blk": [], "freeze": True}
    events = []
    plans = _dicts(fill_protect(snapshot, 2, max_num_seqs=2, threshold=1,
                                observer=events.append))
    drops = [e for e in events if e["kind"] == "drop"]
    assert [(d["blk"], d["newly_added"]) for d in drops] == [(4000, False)]
    assert plans[0] == {"out_blk": [], "in_blk": [], "freeze": True}


@settings(max_examples=1000, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(snapshots)
def test_fill_protect_equals_its_literal_oracle(case):
    requests_by_rank, dp, max_num_seqs, threshold, max_iters = case
    oracle = literal_planner.literal_balance_load(
        requests_by_rank, dp, max_num_seqs=max_num_seqs, max_iters=max_iters,
        threshold=threshold, protect_fill=True)
    plans = fill_protect(requests_by_rank, dp, max_num_seqs=max_num_seqs,
                         threshold=threshold, max_iters=max_iters)
    assert _dicts(plans) == oracle
    if max_num_seqs is None:
        # No fill, no newly added item: nothing to protect, the reference's plans.
        assert plans == front.balance_load(requests_by_rank, dp, threshold=threshold,
                                           max_iters=max_iters)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(full_snapshots())
def test_fill_protect_equals_its_literal_oracle_on_payload_shaped_snapshots(case):
    rows, dp, max_num_seqs, threshold = case
    oracle = literal_planner.literal_balance_load(rows, dp, max_num_seqs=max_num_seqs,
                                                  threshold=threshold, protect_fill=True)
    assert _dicts(fill_protect(rows, dp, max_num_seqs=max_num_seqs,
                               threshold=threshold)) == oracle
