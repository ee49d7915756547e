"""vLLM's async scheduling, vLLM 0.27.1's default for the decode node, on both impls:
``dyntra-emu diff`` of the kit against vllm-ascend's code is identical -- every step
record, request record and diagnostics line.

The matrix of issue 41, as cheaply as it allows: rank threads, the first 16 requests of
each bundled workload (outputs capped at 60 tokens). These cells and
``test_mtp_upstream.py``'s (static and dynamic mode with MTP, open loop, dp 2 and 4)
together cover dp 2 and 4, DyntraLB static, dynamic and off, MTP on and off, open and
closed loop, and all four bundled workloads; the whole workloads and the PR recipe at
dp 8 are ``benchmarks/diff_matrix.py``'s (docs/upstream-findings.md, "Async
scheduling"). The tier's own static and dynamic runs, two waves each, diff identical too
(``test_diff_upstream.py``)."""

from __future__ import annotations

import json

import pytest

from tests.upstream.conftest import TREE
from tests.upstream.test_diff_upstream import _diff
from tests.upstream.test_mtp_upstream import _first_requests, _records

pytestmark = pytest.mark.integration

# (dp, workload, DyntraLB mode or "off", MTP, closed-loop clients or None)
CELLS = [
    (2, "default", "off", True, 4),
    (2, "bimodal", "dynamic", False, 4),
    (4, "bimodal", "static", False, 4),
    (4, "default", "off", False, None),
]


def _config(mode: str) -> dict:
    if mode == "off":
        return {}
    return {"scheduler_config": {"dyntra_lb_config": {
        "enabled": True, "mode": mode, "start_step": 0, "enable_diagnostics": True,
        "long_req_block_threshold": 40}}}


@pytest.mark.parametrize("dp,workload,mode,mtp,concurrency", CELLS)
def test_kit_and_vllm_ascend_async_are_identical(tmp_path, dp, workload, mode, mtp,
                                                 concurrency):
    trace = _first_requests(workload, tmp_path / f"{workload}.jsonl")
    out = tmp_path / "diff"
    args = ["--workload", trace, "--dp", dp, "--block-size", 16, "--max-num-seqs", 4,
            "--num-gpu-blocks", 1024, "--device", "cpu", "--quiet", "--vllm-ascend", TREE,
            "--transport", "thread", "--strict", "--additional-config",
            json.dumps(_config(mode)), "--out", out, "--json"]
    if mtp:
        args += ["--cost-model", "kv-token-mtp3"]
    if concurrency is not None:
        args += ["--max-concurrency", concurrency]
    proc = _diff(*args)
    assert proc.returncode in (0, 1), proc.stderr
    report = json.loads(proc.stdout)
    assert proc.returncode == 0 and report["identical"], json.dumps(report["first"], indent=1)
    counts = report["counts"]
    assert counts["requests"] == 16
    for side in ("a", "b"):
        config = json.loads((out / side / "metrics.json").read_text())["config"]
        assert config["async_scheduling"] is True  # vLLM's default, on both impls
        assert config["max_concurrency"] == concurrency
    if mode != "off":
        assert counts["plans"] > 0 and counts["diagnostics_lines"] > 0
    steps = _records(out / "b", dp, "step")
    # a step ran while the previous one's output was in flight: the finish of a request
    # is reported in the iteration after its last forward, one with tokens or a dummy
    assert any(s["finished"] for s in steps)
    if mtp:  # drafts verified: more tokens ran than requests decoded
        assert any(s["scheduled_tokens"] > s["num_running"] > 0 for s in steps)


# A request that finishes in the iteration whose 32nd-step sync ends the wave, then
# (seconds later) a request on the other rank: the first rank's next step is a dummy
# step of the new wave. Its output tokens make the finish land there in each mode.
WAVE_END = {True: 28, False: 30}


@pytest.mark.parametrize("async_scheduling", [True, False])
def test_a_wave_ended_by_a_finish_is_recorded_alike(tmp_path, async_scheduling):
    """After the wave-ending finish, vLLM schedules once more (its finished ids) in a
    loop pass in which every engine is idle; that pass is no step. The vllm-ascend ranks
    recorded the next step with that pass's clock (the emulator's fault, fixed)."""
    trace = tmp_path / "wave.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in [
        {"request_id": "x", "arrival_s": 0.0, "prompt_tokens": 100,
         "output_tokens": WAVE_END[async_scheduling], "rank": 0},
        {"request_id": "y", "arrival_s": 5.0, "prompt_tokens": 50, "output_tokens": 5,
         "rank": 1}]))
    out = tmp_path / "diff"
    proc = _diff("--workload", trace, "--dp", 2, "--block-size", 16, "--max-num-seqs", 4,
                 "--num-gpu-blocks", 512, "--device", "cpu", "--quiet", "--vllm-ascend", TREE,
                 "--transport", "thread", "--no-dyntra-lb", "--out", out, "--json",
                 "--async-scheduling" if async_scheduling else "--no-async-scheduling")
    assert proc.returncode in (0, 1), proc.stderr
    report = json.loads(proc.stdout)
    assert proc.returncode == 0 and report["identical"], json.dumps(report["first"], indent=1)
    steps = [s for s in _records(out / "b", 2, "step") if s["rank"] == 0]
    (end,) = [i for i, s in enumerate(steps[:-1]) if steps[i + 1]["wave"] != s["wave"]]
    assert steps[end]["finished"] == ["x"]  # the case: x's finish ended the wave
    assert steps[end + 1]["clock_s"] == 5.0  # y's arrival woke rank 0
