"""Issue 3, property 5: an idle gap in the workload ends a wave at a 32-step sync, a
later arrival starts the next wave on every rank at the same virtual time, and the
plan is cleared at the wave end."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("dp_size", [2, 4])
def test_idle_gap_ends_wave_and_next_arrival_starts_one(shared_run, kit, dp_size):
    result = shared_run("static", dp_size)
    per_rank = [kit.steps(result, r) for r in range(dp_size)]
    wave_starts = []
    for rank, records in enumerate(per_rank):
        assert result.ranks[rank].waves == 2
        ends = [i for i, s in enumerate(records)
                if i + 1 < len(records) and records[i + 1]["wave"] != s["wave"]]
        assert len(ends) == 1
        end = records[ends[0]]
        nxt = records[ends[0] + 1]
        # The wave ended at a 32-step sync that found no unfinished request anywhere.
        assert end["step_counter"] % 32 == 0 and "engine.dp_sync" in kit.sites(end)
        assert end["wave"] == 0 and nxt["wave"] == 1
        assert end["step_counter"] > 32  # an earlier sync kept the wave running
        # The plan is cleared at the wave end: none made, none applied next.
        assert end["plan_generated"] is None and not end["lb_active"]
        assert not any(x.startswith("dyntra_lb") for x in kit.sites(end))
        assert nxt["plan_applied"] is None and nxt["step_counter"] == 1
        # Idle gap: nothing ran between the wave end and the next arrival, which
        # starts the new wave at its arrival time.
        assert end["clock_s"] + end["step_time_s"] < kit.SECOND_BURST_S
        assert nxt["clock_s"] == kit.SECOND_BURST_S
        wave_starts.append((ends[0] + 1, nxt["iter"]))
        # Every step of wave 0 after the last request finished anywhere was a dummy.
        wave0 = records[: ends[0] + 1]
        last_work = max(s["iter"] for r in per_rank for s in r[: ends[0] + 1]
                        if not s["dummy"])
        assert all(s["dummy"] for s in wave0 if s["iter"] > last_work)
        assert end["num_running"] == end["num_waiting"] == 0
        # The last wave ends the same way.
        assert records[-1]["step_counter"] % 32 == 0
        assert records[-1]["kv_held_blocks"] == 0
    assert len(set(wave_starts)) == 1  # same iteration on every rank
