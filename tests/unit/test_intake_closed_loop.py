"""Closed-loop intake (``emu.rank.intake.Arrivals`` with ``max_concurrency``), as pure logic:
which requests are due when, and with which send time, as finishes are reported."""

from __future__ import annotations

from emu.rank.intake import Arrivals
from emu.workload import TraceRequest


def trace(*arrivals: float) -> list[TraceRequest]:
    return [TraceRequest(f"r{i}", a, 16, 4) for i, a in enumerate(arrivals)]


def ids(taken) -> list[str]:
    return [request.request_id for request, _ in taken]


def test_without_a_limit_every_request_is_due_at_its_arrival_unchanged():
    requests = trace(0.0, 0.0, 0.5)
    arrivals = Arrivals(requests, "round_robin", 2)
    taken = arrivals.take(10, [(0, 0)] * 2)
    assert ids(taken) == ["r0", "r1"]
    assert [r for r, _ in taken] == requests[:2]  # the trace's objects, untouched
    assert arrivals.next_arrival_us() == 500_000


def test_a_limit_holds_back_requests_until_finishes_free_slots():
    arrivals = Arrivals(trace(0.0, 0.0, 0.0, 0.3), "round_robin", 2, max_concurrency=2)
    counts = [(0, 0)] * 2
    assert ids(arrivals.take(0, counts)) == ["r0", "r1"]
    assert not arrivals.due(10**9)  # both slots taken
    arrivals.finished(0, 40_000)
    assert not arrivals.due(10**9)
    arrivals.finished(1, 40_000)  # one slot frees at 0.04 s: r2 is sent then
    taken = arrivals.take(50_000, counts)
    assert ids(taken) == ["r2"] and taken[0][0].arrival_s == 0.04
    arrivals.finished(2, 60_000)  # r3 gets its slot at 0.06 s but arrives at 0.3 s
    assert not arrivals.due(299_999)
    taken = arrivals.take(300_000, counts)
    assert ids(taken) == ["r3"] and taken[0][0].arrival_s == 0.3
    assert arrivals.exhausted()


def test_a_stale_or_repeated_count_changes_nothing():
    arrivals = Arrivals(trace(0.0, 0.0), "round_robin", 2, max_concurrency=1)
    arrivals.take(0, [(0, 0)] * 2)
    arrivals.finished(1, 30_000)
    arrivals.finished(1, 90_000)  # the same finish, reported by a later step
    arrivals.finished(0, 100_000)
    assert arrivals.take(100_000, [(0, 0)] * 2)[0][0].arrival_s == 0.03


def test_nothing_in_flight_frees_every_slot_at_that_time():
    arrivals = Arrivals(trace(0.0, 0.0, 0.0), "round_robin", 2, max_concurrency=1)
    arrivals.take(0, [(0, 0)] * 2)
    arrivals.nothing_in_flight(70_000)  # the wave ended: r0 finished unreported
    assert arrivals.next_arrival_us() == 70_000
    assert ids(arrivals.take(70_000, [(0, 0)] * 2)) == ["r1"]
