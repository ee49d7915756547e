"""The pytest fixture reads the field's trace formats as the CLI does: format detected,
a window of the trace replayed faster."""

from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parents[1] / "data" / "traces"


@pytest.mark.dp(2)
def test_the_fixture_replays_a_window_of_a_mooncake_trace(dyntra_cluster):
    run = dyntra_cluster(workload=DATA / "mooncake.jsonl", window=(0.04, 0.2), limit=4,
                         time_scale=0.5, transport="thread", block_size=16,
                         num_gpu_blocks=512, max_num_seqs=4)
    arrivals = sorted((r["request_id"], r["arrival_s"]) for r in run.requests())
    assert arrivals == [("mooncake-4", 0.0), ("mooncake-5", 0.0), ("mooncake-6", 0.02),
                        ("mooncake-7", 0.04)]
    assert run.metrics["config"]["workload"] == (f"{DATA / 'mooncake.jsonl'} "
                                                 "(window 0.04:0.2, limit 4, time-scale 0.5)")
