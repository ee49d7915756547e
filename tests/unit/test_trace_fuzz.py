"""Fuzz the trace loader: whatever bytes, lines or JSON values a trace file holds, loading
it either returns requests or raises TraceError (a ValueError) listing file:line
problems — never another exception; valid generated traces load back exactly; and a
single bad field is reported on its own line."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from emu.workload import (
    MAX_ARRIVAL_S,
    MAX_PRIORITY,
    MAX_TOKENS,
    OPTIONAL_FIELDS,
    REQUIRED_FIELDS,
    TraceError,
    TraceRequest,
    load_trace,
    validate_trace,
)

FUZZ = settings(max_examples=300, deadline=None,
                suppress_health_check=[HealthCheck.too_slow])
FIELDS = list(REQUIRED_FIELDS + OPTIONAL_FIELDS)


@pytest.fixture(scope="module")
def trace_path(tmp_path_factory):
    """One file, rewritten by every example (hypothesis runs examples one at a time)."""
    return tmp_path_factory.mktemp("fuzz") / "trace.jsonl"


def load_outcome(path, dp_size=None):
    """Load the file both ways and check they agree: (requests or None, problems)."""
    problems = validate_trace(path, dp_size=dp_size)
    assert isinstance(problems, list) and all(isinstance(p, str) for p in problems)
    try:
        requests = load_trace(path, dp_size=dp_size)
    except TraceError as exc:
        assert isinstance(exc, ValueError)
        assert exc.problems == problems and problems
        for problem in problems:
            assert problem.startswith(str(path))  # every problem names the file
        return None, problems
    assert problems == []
    assert all(isinstance(r, TraceRequest) for r in requests)
    return requests, problems


# ------------------------------------------------------------------ arbitrary input


@FUZZ
@given(st.binary(max_size=400))
def test_arbitrary_bytes(trace_path, data):
    trace_path.write_bytes(data)
    load_outcome(trace_path)


@FUZZ
@given(st.lists(st.text(alphabet='{}[]":,0123456789 \t\r\\\x00é-.eE+truefalsnNIy_',
                        max_size=60), max_size=8))
def test_json_like_lines(trace_path, lines):
    trace_path.write_text("\n".join(lines), encoding="utf-8")
    requests, _ = load_outcome(trace_path)
    if requests is not None:
        assert len(requests) == sum(1 for line in lines if line.strip())


scalars = st.one_of(
    st.none(), st.booleans(), st.integers(),
    st.integers(min_value=-2, max_value=5),
    st.integers(min_value=10**17, max_value=10**40),
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(min_value=0, max_value=10.0),
    st.text(max_size=6),
)
json_values = st.recursive(
    scalars,
    lambda children: st.one_of(st.lists(children, max_size=3),
                               st.dictionaries(st.text(max_size=5), children, max_size=3)),
    max_leaves=8,
)
# Objects with mostly schema keys, so that the field checks run (not only "unknown key").
objects = st.dictionaries(st.one_of(st.sampled_from(FIELDS), st.text(max_size=5)),
                          json_values, max_size=8)
lines_of_values = st.lists(st.one_of(objects, json_values), min_size=0, max_size=6)


def _ranks_fit(requests, dp_size: int) -> bool:
    """Every pinned request is pinned to a rank of a ``dp_size`` cluster."""
    return all(r.rank is None or 0 <= r.rank < dp_size for r in requests)


def dump(value) -> str:
    """JSON text of any generated value; NaN/Infinity as Python writes them (the
    loader must reject them, they are not JSON numbers)."""
    return json.dumps(value)


@FUZZ
@given(lines_of_values, st.one_of(st.none(), st.integers(min_value=1, max_value=4)))
def test_arbitrary_json_values(trace_path, values, dp_size):
    trace_path.write_text("\n".join(dump(v) for v in values) + "\n", encoding="utf-8")
    requests, _ = load_outcome(trace_path, dp_size)
    if requests is not None:
        assert len(requests) == len(values)
        if dp_size is not None:
            # loading with dp_size checked the ranks already
            assert _ranks_fit(requests, dp_size)


# Found by this fuzzing: json.loads raises RecursionError on a deeply nested line.
@FUZZ
@given(st.integers(min_value=1, max_value=3), st.sampled_from(["[", "{\"a\":"]))
def test_deep_nesting_is_a_problem_not_a_crash(trace_path, depth_thousands, opener):
    trace_path.write_text(opener * (depth_thousands * 1000) + "\n")
    requests, problems = load_outcome(trace_path)
    assert requests is None and "invalid JSON" in problems[0]


# ------------------------------------------------------------------- valid traces


ids = st.text(min_size=1, max_size=12).filter(lambda s: s.strip())
arrival_steps = st.one_of(st.just(0.0), st.floats(min_value=0.0, max_value=5.0),
                          st.integers(min_value=0, max_value=3))
tokens = st.one_of(st.integers(min_value=1, max_value=4096),
                   st.integers(min_value=1, max_value=MAX_TOKENS))


@st.composite
def valid_traces(draw):
    """(dp_size, list of request dicts) that must load without a problem."""
    dp_size = draw(st.integers(min_value=1, max_value=8))
    request_ids = draw(st.lists(ids, min_size=1, max_size=12, unique=True))
    arrival = 0.0
    requests = []
    for request_id in request_ids:
        arrival = min(arrival + draw(arrival_steps), MAX_ARRIVAL_S)
        obj = {"request_id": request_id,
               "arrival_s": draw(st.sampled_from([arrival, int(arrival)]))
               if arrival == int(arrival) else arrival,
               "prompt_tokens": draw(tokens), "output_tokens": draw(tokens)}
        if draw(st.booleans()):
            obj["rank"] = draw(st.integers(min_value=0, max_value=dp_size - 1))
        if draw(st.booleans()):
            obj["priority"] = draw(st.integers(min_value=-MAX_PRIORITY, max_value=MAX_PRIORITY))
        if draw(st.booleans()):
            obj["prompt_text"] = draw(st.text(max_size=20))
        keys = list(obj)
        order = draw(st.permutations(keys))
        requests.append({k: obj[k] for k in order})
    return dp_size, requests


@FUZZ
@given(valid_traces(), st.sampled_from(["\n", "\r\n"]), st.booleans())
def test_valid_traces_round_trip(trace_path, generated, newline, blank_lines):
    dp_size, objs = generated
    lines = [json.dumps(o) for o in objs]
    if blank_lines:
        lines = [x for line in lines for x in (line, "  ")]
    trace_path.write_bytes(newline.join(lines).encode("utf-8"))
    requests, _ = load_outcome(trace_path, dp_size)
    assert requests is not None
    assert requests == [TraceRequest(o["request_id"], float(o["arrival_s"]), o["prompt_tokens"],
                                     o["output_tokens"], o.get("rank"), o.get("priority", 0))
                        for o in objs]
    assert [r.prompt_text for r in requests] == [o.get("prompt_text") for o in objs]
    assert all(isinstance(r.arrival_s, float) for r in requests)
    assert _ranks_fit(requests, dp_size)


BAD_VALUES = {
    "request_id": st.one_of(st.just(""), st.just("  "), st.integers(), st.none(),
                            st.lists(st.text(), max_size=1)),
    "arrival_s": st.one_of(st.floats(max_value=-1e-9), st.text(max_size=4), st.booleans(),
                           st.none(), st.floats(min_value=MAX_ARRIVAL_S * 1.5,
                                                allow_infinity=False),
                           st.integers(min_value=10**7)),
    "prompt_tokens": st.one_of(st.integers(max_value=0), st.integers(min_value=MAX_TOKENS + 1),
                               st.floats(), st.booleans(), st.text(max_size=3), st.none()),
    "output_tokens": st.one_of(st.integers(max_value=0), st.floats(min_value=1, max_value=9),
                               st.just("12"), st.just([1])),
    "rank": st.one_of(st.integers(max_value=-1), st.floats(), st.booleans(), st.none(),
                      st.just("0")),
    "priority": st.one_of(st.integers(min_value=MAX_PRIORITY + 1), st.floats(), st.just("1"),
                          st.booleans()),
    "prompt_text": st.one_of(st.integers(), st.none(), st.lists(st.text(), max_size=1)),
}


@FUZZ
@given(valid_traces(), st.data())
def test_one_bad_field_is_reported_on_its_line(trace_path, generated, data):
    dp_size, objs = generated
    index = data.draw(st.integers(min_value=0, max_value=len(objs) - 1))
    field = data.draw(st.sampled_from(FIELDS))
    value = data.draw(BAD_VALUES[field])
    if isinstance(value, float) and field == "arrival_s":
        assume(not (math.isfinite(value) and 0 <= value <= MAX_ARRIVAL_S))
    objs[index] = {**objs[index], field: value}
    trace_path.write_text("\n".join(json.dumps(o) for o in objs) + "\n")
    requests, problems = load_outcome(trace_path, dp_size)
    assert requests is None
    line = f"{trace_path}:{index + 1}: "
    assert any(p.startswith(line) and f"'{field}'" in p for p in problems), problems


@FUZZ
@given(valid_traces(), st.data())
def test_a_missing_field_or_a_duplicate_id_is_named(trace_path, generated, data):
    dp_size, objs = generated
    index = data.draw(st.integers(min_value=0, max_value=len(objs) - 1))
    if len(objs) > 1 and data.draw(st.booleans()):
        other = data.draw(st.integers(min_value=0, max_value=len(objs) - 1).filter(
            lambda i: i != index))
        objs[other] = {**objs[other], "request_id": objs[index]["request_id"]}
        expected = "duplicate id"
        line = max(index, other) + 1
    else:
        field = data.draw(st.sampled_from(REQUIRED_FIELDS))
        objs[index] = {k: v for k, v in objs[index].items() if k != field}
        expected = f"field '{field}': missing (required)"
        line = index + 1
    trace_path.write_text("\n".join(json.dumps(o) for o in objs) + "\n")
    requests, problems = load_outcome(trace_path, dp_size)
    assert requests is None
    assert any(p.startswith(f"{trace_path}:{line}: ") and expected in p for p in problems)
