"""``emu.cluster.thread_collectives.PlanMemo``, the plans the rank threads of a group
share: computed once per key, recomputed for a new key, untouched by a planner that
raises."""

from __future__ import annotations

import threading

import pytest

from emu.cluster.thread_collectives import PlanMemo


def test_the_same_key_is_computed_once_and_returns_the_same_plans():
    memo = PlanMemo()
    calls = []

    def compute():
        calls.append(1)
        return [object()]

    first = memo(("reference", b"\x01"), compute)
    assert memo(("reference", b"\x01"), compute) is first
    assert len(calls) == 1
    other = memo(("reference", b"\x02"), compute)
    assert other is not first and len(calls) == 2
    assert memo(("reference", b"\x01"), compute) is not first  # one entry: recomputed
    assert len(calls) == 3


def test_a_planner_error_reaches_the_caller_and_leaves_the_memo_as_it_was():
    memo = PlanMemo()
    plans = memo(("k", 1), lambda: ["plans"])

    def broken():
        raise ValueError("block counts too large")

    with pytest.raises(ValueError, match="too large"):
        memo(("k", 2), broken)
    assert memo(("k", 1), lambda: pytest.fail("recomputed")) is plans


def test_threads_asking_for_one_key_share_one_computation():
    memo = PlanMemo()
    calls = []
    start = threading.Barrier(8)
    results = [None] * 8

    def compute():
        calls.append(threading.current_thread().name)
        return ["plans"]

    def rank(r):
        start.wait()
        results[r] = memo(("snapshot",), compute)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1
    assert all(r is results[0] for r in results)
