"""``emu.run.join_cluster`` under torchrun: each rank process runs its part of the
cluster (strict mode on; the guard records into private memory, as there is no launcher
to read it) and returns its summary, with the device it used, and with no gloo thread
left running (one still running when the process exits can abort it, SIGABRT)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.integration

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_join_cluster_runs_one_rank_per_torchrun_process(tmp_path):
    script = tmp_path / "rank.py"
    script.write_text(textwrap.dedent(f"""
        import dataclasses, json, os, sys
        sys.path.insert(0, {ROOT!r})
        from emu.spec import RunSpec
        from emu.run import join_cluster
        from emu.workload import TraceRequest

        trace = [TraceRequest(f"r{{i}}", 0.01 * i, 40 + 30 * i, 5 + i % 7) for i in range(12)]
        config = {{"scheduler_config": {{"dyntra_lb_config": {{
            "enabled": True, "mode": "static", "start_step": 0}}}}}}
        summary = join_cluster(RunSpec(trace=trace, dp_size=2, out_dir={str(tmp_path)!r},
                                       additional_config=config, max_num_seqs=4,
                                       block_size=16, device="cpu", strict=True,
                                       collective_timeout_s=60.0))
        threads = [open(f"/proc/self/task/{{t}}/comm").read().strip()
                   for t in os.listdir("/proc/self/task")]
        with open(f"{tmp_path}/summary{{summary.rank}}.json", "w") as f:
            json.dump({{**dataclasses.asdict(summary), "threads": threads}}, f)
    """))
    run = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         "--log-dir", str(tmp_path / "torchrun"), str(script)],
        timeout=180, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    summaries = [json.loads((tmp_path / f"summary{r}.json").read_text()) for r in (0, 1)]
    assert [s["rank"] for s in summaries] == [0, 1]
    assert sum(s["num_finished"] for s in summaries) == 12
    assert summaries[0]["num_plans"] > 0
    # both ranks issued the same collectives (recorded, and in the event logs)
    assert summaries[0]["num_collectives"] == summaries[1]["num_collectives"] > 0
    # gloo's threads (names "gloo_tcp_loop", "pt_gloo_runloop") ended with the groups
    assert [[t for t in s["threads"] if "gloo" in t] for s in summaries] == [[], []]
