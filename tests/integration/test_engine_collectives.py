"""Issue 3, property 1: every rank issues the same ordered sequence of DP-group
collectives (and of lockstep collectives on the device group)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration

EXPECTED_SITES = {
    "static": {"engine.dp_sync", "dyntra_lb.allgather"},
    "dynamic": {"engine.dp_sync", "dyntra_lb.flag", "dyntra_lb.allgather"},
    "disabled": {"engine.dp_sync"},
}


@pytest.mark.parametrize("dp_size", [2, 4])
@pytest.mark.parametrize("name", sorted(EXPECTED_SITES))
def test_same_collective_sequence_on_every_rank(shared_run, kit, name, dp_size):
    result = shared_run(name, dp_size)
    per_rank = [kit.steps(result, r) for r in range(dp_size)]
    sequences = [kit.dp_collectives(s) for s in per_rank]
    for rank in range(1, dp_size):
        assert sequences[rank] == sequences[0], f"rank {rank} differs from rank 0"
    assert {site for _, site, *_ in sequences[0]} == EXPECTED_SITES[name]

    for rank, records in enumerate(per_rank):
        seqs = [c["seq"] for s in records for c in s["collectives"]]
        assert seqs == list(range(len(seqs))), f"rank {rank}: collective log has gaps"
        # One lockstep collective per non-idle iteration, first in the iteration.
        assert all(s["collectives"][0]["site"] == "engine.lockstep" for s in records)
        assert [c["site"] for s in records for c in s["collectives"]].count(
            "engine.lockstep") == len(records)
    lockstep = [[(s["iter"], s["step_time_s"]) for s in records] for records in per_rank]
    assert all(seq == lockstep[0] for seq in lockstep), "ranks disagree on the DP step time"
