"""The collective guard end to end, with real rank processes and gloo groups: each rank
records its collectives through a ``CollectiveRecorder`` on the launcher's guard slot, and
the launcher's watchdog turns a hang, a silent disagreement, a rank that stops early or a
step/wave disagreement into one named ``ClusterError`` with every rank's last entered and
completed collective and Python stack, and no rank process left."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from emu.cluster.launcher import launch
from emu.cluster.supervision import ClusterError
from emu.rank.recorder import CollectiveRecorder

pytestmark = pytest.mark.integration

TIMEOUT_S = 3.0



# --- targets (module level: the spawn start method pickles them by name) ---------------


class _Rank:
    """A rank that issues recorded collectives like the engine does: ``where`` carries
    the engine-like position (iteration, step_counter, current_wave)."""

    def __init__(self, ctx):
        self.ctx = ctx
        self.where = SimpleNamespace(iteration=0, step_counter=0, current_wave=0)
        self.record = CollectiveRecorder(ctx.guard, where=self.where)
        self.sync = torch.zeros(2, dtype=torch.int32)
        self.step = torch.zeros(5, dtype=torch.int32)

    def dp_sync(self, op=dist.ReduceOp.SUM, name="all_reduce_sum"):
        self.record("engine.dp_sync", name, self.sync,
                    lambda: dist.all_reduce(self.sync, op=op, group=self.ctx.dp_group))

    def lockstep(self):
        self.record("engine.lockstep", "all_reduce_max", self.step,
                    lambda: dist.all_reduce(self.step, op=dist.ReduceOp.MAX,
                                            group=self.ctx.device_group))

    def iterate(self, n):
        for _ in range(n):
            self.lockstep()
            self.where.iteration += 1
            self.where.step_counter += 1


def stall_target(ctx, stalled_rank):
    rank = _Rank(ctx)
    rank.iterate(3)
    if ctx.rank == stalled_rank:
        time.sleep(3600)  # stuck outside any collective: the others wait in the next one
    rank.iterate(3)
    return rank.record.seq


def silent_mismatch_target(ctx, args):
    rank = _Rank(ctx)
    rank.iterate(2)
    if ctx.rank == 1:  # same group, shape and dtype: gloo completes it, nobody hangs
        rank.dp_sync(dist.ReduceOp.MAX, "all_reduce_max")
    else:
        rank.dp_sync()
    rank.iterate(200)
    return rank.record.seq


def step_counter_target(ctx, args):
    rank = _Rank(ctx)
    rank.iterate(4)
    if ctx.rank == 1:
        rank.where.step_counter += 1  # rank 1 is one step ahead from here on
    rank.iterate(200)
    return rank.record.seq


def early_finish_target(ctx, args):
    rank = _Rank(ctx)
    rank.iterate(4)
    if ctx.rank == 0:
        rank.dp_sync()  # rank 1 never enters this one: it is done
    return rank.record.seq


def many_collectives_target(ctx, n):
    rank = _Rank(ctx)
    for i in range(n):
        rank.lockstep()
        if i % 32 == 31:
            rank.dp_sync()
        rank.where.iteration += 1
    return rank.record.seq


# --- tests ------------------------------------------------------------------------------


def test_hang_names_the_waiting_rank_and_where_the_other_one_is(no_leftover_processes):
    with pytest.raises(ClusterError) as info:
        launch(stall_target, 1, dp_size=2, device="cpu", collective_timeout_s=TIMEOUT_S,
               run_timeout_s=120.0)
    err = info.value
    assert err.rank is None
    assert err.message == (
        f"collective hang: no rank completed a collective for {TIMEOUT_S:g} s "
        "(collective_timeout_s); waiting: rank 0 in seq 3 engine.lockstep; not in a "
        "collective: rank 1")
    assert err.collectives[0]["inside"] and not err.collectives[1]["inside"]
    assert err.collectives[0]["entered"] == {
        "seq": 3, "group": "device", "site": "engine.lockstep", "op": "all_reduce_max",
        "shape": [5], "dtype": "int32", "iteration": 3, "step_counter": 3, "wave": 0}
    assert err.collectives[1]["completed"]["seq"] == 2
    assert err.details[0].startswith(
        "last entered collective: seq 3 engine.lockstep (device group, all_reduce_max [5] "
        "int32) at iteration 3, step_counter 3, wave 0 (still inside)\n"
        "last completed collective: seq 2 engine.lockstep")
    # rank 1 was stopped and its stack shows where it is instead of the collective
    assert "stopped by the launcher" in err.details[1]
    assert "time.sleep" in err.details[1] or "stall_target" in err.details[1]
    assert "stall_target" in err.details[0]  # its gloo timeout traceback or its stack


def test_silent_disagreement_is_found_although_nothing_hangs(no_leftover_processes):
    with pytest.raises(ClusterError) as info:
        launch(silent_mismatch_target, None, dp_size=2, device="cpu",
               collective_timeout_s=30.0, run_timeout_s=120.0)
    err = info.value
    assert err.rank is None
    assert err.message == (
        "collective mismatch at seq 2: "
        "rank 0: seq 2 engine.dp_sync (dp group, all_reduce_sum [2] int32) at iteration 2, "
        "step_counter 2, wave 0; "
        "rank 1: seq 2 engine.dp_sync (dp group, all_reduce_max [2] int32) at iteration 2, "
        "step_counter 2, wave 0")
    assert set(err.details) == {0, 1}


def test_ranks_at_different_step_counters_are_a_mismatch(no_leftover_processes):
    with pytest.raises(ClusterError) as info:
        launch(step_counter_target, None, dp_size=2, device="cpu", collective_timeout_s=30.0,
               run_timeout_s=120.0)
    err = info.value
    assert err.message.startswith("collective mismatch at seq 4: rank 0: seq 4 engine.lockstep")
    assert "iteration 4, step_counter 4, wave 0; rank 1: seq 4" in err.message
    assert err.message.endswith("iteration 4, step_counter 5, wave 0")


def test_rank_finishing_while_a_peer_waits_is_a_mismatch_before_the_timeout(
        no_leftover_processes):
    with pytest.raises(ClusterError) as info:
        launch(early_finish_target, None, dp_size=2, device="cpu", collective_timeout_s=30.0,
               run_timeout_s=120.0)
    err = info.value
    # found by the standstill rule (2 s), long before the 30 s collective timeout
    assert err.message == ("collective mismatch: rank 1 finished its run after seq 3 "
                           "engine.lockstep, while rank 0 waits in seq 4 engine.dp_sync")
    assert err.details[1].startswith("last entered collective: seq 3 engine.lockstep")
    assert "had returned its result" in err.details[1]
    assert "early_finish_target" in err.details[0]


def test_a_long_matched_run_passes_the_guard(no_leftover_processes):
    n = 5000
    results = launch(many_collectives_target, n, dp_size=2, device="cpu",
                     collective_timeout_s=30.0, run_timeout_s=300.0)
    assert results == [n + n // 32] * 2
