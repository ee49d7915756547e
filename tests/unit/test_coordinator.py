"""DyntraLBCoordinator (docs/protocol.md, "DyntraLB's part"; docs/diagnostics.md) against
a fake policy and fake
collectives: the other ranks' contributions are scripted, this rank's are real."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from dyntra_lb import coordinator as coordinator_module
from dyntra_lb import diagnostics
from dyntra_lb.config import load_additional_config
from dyntra_lb.coordinator import BalanceStep, DyntraLBCoordinator
from dyntra_lb.payload import pack, payload_len
from dyntra_lb.planner.front import Plan, balance_load


class FakeCandidate:
    def __init__(self, blocks):
        self.blocks = blocks


class FakePolicy:
    """The policy surface the coordinator uses, with the block counts set by the test.

    ``prepare_step`` returns fresh candidate objects (``candidates`` are their block
    counts); ``block_counts`` only counts the list ``prepare_step`` last returned, so
    the payload shows that the coordinator published exactly those candidates.
    """

    def __init__(self):
        self.plan = None
        self.running = []
        self.candidates = []
        self.calls = []
        self._prepared = None

    def prepare_step(self):
        self.calls.append("prepare_step")
        self._prepared = [FakeCandidate(b) for b in self.candidates]
        return self._prepared

    def running_block_counts(self):
        return list(self.running)

    def block_counts(self, requests):
        assert requests is self._prepared, "not the candidates prepare_step returned"
        return [r.blocks for r in requests]

    def set_plan(self, plan):
        self.calls.append("set_plan")
        self.plan = plan

    def clear_plan(self):
        self.calls.append("clear_plan")
        self.plan = None


class FakeDP:
    """Scripted peers for ``dist.all_reduce`` / ``dist.all_gather`` on ``group=self``.

    ``peer_flags[r]`` is rank r's flag contribution; ``peer_payloads[r]`` is
    ``(running, waiting, pending_long)`` for rank r. ``log`` lists (op, sent values).
    """

    def __init__(self, rank, dp_size, max_num_seqs):
        self.rank = rank
        self.dp_size = dp_size
        self.max_num_seqs = max_num_seqs
        self.peer_flags = {r: (0, 0) for r in range(dp_size) if r != rank}
        self.peer_payloads = {r: ([], [], False) for r in range(dp_size) if r != rank}
        self.log = []

    def all_reduce(self, tensor, op=None, group=None):
        assert group is self and op == torch.distributed.ReduceOp.MAX
        self.log.append(("all_reduce_max", tensor.tolist()))
        for flag in self.peer_flags.values():
            for i, v in enumerate(flag):
                tensor[i] = max(int(tensor[i]), v)

    def all_gather(self, tensor_list, tensor, group=None):
        assert group is self and len(tensor_list) == self.dp_size
        self.log.append(("all_gather", tensor.tolist()))
        for r, out in enumerate(tensor_list):
            if r == self.rank:
                out.copy_(tensor)
            else:
                buf = np.zeros(payload_len(self.max_num_seqs), dtype=np.int32)
                running, waiting, long_flag = self.peer_payloads[r]
                pack(buf, running, waiting, long_flag)
                out.copy_(torch.from_numpy(buf))

    def ops(self):
        return [op for op, _ in self.log]


def _config(diag=False, raw_diag=None, **lb):
    lb.setdefault("enabled", True)
    lb["enable_diagnostics"] = diag
    cfg = load_additional_config({"scheduler_config": {"dyntra_lb_config": lb}})
    if raw_diag is not None:
        # A raw config whose enable_diagnostics differs from the validated one (docs/config.md):
        # only the step-counter line follows the raw value.
        raw = {"scheduler_config": {"dyntra_lb_config": {"enable_diagnostics": raw_diag}}}
        cfg = type(cfg)(dyntra_lb=cfg.dyntra_lb, raw=raw)
    return cfg


@pytest.fixture
def make(monkeypatch):
    def build(rank=0, dp_size=2, max_num_seqs=4, observe=None, **kwargs):
        dp = FakeDP(rank, dp_size, max_num_seqs)
        monkeypatch.setattr(coordinator_module.dist, "all_reduce", dp.all_reduce)
        monkeypatch.setattr(coordinator_module.dist, "all_gather", dp.all_gather)
        policy = FakePolicy()
        coord = DyntraLBCoordinator(
            _config(**kwargs),
            policy=policy,
            dp_rank=rank,
            dp_size=dp_size,
            dp_group=dp,
            max_num_seqs=max_num_seqs,
            observe=observe,
        )
        return coord, policy, dp

    return build


def _iterate(coord, step_counter, wave=0, running=True):
    """One engine iteration's hooks; returns what ``after_dp_sync`` returned."""
    coord.before_dp_sync(step_counter - 1)
    step = coord.after_dp_sync(running, step_counter=step_counter, current_wave=wave)
    assert isinstance(step, BalanceStep)
    return step


# ---------------------------------------------------------------- static mode


def test_static_plans_every_step_and_keeps_own_row(make):
    coord, policy, dp = make(rank=1, mode="static", start_step=0, bubble_threshold=1.0)
    policy.running = [1]
    policy.candidates = [2]
    dp.peer_payloads[0] = ([3], [], False)
    step = _iterate(coord, 1)
    assert dp.log[0] == ("all_gather", [1, 2, 0, 0, 0, 0, 0, 0, 1, 0])
    assert dp.ops() == ["all_gather"]
    # The snapshot (and with it the KV prefetch) before the all-gather, then the hand-over.
    assert policy.calls == ["prepare_step", "set_plan"]
    # The fill step (max_num_seqs=4) admits the waiting 2 on rank 1; loads are then equal.
    assert policy.plan == Plan(out_blk=[], in_blk=[2], freeze=False)
    assert step.plan is policy.plan
    _iterate(coord, 2)
    assert dp.ops() == ["all_gather", "all_gather"]
    assert policy.calls == ["prepare_step", "set_plan"] * 2


def test_frozen_row_is_handed_over_with_its_freeze(make):
    coord, policy, dp = make(rank=0, mode="static", start_step=0, bubble_threshold=1.0)
    policy.running = [3]
    dp.peer_payloads[1] = ([1], [2], False)
    step = _iterate(coord, 1)
    assert policy.plan == Plan(out_blk=[], in_blk=[], freeze=True)
    assert policy.plan.freeze is True and step.plan is policy.plan


def test_payload_layout_and_pending_flag_reset(make):
    coord, policy, dp = make(mode="dynamic", start_step=0, max_num_seqs=2,
                             long_req_block_threshold=8)
    coord.on_add_request(9)
    # Activation consumes the flag; arm again afterwards so the payload carries it.
    _iterate(coord, 1)
    assert dp.log[0] == ("all_reduce_max", [1, 9])
    assert dp.log[1] == ("all_gather", [0, 0, 0, 0, 0, 0])
    policy.running = [5, 3]
    policy.candidates = [9, 2, 7]
    coord.on_add_request(20)
    _iterate(coord, 2)
    assert dp.log[2] == ("all_gather", [5, 3, 9, 2, 2, 1])  # docs/protocol.md, "The payload"
    assert coord.pending_long_req is False and coord.pending_long_req_blk == 0


def test_step_window(make):
    coord, policy, dp = make(mode="static", start_step=3, end_step=5)
    active = []
    stale = Plan(out_blk=[1], in_blk=[], freeze=True)
    for n in range(1, 8):
        policy.plan = stale
        policy.calls.clear()
        step = _iterate(coord, n)
        is_active = step.plan is not None
        active.append(is_active)
        if is_active:
            assert policy.plan is step.plan is not stale
        else:
            assert policy.plan is None
        # the KV prefetch runs (inside prepare_step) exactly on the active steps
        assert policy.calls == (["prepare_step", "set_plan"] if is_active else ["clear_plan"])
    assert active == [False, False, True, True, False, False, False]
    assert dp.ops() == ["all_gather", "all_gather"]


def test_start_step_zero_and_one_are_identical(make):
    runs = []
    for start in (0, 1):
        coord, policy, dp = make(mode="static", start_step=start)
        for n in range(1, 4):
            _iterate(coord, n)
        runs.append(dp.ops())
    assert runs[0] == runs[1] == ["all_gather"] * 3


def test_wave_end_clears_plan_without_collectives(make):
    coord, policy, dp = make(mode="static", start_step=0)
    _iterate(coord, 1)
    assert policy.plan is not None
    policy.plan = Plan(out_blk=[], in_blk=[], freeze=True)  # a frozen plan is dropped too
    policy.calls.clear()
    step = _iterate(coord, 32, running=False)
    assert dp.ops() == ["all_gather"]
    assert policy.plan is None
    assert policy.calls == ["clear_plan"]  # no snapshot, hence no KV prefetch
    assert step == BalanceStep(None, 0.0, 0.0)


# ---------------------------------------------------------------- dynamic mode


def test_dynamic_inactive_runs_flag_allreduce_only(make):
    coord, policy, dp = make(mode="dynamic", start_step=0, long_req_block_threshold=10)
    coord.on_add_request(10)  # not strictly greater: does not arm
    for n in range(1, 4):
        step = _iterate(coord, n)
        assert policy.plan is None and step.plan is None
    assert dp.log == [("all_reduce_max", [0, 0])] * 3
    assert policy.calls == ["clear_plan"] * 3


def test_static_mode_never_arms(make):
    coord, _, dp = make(mode="static", start_step=0, long_req_block_threshold=1)
    coord.on_add_request(100)
    assert coord.pending_long_req is False
    _iterate(coord, 1)
    assert dp.log == [("all_gather", [0] * payload_len(4))]


def test_dynamic_timeline_of_spec_b4(make):
    """Activation at iteration A gives dynamic_max_step + 1 plans, then the flag
    all-reduce returns and the plan is cleared."""
    coord, policy, dp = make(mode="dynamic", start_step=0, dynamic_max_step=2,
                             long_req_block_threshold=700)
    for n in range(1, 5):
        _iterate(coord, n)
    assert dp.ops() == ["all_reduce_max"] * 4
    coord.on_add_request(701)
    plans = []
    for n in range(5, 10):
        before = len(dp.log)
        step = _iterate(coord, n)
        plans.append(step.plan is not None)
        if n == 5:
            assert [op for op, _ in dp.log[before:]] == ["all_reduce_max", "all_gather"]
            assert dp.log[before] == ("all_reduce_max", [1, 701])
            assert dp.log[before + 1][1][-1] == 0  # flag consumed by the all-reduce
    assert plans == [True, True, True, False, False]  # P6, P7, P8 generated at 5, 6, 7
    assert dp.ops()[4:] == ["all_reduce_max", "all_gather", "all_gather", "all_gather",
                            "all_reduce_max", "all_reduce_max"]
    assert coord.dynamic_enable is False and policy.plan is None


def test_dynamic_activation_by_a_peer_and_keep_alive(make):
    coord, policy, dp = make(rank=0, mode="dynamic", start_step=0, dynamic_max_step=2)
    dp.peer_flags[1] = (1, 900)
    step = _iterate(coord, 1)
    assert coord.dynamic_enable is True and step.plan is not None
    dp.peer_flags[1] = (0, 0)
    _iterate(coord, 2)
    assert coord.dynamic_step == 1
    dp.peer_payloads[1] = ([], [], True)  # a long request on the peer: keep-alive
    _iterate(coord, 3)
    assert coord.dynamic_step == 0
    dp.peer_payloads[1] = ([], [], False)
    _iterate(coord, 4)
    _iterate(coord, 5)
    assert coord.dynamic_enable is False
    assert dp.ops() == ["all_reduce_max"] + ["all_gather"] * 5


def test_own_long_request_in_payload_keeps_alive(make):
    coord, _, dp = make(mode="dynamic", start_step=0, dynamic_max_step=2,
                        long_req_block_threshold=5)
    coord.on_add_request(6)
    _iterate(coord, 1)
    _iterate(coord, 2)
    assert coord.dynamic_step == 1
    coord.on_add_request(7)
    _iterate(coord, 3)
    assert dp.log[-1][1][-1] == 1
    assert coord.dynamic_step == 0 and coord.dynamic_enable is True


def test_dynamic_state_survives_wave_end(make):
    coord, policy, dp = make(mode="dynamic", start_step=0, dynamic_max_step=5)
    dp.peer_flags[1] = (1, 800)
    _iterate(coord, 1)
    dp.peer_flags[1] = (0, 0)
    _iterate(coord, 2)
    _iterate(coord, 32, running=False)  # wave end: plan cleared, state kept
    assert policy.plan is None
    assert coord.dynamic_enable is True and coord.dynamic_step == 1
    _iterate(coord, 1, wave=1)
    assert dp.ops() == ["all_reduce_max", "all_gather", "all_gather", "all_gather"]
    assert coord.dynamic_step == 2


def test_dynamic_outside_window_neither_counts_nor_resets(make):
    coord, policy, dp = make(mode="dynamic", start_step=3, end_step=4, dynamic_max_step=2,
                             long_req_block_threshold=5)
    coord.on_add_request(6)
    step = _iterate(coord, 1)  # activation outside the window: no plan
    assert coord.dynamic_enable is True and step.plan is None and policy.plan is None
    coord.on_add_request(9)  # accumulates until the next all-gather
    _iterate(coord, 2)
    assert coord.dynamic_step == 0 and coord.pending_long_req is True
    _iterate(coord, 3)  # in window: gathers the pending flag -> keep-alive
    assert dp.log[-1][1][-1] == 1 and coord.dynamic_step == 0
    for n in range(4, 9):
        _iterate(coord, n)
    assert coord.dynamic_enable is True and coord.dynamic_step == 0
    assert dp.ops() == ["all_reduce_max", "all_gather"]


def test_pending_flag_reset_when_inactive_and_nothing_reduced(make):
    coord, _, dp = make(mode="dynamic", start_step=0)
    coord.pending_long_req_blk = 3  # blk without flag: reduced but not activating
    _iterate(coord, 1)
    assert dp.log == [("all_reduce_max", [0, 3])]
    assert coord.pending_long_req_blk == 0 and coord.dynamic_enable is False


# ---------------------------------------------------------------- observe / timing


def test_observe_wraps_every_collective(make):
    seen = []

    def observe(site, op, tensor, fn):
        seen.append((site, op, tuple(tensor.shape), tensor.dtype))
        return fn()

    coord, _, dp = make(mode="dynamic", start_step=0, observe=observe,
                        long_req_block_threshold=5)
    coord.on_add_request(6)
    step = _iterate(coord, 1)
    assert seen == [
        ("dyntra_lb.flag", "all_reduce_max", (2,), torch.int32),
        ("dyntra_lb.allgather", "all_gather", (payload_len(4),), torch.int32),
    ]
    assert dp.ops() == ["all_reduce_max", "all_gather"]
    assert step.collectives_s > 0 and step.planner_s > 0
    step = _iterate(coord, 32, running=False)
    assert step.collectives_s == 0 and step.planner_s == 0


# ---------------------------------------------------------------- diagnostics


def _lines(caplog):
    return [r.getMessage() for r in caplog.records if r.name == "dyntra_lb"]


def test_diagnostics_rank0(make, caplog):
    caplog.set_level(logging.INFO, logger="dyntra_lb")
    coord, policy, dp = make(rank=0, diag=True, mode="dynamic", start_step=0,
                             dynamic_max_step=1, long_req_block_threshold=5)
    init = _lines(caplog)
    assert init == diagnostics.config_lines(_config(diag=True, mode="dynamic", start_step=0,
                                                    dynamic_max_step=1,
                                                    long_req_block_threshold=5).dyntra_lb)
    caplog.clear()
    policy.running = [3]
    dp.peer_payloads[1] = ([1], [2], False)
    coord.on_add_request(7)
    _iterate(coord, 4, wave=2)
    requests = [([3, 0, 0, 0, 0, 0, 0, 0], 1), ([1, 2, 0, 0, 0, 0, 0, 0], 1)]
    assert _lines(caplog) == [
        diagnostics.step_counter_line(3),
        diagnostics.activation_line(7, 5, 2, 4),
        diagnostics.requests_table(requests),
        diagnostics.modifications_table(
            balance_load(requests, 2, max_num_seqs=4, threshold=5.0)
        ),
    ]
    caplog.clear()
    _iterate(coord, 5, wave=2)
    assert _lines(caplog)[-1] == diagnostics.deactivation_line(1, 2, 5)
    caplog.clear()
    _iterate(coord, 32, wave=2, running=False)
    assert _lines(caplog) == [diagnostics.step_counter_line(31), diagnostics.wave_end_line(3)]


def test_diagnostics_other_rank_prints_only_step_and_wave_lines(make, caplog):
    caplog.set_level(logging.INFO, logger="dyntra_lb")
    coord, _, dp = make(rank=1, diag=True, mode="dynamic", start_step=0,
                        dynamic_max_step=1)
    dp.peer_flags[0] = (1, 800)
    _iterate(coord, 1)
    dp.peer_flags[0] = (0, 0)
    _iterate(coord, 2)
    _iterate(coord, 32, running=False)
    assert _lines(caplog) == [
        diagnostics.step_counter_line(0),
        diagnostics.step_counter_line(1),
        diagnostics.step_counter_line(31),
        diagnostics.wave_end_line(1),
    ]


def test_step_counter_line_follows_the_raw_config(make, caplog):
    caplog.set_level(logging.INFO, logger="dyntra_lb")
    coord, _, _ = make(diag=False, raw_diag=True, mode="static", start_step=0)
    _iterate(coord, 1)
    assert _lines(caplog) == [diagnostics.step_counter_line(0)]


def test_no_formatting_work_when_diagnostics_off(make, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="dyntra_lb")

    def forbidden(*args, **kwargs):
        raise AssertionError("diagnostics text built while diagnostics are off")

    for name in ("config_lines", "step_counter_line", "wave_end_line", "activation_line",
                 "deactivation_line", "requests_table", "modifications_table"):
        monkeypatch.setattr(coordinator_module.diagnostics, name, forbidden)
    coord, _, dp = make(mode="dynamic", start_step=0, dynamic_max_step=1,
                        long_req_block_threshold=5)
    coord.on_add_request(6)
    for n in range(1, 4):
        _iterate(coord, n)
    _iterate(coord, 32, running=False)
    assert dp.ops() == ["all_reduce_max", "all_gather", "all_gather", "all_reduce_max"]
    assert _lines(caplog) == []


# ------------------------------------------------------------ the planner it is given


@pytest.mark.parametrize("name", ["reference", "fill-protect"])
def test_the_coordinator_runs_the_planner_it_is_given(monkeypatch, name):
    """The plan handed to the policy is the named planner's row for this rank."""
    from dyntra_lb.planner import registry as planners

    dp = FakeDP(0, 2, 2)
    monkeypatch.setattr(coordinator_module.dist, "all_reduce", dp.all_reduce)
    monkeypatch.setattr(coordinator_module.dist, "all_gather", dp.all_gather)
    policy = FakePolicy()
    coord = DyntraLBCoordinator(_config(mode="static", start_step=0), policy=policy,
                                dp_rank=0, dp_size=2, dp_group=dp, max_num_seqs=2,
                                planner=planners.get(name))
    policy.running, policy.candidates = [10], [800]
    dp.peer_payloads = {1: ([20, 20], [], False)}
    step = _iterate(coord, 1)
    expected = planners.get(name)([([10, 800], 1), ([20, 20], 2)], 2, max_num_seqs=2)
    assert step.plan == expected[0]
    assert step.plan.in_blk == ([800] if name == "fill-protect" else [])

