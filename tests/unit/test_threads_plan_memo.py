"""``emu.cluster.thread_collectives.PlanMemo``, the plans the rank threads of a group
share: computed once per key, recomputed for a new key, untouched by a planner that
raises."""

from __future__ import annotations

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
