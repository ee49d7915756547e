"""RunSpec validation: every bad input is one ValueError naming the field, raised
before any rank process starts."""

from __future__ import annotations

import re

import pytest

from emu.cluster import threads, transport
from emu.rank.costs import PROFILES
from emu.run import run_cluster
from emu.spec import RunSpec, SpecError, check
from emu.workload import TraceRequest

TRACE = [TraceRequest("a", 0.0, 100, 10), TraceRequest("b", 0.5, 200, 10, rank=1)]
LB = {"scheduler_config": {"dyntra_lb_config": {"enabled": True}}}


@pytest.fixture(autouse=True)
def no_launch(monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("a rank was started for an invalid spec")

    monkeypatch.setattr(transport, "launch", forbidden)
    monkeypatch.setattr(threads, "run_in_threads", forbidden)


def _spec(tmp_path, **kwargs):
    kwargs.setdefault("trace", TRACE)
    kwargs.setdefault("dp_size", 2)
    return RunSpec(out_dir=tmp_path, **kwargs)


def test_valid_spec_returns_the_parsed_config(tmp_path):
    config = check(_spec(tmp_path, additional_config=LB)).config
    assert config.dyntra_lb.enabled is True
    assert check(_spec(tmp_path)).config.dyntra_lb.enabled is False


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"dp_size": 0}, "RunSpec.dp_size: must be an int >= 1"),
        ({"max_num_seqs": 0}, "RunSpec.max_num_seqs"),
        ({"block_size": True}, "RunSpec.block_size"),
        ({"num_gpu_blocks": 2.0}, "RunSpec.num_gpu_blocks"),
        ({"max_steps": -1}, "RunSpec.max_steps"),
        ({"stall_steps": 0}, "RunSpec.stall_steps: must be an int >= 1"),
        ({"scheduling_policy": "lifo"}, "RunSpec.scheduling_policy"),
        ({"router": "random"}, "RunSpec.router"),
        ({"device": "gpu"}, "RunSpec.device"),
        ({"cost_model": {"fixed_s": 0.02}}, "RunSpec.cost_model"),
        ({"kv_latency_fixed_s": -0.1}, "RunSpec.kv_latency_fixed_s"),
        ({"kv_latency_per_block_s": float("nan")}, "RunSpec.kv_latency_per_block_s"),
        ({"seed": "1"}, "RunSpec.seed"),
        ({"collective_timeout_s": 0}, "RunSpec.collective_timeout_s"),
        ({"run_timeout_s": -5}, "RunSpec.run_timeout_s"),
        ({"dp_size": 1025}, "RunSpec.dp_size: must be at most 1024"),
        ({"max_num_seqs": 65_537}, "RunSpec.max_num_seqs: must be at most 65536"),
        ({"num_gpu_blocks": 1_000_001}, "RunSpec.num_gpu_blocks: must be at most 1000000"),
        ({"collective_timeout_s": 1e12},
         "RunSpec.collective_timeout_s: must be > 0 and at most"),
        ({"run_timeout_s": 1e12}, "RunSpec.run_timeout_s: must be > 0 and at most"),
        ({"trace": []}, "RunSpec.trace: is empty"),
        ({"trace": "trace.jsonl"}, "RunSpec.trace: must be a list"),
        ({"trace": [TRACE[0], TRACE[0]]},
         r"RunSpec.trace\[1\]: field 'request_id': duplicate id 'a' \(first used on "
         r"RunSpec.trace\[0\]\)"),
        ({"trace": [TRACE[1], TRACE[0]]},
         r"RunSpec.trace\[1\]: field 'arrival_s': arrivals must be non-decreasing, got 0.0 "
         r"after 0.5 on RunSpec.trace\[0\]"),
        ({"trace": [TraceRequest("a", -1.0, 100, 10)]},
         r"RunSpec.trace\[0\]: field 'arrival_s': expected a finite number >= 0 \(seconds\), "
         r"got -1.0"),
        ({"trace": [TraceRequest("a", float("nan"), 100, 10)]},
         r"RunSpec.trace\[0\]: field 'arrival_s': expected a finite number >= 0"),
        ({"trace": [{"request_id": "a"}]}, r"RunSpec.trace\[0\]: must be a TraceRequest"),
        ({"trace": [TraceRequest("x", 0.0, 4000, 100)], "block_size": 16,
          "num_gpu_blocks": 100}, "needs 257 KV blocks"),
        ({"additional_config": {"scheduler_config": {"dyntra_lb_config": {"mode": "x"}}}},
         "dyntra_lb_config.mode must be one of"),
        ({"additional_config": "{not json"}, "additional_config is not valid JSON"),
        ({"additional_config": LB, "dp_size": 1, "trace": TRACE[:1]},
         "DyntraLB requires data_parallel_size > 1."),
        ({"additional_config": {"scheduler_config": {"dyntra_lb_config": {"enabled": True},
                                                     "enable_balance_scheduling": True}}},
         "enable_balance_scheduling only supports PD-mixed mode"),
        ({"additional_config": {"scheduler_config": {"recompute_scheduler_enable": True}}},
         re.escape("the kit runs vLLM's own scheduler (synchronous or async); the "
                   "additional config selects vllm-ascend's recompute scheduler "
                   "(scheduler_config.recompute_scheduler_enable runs with --impl "
                   "vllm-ascend)")),
        ({"impl": "vllm"}, r"RunSpec.impl: must be one of \['kit', 'vllm-ascend'\], got 'vllm'"),
        ({"async_scheduling": 1}, "RunSpec.async_scheduling: must be a bool or None, got 1"),
    ],
)
def test_invalid_spec_is_rejected_before_launch(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        run_cluster(_spec(tmp_path, **kwargs))


def test_pinned_rank_beyond_dp_size(tmp_path):
    with pytest.raises(SpecError) as info:
        run_cluster(_spec(tmp_path, dp_size=1))
    [problem] = info.value.problems
    assert (problem.field, problem.index) == ("trace", 1)
    assert problem.message == "field 'rank': expected an integer in 0..0 for dp_size=1, got 1"


def test_default_cost_model_is_the_kv_token_profile():
    assert RunSpec(trace=TRACE, dp_size=2, out_dir="x").cost_model is PROFILES["kv-token"]


def test_api_servers_belong_to_the_vllm_router(tmp_path):
    # the default count is the DP size, as vLLM's; a count for a router without API
    # servers is refused, naming the field
    assert check(_spec(tmp_path, router="vllm")).engine_spec.api_server_count == 2
    assert check(_spec(tmp_path, router="vllm", api_server_count=1)
                 ).engine_spec.api_server_count == 1
    assert check(_spec(tmp_path)).engine_spec.api_server_count == 1  # round robin
    with pytest.raises(SpecError) as exc:
        check(_spec(tmp_path, api_server_count=3))
    assert [p.field for p in exc.value.problems] == ["api_server_count"]
    assert "only with router='vllm'" in str(exc.value)
