"""DyntraLB's control plane in virtual time, as pure logic: the profile terms
(``emu.rank.control_costs``), the planner's work counted on a snapshot and the charge of
one iteration (``emu.rank.control_plane``), the metrics summed from step records
(``emu.metrics.control_plane``). The engines that charge it are tested in
tests/integration/test_control_plane.py."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from dyntra_lb.planner import registry as planners
from emu.metrics import Run, compute_metrics
from emu.rank.control_costs import ControlCharge, ControlPlaneCost, PlannerWork
from emu.rank.control_plane import (
    ControlPlane,
    PlannerCall,
    _Counted,
    _WorkCounter,
    planner_work,
)
from emu.rank.costs import PROFILES, CostProfileError, profile_from_dict
from emu.sites import ALLGATHER_SITE, DP_SYNC_SITE, FLAG_SITE, LOCKSTEP_SITE
from emu.spec import RunSpec, SpecError, check
from emu.workload import TraceRequest

TERMS = ControlPlaneCost(collective_fixed_s=100e-6, collective_per_peer_s=10e-6,
                         collective_per_byte_s=1e-9, planner_fixed_s=50e-6,
                         planner_per_request_s=2e-6, planner_per_pair_s=1e-6,
                         planner_per_round_s=7e-6)


def _collective(site, op, shape, dtype="int32"):
    return {"seq": 0, "site": site, "op": op, "shape": shape, "dtype": dtype}


# ------------------------------------------------------------------ the terms


def test_a_collective_costs_its_latency_in_dp_and_received_bytes():
    # dp 4: the all-gather receives the 3 other ranks' 34 x 4 bytes, the all-reduce its 8
    assert TERMS.collective_us("all_gather", [34], "int32", 4) == 130  # 130.408: whole us
    assert TERMS.collective_us("all_reduce_max", [2], "int32", 4) == 130
    big = dataclasses.replace(TERMS, collective_per_byte_s=1e-6)
    # int64[2, 100]: 1,600 bytes from each of 2 peers
    assert big.collective_us("all_gather", [2, 100], "int64", 3) == 100 + 20 + 3200


def test_the_planner_costs_its_work():
    assert TERMS.planner_us(PlannerWork(requests=4, pairs=4, rounds=2)) == 50 + 8 + 4 + 14


def test_profile_files_read_write_and_turn_the_control_plane_off():
    default = PROFILES["kv-token"]
    assert default.control_plane == ControlPlaneCost()
    assert profile_from_dict(default.to_dict(), "x") == default
    off = profile_from_dict({**default.to_dict(), "control_plane": None}, "x")
    assert off.control_plane is None and off.to_dict()["control_plane"] is None
    assert profile_from_dict(off.to_dict(), "x") == off
    partial = profile_from_dict({"name": "p", "fixed_s": 0.01,
                                 "control_plane": {"planner_fixed_s": 0.001}}, "x")
    assert partial.control_plane == ControlPlaneCost(planner_fixed_s=0.001)
    # a profile file without the key gets the default terms
    assert profile_from_dict({"name": "p", "fixed_s": 0.01}, "x").control_plane == \
        ControlPlaneCost()


@pytest.mark.parametrize("value, message", [
    ({"collective_fixd_s": 1e-4}, "unknown key 'control_plane.collective_fixd_s'"),
    ({"planner_per_pair_s": -1e-9}, "control_plane.planner_per_pair_s must be a number"),
    ({"collective_fixed_s": float("nan")}, "control_plane.collective_fixed_s"),
    ({"planner_fixed_s": "1"}, "control_plane.planner_fixed_s"),
    ([1, 2], "key 'control_plane' must be an object"),
])
def test_bad_terms_are_one_error_naming_file_and_key(value, message):
    with pytest.raises(CostProfileError, match="my.json") as raised:
        profile_from_dict({"name": "p", "fixed_s": 0.01, "control_plane": value}, "my.json")
    assert message in str(raised.value)


# ------------------------------------------------------------------ the planner's work


def test_the_work_counted_on_a_hand_snapshot():
    """Rank 0 runs 10 + 10 blocks with an 8 waiting, rank 1 runs 1 + 1 with a 3 waiting
    (max_num_seqs 2): the planner parses 6 requests; round 0 (bubble 9) searches the
    least loaded rank's 2 x 1 pairs and the most loaded rank's 2 x 1, swaps 1 for 3 on
    rank 1 and 10 for 8 on rank 0 (a swap keeps the sizes); round 1 (bubble 7) searches
    the same sizes again and stops (no progress): 2 rounds, 8 pairs."""
    snapshot = [([10, 10, 8, 0], 2), ([1, 1, 3, 0], 2)]
    work = planner_work(snapshot, 2, max_num_seqs=2, threshold=5.0, planner="reference")
    assert work == PlannerWork(requests=6, pairs=8, rounds=2)
    # balanced within the threshold: one round, no search
    assert planner_work(snapshot, 2, max_num_seqs=2, threshold=50.0,
                        planner="reference") == PlannerWork(requests=6, pairs=0, rounds=1)
    # a fill moves a request from waiting to running: rank 1 pulls its 3 into its free
    # slot, then runs 2 with 1 waiting, as above
    filled = planner_work([([10, 10, 8, 0], 2), ([1, 3, 2, 0], 1)], 2, max_num_seqs=2,
                          threshold=5.0, planner="reference")
    assert filled == PlannerWork(requests=6, pairs=8, rounds=2)


def test_the_work_is_the_same_for_both_impls_snapshots():
    """The kit gathers int32 rows, vllm-ascend hands ``_balance_load`` lists of ints."""
    rng = np.random.default_rng(5)
    for _ in range(20):
        rows = [(rng.integers(0, 900, size=16).astype(np.int32), int(rng.integers(0, 9)))
                for _ in range(4)]
        as_lists = [(blks.tolist(), split) for blks, split in rows]
        assert planner_work(rows, 4, max_num_seqs=8, threshold=5.0, planner="reference") == \
            planner_work(as_lists, 4, max_num_seqs=8, threshold=5.0, planner="reference")


@pytest.mark.parametrize("planner", ["reference", "fill-protect"])
def test_the_count_ends_the_call_at_the_stop_yet_counts_the_whole_run(planner):
    """planner_work ends the planner's call at its ``stop`` event: its count is the one
    of every event a whole call emits (cancellations and plans included), each snapshot
    a fresh one, on random snapshots of 2 to 8 ranks with waiting requests to fill."""
    rng = np.random.default_rng(23)
    for _ in range(60):
        dp = int(rng.integers(2, 9))
        rows = [(rng.integers(1, 400, size=int(rng.integers(1, 14))).tolist(),
                 int(rng.integers(0, 6))) for _ in range(dp)]
        rows = [(blks, min(split, len(blks))) for blks, split in rows]
        events: list[dict] = []
        planners.get(planner)(rows, dp, max_num_seqs=6, threshold=5.0,
                              observer=events.append)
        whole = _WorkCounter(5.0)
        for event in events:
            try:
                whole(event)
            except _Counted:  # the stop: the counter ends a call there
                pass
        assert planner_work(rows, dp, max_num_seqs=6, threshold=5.0, planner=planner) == \
            PlannerWork(whole.requests, whole.pairs, whole.rounds)


def test_each_snapshot_is_counted_anew_whatever_was_counted_before():
    """Every rank counts the gathered snapshot and the last count is kept for the next
    rank: a snapshot that differs from the last one in one rank's row only, in its split
    only, or in its rows' dtype only (same bytes, other counts) is counted again, and
    gets the count a fresh process would give it."""
    rng = np.random.default_rng(11)
    for _ in range(30):
        rows = [(rng.integers(0, 900, size=12).astype(np.int32), int(rng.integers(0, 7)))
                for _ in range(4)]
        changed_row = [(blks.copy(), split) for blks, split in rows]
        changed_row[int(rng.integers(0, 4))][0][int(rng.integers(0, 12))] += 37
        changed_split = [(blks, (split + 3) % 8) for blks, split in rows]
        wide = [(blks.astype(np.int64), split) for blks, split in rows]
        # int32 rows a, 0, b, 0, ... and the int64 rows a, b, ... of the same bytes
        narrow = [(np.stack([blks, np.zeros_like(blks)], axis=1).ravel(), split)
                  for blks, split in rows]
        same_bytes = [(blks.view(np.int64), split) for blks, split in narrow]
        for first, other in [(rows, changed_row), (rows, changed_split), (rows, wide),
                             (narrow, same_bytes)]:
            planner_work(first, 4, max_num_seqs=6, threshold=5.0, planner="reference")
            counted = planner_work(other, 4, max_num_seqs=6, threshold=5.0,
                                   planner="reference")
            as_lists = [(blks.tolist(), split) for blks, split in other]
            assert counted == planner_work(as_lists, 4, max_num_seqs=6, threshold=5.0,
                                           planner="reference")


def test_each_collective_is_charged_the_latency_of_its_own_shape_and_dtype():
    """A rank keeps each collective's latency for the next steps: collectives of one op
    but other shapes or dtypes, on the same plane, are each charged their own."""
    plane = ControlPlane(dataclasses.replace(TERMS, collective_per_byte_s=1e-6), dp_size=2,
                         planner="vllm-ascend", overlap=False)
    for shape, dtype in [([6], "int32"), ([60], "int32"), ([6], "int64"), ([6, 10], "int32"),
                         ([6], "int32")]:
        gather = [_collective(ALLGATHER_SITE, "all_gather", shape, dtype)]
        charge = plane.charge(gather, None, step_us=20_000, planner_wall_s=0.0)
        assert charge.collectives_us == plane.cost.collective_us("all_gather", shape, dtype, 2)
    assert len({plane.charge([_collective(ALLGATHER_SITE, "all_gather", shape)], None,
                             step_us=1, planner_wall_s=0.0).collectives_us
                for shape in ([6], [60], [6, 11])}) == 3


# ------------------------------------------------------------------ one iteration's charge


COLLECTIVES = [_collective(LOCKSTEP_SITE, "all_reduce_max", [5]),
               _collective(DP_SYNC_SITE, "all_reduce_max", [2]),
               _collective(FLAG_SITE, "all_reduce_max", [2]),
               _collective(ALLGATHER_SITE, "all_gather", [6])]
CALL = PlannerCall([([10, 10, 8, 0], 2), ([1, 1, 3, 0], 2)], 2, 5.0)


def test_a_synchronous_iteration_is_charged_its_collectives_and_planner():
    plane = ControlPlane(TERMS, dp_size=2, planner="vllm-ascend", overlap=False)
    # DyntraLB's two collectives only (not the lockstep, not vLLM's wave sync):
    # 110 us + 8 ns and 110 us + 24 ns; the planner (6 requests, 8 pairs, 2 rounds)
    # 50 + 12 + 8 + 14 us
    charge = plane.charge(COLLECTIVES, CALL, step_us=20_000, planner_wall_s=3.0)
    assert charge == ControlCharge(collectives_us=220, planner_us=84, charged_us=304)
    no_plan = plane.charge(COLLECTIVES[:3], None, step_us=20_000, planner_wall_s=0.0)
    assert no_plan == ControlCharge(110, 0, 110)


def test_async_scheduling_charges_only_what_outlasts_the_forward_in_flight():
    plane = ControlPlane(TERMS, dp_size=2, planner="reference", overlap=True)
    assert plane.charge(COLLECTIVES, CALL, step_us=20_000, planner_wall_s=0).charged_us == 0
    assert plane.charge(COLLECTIVES, CALL, step_us=200, planner_wall_s=0).charged_us == 104
    assert plane.charge(COLLECTIVES, CALL, step_us=0, planner_wall_s=0).charged_us == 304


def test_measured_mode_charges_the_exchanged_wall_time():
    seen = []

    def exchange(value_us):  # the slowest rank's, as the MAX all-reduce would return
        seen.append(value_us)
        return value_us + 1000

    plane = ControlPlane(TERMS, dp_size=2, planner="reference", overlap=False,
                         exchange=exchange)
    charge = plane.charge(COLLECTIVES, CALL, step_us=20_000, planner_wall_s=0.0025)
    assert seen == [2500]
    assert charge == ControlCharge(220, 3500, 3720, measured=True)


# ------------------------------------------------------------------ metrics


PLAN = {"out_blk": [], "in_blk": [], "freeze": False}


def _step(clock_s, step_s, charge, *, active=False):
    return {"clock_s": clock_s, "step_time_s": step_s, "own_cost_s": step_s, "iter": 0,
            "wave": 0, "step_counter": 0, "dummy": False, "num_running": 1,
            "num_waiting": 0, "running_blocks": 1, "waiting_blocks": 0, "scheduled_tokens": 1,
            "plan_applied": PLAN if active else None,
            "plan_generated": PLAN if active else None, "paused": [],
            "resumed": [], "admitted": [], "preempted": [], "finished": [],
            "kv_free_blocks": 1, "kv_held_blocks": 1, "paused_kv_blocks": {},
            "collectives": [], "lb_active": active,
            **({} if charge is None else {"control_plane": charge.to_dict()})}


def _run(charges):
    steps, clock = [], 0.0
    for i, charge in enumerate(charges):
        steps.append(_step(clock, 0.02, charge, active=i > 0))
        clock += 0.02 + (charge.charged_us / 1e6 if charge is not None else 0)
    return Run.from_records(dp_size=1, steps=[steps], requests=[])


def test_metrics_sum_the_charges():
    charges = [ControlCharge(110, 0, 110), ControlCharge(220, 4000, 4220),
               ControlCharge(220, 1000, 1220)]
    m = compute_metrics(_run(charges))
    control = m["control_plane"]
    assert control["total_s"] == pytest.approx(0.00555)
    assert control["collectives_s"] == pytest.approx(0.00055)
    assert control["planner_s"] == pytest.approx(0.005)
    assert control["active_steps"] == 2
    assert control["per_active_step_ms"] == pytest.approx(2.72)
    assert control["busy_share"] == pytest.approx(0.00555 / (0.06 + 0.00555))
    assert control["deterministic"] and control["planner_cost"] == "model"
    # virtual time ends after the last step's charge
    assert m["virtual_time_s"] == pytest.approx(0.06 + 0.00555)
    assert m["busy_time_s"] == pytest.approx(0.06)


def test_metrics_of_a_measured_run_say_so_and_of_an_off_run_leave_it_out():
    m = compute_metrics(_run([ControlCharge(0, 0, 0), ControlCharge(110, 900, 1010, True)]))
    assert m["control_plane"]["planner_cost"] == "measured"
    assert m["control_plane"]["deterministic"] is False
    assert "control_plane" not in compute_metrics(_run([None, None]))


def test_measured_planner_cost_needs_the_control_plane_on(tmp_path):
    off = dataclasses.replace(PROFILES["kv-token"], control_plane=None)
    spec = RunSpec(trace=[TraceRequest("r0", 0.0, 64, 4)], dp_size=2, out_dir=tmp_path,
                   cost_model=off, planner_cost="measured")
    with pytest.raises(SpecError) as info:
        check(spec)
    problems = info.value.problems
    assert [p.field for p in problems] == ["planner_cost"]
    assert "RunSpec.cost_model 'kv-token' has it off" in str(problems[0])
    check(dataclasses.replace(spec, planner_cost="model"))
