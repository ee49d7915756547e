"""Step-cost model and the lockstep clock's buffer protocol (fake all-reduce)."""

from __future__ import annotations

import pytest
import torch

from emu.rank import clock as clock_module
from emu.rank.clock import LockstepClock
from emu.rank.costs import StepCostModel


def test_default_costs_in_microseconds():
    model = StepCostModel()
    assert model.name == "kv-token"
    assert model.cost(0, 0, 0, 0, dummy=True) == 20_000
    # 12,800 KV tokens at 0.15 us + 4 scheduled tokens at 5 us
    assert model.cost(100, 12_800, 4, 4, dummy=False) == 20_000 + 1_920 + 20
    assert model.cost(100, 12_800, 4, 4, dummy=True) == 20_000  # dummy: the fixed part only
    assert isinstance(model.cost(3, 300, 1, 1, dummy=False), int)


def test_custom_costs():
    model = StepCostModel(name="x", fixed_s=0.001, per_kv_token_s=0.0, per_kv_block_s=1e-6,
                          per_scheduled_token_s=0.0, per_running_request_s=2e-6)
    assert model.cost(10, 5000, 3, 100, dummy=False) == 1_000 + 10 + 6


@pytest.mark.parametrize(
    "kwargs",
    [{"fixed_s": -1.0}, {"per_kv_block_s": float("nan")}, {"per_scheduled_token_s": float("inf")},
     {"fixed_s": True}, {"fixed_s": "0.02"}, {"fixed_s": 0.0}, {"name": ""}],
)
def test_invalid_cost_model(kwargs):
    with pytest.raises(ValueError, match="cost model"):
        StepCostModel(**kwargs)


class FakeDeviceGroup:
    """Peers' buffers for a MAX all-reduce; records what this rank sent."""

    def __init__(self, peers):
        self.peers = peers
        self.sent = []

    def all_reduce(self, tensor, op=None, group=None):
        assert group is self and op == torch.distributed.ReduceOp.MAX
        assert tensor.dtype == torch.int32
        self.sent.append(tensor.tolist())
        for peer in self.peers:
            for i, v in enumerate(peer):
                tensor[i] = max(int(tensor[i]), v)


def test_lockstep_step_time_and_counts(monkeypatch):
    group = FakeDeviceGroup([[25_000, 3, 1, 0, 0, 0, 0]])  # rank 0's contribution
    monkeypatch.setattr(clock_module.dist, "all_reduce", group.all_reduce)
    seen = []
    clock = LockstepClock(group, dp_rank=1, dp_size=3,
                          observe=lambda site, op, t, fn: (seen.append((site, op)), fn())[1])
    step_us = clock.step(21_000, 2, 5)
    assert group.sent == [[21_000, 0, 0, 2, 5, 0, 0]]
    assert step_us == 25_000
    assert clock.counts == [(3, 1), (2, 5), (0, 0)]
    assert seen == [("engine.lockstep", "all_reduce_max")]
    # the buffer is re-zeroed each step: old peer values do not leak into the sent data
    group.peers = []
    assert clock.step(20_000, 0, 0) == 20_000
    assert group.sent[-1] == [20_000, 0, 0, 0, 0, 0, 0]
    assert clock.counts == [(0, 0)] * 3


def test_lockstep_carries_finished_and_kv_usage_for_the_vllm_router(monkeypatch):
    # With both extras each rank's slots are (waiting, running, finished, KV permille):
    # what vLLM's DP load balancer reads (emu/vllm_dp_lb.py).
    group = FakeDeviceGroup([[25_000, 3, 1, 7, 400, 0, 0, 0, 0]])  # rank 0's contribution
    monkeypatch.setattr(clock_module.dist, "all_reduce", group.all_reduce)
    clock = LockstepClock(group, dp_rank=1, dp_size=2, carry_finished=True,
                          carry_kv_usage=True)
    assert clock.step(21_000, 2, 5, num_finished=4, kv_usage_permille=650) == 25_000
    assert group.sent == [[21_000, 0, 0, 0, 0, 2, 5, 4, 650]]
    assert clock.counts == [(3, 1), (2, 5)]
    assert clock.finished_total == 11
    assert [(s.waiting, s.running, s.finished, s.kv_usage_permille)
            for s in clock.rank_stats] == [(3, 1, 7, 400), (2, 5, 4, 650)]
