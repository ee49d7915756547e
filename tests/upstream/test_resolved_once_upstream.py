"""One `dyntra-emu run --impl vllm-ascend` works out each input of its run once
(tests/call_counts.py): besides the kit's (tests/cli/test_cli_run.py), its
vllm-ascend tree is resolved once (one `git rev-parse`) and hashed once. Counted in the
command's process, which launches rank processes."""

from __future__ import annotations

import json

from tests.call_counts import RESOLVED_ONCE, TREE_RESOLVED_ONCE, count_calls
from tests.in_process import run_in_process
from tests.upstream.conftest import TREE

COUNTED = {**RESOLVED_ONCE, **TREE_RESOLVED_ONCE}
STATIC = {"scheduler_config": {"dyntra_lb_config": {"enabled": True, "mode": "static",
                                                    "start_step": 0}}}


def test_one_vllm_ascend_run_works_out_each_input_once(tmp_path, monkeypatch):
    trace = tmp_path / "tiny.jsonl"
    trace.write_text("".join(json.dumps({"request_id": f"r{i}", "arrival_s": 0.01 * i,
                                         "prompt_tokens": 40 + 150 * (i % 3),
                                         "output_tokens": 8 + 9 * (i % 4)}) + "\n"
                             for i in range(6)))
    calls = count_calls(monkeypatch, COUNTED, trace)
    proc = run_in_process(["run", "--workload", str(trace), "--dp", "2", "--block-size", "16",
                           "--num-gpu-blocks", "512", "--max-num-seqs", "4",
                           "--impl", "vllm-ascend", "--vllm-ascend", str(TREE),
                           "--additional-config", json.dumps(STATIC),
                           "--out", str(tmp_path / "out"), "--quiet"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert metrics["config"]["vllm_ascend_sha256"]
    assert {what: len(callers) for what, callers in calls.items()} == \
        dict.fromkeys(COUNTED, 1), calls
