"""Trace loading/validation and request routing (emu.workload)."""

import json

import pytest

from emu.spec import RunSpec, SpecError, check
from emu.workload import (
    MAX_TOKENS,
    TraceError,
    TraceRequest,
    arrival_us,
    load_trace,
    make_router,
    validate_trace,
)


def _req(i, arrival=0.0, **extra):
    obj = {"request_id": f"r{i}", "arrival_s": arrival, "prompt_tokens": 100,
           "output_tokens": 10}
    obj.update(extra)
    return obj


def _write(tmp_path, lines, name="t.jsonl"):
    path = tmp_path / name
    text = "\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines)
    path.write_text(text + "\n")
    return path


def test_load_valid_trace_with_optional_fields(tmp_path):
    path = _write(tmp_path, [
        _req(0, 0.0),
        "",
        "   ",
        _req(1, 0.5, rank=1, priority=-3, prompt_text="hello"),
        _req(2, 0.5),
    ])
    trace = load_trace(path)
    assert [r.request_id for r in trace] == ["r0", "r1", "r2"]
    assert trace[1] == TraceRequest("r1", 0.5, 100, 10, rank=1, priority=-3)
    assert trace[1].prompt_text == "hello"
    assert trace[0].rank is None and trace[0].priority == 0
    assert isinstance(trace[0].arrival_s, float)
    assert validate_trace(path) == []


def test_arrival_us_rounds_to_integer_microseconds():
    req = TraceRequest("a", 1.0000004, 1, 1)
    assert arrival_us(req) == 1_000_000
    assert arrival_us(TraceRequest("b", 0.0000015, 1, 1)) == 2
    assert isinstance(arrival_us(req), int)


@pytest.mark.parametrize(
    "field,value,expect",
    [
        ("request_id", "", "field 'request_id': expected a non-empty string"),
        ("request_id", 7, "field 'request_id': expected a non-empty string"),
        ("arrival_s", -1, "field 'arrival_s': expected a finite number >= 0"),
        ("arrival_s", True, "field 'arrival_s': expected a finite number >= 0"),
        ("arrival_s", "1.0", "field 'arrival_s': expected a finite number >= 0"),
        ("arrival_s", 2e6, "field 'arrival_s': expected at most"),
        ("prompt_tokens", 0, "field 'prompt_tokens': expected an integer >= 1, got 0"),
        ("prompt_tokens", 3.0, "field 'prompt_tokens': expected an integer >= 1, got 3.0"),
        ("output_tokens", True, "field 'output_tokens': expected an integer >= 1, got true"),
        ("output_tokens", None, "field 'output_tokens': expected an integer >= 1, got null"),
        ("output_tokens", MAX_TOKENS + 1,
         "field 'output_tokens': expected at most 10,000,000 tokens, got 10000001"),
        ("rank", -1, "field 'rank': expected an integer >= 0"),
        ("rank", None, "field 'rank': expected an integer >= 0"),
        ("rank", False, "field 'rank': expected an integer >= 0"),
        ("priority", 1.5, "field 'priority': expected an integer"),
        ("priority", True, "field 'priority': expected an integer"),
        ("prompt_text", 5, "field 'prompt_text': expected a string"),
    ],
)
def test_bad_field_is_named_with_file_and_line(tmp_path, field, value, expect):
    path = _write(tmp_path, [_req(0), _req(1, **{field: value})])
    problems = validate_trace(path)
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"{path}:2: {expect}")
    with pytest.raises(TraceError) as info:
        load_trace(path)
    assert f"{path}:2:" in str(info.value)
    assert info.value.problems == problems


def test_nan_and_infinity_rejected(tmp_path):
    path = _write(tmp_path, [
        '{"request_id": "a", "arrival_s": NaN, "prompt_tokens": 1, "output_tokens": 1}',
        '{"request_id": "b", "arrival_s": Infinity, "prompt_tokens": 1, "output_tokens": 1}',
    ])
    problems = validate_trace(path)
    assert [p.split(": field")[0] for p in problems] == [f"{path}:1", f"{path}:2"]
    assert all("finite number" in p for p in problems)


def test_huge_numbers_are_reported_not_crashed_on(tmp_path):
    path = _write(tmp_path, [
        '{"request_id": "a", "arrival_s": 1' + "0" * 400 + ', "prompt_tokens": 1, '
        '"output_tokens": 1}',
        '{"request_id": "b", "arrival_s": 0, "prompt_tokens": 1' + "0" * 5000 + ', '
        '"output_tokens": 1}',
        '{"request_id": "c", "arrival_s": 0, "prompt_tokens": 1e400, "output_tokens": 1}',
    ])
    problems = validate_trace(path)
    assert problems[0].startswith(f"{path}:1: field 'arrival_s': expected at most 1e+06 "
                                  "seconds, got 1000")
    assert "0... (a number)" in problems[0]  # shortened, not 401 digits
    assert problems[1] == f"{path}:2: invalid JSON: a number has too many digits"
    assert problems[2].startswith(f"{path}:3: field 'prompt_tokens': expected an integer")
    assert len(problems) == 3


def test_missing_and_unknown_fields(tmp_path):
    path = _write(tmp_path, [{"request_id": "a", "arrival_s": 0, "prompt_tokens": 3,
                              "prompt": "x"}])
    problems = validate_trace(path)
    assert f"{path}:1: unknown field(s) ['prompt']" in problems[0]
    assert problems[1] == f"{path}:1: field 'output_tokens': missing (required)"
    assert len(problems) == 2


def test_json_syntax_and_non_object_lines(tmp_path):
    path = _write(tmp_path, [_req(0), '{"request_id": "x",', "[1, 2]", "42"])
    problems = validate_trace(path)
    assert problems[0].startswith(f"{path}:2: invalid JSON:")
    assert problems[1] == f"{path}:3: expected a JSON object per line, got an array"
    assert problems[2] == f"{path}:4: expected a JSON object per line, got a number"


def test_invalid_utf8_line(tmp_path):
    path = tmp_path / "bin.jsonl"
    path.write_bytes(json.dumps(_req(0)).encode() + b"\n\xff\xfe\n")
    problems = validate_trace(path)
    assert len(problems) == 1 and problems[0].startswith(f"{path}:2: not valid UTF-8")


def test_duplicate_ids_name_both_lines(tmp_path):
    path = _write(tmp_path, [_req(0), _req(1), _req(0, 1.0)])
    assert validate_trace(path) == [
        f"{path}:3: field 'request_id': duplicate id 'r0' (first used on line 1)"
    ]


def test_unsorted_arrivals_name_both_lines(tmp_path):
    path = _write(tmp_path, [_req(0, 0.0), _req(1, 2.0), _req(2, 1.0), _req(3, 1.0)])
    problems = validate_trace(path)
    assert problems == [
        f"{path}:3: field 'arrival_s': arrivals must be non-decreasing, got 1.0 after 2.0 "
        "on line 2"
    ]


def test_every_problem_is_collected(tmp_path):
    path = _write(tmp_path, [_req(i, prompt_tokens=0) for i in range(30)])
    problems = validate_trace(path)
    assert len(problems) == 30
    with pytest.raises(TraceError) as info:
        load_trace(path)
    assert len(info.value.problems) == 30
    assert "... and 10 more problem(s)" in str(info.value)


@pytest.mark.parametrize("content", ["", "\n\n  \n"])
def test_empty_trace_is_an_error(tmp_path, content):
    path = tmp_path / "empty.jsonl"
    path.write_text(content)
    assert validate_trace(path) == [
        f"{path}: trace is empty (expected at least one request line)"
    ]
    with pytest.raises(TraceError, match="trace is empty"):
        load_trace(path)


def test_unreadable_path(tmp_path):
    assert validate_trace(tmp_path / "nope.jsonl") == [
        f"{tmp_path / 'nope.jsonl'}: cannot read trace: No such file or directory"
    ]
    with pytest.raises(TraceError, match="cannot read trace"):
        load_trace(tmp_path)


def test_pinned_rank_checked_against_dp_size(tmp_path):
    path = _write(tmp_path, [_req(0, rank=3), _req(1, rank=4)])
    assert validate_trace(path, dp_size=4) == [
        f"{path}:2: field 'rank': expected an integer in 0..3 for dp_size=4, got 4"
    ]
    # A trace loaded without the DP size: the RunSpec's check holds it against dp_size.
    trace = load_trace(path)
    check(RunSpec(trace=trace, dp_size=5, out_dir=tmp_path))
    with pytest.raises(SpecError) as info:
        check(RunSpec(trace=trace, dp_size=4, out_dir=tmp_path))
    [problem] = info.value.problems
    assert str(problem) == ("RunSpec.trace[1]: field 'rank': expected an integer in 0..3 for "
                            "dp_size=4, got 4")
    with pytest.raises(SpecError) as info:
        check(RunSpec(trace=trace, dp_size=0, out_dir=tmp_path))
    [problem] = info.value.problems
    assert str(problem) == "RunSpec.dp_size: must be an int >= 1, got 0"


def _unpinned(i):
    return TraceRequest(f"r{i}", 0.0, 1, 1)


def test_round_robin_skips_pinned_requests():
    router = make_router("round_robin", 3)
    pinned = TraceRequest("p", 0.0, 1, 1, rank=2)
    got = [router.route(r) for r in
           [_unpinned(0), pinned, _unpinned(1), _unpinned(2), pinned, _unpinned(3)]]
    assert got == [0, 2, 1, 2, 2, 0]


def test_least_loaded_score_and_ties():
    router = make_router("least_loaded", 3)
    # scores: 1*4+0=4, 0*4+3=3, 0*4+3=3 -> rank 1 (lowest index among ties)
    assert router.route(_unpinned(0), [(1, 0), (0, 3), (0, 3)]) == 1
    # local copy now (1,0),(1,3),(0,3): scores 4, 7, 3 -> rank 2
    assert router.route(_unpinned(1), [(1, 0), (0, 3), (0, 3)]) == 2
    # (1,0),(1,3),(1,3): 4, 7, 7 -> rank 0
    assert router.route(_unpinned(2), [(1, 0), (0, 3), (0, 3)]) == 0


def test_least_loaded_burst_spreads_and_rebases_on_new_counts():
    router = make_router("least_loaded", 4)
    assert [router.route(_unpinned(i), None) for i in range(6)] == [0, 1, 2, 3, 0, 1]
    # new counts from the next step replace the local copy
    assert router.route(_unpinned(6), [(0, 5), (0, 1), (0, 2), (0, 1)]) == 1
    assert router.route(_unpinned(7), [(0, 5), (0, 1), (0, 2), (0, 1)]) == 3


def test_least_loaded_pinned_request_does_not_count():
    router = make_router("least_loaded", 2)
    pinned = TraceRequest("p", 0.0, 1, 1, rank=0)
    counts = [(0, 0), (0, 0)]
    assert router.route(pinned, counts) == 0
    assert router.route(_unpinned(0), counts) == 0


def test_routers_are_deterministic_across_instances():
    counts = [(2, 1), (0, 4), (1, 1)]
    reqs = [_unpinned(i) for i in range(10)]
    for name in ("round_robin", "least_loaded", "vllm"):
        a, b = make_router(name, 3), make_router(name, 3)
        assert [a.route(r, counts) for r in reqs] == [b.route(r, counts) for r in reqs]


def test_make_router_errors():
    with pytest.raises(ValueError, match=r"unknown router 'random'; expected one of "
                                         r"\['round_robin', 'least_loaded', 'vllm'\]"):
        make_router("random", 2)
    with pytest.raises(ValueError, match="dp_size"):
        make_router("round_robin", 0)
    with pytest.raises(ValueError, match="expected counts for 2 ranks, got 3"):
        make_router("least_loaded", 2).route(_unpinned(0), [(0, 0)] * 3)
