"""The two deadlocks of the reference's earlier balance-scheduling design, reproduced by
engines (subclasses of the kit's, below) that run DyntraLB's collectives where that
design had them, and turned by the guard into named failures with every rank stopped;
and the correct placement (right after the wave sync) running through 1,000 wave
boundaries under skewed, bursty arrivals (on rank threads; its first 50 on rank
processes too, byte for byte the same).

(A) the gather inside ``schedule()``: a rank without work runs a dummy step instead and
    never reaches the gather a busy rank waits in;
(B) the gather before the wave sync: each rank decides from its own unfinished requests
    whether to gather, so at the tail of a wave a rank that has drained goes on (to its
    next lockstep step) while a busy rank waits in the gather.

Real rank processes and gloo groups (the soak: rank threads, then processes); strict
mode is on.
"""

from __future__ import annotations

import itertools
import pathlib
import random

import pytest

from emu.cluster.launcher import launch
from emu.cluster.supervision import ClusterError
from emu.cluster.threads import run_in_threads
from emu.impl.kit.engine import EngineCore
from emu.records.reader import event_lines, read_table
from emu.records.schema import STEPS
from emu.run import run_cluster
from emu.spec import RunSpec, check
from emu.workload import TraceRequest

pytestmark = pytest.mark.integration

BLOCK_SIZE = 16
STATIC = {"scheduler_config": {"dyntra_lb_config": {
    "enabled": True, "mode": "static", "start_step": 0, "bubble_threshold": 1.0}}}
# Short: the stuck disagreement is found after min(2 s, timeout / 2) of standstill.
COLLECTIVE_TIMEOUT_S = 10.0
SOAK_WAVES = 1000
# The soak's first waves, run again on rank processes over gloo.
GLOO_WAVES = 50



class GatherInSchedule(EngineCore):
    """(A): DyntraLB's protocol inside ``schedule()``, which a rank without work (a dummy
    step) never calls; after the wave sync only the wave-end clearing remains."""

    def schedule(self, now_s):
        self.coordinator.after_dp_sync(True, step_counter=self.step_counter + 1,
                                       current_wave=self.current_wave)
        return super().schedule(now_s)

    def _has_global_unfinished_reqs(self, local_unfinished):
        self.coordinator.before_dp_sync(self.step_counter)
        running = self._sync_dp_state(local_unfinished)
        self._balance = None
        if not running:
            self.coordinator.after_dp_sync(False, step_counter=self.step_counter,
                                           current_wave=self.current_wave)
        return running


class GatherBeforeSync(EngineCore):
    """(B): DyntraLB's protocol before the wave sync, gated on this rank's own
    unfinished requests because the global answer is not known yet."""

    def _has_global_unfinished_reqs(self, local_unfinished):
        coordinator = self.coordinator
        coordinator.before_dp_sync(self.step_counter)
        self._balance = coordinator.after_dp_sync(
            local_unfinished, step_counter=self.step_counter + 1,
            current_wave=self.current_wave)
        running = self._sync_dp_state(local_unfinished)
        if not running:
            coordinator.after_dp_sync(False, step_counter=self.step_counter,
                                      current_wave=self.current_wave)
        return running


PLACEMENTS = {"in_schedule": GatherInSchedule, "before_sync": GatherBeforeSync}


def placed_target(ctx, args):
    """A rank whose engine runs DyntraLB's collectives at ``placement``."""
    implementation, engine_spec, placement = args
    engine = implementation.make_engine(ctx, engine_spec)
    engine.__class__ = PLACEMENTS[placement]  # same state, the placement's methods
    return engine.run()


def _spec(trace, out_dir, **fields) -> RunSpec:
    return RunSpec(trace=trace, dp_size=2, out_dir=out_dir, additional_config=STATIC,
                   max_num_seqs=4, block_size=BLOCK_SIZE, device="cpu", strict=True,
                   collective_timeout_s=COLLECTIVE_TIMEOUT_S, run_timeout_s=600.0, **fields)


def _run_placed(trace, out_dir, placement, transport="process"):
    """Run ``trace`` with DyntraLB's collectives at ``placement``, on rank processes
    (the launcher) or rank threads."""
    spec = _spec(trace, out_dir)
    checked = check(spec)
    args = (checked.implementation, checked.engine_spec, placement)
    if transport == "thread":
        pathlib.Path(out_dir).mkdir(parents=True, exist_ok=True)
        return run_in_threads(placed_target, args,
                              dp_size=spec.dp_size, out_dir=spec.out_dir,
                              collective_timeout_s=spec.collective_timeout_s,
                              run_timeout_s=spec.run_timeout_s)
    return launch(placed_target, args, dp_size=spec.dp_size,
                  device="cpu", out_dir=spec.out_dir,
                  collective_timeout_s=spec.collective_timeout_s,
                  run_timeout_s=spec.run_timeout_s)


def bursty_trace(num_bursts: int, seed: int = 0) -> list[TraceRequest]:
    """``num_bursts`` bursts, 3 s apart (longer than a wave lasts, so each burst starts a
    wave of its own). Each burst is skewed and ragged: rank 0 gets 1-4 requests, rank 1
    0-2 (none in about a third of the bursts), arriving over the first 0.3 s of the
    burst, with 1-24 output tokens, so ranks drain at different steps and sometimes a
    rank has no work for the whole wave."""
    rng = random.Random(seed)
    trace = []
    for burst in range(num_bursts):
        t0 = 3.0 * burst
        for rank, count in ((0, rng.randint(1, 4)), (1, rng.choice([0, 0, 1, 1, 2, 2]))):
            for i in range(count):
                trace.append(TraceRequest(
                    f"b{burst}-r{rank}-{i}", round(t0 + rng.uniform(0.0, 0.3), 4),
                    rng.randint(16, 600), rng.randint(1, 24), rank=rank))
    trace.sort(key=lambda r: r.arrival_s)
    return trace


def _assert_named_gather_deadlock(err: ClusterError) -> None:
    """The report names the disagreement: one rank waits in DyntraLB's all-gather on
    the DP group, the other in the lockstep all-reduce on the device group, at the same
    collective number; every rank's last collectives and Python stack are there."""
    assert err.rank is None
    assert err.message.startswith("collective mismatch: ")
    sites = {r: c["entered"]["site"] for r, c in err.collectives.items()}
    assert sorted(sites.values()) == ["dyntra_lb.allgather", "engine.lockstep"]
    assert all(c["inside"] for c in err.collectives.values())
    assert len({c["entered"]["seq"] for c in err.collectives.values()}) == 1
    for rank, site in sites.items():
        detail = err.details[rank]
        seq = err.collectives[rank]["entered"]["seq"]
        assert detail.startswith(f"last entered collective: seq {seq} {site} (")
        completed = f"seq {seq - 1} " if seq > 0 else "none"
        assert f"\nlast completed collective: {completed}" in detail
        assert "Python stack:" in detail
        # the stack shows the rank inside that very collective
        assert ("_all_gather" if site == "dyntra_lb.allgather" else "clock.py") in detail
    gatherer = next(r for r, s in sites.items() if s == "dyntra_lb.allgather")
    assert f"rank {gatherer} waits in seq" in err.message


def test_gather_inside_schedule_deadlocks_as_a_named_failure(tmp_path, no_leftover_processes):
    # Rank 1 has nothing to do in the first wave: it runs dummy steps, never schedule().
    trace = [TraceRequest("busy", 0.0, 200, 20, rank=0),
             TraceRequest("late", 5.0, 200, 5, rank=1)]
    with pytest.raises(ClusterError) as info:
        _run_placed(trace, tmp_path, "in_schedule")
    err = info.value
    _assert_named_gather_deadlock(err)
    assert err.collectives[0]["entered"]["site"] == "dyntra_lb.allgather"
    # the very first collective: the gather rank 0 runs inside its first schedule()
    assert err.collectives[0]["entered"]["seq"] == 0
    assert err.collectives[1]["entered"]["iteration"] == 0


def test_gather_before_wave_sync_deadlocks_at_the_wave_tail(tmp_path, no_leftover_processes):
    # Both ranks start busy; rank 1 drains after 3 tokens, rank 0 still has work.
    trace = [TraceRequest("long", 0.0, 200, 20, rank=0),
             TraceRequest("short", 0.0, 200, 3, rank=1)]
    with pytest.raises(ClusterError) as info:
        _run_placed(trace, tmp_path, "before_sync")
    err = info.value
    _assert_named_gather_deadlock(err)
    gather = err.collectives[0]["entered"]
    lockstep = err.collectives[1]["entered"]
    assert gather["site"] == "dyntra_lb.allgather"
    # rank 1 believed the wave over and went on to the next step's lockstep
    assert lockstep["iteration"] == gather["iteration"] + 1
    assert gather["wave"] == lockstep["wave"] == 0
    # until then both gathered every step: the plans of the earlier steps exist
    assert gather["iteration"] >= 2


@pytest.mark.parametrize("transport", ["process", "thread"])
@pytest.mark.parametrize("placement", ["in_schedule", "before_sync"])
def test_soak_workload_reaches_both_deadlocks(placement, transport, tmp_path,
                                              no_leftover_processes):
    """The workload of the 1,000-wave test is not tame: with either wrong placement it
    deadlocks, on rank processes as on the rank threads the soak runs on, and the
    guard names it the same way."""
    with pytest.raises(ClusterError) as info:
        _run_placed(bursty_trace(SOAK_WAVES), tmp_path, placement, transport)
    _assert_named_gather_deadlock(info.value)


@pytest.mark.soak  # 1,000 waves on rank threads (37,568 steps per rank), 50 on processes
def test_correct_placement_survives_1000_wave_boundaries(tmp_path, no_leftover_processes):
    """1,000 bursts, each a wave of its own, on rank threads: the thread transport runs
    the same engines over in-memory collectives, with event logs byte-identical to rank
    processes'. The first GLOO_WAVES bursts again on rank processes over gloo: their
    event logs are the thread run's first lines, byte for byte, so what the threads did
    at those wave boundaries is what gloo ranks do, and the run goes on from there on
    the same code and inputs."""
    trace = bursty_trace(SOAK_WAVES)
    result = run_cluster(_spec(trace, tmp_path / "threads", transport="thread"))
    assert [r.waves for r in result.ranks] == [SOAK_WAVES] * 2
    assert sum(r.num_finished for r in result.ranks) == len(trace)
    assert not result.truncated
    # the hazard was there: many waves where one rank had no work at all, and
    # DyntraLB planned on every non-idle iteration
    assert len(_idle_waves(result, rank=1)) > SOAK_WAVES // 5
    assert all(r.num_plans == r.steps - SOAK_WAVES for r in result.ranks)

    gloo = run_cluster(_spec(bursty_trace(GLOO_WAVES), tmp_path / "processes"))
    assert [r.waves for r in gloo.ranks] == [GLOO_WAVES] * 2
    assert len(_idle_waves(gloo, rank=1)) > GLOO_WAVES // 5
    for rank in (0, 1):
        lines = list(event_lines(gloo.out_dir, rank))
        assert lines == list(itertools.islice(event_lines(result.out_dir, rank),
                                              len(lines))), rank


def _idle_waves(result, rank: int) -> set[int]:
    """The waves in which ``rank`` ran only dummy steps (it had no request at all), from
    the steps table's columns (the thread run has tens of thousands of steps)."""
    steps = read_table(result.out_dir, rank, STEPS, ["wave", "dummy"]).to_pydict()
    busy = {wave for wave, dummy in zip(steps["wave"], steps["dummy"], strict=True)
            if not dummy}
    return set(steps["wave"]) - busy
