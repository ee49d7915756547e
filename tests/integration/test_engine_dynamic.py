"""Issue 3, property 4: dynamic mode is inactive until a request longer than
long_req_block_threshold arrives, then plans for dynamic_max_step + 1 steps after the
last long request (docs/protocol.md, "Dynamic mode"), identically on every rank process."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration


def _intake_iteration(records, arrival_s):
    """The iteration whose input processing took a request arriving at arrival_s."""
    arrival_us = round(arrival_s * 1e6)
    return next(s["iter"] for s in records if round(s["clock_s"] * 1e6) >= arrival_us)


@pytest.mark.parametrize("dp_size", [2, 4])
def test_dynamic_timeline(shared_run, kit, dp_size):
    result = shared_run("dynamic", dp_size)
    per_rank = [kit.steps(result, r) for r in range(dp_size)]
    records = per_rank[0]
    a = {name: _intake_iteration(records, t) for name, t in kit.LONG_ARRIVALS.items()}
    # The trace is built so that long2 lands while long1's activation is still on,
    # and long3 well after the deactivation.
    assert a["long1"] < a["long2"] <= a["long1"] + kit.DYNAMIC_MAX_STEP
    assert a["long3"] > a["long2"] + kit.DYNAMIC_MAX_STEP + 1
    assert result.ranks[0].waves == 1  # no wave end inside the timeline

    # Expected (docs/protocol.md, "Dynamic mode"): plans at [A, A + dynamic_max_step]
    # after each activation,
    # extended by every long request that arrives while active; the flag all-reduce
    # runs whenever dynamic balancing was off at the start of the iteration.
    windows = [(a["long1"], a["long2"] + kit.DYNAMIC_MAX_STEP),
               (a["long3"], a["long3"] + kit.DYNAMIC_MAX_STEP)]
    wave_end = records[-1]["iter"]
    for rank, rank_records in enumerate(per_rank):
        for s in rank_records:
            i = s["iter"]
            planning = any(lo <= i <= hi for lo, hi in windows)
            enabled_before = any(lo < i <= hi for lo, hi in windows)
            where = f"rank {rank} iter {i}"
            assert (s["plan_generated"] is not None) == planning, where
            assert s["lb_active"] == planning, where
            dyntra = [x for x in kit.sites(s) if x.startswith("dyntra_lb")]
            if i == wave_end:
                assert dyntra == [], where
            elif planning and not enabled_before:
                assert dyntra == ["dyntra_lb.flag", "dyntra_lb.allgather"], where
            elif planning:
                assert dyntra == ["dyntra_lb.allgather"], where
            else:
                assert dyntra == ["dyntra_lb.flag"], where
    total_plans = sum(hi - lo + 1 for lo, hi in windows)
    assert [s.num_plans for s in result.ranks] == [total_plans] * dp_size
