"""docs/planner.md: the planner on its worked examples, the parser edge cases, the public
API and the observer events. Every example is also checked against the literal oracle
(tests/literal_planner.py), so a wrong oracle cannot hide behind a wrong planner."""

import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest

from dyntra_lb.planner.front import Plan, balance_load

# The oracle lives in tests/ (not a package on sys.path under pytest's default import mode).
_spec = importlib.util.spec_from_file_location(
    "literal_planner", Path(__file__).resolve().parents[1] / "literal_planner.py")
literal_planner = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(literal_planner)
literal_balance_load = literal_planner.literal_balance_load

FROZEN = {"out_blk": [], "in_blk": [], "freeze": True}


def _plan(snapshot, dp, **kw):
    """Plans as dicts from the real planner, after checking the oracle agrees."""
    real = [p.to_dict() for p in balance_load(snapshot, dp, **kw)]
    oracle = literal_balance_load(snapshot, dp, max_num_seqs=kw.get("max_num_seqs"),
                                  max_iters=kw.get("max_iters", 1000),
                                  threshold=kw.get("threshold", 5.0))
    assert real == oracle
    return real


def _events(snapshot, dp, **kw):
    events = []
    balance_load(snapshot, dp, observer=events.append, **kw)
    return events


def _kinds(events, kind):
    return [e for e in events if e["kind"] == kind]


# --- Worked examples -----------------------------------------------------------------


def test_ex1_absolute_threshold_one_swap():
    assert _plan([([3], 1), ([1, 2], 1)], 2, threshold=1.0) == [
        FROZEN, {"out_blk": [1], "in_blk": [2], "freeze": False}]


def test_ex2_ratio_threshold_no_action():
    snapshot = [([3], 1), ([1, 2], 1)]
    assert _plan(snapshot, 2, threshold=0.5) == [FROZEN, FROZEN]
    (round0,) = _kinds(_events(snapshot, 2, threshold=0.5), "round")
    assert round0["bubble"] == pytest.approx(1 / 3)


def test_ex3_drop_heuristic_fires():
    snapshot = [([4000, 1000], 2), ([1000], 1)]
    assert _plan(snapshot, 2, threshold=1.0) == [
        {"out_blk": [4000], "in_blk": [], "freeze": True}, FROZEN]
    (drop,) = _kinds(_events(snapshot, 2, threshold=1.0), "drop")
    assert drop["throughput_before"] == 3 / 116000
    assert drop["throughput_after"] == 2 / 39200


def test_ex3_counter_case_no_drop():
    snapshot = [([60, 40], 2), ([60], 1)]
    assert _plan(snapshot, 2, threshold=5) == [FROZEN, FROZEN]
    events = _events(snapshot, 2, threshold=5)
    (no_drop,) = _kinds(events, "no_drop")
    assert no_drop["throughput"] == 3 / 21920
    assert _kinds(events, "stop")[0]["reason"] == "no_progress"


def test_ex4_fill_decrease_swap_of_newly_added_and_cancellation():
    snapshot = [([20, 100, 30], 1), ([40, 40], 2)]
    assert _plan(snapshot, 2, max_num_seqs=2, threshold=5) == [
        {"out_blk": [], "in_blk": [30], "freeze": False}, FROZEN]


def test_ex5_three_ranks_two_swaps_in_one_round():
    snapshot = [([300, 200, 50], 2), ([100, 250, 20], 1), ([150, 50], 2)]
    assert _plan(snapshot, 3, threshold=0.1) == [
        {"out_blk": [300], "in_blk": [50], "freeze": False},
        {"out_blk": [100], "in_blk": [250], "freeze": False},
        FROZEN]
    swaps = _kinds(_events(snapshot, 3, threshold=0.1), "swap")
    assert [(s["round"], s["rank"], s["mode"]) for s in swaps] == [
        (0, 1, "increase"), (0, 0, "decrease")]


def test_ex6_drop_tie_prefers_newly_added_and_leaves_rank_idle():
    snapshot = [([4000, 4000], 1), ([100, 100], 2)]
    assert _plan(snapshot, 2, max_num_seqs=2, threshold=1) == [
        {"out_blk": [4000], "in_blk": [], "freeze": True}, FROZEN]
    drops = _kinds(_events(snapshot, 2, max_num_seqs=2, threshold=1), "drop")
    assert [(d["round"], d["blk"], d["newly_added"], d["tie_rule"]) for d in drops] == [
        (0, 4000, True, True), (1, 4000, False, False)]


def test_ex7_zero_gain_swap_accepted_by_tie_rule():
    snapshot = [([10], 1), ([2, 18], 0)]
    assert _plan(snapshot, 2, max_num_seqs=1, threshold=1) == [
        FROZEN, {"out_blk": [], "in_blk": [18], "freeze": False}]
    (swap,) = _kinds(_events(snapshot, 2, max_num_seqs=1, threshold=1), "swap")
    assert swap["dist_before"] == swap["dist_after"] == 4
    assert swap["tie_rule"] and swap["newly_added"]


def test_ex7_without_fill_the_same_swap_is_rejected():
    assert _plan([([10], 1), ([2, 18], 1)], 2, threshold=1) == [FROZEN, FROZEN]


def test_ex8_oscillation_runs_to_max_iters():
    snapshot = [([8], 0), ([3, 7, 3], 0)]
    assert _plan(snapshot, 2, max_num_seqs=2, threshold=1) == [
        {"out_blk": [], "in_blk": [8], "freeze": False},
        {"out_blk": [], "in_blk": [3, 3], "freeze": False}]
    events = _events(snapshot, 2, max_num_seqs=2, threshold=1)
    swaps = [e for e in _kinds(events, "swap") if e["rank"] == 1]
    assert len(swaps) == 1999  # 1999 outs; 2 fills + 1999 swaps = 2001 ins
    assert [s["out_blk"] for s in swaps[:4]] == [7, 3, 7, 3]
    assert all(s["tie_rule"] for s in swaps)
    assert _kinds(events, "stop") == [
        {"kind": "stop", "reason": "max_iters", "round": 1000, "bubble": 1.0}]


def test_ex8_result_depends_on_max_iters_parity():
    snapshot = [([8], 0), ([3, 7, 3], 0)]
    for max_iters in (0, 1, 2, 3, 10, 11):
        _plan(snapshot, 2, max_num_seqs=2, threshold=1, max_iters=max_iters)


# --- Input and parsing: edge cases -------------------------------------------------


def test_parser_stops_at_first_zero():
    snapshot = [([5, 0, 7], 3), ([1], 1)]
    assert _plan(snapshot, 2, threshold=1) == [FROZEN, FROZEN]
    (parsed,) = _kinds(_events(snapshot, 2, threshold=1), "parsed")
    assert parsed["cards"][0] == {"rank": 0, "running": [5], "waiting": [], "tot_blk": 5}


def test_zero_hides_waiting_entries_after_it():
    # The 0 is inside the waiting part: the later 50 is never seen (quirk Q7).
    snapshot = [([100], 1), ([10, 0, 50], 1)]
    (parsed,) = _kinds(_events(snapshot, 2, threshold=1), "parsed")
    assert parsed["cards"][1]["waiting"] == []
    _plan(snapshot, 2, threshold=1)


def test_missing_ranks_are_empty_cards():
    events = _events([([9, 4], 1)], 3, threshold=1)
    assert _kinds(events, "parsed")[0]["cards"][1:] == [
        {"rank": 1, "running": [], "waiting": [], "tot_blk": 0},
        {"rank": 2, "running": [], "waiting": [], "tot_blk": 0}]
    # R0 9 vs average 3: the decrease swap 9 -> 4 (distance 6 -> 2.67); nothing else.
    assert _plan([([9, 4], 1)], 3, threshold=1) == [
        {"out_blk": [9], "in_blk": [4], "freeze": False}, FROZEN, FROZEN]
    assert _plan([], 2, max_num_seqs=4) == [FROZEN, FROZEN]


def test_split_beyond_length_and_negative():
    # R0 runs both (split 9 > length), R1 only waits (split -1): no swap possible, and
    # pausing 5 or 6 would lower the modelled throughput.
    assert _plan([([5, 6], 9), ([1], -1)], 2, threshold=1) == [FROZEN, FROZEN]
    (parsed,) = _kinds(_events([([5, 6], 9), ([1], -1)], 2, threshold=1), "parsed")
    assert parsed["cards"][1]["waiting"] == [1]


def test_trailing_zero_padding_like_the_payload():
    # max_num_seqs=3 payload: running [7, 2], waiting [9], three zero pads.
    snapshot = [([7, 2, 9, 0, 0, 0], 2), ([1, 0, 0, 0, 0, 0], 1)]
    _plan(snapshot, 2, max_num_seqs=3, threshold=1)


def test_numpy_int32_payload_rows_are_accepted():
    row = np.array([30, 20, 5, 0], dtype=np.int32)
    as_numpy = balance_load([(row, 1), ([10, 40], 1)], 2, threshold=1)
    as_list = balance_load([([30, 20, 5, 0], 1), ([10, 40], 1)], 2, threshold=1)
    assert as_numpy == as_list


# --- thresholds -------------------------------------------------------------------------


def test_infinite_threshold_keeps_only_the_fill():
    snapshot = [([100, 3], 1), ([1, 2], 1)]
    assert _plan(snapshot, 2, max_num_seqs=2, threshold=math.inf) == [
        {"out_blk": [], "in_blk": [3], "freeze": False},
        {"out_blk": [], "in_blk": [2], "freeze": False}]


def test_nan_threshold_runs_until_nothing_changes():
    snapshot = [([4000, 1000], 2), ([1000], 1)]
    _plan(snapshot, 2, threshold=math.nan)
    assert _kinds(_events(snapshot, 2, threshold=math.nan), "stop")[0]["reason"] in (
        "no_progress", "max_iters")


def test_one_rank_never_balances_with_a_positive_threshold():
    assert _plan([([5, 9, 1], 1)], 1, max_num_seqs=2, threshold=1) == [
        {"out_blk": [], "in_blk": [9], "freeze": False}]
    _plan([([5, 9, 1, 3], 1)], 1, max_num_seqs=2, threshold=math.nan)


def test_max_iters_zero_runs_no_round():
    events = _events([([100], 1), ([1, 50], 1)], 2, threshold=1, max_iters=0)
    assert _kinds(events, "round") == []
    assert _kinds(events, "stop")[0]["reason"] == "max_iters"


# --- API --------------------------------------------------------------------------------


def test_plan_dataclass_and_to_dict():
    plan = Plan(out_blk=[3], in_blk=[4, 5], freeze=False)
    assert plan.to_dict() == {"out_blk": [3], "in_blk": [4, 5], "freeze": False}
    assert Plan().to_dict() == {"out_blk": [], "in_blk": [], "freeze": False}
    copy = plan.to_dict()
    copy["in_blk"].append(9)
    assert plan.in_blk == [4, 5]


def test_freeze_is_true_exactly_when_in_blk_is_empty():
    plans = balance_load([([4000, 1000], 2), ([1000, 7], 1)], 2, max_num_seqs=2, threshold=1)
    assert all(p.freeze == (not p.in_blk) for p in plans)


def test_rejects_bad_dp_size_and_sizes_beyond_exact_float_range():
    with pytest.raises(ValueError, match="dp_size"):
        balance_load([], 0)
    with pytest.raises(ValueError, match="int32"):
        balance_load([([2**31], 1)], 1)
    with pytest.raises(ValueError, match="2\\*\\*48"):
        balance_load([([2**31 - 1] * (2**17 + 1), 1)], 1)
    balance_load([([2**31 - 1] * 512, 256)] * 16, 16)  # the largest int32 payload is fine


def test_large_sizes_take_the_vectorised_search():
    # Sizes beyond the bitset range and far apart: same answer as the oracle.
    snapshot = [([2**31 - 1, 70000, 5], 2), ([100000, 3, 2**30, 70001], 1),
                ([1 << 20, 9, 65537], 1)]
    for threshold in (1, 0.01, 5):
        _plan(snapshot, 3, max_num_seqs=2, threshold=threshold)


def test_negative_sizes_follow_the_reference():
    # Never produced by real requests, but the reference parses them like any size.
    _plan([([-5, 7, 3], 1), ([-1, 4, -8], 2)], 2, max_num_seqs=2, threshold=1)


# --- observer ---------------------------------------------------------------------------


def test_observer_does_not_change_the_plans():
    snapshot = [([300, 200, 50], 2), ([100, 250, 20], 1), ([150, 50], 2)]
    events = []
    with_observer = balance_load(snapshot, 3, threshold=0.1, observer=events.append)
    assert with_observer == balance_load(snapshot, 3, threshold=0.1)
    assert events[-1] == {"kind": "plans", "plans": [p.to_dict() for p in with_observer]}


def test_observer_event_sequence_of_ex4():
    events = _events([([20, 100, 30], 1), ([40, 40], 2)], 2, max_num_seqs=2, threshold=5)
    assert [e["kind"] for e in events] == [
        "parsed", "fill", "round", "swap", "round", "no_drop", "stop", "cancel", "plans"]
    fill, round0, swap, round1 = events[1:5]
    assert fill == {"kind": "fill", "rank": 0, "blk": 100, "tot_blk": 120}
    assert round0 == {"kind": "round", "round": 0, "order": [0, 1], "tot_blk": [120, 80],
                      "avg": 100.0, "bubble": 20.0}
    assert swap == {"kind": "swap", "round": 0, "rank": 0, "mode": "decrease",
                    "out_blk": 100, "in_blk": 30, "newly_added": True, "dist_before": 20.0,
                    "dist_after": 15.0, "tie_rule": False, "tot_blk": 50}
    assert round1["order"] == [1, 0] and round1["tot_blk"] == [50, 80]
    assert events[-3] == {"kind": "stop", "reason": "no_progress", "round": 1,
                          "bubble": 15.0}
    assert events[-2] == {"kind": "cancel", "rank": 0, "cancelled": [100], "out_blk": [],
                          "in_blk": [30]}


def test_observer_stop_reasons():
    stop = _kinds(_events([([3], 1), ([1, 2], 1)], 2, threshold=1.0), "stop")
    assert stop[0]["reason"] == "bubble_below_threshold"
    assert stop[0]["bubble"] == 0.5
    stop = _kinds(_events([([3], 1), ([1, 2], 1)], 2, threshold=0.5), "stop")
    assert stop[0]["reason"] == "bubble_below_threshold"
    assert stop[0]["round"] == 0


def test_observer_no_drop_when_at_most_one_request_runs():
    events = _events([([50], 1), ([], 0)], 2, threshold=1)
    (no_drop,) = _kinds(events, "no_drop")
    assert no_drop["throughput"] is None
