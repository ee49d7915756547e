"""The DP sync cadence (emu/rank/dp_sync.py) in a running kit cluster: under vLLM
0.27.1's (the default) a wave ends only on a 32nd step; under vLLM >= 0.30's
(``dp_sync_interval`` N) on its first step or a multiple of N, where the all-reduce
runs, and on no other step."""

from __future__ import annotations

import pytest

from emu.rank.dp_sync import syncs
from emu.run import run_cluster
from emu.sites import DP_SYNC_SITE
from emu.spec import RunSpec
from emu.workload import TraceRequest

pytestmark = pytest.mark.integration

# Three bursts of short requests far apart: three waves, each a few steps long.
TRACE = [*(TraceRequest(f"a{i}", 0.0, 16, 5 + i, rank=i % 2) for i in range(4)),
         TraceRequest("b0", 5.0, 16, 1, rank=0), TraceRequest("b1", 5.0, 16, 1, rank=1),
         *(TraceRequest(f"c{i}", 10.0, 16, 9, rank=i % 2) for i in range(2))]


def _steps(tmp_path, interval: int | None) -> list[list[dict]]:
    run = run_cluster(RunSpec(trace=TRACE, dp_size=2, out_dir=tmp_path / str(interval),
                              block_size=16, device="cpu", transport="thread",
                              dp_sync_interval=interval, additional_config={}))
    return [[r for r in run.events(rank) if r["kind"] == "step"]
            for rank in range(len(run.ranks))]


@pytest.mark.parametrize("interval", [None, 4])
def test_waves_end_only_where_the_cadence_syncs(tmp_path, interval):
    per_rank = _steps(tmp_path, interval)
    for records in per_rank:
        wave_ends = [s for i, s in enumerate(records)
                     if i + 1 == len(records) or records[i + 1]["wave"] != s["wave"]]
        assert len(wave_ends) == 3
        for step in records:
            synced = any(c["site"] == DP_SYNC_SITE for c in step["collectives"])
            assert synced == syncs(step["step_counter"], interval), step["step_counter"]
        assert all(syncs(s["step_counter"], interval) for s in wave_ends)
        counters = [s["step_counter"] for s in wave_ends]
        if interval is None:
            assert counters == [32, 32, 32]
        else:
            # each wave ends at the first sync after its last token, long before step 32
            assert max(counters) < 32
            assert all(s["step_counter"] != 1 or any(
                c["site"] == DP_SYNC_SITE for c in s["collectives"]) for s in records)
