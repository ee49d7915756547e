"""``StepRecord.line``, the event log's step line written field by field, and its request
lines, written from kept token-time texts, against the generic encoder they replace: the
same bytes for every record, including the shapes they hand back to the encoder (a plan
or collective record of another shape, a time that is not a float)."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from emu.rank.control_costs import ControlCharge
from emu.rank.eventlog import EventLog, StepRecord

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


times = st.lists(st.floats() | st.sampled_from([0.0, -0.0, 1.0, 0.5]) | st.integers(0, 3)
                 | st.booleans() | st.none(), max_size=12)
request_records = st.fixed_dictionaries(
    {"request_id": st.text(max_size=8), "arrival_s": st.floats(allow_nan=False),
     "prompt_tokens": ints, "output_tokens": ints,
     "first_scheduled_s": st.none() | st.floats(allow_nan=False),
     "token_times_s": times, "finish_s": st.none() | st.floats(allow_nan=False),
     "pauses": st.lists(st.lists(st.floats(allow_nan=False) | st.none(), max_size=2),
                        max_size=2)},
    optional={"unfinished": st.booleans(), "zz": ints})


@settings(max_examples=300, deadline=None)
@given(records=st.lists(request_records, max_size=4), rank=st.integers(0, 63))
def test_request_lines_are_the_generic_encoders_output(records, rank):
    """A request line's token times are written from texts an event log keeps per value:
    every line stays the encoder's, for floats seen before, equal values of another type
    (1 and 1.0, True), zeros of both signs, NaN and infinities, and records with a key
    after ``token_times_s``. One log writes them all, so later records meet the texts
    the earlier ones left."""
    log = EventLog(None, rank)
    for record in records:
        expected = _dumps({**record, "kind": "request", "rank": rank})
        assert log._request_line(dict(record)) == expected


def test_request_lines_of_look_alike_times():
    """Values a kept text must not stand for: an int or a bool equal to a float seen
    before (and the other way round), -0.0 after 0.0, NaN and the infinities."""
    inf = float("inf")
    sequences = [[1, 1.0, True, 1.0, 1], [1, 2.5], [1.0, 2], [True], [1.0, 2.5],
                 [0.0, -0.0, 0.0], [-0.0, 0.0],
                 [float("nan"), float("nan"), inf, -inf, inf], [1e-07, 5e-06, 0.1, 1e16]]
    for order in (sequences, sequences[::-1]):
        log = EventLog(None, 3)
        for token_times in order:
            record = {"request_id": "r", "token_times_s": token_times}
            assert log._request_line(dict(record)) == \
                _dumps({**record, "kind": "request", "rank": 3})
