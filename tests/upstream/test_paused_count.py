"""What "paused" counts. vllm-ascend PR #12292 split its GPQA run's 198 requests by
whether each was paused at least once (161 were). On a node the one record of a pause
that names the request is vllm-ascend's ``DYNTRA_LB_PAUSE request_id=...`` line
(``DyntraLBPolicyMixin._lb_pause_request``, diagnostics on); vLLM's own preemption
metrics are a count, not per request. ``pauses.requests_paused`` must count exactly the
requests those lines name, on vllm-ascend's code and on the kit. The run routes with
``--router vllm`` (vLLM's DP load balancer, emu/vllm_dp_lb.py): the kit and vllm-ascend
make it step for step the same (``dyntra-emu diff`` identical)."""

from __future__ import annotations

import json
import re

import pytest

from tests.upstream.conftest import REPO, TREE, dyntra_emu

pytestmark = pytest.mark.integration

PAUSE_LINE = re.compile(r"DYNTRA_LB_PAUSE request_id=(\S+)")


def test_requests_paused_counts_the_pause_lines_a_node_logs(tmp_path):
    lines = (REPO / "fixtures" / "workloads" / "longtail.jsonl").read_text().splitlines()[:24]
    # all at once, uneven outputs: 8 in flight on 2 ranks of 3 slots keeps queues waiting
    requests = [{**json.loads(line), "arrival_s": 0.0, "output_tokens": 8 + i * 37 % 60}
                for i, line in enumerate(lines)]
    trace = tmp_path / "longtail24.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in requests))
    lb = {"enabled": True, "mode": "static", "start_step": 0, "enable_diagnostics": True}
    proc = dyntra_emu("diff", "--workload", trace, "--dp", 2, "--block-size", 16,
                      "--max-num-seqs", 3, "--max-concurrency", 8, "--router", "vllm",
                      "--transport", "thread", "--device", "cpu", "--quiet",
                      "--vllm-ascend", TREE, "--additional-config",
                      json.dumps({"scheduler_config": {"dyntra_lb_config": lb}}),
                      "--out", tmp_path / "diff", "--json")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert json.loads(proc.stdout)["identical"]

    for side in ("a", "b"):  # a: the kit, b: vllm-ascend
        run_dir = tmp_path / "diff" / side
        metrics = json.loads((run_dir / "metrics.json").read_text())
        assert metrics["config"]["router"] == "vllm"
        logged = [m.group(1) for path in sorted(run_dir.glob("rank[0-9].log"))
                  for m in PAUSE_LINE.finditer(path.read_text())]
        pauses = metrics["pauses"]
        assert logged and pauses["total"] == len(logged)
        assert pauses["requests_paused"] == len(set(logged)) < len(requests)
        assert pauses["requests_paused_pct"] == pytest.approx(
            100 * len(set(logged)) / len(requests))
