"""Issue 28, DyntraLB's control plane in virtual time, on real kit ranks (rank threads over
in-memory collectives, and one comparison on rank processes over gloo): every iteration
is charged what its DyntraLB collectives and its planner cost by the profile's terms, the
clock moves on by it, and an A/B's throughput change shrinks by exactly that time.

The trace arrives at once and remote KV loads take no time, so what the scheduler does
cannot depend on the clock: the same spec with the control plane off schedules the same
steps, and virtual time differs by the charges alone, which the tests add up by hand
from the collectives each step record lists. The runs are synchronous, where the whole
control plane is charged; under vLLM's async scheduling only what outlasts the forward
in flight is (the last test, with a control plane slower than the steps)."""

from __future__ import annotations

import dataclasses

import pytest

from emu.metrics import compute_metrics, load_run
from emu.rank.control_costs import ControlPlaneCost
from emu.rank.costs import StepCostModel
from emu.report import headroom_summary, summary_table
from emu.run import run_cluster
from emu.sites import ALLGATHER_SITE, FLAG_SITE, PLANNER_COST_SITE
from emu.spec import RunSpec
from emu.workload import TraceRequest
from tests.records import event_log, events

pytestmark = pytest.mark.integration

DP = 2
# Round numbers, so that the charges can be added up by hand: a DyntraLB collective at
# dp 2 costs 100 + 10 us; a planner call 50 us whatever the snapshot.
TERMS = ControlPlaneCost(collective_fixed_s=100e-6, collective_per_peer_s=10e-6,
                         collective_per_byte_s=0.0, planner_fixed_s=50e-6,
                         planner_per_request_s=0.0, planner_per_pair_s=0.0,
                         planner_per_round_s=0.0)
COLLECTIVE_US, PLANNER_US = 110, 50
PROFILE = StepCostModel(name="cp-test", fixed_s=0.005, per_kv_token_s=0.2e-6,
                        per_scheduled_token_s=5e-6, control_plane=TERMS)
OFF = dataclasses.replace(PROFILE, control_plane=None)
DYNAMIC = {"scheduler_config": {"dyntra_lb_config": {
    "enabled": True, "mode": "dynamic", "start_step": 0, "long_req_block_threshold": 60,
    "dynamic_max_step": 60}}}
# Requests at 0 s: prompts of 48 to 1,500 tokens (3 to 94 blocks of 16), 4 to 40 tokens out.
TRACE = [TraceRequest(f"r{i}", 0.0, (48, 300, 1500, 120, 700)[i % 5], 4 + (i * 7) % 37)
         for i in range(24)]


def _spec(out_dir, profile, config=DYNAMIC, **kw) -> RunSpec:
    kw.setdefault("async_scheduling", False)
    return RunSpec(trace=TRACE, dp_size=DP, out_dir=out_dir, additional_config=config,
                   max_num_seqs=4, block_size=16, cost_model=profile, kv_latency_fixed_s=0.0,
                   kv_latency_per_block_s=0.0, device="cpu", transport="thread", **kw)


def _steps(out_dir, rank: int) -> list[dict]:
    return [r for r in events(out_dir, rank) if r["kind"] == "step"]


def _by_hand_us(step: dict) -> int:
    """What the terms charge for this step's recorded collectives and plan."""
    lb_collectives = [c for c in step["collectives"] if c["site"] in (FLAG_SITE, ALLGATHER_SITE)]
    planned = any(c["site"] == ALLGATHER_SITE for c in step["collectives"])
    return COLLECTIVE_US * len(lb_collectives) + (PLANNER_US if planned else 0)


_TIME_KEYS = ("clock_s", "control_plane")


def _untimed(steps: list[dict]) -> list[dict]:
    return [{k: v for k, v in s.items() if k not in _TIME_KEYS} for s in steps]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The same spec with the control plane charged and off, and DyntraLB off (the A of
    the A/B)."""
    out = {}
    for name, profile, config in (("on", PROFILE, DYNAMIC), ("off", OFF, DYNAMIC),
                                  ("no_lb", PROFILE, None)):
        out_dir = tmp_path_factory.mktemp(name)
        run_cluster(_spec(out_dir, profile, config))
        out[name] = out_dir
    return out


def test_every_step_is_charged_its_terms_and_the_clock_moves_on_by_it(runs):
    charged_steps = 0
    for rank in range(DP):
        steps = _steps(runs["on"], rank)
        for step, following in zip(steps, steps[1:], strict=False):
            expected_us = _by_hand_us(step)
            charged_steps += expected_us > 0
            assert round(step["control_plane"]["charged_s"] * 1e6) == expected_us
            if following["wave"] == step["wave"]:  # no idle gap between them
                assert following["clock_s"] == pytest.approx(
                    step["clock_s"] + step["step_time_s"] + expected_us / 1e6, abs=1e-9)
    assert charged_steps > 10
    # the same charge on every rank of a step
    assert [s["control_plane"] for s in _steps(runs["on"], 0)] == \
        [s["control_plane"] for s in _steps(runs["on"], 1)]


def test_the_charge_moves_only_time_and_the_ab_shrinks_by_it(runs):
    on, off, a = (compute_metrics(load_run(runs[k])) for k in ("on", "off", "no_lb"))
    for rank in range(DP):  # what the scheduler did is the same, step by step
        assert _untimed(_steps(runs["on"], rank)) == _untimed(_steps(runs["off"], rank))
    by_hand_s = sum(_by_hand_us(s) for s in _steps(runs["on"], 0)) / 1e6
    control = on["control_plane"]
    assert control["total_s"] == pytest.approx(by_hand_s, abs=1e-9)
    assert control["total_s"] > 0
    assert on["virtual_time_s"] == pytest.approx(off["virtual_time_s"] + by_hand_s, abs=1e-9)
    assert on["busy_time_s"] == pytest.approx(off["busy_time_s"], abs=1e-9)
    assert on["output_tokens"] == off["output_tokens"]
    assert on["pauses"]["total"] > 0 and control["active_steps"] > 10  # DyntraLB worked
    gain_on = on["throughput_tok_s"] / a["throughput_tok_s"]
    gain_off = off["throughput_tok_s"] / a["throughput_tok_s"]
    assert gain_on == pytest.approx(gain_off * off["virtual_time_s"] / on["virtual_time_s"])
    assert gain_on < gain_off
    # DyntraLB off (A) joins none of DyntraLB's collectives: charged nothing
    assert a["control_plane"]["total_s"] == 0
    # the headroom line is net of the charge and says what B would reach without it
    lines = headroom_summary(a, on)
    assert f"reached {on['throughput_tok_s']:.1f} tok/s" in lines[0]
    assert "net of DyntraLB's control plane" in lines[1]
    assert f"{off['throughput_tok_s']:.1f} tok/s" in lines[1]


def test_with_the_control_plane_off_no_step_record_carries_it(runs):
    assert all("control_plane" not in s for r in range(DP) for s in _steps(runs["off"], r))
    assert "control_plane" not in compute_metrics(load_run(runs["off"]))


def test_rank_processes_charge_as_rank_threads(runs, tmp_path):
    run_cluster(dataclasses.replace(_spec(tmp_path, PROFILE), transport="process"))
    for rank in range(DP):
        assert event_log(tmp_path, rank) == event_log(runs["on"], rank)


def test_measured_planner_cost_is_the_slowest_ranks_wall_time(tmp_path):
    run_cluster(_spec(tmp_path, PROFILE, planner_cost="measured"))
    steps = [_steps(tmp_path, r) for r in range(DP)]
    assert [s["control_plane"] for s in steps[0]] == [s["control_plane"] for s in steps[1]]
    planned = [s for s in steps[0] if any(c["site"] == ALLGATHER_SITE for c in s["collectives"])]
    assert planned and all(s["control_plane"]["planner_measured"] for s in steps[0])
    for s in planned:  # the exchange of the measured time follows the all-gather
        sites = [c["site"] for c in s["collectives"]]
        assert sites[sites.index(ALLGATHER_SITE) + 1] == PLANNER_COST_SITE
        lb_us = COLLECTIVE_US * sum(c in (FLAG_SITE, ALLGATHER_SITE) for c in sites)
        charge = s["control_plane"]
        assert round(charge["collectives_s"] * 1e6) == lb_us
        assert charge["charged_s"] == pytest.approx(charge["collectives_s"] + charge["planner_s"])
    # a planner call takes some wall time (the model's fixed 50 us is not what is charged)
    assert sum(s["control_plane"]["planner_s"] for s in planned) > 0
    metrics = compute_metrics(load_run(tmp_path))
    control = metrics["control_plane"]
    assert control["planner_cost"] == "measured" and control["deterministic"] is False
    assert "measured wall time (not deterministic)" in summary_table(metrics)


def test_async_scheduling_charges_what_outlasts_the_forward_in_flight(tmp_path):
    """A control plane slower than the steps (collectives of 10 ms against 5 ms steps):
    under async scheduling each step is charged its terms minus its own step time (the
    forward it overlaps), never less than 0, and the clock moves on by that."""
    slow = dataclasses.replace(TERMS, collective_fixed_s=10e-3)
    run_cluster(_spec(tmp_path, dataclasses.replace(PROFILE, control_plane=slow),
                      async_scheduling=True))
    charged_steps = 0
    for rank in range(DP):
        steps = _steps(tmp_path, rank)
        for step, following in zip(steps, steps[1:], strict=False):
            lb = sum(c["site"] in (FLAG_SITE, ALLGATHER_SITE) for c in step["collectives"])
            planned = any(c["site"] == ALLGATHER_SITE for c in step["collectives"])
            terms_us = 10_010 * lb + (PLANNER_US if planned else 0)
            expected_us = max(0, terms_us - round(step["step_time_s"] * 1e6))
            charged_steps += expected_us > 0
            charge = step["control_plane"]
            assert round((charge["collectives_s"] + charge["planner_s"]) * 1e6) == terms_us
            assert round(charge["charged_s"] * 1e6) == expected_us
            if following["wave"] == step["wave"]:
                assert following["clock_s"] == pytest.approx(
                    step["clock_s"] + step["step_time_s"] + expected_us / 1e6, abs=1e-9)
    assert charged_steps > 10
