"""``--split``'s pure parts: where a trace is cut (emu/split/windows.py) and the windows'
runs stitched (emu/split/stitch.py), on hand-written records; every expected figure is
worked out by hand in the comments."""

import pytest

from emu.metrics import Run
from emu.split.stitch import StitchError, measured_metrics, stitch
from emu.split.windows import MAX_WINDOWS, Window, cut
from emu.workload import TraceRequest
from tests.unit.test_metrics import request, step

approx = pytest.approx


def _trace(arrivals):
    return [TraceRequest(f"r{i}", t, 100, 10) for i, t in enumerate(arrivals)]


# ------------------------------------------------------------------------------ windows

def test_windows_hold_equal_shares_of_the_requests_and_own_each_once():
    trace = _trace([i * 0.5 for i in range(100)])[::-1]  # any order in, arrival order out
    windows = cut(trace, 4, warmup_s=2.0)
    assert [len(w.owned) for w in windows] == [25, 25, 25, 25]
    owned = [r.request_id for w in windows for r in w.owned]
    assert sorted(owned) == sorted(r.request_id for r in trace)
    assert [w.start_s for w in windows] == [0.0, 12.5, 25.0, 37.5]
    assert [w.end_s for w in windows] == [12.5, 25.0, 37.5, None]
    # the warm-up: what arrived in the 2 s before the window (10.5, 11, 11.5, 12 for w1)
    assert windows[0].warmup == ()
    assert [r.arrival_s for r in windows[1].warmup] == [10.5, 11.0, 11.5, 12.0]
    # the cool-down: what arrives in the 2 s after it (12.5 to 14 for w0); none after the
    # last window
    assert [r.arrival_s for r in windows[0].cooldown] == [12.5, 13.0, 13.5, 14.0]
    assert windows[3].cooldown == ()
    assert [r.request_id for r in windows[1].trace] == [f"r{i}" for i in range(21, 54)]


def test_requests_arriving_together_stay_in_one_window():
    # the cut would fall between two requests of the same microsecond: both go later
    trace = _trace([0.0, 1.0, 2.0, 2.0, 3.0, 4.0])
    windows = cut(trace, 2, warmup_s=0.0)
    assert [[r.arrival_s for r in w.owned] for w in windows] == [[0.0, 1.0],
                                                                 [2.0, 2.0, 3.0, 4.0]]


def test_a_warmup_longer_than_the_trace_replays_all_of_it_in_every_window():
    windows = cut(_trace([0.0, 1.0, 2.0, 3.0]), 2, warmup_s=100.0)
    for window in windows:
        assert [r.request_id for r in window.trace] == ["r0", "r1", "r2", "r3"]
    assert [[r.request_id for r in w.owned] for w in windows] == [["r0", "r1"], ["r2", "r3"]]


@pytest.mark.parametrize("arrivals, windows, warmup, message", [
    ([0.0, 1.0], 0, 0.0, "0 windows: expected 1 to"),
    ([0.0, 1.0], MAX_WINDOWS + 1, 0.0, "expected 1 to"),
    ([0.0, 1.0], 2, -1.0, "warm-up -1.0 s"),
    ([0.0, 1.0], 2, float("nan"), "warm-up nan s"),
    ([], 2, 0.0, "an empty trace"),
    ([0.0, 0.0, 0.0, 1.0], 2, 0.0, "cannot be cut into 2 windows"),
    ([0.0, 1.0, 2.0], 4, 0.0, "cannot be cut into 4 windows"),
])
def test_a_split_that_would_leave_a_window_empty_is_refused(arrivals, windows, warmup,
                                                            message):
    with pytest.raises(ValueError, match=message):
        cut(_trace(arrivals), windows, warmup)


# ------------------------------------------------------------------------------- stitch

# Two windows of a dp-2 trace of two requests: A arrives at 0.1 (window 0), B at 1.2
# (window 1, from 1.0). Window 0's run replays A; its steps from 1.0 on are its drain,
# not measured. Window 1's run replays A as warm-up, then B; its steps before 1.0 are the
# warm-up, not measured; as the last window it is measured to its run's end (1.6 + 0.5).
WINDOW0 = (
    [step(0, 0, 0.0, 0.2, 0.5, 10), step(0, 1, 0.5, 0.5, 0.5, 10),
     step(0, 2, 1.0, 0.1, 0.5, 10), step(0, 3, 1.5, 0.3, 0.5, 0)],
    [step(1, 0, 0.0, 0.5, 0.5, 20), step(1, 1, 0.5, 0.1, 0.5, 5),
     step(1, 2, 1.0, 0.5, 0.5, 0), step(1, 3, 1.5, 0.5, 0.5, 0)],
    [request(0, "A", 0.1, 0.1, [0.5, 0.9, 1.2, 1.6], 1.6)],
)
WINDOW1 = (
    [step(0, 0, 0.1, 0.5, 0.5, 10), step(0, 1, 0.6, 0.5, 0.5, 10),
     step(0, 2, 1.1, 0.25, 0.5, 30), step(0, 3, 1.6, 0.5, 0.5, 30)],
    [step(1, 0, 0.1, 0.5, 0.5, 10), step(1, 1, 0.6, 0.2, 0.5, 10),
     step(1, 2, 1.1, 0.5, 0.5, 10), step(1, 3, 1.6, 0.0, 0.5, 0)],
    [request(0, "A", 0.1, 0.1, [0.6, 1.1, 1.3], 1.3, pauses=[(0.7, 0.9)]),  # warm-up
     request(1, "B", 1.2, 1.2, [1.3, 1.5, 2.0], 2.0, pauses=[(1.6, 1.8)])],
)


def _parts():
    a, b = TraceRequest("A", 0.1, 100, 4), TraceRequest("B", 1.2, 100, 3)
    windows = [Window(0, 0.0, 1.0, (), (a,)), Window(1, 1.0, None, (a,), (b,))]
    runs = [Run.from_records(2, [r0, r1], reqs) for r0, r1, reqs in (WINDOW0, WINDOW1)]
    return list(zip(windows, runs, strict=True))


def test_the_stitch_keeps_the_measured_steps_and_the_owned_requests():
    measured = stitch(_parts(), last=1)
    run = measured.run
    # steps: window 0's at 0.0 and 0.5, window 1's at 1.1 and 1.6, numbered again
    assert run.steps[0].clock_s.tolist() == [0.0, 0.5, 1.1, 1.6]
    assert run.steps[1].own_cost_s.tolist() == [0.5, 0.1, 0.5, 0.0]
    assert run.steps[0].iter.tolist() == [0, 1, 2, 3]
    # requests: A from window 0 (its 4 tokens), B from window 1; A's warm-up copy is not
    assert run.requests.table["request_id"].to_pylist() == ["A", "B"]
    assert run.requests.token_counts.tolist() == [4, 3]
    # tokens inside the spans: A's 0.5 and 0.9 in [0, 1); A's copy at 1.1 and 1.3 and
    # B's three in [1, end)
    assert measured.tokens == 7
    # spans: [0, 1) and [1, 2.1)
    assert measured.span_s == approx(2.1)


def test_the_stitched_metrics_are_computed_over_the_measured_parts():
    metrics, _ = measured_metrics(_parts(), last=1)
    assert metrics["steps"] == 4
    assert metrics["requests_total"] == 2 and metrics["requests_finished"] == 2
    assert metrics["output_tokens"] == 7  # A's 4 + B's 3, each once
    assert metrics["virtual_time_s"] == approx(2.1)
    assert metrics["throughput_tok_s"] == approx(7 / 2.1)
    # waiting: window 0 (0.3 + 0.0) + (0.0 + 0.4), window 1 (0.25 + 0.0) + (0.0 + 0.5),
    # over 2 ranks x 4 steps x 0.5 s
    assert metrics["bubble_ratio"] == approx(1.45 / 4.0)
    assert metrics["busy_time_s"] == approx(2.0)
    # TTFT: A 0.5 - 0.1, B 1.3 - 1.2; TPOT: A (1.6 - 0.5) / 3, B (2.0 - 1.3) / 2
    assert metrics["ttft_ms"]["max"] == approx(400.0)
    assert metrics["ttft_ms"]["p50"] == approx(250.0)
    assert metrics["tpot_ms"]["mean"] == approx((1100 / 3 + 350) / 2)
    # pauses: B's one (0.2 s); A's warm-up copy's pause is not A's
    assert metrics["pauses"]["total"] == 1
    assert metrics["pauses"]["requests_paused_pct"] == approx(50.0)
    assert metrics["pauses"]["longest_paused_ms"] == approx(200.0)
    # balance over the measured steps: (10+20)/2/20, (10+5)/2/10, (30+10)/2/30, 30/2/30
    assert metrics["balance_ratio"] == approx((0.75 + 0.75 + 2 / 3 + 0.5) / 4)


def test_a_window_whose_run_lost_an_owned_request_is_named():
    parts = _parts()
    window, run = parts[1]
    parts[1] = (window, Run.from_records(2, list(WINDOW1[:2]), WINDOW1[2][:1]))
    with pytest.raises(StitchError, match=r"window 1 \(1 requests .*recorded 0 of its 1"):
        stitch(parts, last=1)
