"""Why DyntraLB did nothing (emu/no_effect.py), from metrics dictionaries as the CLI
writes them: each reason names its numbers, and a run that did something gets no note."""

from __future__ import annotations

import pytest

from dyntra_lb.config import DyntraLBConfig
from emu.no_effect import no_effect_notes, trace_warnings
from emu.workload import TraceRequest


def metrics(lb=None, *, planner_steps=0, longest=500, largest_prompt=3000, outs=0, ins=0,
            paused=0, block_size=128):
    additional = {} if lb is None else {"scheduler_config": {"dyntra_lb_config": {
        "enabled": True, **lb}}}
    return {
        "config": {"additional_config": additional, "block_size": block_size},
        "balance_ratio": 0.8,
        "plan_churn": {"outs": outs, "ins": ins, "paused": paused, "active_steps": 0},
        "lb_activity": {"planner_steps": planner_steps, "waves": 1,
                        "longest_wave_steps": longest, "largest_prompt_tokens": largest_prompt},
    }


def test_dynamic_mode_without_long_requests():
    [note] = no_effect_notes(metrics({"long_req_block_threshold": 40}, largest_prompt=5000))
    assert note.startswith("DyntraLB generated no plan: dynamic mode never activated")
    assert "largest prompt is 40 blocks (5,000 tokens at block size 128)" in note
    assert "long_req_block_threshold = 40" in note
    assert "lower long_req_block_threshold below 40" in note


def test_dynamic_mode_with_a_long_request_that_planned_has_no_note():
    m = metrics({"long_req_block_threshold": 40}, largest_prompt=5200, planner_steps=300,
                outs=4, paused=4)
    assert no_effect_notes(m) == []


def test_start_step_beyond_every_wave():
    [note] = no_effect_notes(metrics({"mode": "static", "start_step": 900}, longest=512))
    assert "start_step = 900 is beyond the last step of every wave" in note
    assert "longest wave reached step 512" in note


def test_window_closed_before_a_long_request():
    lb = {"long_req_block_threshold": 40, "start_step": 10, "end_step": 50}
    [note] = no_effect_notes(metrics(lb, largest_prompt=6000))
    assert "the window closed: the planner may run only from step 10 to before end_step = 50"\
        in note
    assert "after a long request arrived" in note


def test_both_reasons_are_named():
    notes = no_effect_notes(metrics({"long_req_block_threshold": 40, "start_step": 800},
                                    largest_prompt=100, longest=100))
    assert len(notes) == 2
    assert "dynamic mode never activated" in notes[0] and "start_step = 800" in notes[1]


def test_plans_without_change():
    [note] = no_effect_notes(metrics({"mode": "static", "start_step": 0}, planner_steps=120))
    assert "planned on 120 steps, but every plan was empty" in note
    assert "bubble_threshold = 5" in note and "balance ratio was 0.800" in note


@pytest.mark.parametrize("m", [
    metrics(None),                                               # DyntraLB off
    metrics({"mode": "static", "start_step": 0}, planner_steps=5, ins=2),  # it admitted
    {"config": None, "plan_churn": {}, "lb_activity": None},     # not recorded
])
def test_no_note(m):
    assert no_effect_notes(m) == []


def test_trace_warnings():
    lb = DyntraLBConfig(enabled=True, long_req_block_threshold=40)
    short = [TraceRequest("a", 0.0, 1000, 10), TraceRequest("b", 0.1, 5000, 10)]
    [warning] = trace_warnings(lb, short, 128)
    assert "largest prompt is 40 blocks" in warning
    assert trace_warnings(lb, [*short, TraceRequest("c", 0.2, 5121, 10)], 128) == []
    assert trace_warnings(DyntraLBConfig(enabled=True, mode="static"), short, 128) == []
    assert trace_warnings(DyntraLBConfig(enabled=False), short, 128) == []
