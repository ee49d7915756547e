"""Closed-loop clients (``--max-concurrency``) on vllm-ascend's ranks: vLLM's scheduler
never holds more than the limit across the instance, sends wait for finishes, and the
kit makes the same run step for step (``dyntra-emu diff`` identical)."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from tests.records import events
from tests.upstream.conftest import REPO, TREE, dyntra_emu

pytestmark = pytest.mark.integration

LIMIT = 3


def test_the_limit_holds_on_vllm_ascend_and_matches_the_kit(tmp_path):
    lines = (REPO / "fixtures" / "workloads" / "uniform.jsonl").read_text().splitlines()[:16]
    requests = [{**json.loads(line), "output_tokens": 12} for line in lines]
    trace = tmp_path / "uniform16.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in requests))
    lb = {"enabled": True, "mode": "static", "start_step": 0, "enable_diagnostics": True}
    proc = dyntra_emu("diff", "--workload", trace, "--dp", 2, "--block-size", 16,
                      "--max-num-seqs", 4, "--max-concurrency", LIMIT, "--device", "cpu",
                      "--quiet", "--vllm-ascend", TREE, "--additional-config",
                      json.dumps({"scheduler_config": {"dyntra_lb_config": lb}}),
                      "--out", tmp_path / "diff", "--json")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["identical"] and report["counts"]["requests"] == len(requests)

    held, sent = Counter(), {}
    run_dir = tmp_path / "diff" / "b"
    for rank in range(len(list(run_dir.glob("rank*.steps")))):
        for record in events(run_dir, rank):
            if record["kind"] == "step":
                held[record["iter"]] += record["num_running"] + record["num_waiting"]
            else:
                sent[record["request_id"]] = record["arrival_s"]
    assert max(held.values()) == LIMIT
    arrival = {r["request_id"]: r["arrival_s"] for r in requests}
    late = [rid for rid in arrival if sent[rid] > arrival[rid] + 1e-6]
    assert len(late) >= len(requests) // 2  # most requests waited for a slot
