"""The kit's engine under vLLM's async scheduling (``step_with_batch_queue``) against its
synchronous ``step()``, on one request at dp 2 with MTP: every step's output is
processed an iteration later, so the request is admitted one step later (its landed
prompt KV is seen a step late) and then runs the synchronous steps exactly, one step
later; its finish is reported in the iteration after its last forward. The same
relation holds on vllm-ascend's code (``tests/upstream/test_async_upstream.py`` checks
the kit against it step by step)."""

from __future__ import annotations

import dataclasses

import pytest

from emu.rank.costs import PROFILES
from emu.run import run_cluster
from emu.spec import RunSpec
from emu.workload import TraceRequest
from tests.records import events

pytestmark = pytest.mark.integration

# DyntraLB's control plane off: under async scheduling only its part that outlasts the
# forward in flight is charged, which would shift the clocks by other amounts.
MTP = dataclasses.replace(PROFILES["kv-token-mtp3"], control_plane=None)


def _steps(out_dir) -> list[dict]:
    return [r for r in events(out_dir, 0) if r["kind"] == "step"]


def _request(out_dir) -> dict:
    return next(r for r in events(out_dir, 0) if r["kind"] == "request")


def test_async_runs_the_synchronous_steps_one_step_later(tmp_path):
    sync = RunSpec(trace=[TraceRequest("r0", 0.0, 100, 20, rank=0)], dp_size=2,
                   out_dir=tmp_path / "sync", block_size=16, max_num_seqs=4,
                   num_gpu_blocks=1024, device="cpu", cost_model=MTP, strict=True,
                   transport="thread", async_scheduling=False)
    run_cluster(sync)
    run_cluster(dataclasses.replace(sync, out_dir=tmp_path / "async", async_scheduling=True))
    steps = {mode: _steps(tmp_path / mode) for mode in ("sync", "async")}
    admitted = {mode: next(s["iter"] for s in steps[mode] if s["admitted"])
                for mode in steps}
    assert admitted["async"] == admitted["sync"] + 1
    ran = {mode: [(s["scheduled_tokens"], s["own_cost_s"]) for s in steps[mode]
                  if not s["dummy"]] for mode in steps}
    assert len(ran["sync"]) > 4 and ran["async"] == ran["sync"]
    last = {mode: max(s["iter"] for s in steps[mode] if not s["dummy"]) for mode in steps}
    assert last["async"] == last["sync"] + 1
    assert [s["iter"] for s in steps["sync"] if s["finished"]] == [last["sync"]]
    assert [s["iter"] for s in steps["async"] if s["finished"]] == [last["async"] + 1]
    sync_request, async_request = (_request(tmp_path / mode) for mode in ("sync", "async"))
    times = sync_request["token_times_s"]
    assert len(set(times)) < len(times)  # several tokens per step: drafts accepted
    assert async_request["token_times_s"] == pytest.approx(
        [t + MTP.fixed_s for t in times], abs=1e-9)
    assert async_request["finish_s"] == pytest.approx(sync_request["finish_s"] + MTP.fixed_s,
                                                      abs=1e-9)
