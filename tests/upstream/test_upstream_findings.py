"""vllm-ascend behaviour that surprises, shown through ``--impl vllm-ascend`` on the
smallest trace we found for it (docs/upstream-findings.md, "Findings in vllm-ascend").
Our kit reproduces each one; the tests fail when vllm-ascend's behaviour changes."""

from __future__ import annotations

import dataclasses
import json
import pathlib

import pytest

from emu.cluster.supervision import ClusterError
from emu.rank.costs import PROFILES
from emu.run import run_cluster
from emu.spec import RunSpec
from emu.workload import TraceRequest
from tests.records import events
from tests.upstream.conftest import TREE, dyntra_emu

pytestmark = pytest.mark.integration

# Three requests pinned to rank 0 (rank 1 stays empty), KV for one long request only.
KV_STALL_TRACE = [("r0", 12, 18), ("r1", 4, 4), ("r2", 9, 16)]
KV_STALL_FLAGS = ["--dp", 2, "--block-size", 4, "--num-gpu-blocks", 8, "--max-num-seqs", 2,
                  "--stall-steps", 30, "--device", "cpu", "--quiet"]
STATIC = {"scheduler_config": {"dyntra_lb_config": {
    "enabled": True, "mode": "static", "start_step": 0}}}


def _kv_stall_trace(path: pathlib.Path) -> pathlib.Path:
    path.write_text("".join(json.dumps({"request_id": rid, "arrival_s": 0.0,
                                        "prompt_tokens": p, "output_tokens": o, "rank": 0})
                            + "\n" for rid, p, o in KV_STALL_TRACE))
    return path


# The blocks the paused request holds: under async scheduling its last step, in flight
# when it was paused, had allocated a slot one block further.
PAUSED_KV = {False: 5, True: 6}


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_a_kv_tight_rank_stops_for_good_with_its_kv_held_by_a_paused_request(tmp_path,
                                                                             async_scheduling):
    """The planner pauses rank 0's only running request (its KV stays allocated) and asks
    for two waiting ones by block count; the first in schedule order is a preempted
    request whose recompute needs more blocks than are free, so vLLM's waiting loop stops
    there, every step. The paused request, the one that could run, is never in a plan
    again: no token is scheduled until the stall check ends the run. The kit does the
    same, step for step, with vLLM's synchronous and its async scheduling."""
    trace = _kv_stall_trace(tmp_path / "kv_stall.jsonl")
    proc = dyntra_emu("diff", "--workload", trace, *KV_STALL_FLAGS, "--vllm-ascend", TREE,
                      "--additional-config", json.dumps(STATIC), "--out", tmp_path / "diff",
                      "--json", "--transport", "thread",
                      "--async-scheduling" if async_scheduling else "--no-async-scheduling")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["identical"]
    for failure in report["failures"]:
        assert failure.startswith("rank 0 failed: emu.rank.context.StallError: rank 0 is stuck: "
                                  "3 unfinished request(s) but no token scheduled for 30 "
                                  "steps"), failure
        assert "r0 (PREEMPTED, DyntraLB-paused)" in failure
    steps = [s for s in events(tmp_path / "diff" / "b", 0) if s["kind"] == "step"]
    last = max(s["iter"] for s in steps if s["scheduled_tokens"])
    stuck = [s for s in steps if s["iter"] > last]
    assert len(stuck) == 30 - 1  # the 30th step without a token raised before it was logged
    assert all(s["paused_kv_blocks"] == {"r0": PAUSED_KV[async_scheduling]}
               and s["num_running"] == 0
               and s["plan_applied"]["in_blk"] and not s["admitted"] for s in stuck)


def test_without_dyntra_lb_the_kv_stall_trace_finishes(tmp_path):
    """The same trace and engine settings, DyntraLB off: vLLM alone preempts and
    recomputes, and every request finishes."""
    trace = [TraceRequest(rid, 0.0, p, o, rank=0) for rid, p, o in KV_STALL_TRACE]
    spec = RunSpec(trace=trace, dp_size=2, out_dir=tmp_path, block_size=4, num_gpu_blocks=8,
                   max_num_seqs=2, stall_steps=30, device="cpu", impl="vllm-ascend",
                   vllm_ascend=str(TREE), run_timeout_s=600.0)
    result = run_cluster(spec)
    assert sum(r.num_finished for r in result.ranks) == len(KV_STALL_TRACE)


def test_the_recompute_scheduler_fails_at_the_first_verified_draft(tmp_path):
    """vllm-ascend's recompute scheduler reads ``request.async_tokens_to_discard`` when a
    step verified drafts, an attribute vLLM 0.27.1's ``Request`` does not have: with MTP
    (DyntraLB off, vLLM's default async scheduling; synchronous alike, docs/upstream-
    findings.md) the run fails at the first decode step, naming
    the attribute and vllm-ascend's line. Without drafts the same run finishes."""
    trace = [TraceRequest("r0", 0.0, 20, 8, rank=0)]
    spec = RunSpec(trace=trace, dp_size=2, out_dir=tmp_path / "mtp", block_size=4,
                   num_gpu_blocks=64, max_num_seqs=2, device="cpu", impl="vllm-ascend",
                   vllm_ascend=str(TREE), run_timeout_s=600.0,
                   additional_config={"scheduler_config": {"recompute_scheduler_enable": True}},
                   cost_model=PROFILES["kv-token-mtp3"])
    with pytest.raises(ClusterError) as failed:
        run_cluster(spec)
    error = failed.value
    assert error.rank == 0
    assert error.message == ("AttributeError: 'Request' object has no attribute "
                             "'async_tokens_to_discard'")
    assert "vllm_ascend/core/recompute_scheduler.py" in error.details[0]
    plain = run_cluster(dataclasses.replace(spec, out_dir=tmp_path / "plain",
                                            cost_model=PROFILES["kv-token"]))
    assert sum(r.num_finished for r in plain.ranks) == 1
