"""Async scheduling with MTP on vllm-ascend's code, and what it changes against the kit.

vLLM 0.27.1 allows async scheduling with MTP drafts, and the vllm-ascend ranks run it:
vLLM's engine keeps two steps in flight and processes each step's output only after it
has scheduled and run the next one. The kit has no such mode; what differs is stated in
docs/upstream-findings.md ("Async scheduling"), and ``dyntra-emu diff`` checks the
statement here: one request runs the kit's steps exactly one step later, and with
DyntraLB its admission plan comes one step later."""

from __future__ import annotations

import dataclasses
import json

import pytest

from emu.rank.costs import PROFILES
from emu.run import run_cluster
from emu.spec import RunSpec
from emu.workload import TraceRequest, load_trace
from tests.integration.conftest import STATIC_CONFIG
from tests.upstream.conftest import TREE
from tests.upstream.test_diff_upstream import _diff
from tests.upstream.test_mtp_upstream import _first_requests, _records

pytestmark = pytest.mark.integration

# DyntraLB's control plane off: under async scheduling it overlaps the forward in flight,
# which the kit's synchronous steps cannot (docs/cost-models.md), so with it on the clocks
# part at the first planning step, before the plan shift these tests are about.
MTP = dataclasses.replace(PROFILES["kv-token-mtp3"], control_plane=None)


def _kit_and_async(tmp_path, trace, additional_config, **fields):
    """The kit's run and vllm-ascend's with async scheduling, same trace and settings."""
    kit = RunSpec(trace=trace, dp_size=2, out_dir=tmp_path / "kit", block_size=16,
                  max_num_seqs=4, num_gpu_blocks=1024, device="cpu", cost_model=MTP,
                  additional_config=additional_config, strict=True, run_timeout_s=600.0,
                  **fields)
    run_cluster(kit)
    run_cluster(dataclasses.replace(kit, out_dir=tmp_path / "async", impl="vllm-ascend",
                                    vllm_ascend=str(TREE), async_scheduling=True))
    proc = _diff(tmp_path / "kit", tmp_path / "async", "--json")
    assert proc.returncode == 1, proc.stdout + proc.stderr  # divergent, as stated
    return tmp_path / "kit", tmp_path / "async", json.loads(proc.stdout)


def _steps(run_dir, rank: int = 0) -> list[dict]:
    return [r for r in _records(run_dir, 2, "step") if r["rank"] == rank]


def test_one_request_runs_the_kits_steps_one_step_later(tmp_path):
    """Its prompt KV lands in step 0: the kit admits it in step 2 (the step after the
    one that reported the load), vLLM's async engine learns of the load one step
    later and admits it in step 3. From there vLLM runs the kit's steps one step
    later -- the same tokens (the same drafts accepted), the same step costs -- so
    every token comes exactly one dummy step (``fixed_s``) later, and the finish is
    reported in the step after its last forward."""
    trace = [TraceRequest("r0", 0.0, 100, 20, rank=0)]
    kit_dir, async_dir, report = _kit_and_async(tmp_path, trace, None)
    kit, vllm = _steps(kit_dir), _steps(async_dir)
    admitted = next(s["iter"] for s in kit if s["admitted"] == ["r0"])
    first = report["first"]
    assert (first["kind"], first["rank"], first["iter"]) == ("schedule", 0, admitted)
    assert vllm[admitted]["dummy"] and vllm[admitted + 1]["admitted"] == ["r0"]
    ran = [(s["scheduled_tokens"], s["own_cost_s"]) for s in kit if not s["dummy"]]
    assert len(ran) > 4 and ran == [(s["scheduled_tokens"], s["own_cost_s"])
                                    for s in vllm if not s["dummy"]]
    last = max(s["iter"] for s in kit if not s["dummy"])
    assert [s["iter"] for s in kit if s["finished"]] == [last]
    assert [s["iter"] for s in vllm if s["finished"]] == [last + 2]
    (kit_request,), (vllm_request,) = (_records(d, 2, "request")
                                       for d in (kit_dir, async_dir))
    times = kit_request["token_times_s"]
    assert len(set(times)) < len(times)  # several tokens per step: drafts accepted
    assert vllm_request["token_times_s"] == pytest.approx([t + MTP.fixed_s for t in times],
                                                          abs=1e-9)
    assert vllm_request["finish_s"] == pytest.approx(kit_request["finish_s"] + MTP.fixed_s,
                                                     abs=1e-9)


def test_dyntra_lb_plans_an_admission_one_step_later(tmp_path):
    """With DyntraLB (static from step 0): the first plan that admits a request whose
    prompt KV has landed is the first divergence; vLLM's async engine makes the same
    plan one step later, and admits the request one step later."""
    trace = load_trace(_first_requests("uniform", tmp_path / "uniform.jsonl"))
    kit_dir, async_dir, report = _kit_and_async(tmp_path, trace, STATIC_CONFIG)
    kit = _records(kit_dir, 2, "step")
    plan = min((s for s in kit if s["plan_generated"] and s["plan_generated"]["in_blk"]),
               key=lambda s: (s["iter"], s["rank"]))
    rank, i = plan["rank"], plan["iter"]
    first = report["first"]
    assert (first["kind"], first["rank"], first["iter"]) == ("plan", rank, i)
    kit, vllm = _steps(kit_dir, rank), _steps(async_dir, rank)
    assert vllm[i]["plan_generated"]["in_blk"] == []
    assert vllm[i + 1]["plan_generated"] == plan["plan_generated"]
    assert kit[i + 1]["admitted"] and vllm[i + 2]["admitted"] == kit[i + 1]["admitted"]
    # the drafts ran on vLLM's side too: several tokens in one step
    per_step = [times.count(t) for r in _records(async_dir, 2, "request")
                for times in [r["token_times_s"]] for t in set(times)]
    assert max(per_step) == 4
