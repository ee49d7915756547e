"""``StepRecord.line``, the event log's step line written field by field, against the
generic encoder it replaces: the same bytes for every record, including the shapes it
hands back to the encoder (a plan or collective record of another shape)."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from emu.rank.control_costs import ControlCharge
from emu.rank.eventlog import StepRecord

_dumps = json.JSONEncoder(sort_keys=True, separators=(",", ":")).encode

ids = st.lists(st.text(max_size=12), max_size=3)
ints = st.integers(min_value=-(2**40), max_value=2**62)
plans = st.none() | st.fixed_dictionaries(
    {"out_blk": st.lists(ints, max_size=4), "in_blk": st.lists(ints, max_size=4),
     "freeze": st.booleans()}) | st.dictionaries(st.text(max_size=6), ints, max_size=3)
collective = st.fixed_dictionaries(
    {"seq": ints, "site": st.text(max_size=20), "op": st.text(max_size=16),
     "shape": st.lists(st.integers(0, 10**6) | st.booleans() | st.floats(allow_nan=False),
                       max_size=2),
     "dtype": st.text(max_size=8)})
collectives = st.lists(collective | st.dictionaries(st.text(max_size=6), ints, max_size=2),
                       max_size=4)
records = st.builds(
    StepRecord, iter=ints, wave=ints, step_counter=ints, clock_us=ints, own_cost_us=ints,
    step_us=ints, dummy=st.booleans(), num_running=ints, num_waiting=ints,
    running_blocks=ints, waiting_blocks=ints, scheduled_tokens=ints, plan_applied=plans,
    paused=ids, resumed=ids, admitted=ids, preempted=ids, finished=ids,
    plan_generated=plans, kv_free_blocks=ints, kv_held_blocks=ints,
    paused_kv_blocks=st.dictionaries(st.text(max_size=12), ints, max_size=3),
    collectives=collectives,
    control_plane=st.none() | st.builds(ControlCharge, collectives_us=ints, planner_us=ints,
                                        charged_us=ints, measured=st.booleans()))


def reference_line(record: StepRecord, rank: int) -> str:
    return _dumps({**record.to_dict(), "kind": "step", "rank": rank})


@settings(max_examples=400, deadline=None)
@given(record=records, rank=st.integers(0, 63))
def test_line_is_the_generic_encoders_output(record, rank):
    assert record.line(rank) == reference_line(record, rank)


def test_a_typical_engine_record():
    record = StepRecord(
        iter=7, wave=0, step_counter=8, clock_us=140_000, own_cost_us=19_873, step_us=20_001,
        dummy=False, num_running=3, num_waiting=1, running_blocks=41, waiting_blocks=9,
        scheduled_tokens=3, plan_applied={"out_blk": [9], "in_blk": [], "freeze": True},
        paused=["req-\u00e9\"1"], resumed=[], admitted=["b"], preempted=[], finished=[],
        plan_generated=None, kv_free_blocks=4000, kv_held_blocks=50,
        paused_kv_blocks={"req-\u00e9\"1": 9},
        collectives=[{"seq": 14, "site": "engine.lockstep", "op": "all_reduce_max",
                      "shape": [17], "dtype": "int32"}])
    line = record.line(2)
    assert line == reference_line(record, 2)
    assert json.loads(line)["clock_s"] == 0.14 and '"lb_active":false' in line


def test_records_of_another_shape_go_through_the_encoder():
    record = StepRecord(
        iter=1, wave=0, step_counter=1, clock_us=0, own_cost_us=1, step_us=1, dummy=True,
        num_running=0, num_waiting=0, running_blocks=0, waiting_blocks=0,
        scheduled_tokens=0, plan_applied={"out_blk": [], "in_blk": [], "freeze": 1},
        paused=[], resumed=[], admitted=[], preempted=[], finished=[],
        plan_generated={"out_blk": [], "in_blk": [], "freeze": False, "note": "x"},
        kv_free_blocks=1, kv_held_blocks=0, paused_kv_blocks={},
        collectives=[{"seq": 3, "site": "s", "op": "o", "shape": [], "dtype": "d",
                      "origin": "vllm"}, {"seq": True, "site": "s", "op": "o", "shape": [],
                                         "dtype": "d"}])
    assert record.line(0) == reference_line(record, 0)


def test_collectives_that_look_alike_keep_their_own_text():
    """The text around a collective's seq is kept per descriptor: equal-looking shapes
    (1, True, 1.0) and a descriptor seen before with another seq each get their own."""
    def record(collectives):
        return StepRecord(
            iter=1, wave=0, step_counter=1, clock_us=0, own_cost_us=1, step_us=1,
            dummy=False, num_running=0, num_waiting=0, running_blocks=0, waiting_blocks=0,
            scheduled_tokens=0, plan_applied=None, paused=[], resumed=[], admitted=[],
            preempted=[], finished=[], plan_generated=None, kv_free_blocks=1,
            kv_held_blocks=0, paused_kv_blocks={}, collectives=collectives)

    shapes = [[1], [True], [1.0], [1], [2, 1], [1]]
    first = record([{"seq": i, "site": "s", "op": "o", "shape": shape, "dtype": "d"}
                    for i, shape in enumerate(shapes)])
    again = record([{"seq": 10 + i, "site": "s", "op": "o", "shape": shape, "dtype": "d"}
                    for i, shape in enumerate(reversed(shapes))])
    for rec in (first, again):
        line = rec.line(0)
        assert line == reference_line(rec, 0)
        assert [c["shape"] for c in json.loads(line)["collectives"]] == \
            [c["shape"] for c in rec.collectives]
