"""The collective guard without processes: the recorder's records and what it publishes
in its slot, and the watchdog's findings on slots written by recorders in this process
(a collective that raises stands for a rank stuck inside it; ``now`` is passed in)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from emu.cluster.watchdog import Watchdog
from emu.rank.recorder import CollectiveRecorder, GuardSlot


def test_records_then_runs_and_numbers_across_takes():
    recorder = CollectiveRecorder()
    order = []

    def fn():
        order.append(recorder.last["seq"])  # recorded before the collective runs
        return "result"

    assert recorder("engine.lockstep", "all_reduce_max", torch.zeros(5, dtype=torch.int32),
                    fn) == "result"
    recorder("dyntra_lb.allgather", "all_gather", torch.zeros(10, dtype=torch.int32), fn)
    assert recorder.take() == [
        {"seq": 0, "site": "engine.lockstep", "op": "all_reduce_max", "shape": [5],
         "dtype": "int32"},
        {"seq": 1, "site": "dyntra_lb.allgather", "op": "all_gather", "shape": [10],
         "dtype": "int32"},
    ]
    assert recorder.take() == []
    recorder("engine.dp_sync", "all_reduce_sum", torch.zeros(2, dtype=torch.int64), fn)
    assert recorder.take()[0]["seq"] == 2 and recorder.last["dtype"] == "int64"
    assert order == [0, 1, 2]


def test_a_new_buffer_at_a_site_gets_its_own_descriptor():
    recorder = CollectiveRecorder()
    recorder("s", "all_gather", torch.zeros(4, dtype=torch.int32), lambda: None)
    recorder("s", "all_gather", torch.zeros(2, 3, dtype=torch.float32), lambda: None)
    assert [(r["shape"], r["dtype"]) for r in recorder.take()] == [([4], "int32"),
                                                                 ([2, 3], "float32")]


class Stuck(Exception):
    pass


def _stuck():
    raise Stuck


class Ranks:
    """Two (or more) recorders on the slots of one watchdog, with engine-like positions."""

    def __init__(self, tmp_path, dp_size=2, timeout_s=10.0):
        self.watchdog = Watchdog(str(tmp_path / "guard"), dp_size, timeout_s)
        self.where = [SimpleNamespace(iteration=0, step_counter=0, current_wave=0)
                      for _ in range(dp_size)]
        self.rec = [CollectiveRecorder(GuardSlot.attach(str(tmp_path / "guard"), r),
                                       where=self.where[r]) for r in range(dp_size)]
        self.step = torch.zeros(5, dtype=torch.int32)
        self.sync = torch.zeros(2, dtype=torch.int32)
        self.gather = torch.zeros(10, dtype=torch.int32)

    def lockstep(self, rank, fn=lambda: None):
        self.rec[rank]("engine.lockstep", "all_reduce_max", self.step, fn)

    def steps(self, n, ranks=None):
        for _ in range(n):
            for r in ranks if ranks is not None else range(len(self.rec)):
                self.lockstep(r)
                self.where[r].iteration += 1
                self.where[r].step_counter += 1

    def stuck_in(self, rank, site, op, tensor):
        with pytest.raises(Stuck):
            self.rec[rank](site, op, tensor, _stuck)


def test_slot_shows_last_entered_and_completed_with_where(tmp_path):
    ranks = Ranks(tmp_path)
    assert ranks.watchdog.describe(0) == ""
    ranks.steps(3)
    ranks.stuck_in(0, "dyntra_lb.allgather", "all_gather", ranks.gather)
    assert ranks.watchdog.records(0) == {
        "entered": {"seq": 3, "group": "dp", "site": "dyntra_lb.allgather", "op": "all_gather",
                    "shape": [10], "dtype": "int32", "iteration": 3, "step_counter": 3,
                    "wave": 0},
        "completed": {"seq": 2, "group": "device", "site": "engine.lockstep",
                      "op": "all_reduce_max", "shape": [5], "dtype": "int32", "iteration": 2,
                      "step_counter": 2, "wave": 0},
        "inside": True}
    assert ranks.watchdog.describe(0) == (
        "last entered collective: seq 3 dyntra_lb.allgather (dp group, all_gather [10] int32) "
        "at iteration 3, step_counter 3, wave 0 (still inside)\n"
        "last completed collective: seq 2 engine.lockstep (device group, all_reduce_max [5] "
        "int32) at iteration 2, step_counter 2, wave 0")
    assert ranks.watchdog.records(1)["inside"] is False


def test_matching_ranks_give_no_finding(tmp_path):
    ranks = Ranks(tmp_path)
    for t in range(20):
        ranks.steps(50)
        assert ranks.watchdog.poll(float(t), set()) is None
    assert ranks.watchdog.finish() is None


def test_a_different_op_at_the_same_seq_is_found_after_both_completed_it(tmp_path):
    ranks = Ranks(tmp_path)
    ranks.steps(5)
    assert ranks.watchdog.poll(0.0, set()) is None
    ranks.rec[0]("engine.dp_sync", "all_reduce_sum", ranks.sync, lambda: None)
    ranks.rec[1]("engine.dp_sync", "all_reduce_max", ranks.sync, lambda: None)
    assert ranks.watchdog.poll(0.1, set()) == (
        "collective mismatch at seq 5: "
        "rank 0: seq 5 engine.dp_sync (dp group, all_reduce_sum [2] int32) at iteration 5, "
        "step_counter 5, wave 0; "
        "rank 1: seq 5 engine.dp_sync (dp group, all_reduce_max [2] int32) at iteration 5, "
        "step_counter 5, wave 0")


def test_a_different_wave_at_the_same_seq_is_found(tmp_path):
    ranks = Ranks(tmp_path)
    ranks.steps(2)
    ranks.where[1].current_wave = 1
    ranks.steps(2)
    finding = ranks.watchdog.poll(0.0, set())
    assert finding.startswith("collective mismatch at seq 2: rank 0: seq 2 engine.lockstep")
    assert finding.endswith("at iteration 2, step_counter 2, wave 1")


def test_a_disagreement_not_yet_completed_by_every_rank_waits(tmp_path):
    ranks = Ranks(tmp_path)
    ranks.steps(3)
    ranks.steps(1, ranks=[0])
    ranks.where[1].step_counter += 7
    assert ranks.watchdog.poll(0.0, set()) is None  # rank 1 has not completed seq 3 yet
    ranks.steps(1, ranks=[1])
    assert ranks.watchdog.poll(0.1, set()).startswith("collective mismatch at seq 3:")


def test_ranks_stuck_in_different_collectives_are_a_mismatch_once_nothing_moves(tmp_path):
    ranks = Ranks(tmp_path, timeout_s=10.0)
    ranks.steps(4)
    ranks.stuck_in(0, "dyntra_lb.allgather", "all_gather", ranks.gather)
    assert ranks.watchdog.poll(100.0, set()) is None
    ranks.stuck_in(1, "engine.lockstep", "all_reduce_max", ranks.step)
    assert ranks.watchdog.poll(100.5, set()) is None
    assert ranks.watchdog.poll(102.4, set()) is None  # standing still for 1.9 s only
    assert ranks.watchdog.poll(102.6, set()) == (
        "collective mismatch: "
        "rank 0 waits in seq 4 dyntra_lb.allgather (dp group, all_gather [10] int32) at "
        "iteration 4, step_counter 4, wave 0; "
        "rank 1 waits in seq 4 engine.lockstep (device group, all_reduce_max [5] int32) at "
        "iteration 4, step_counter 4, wave 0")


def test_a_rank_slow_to_leave_a_collective_its_peer_completed_is_no_mismatch(tmp_path):
    # Rank 0 completed seq 4 and waits in seq 5; rank 1 is still inside seq 4 (a starved
    # process on a loaded machine): seq 4 did complete, so nothing is stuck yet.
    ranks = Ranks(tmp_path, timeout_s=10.0)
    ranks.steps(4)
    ranks.steps(1, ranks=[0])
    ranks.stuck_in(0, "engine.lockstep", "all_reduce_max", ranks.step)
    ranks.stuck_in(1, "engine.lockstep", "all_reduce_max", ranks.step)
    assert ranks.watchdog.poll(100.0, set()) is None
    assert ranks.watchdog.poll(105.0, set()) is None  # stable for 5 s: still only slow
    assert ranks.watchdog.poll(110.0, set()).startswith("collective hang: ")


def test_ranks_stuck_in_the_same_collective_are_a_hang_at_the_timeout(tmp_path):
    ranks = Ranks(tmp_path, timeout_s=10.0)
    ranks.steps(4)
    assert ranks.watchdog.poll(0.0, set()) is None
    for rank in (0, 1):
        ranks.stuck_in(rank, "engine.lockstep", "all_reduce_max", ranks.step)
    assert ranks.watchdog.poll(0.1, set()) is None
    assert ranks.watchdog.poll(5.0, set()) is None  # identical: no mismatch, just slow
    assert ranks.watchdog.poll(9.9, set()) is None
    # 10 s after the last poll that saw a rank outside a collective
    assert ranks.watchdog.poll(10.0, set()) == (
        "collective hang: no rank completed a collective for 10 s (collective_timeout_s); "
        "waiting: rank 0 in seq 4 engine.lockstep, rank 1 in seq 4 engine.lockstep")


def test_hang_clock_runs_only_while_a_rank_waits_and_nothing_completes(tmp_path):
    ranks = Ranks(tmp_path, timeout_s=10.0)
    ranks.steps(1)
    assert ranks.watchdog.poll(0.0, set()) is None
    assert ranks.watchdog.poll(50.0, set()) is None  # nobody inside a collective
    ranks.stuck_in(0, "engine.lockstep", "all_reduce_max", ranks.step)
    assert ranks.watchdog.poll(51.0, set()) is None
    ranks.steps(3, ranks=[1])  # completions elsewhere are progress
    assert ranks.watchdog.poll(60.0, set()) is None
    assert ranks.watchdog.poll(69.9, set()) is None
    assert ranks.watchdog.poll(70.0, set()).startswith(
        "collective hang: no rank completed a collective for 10 s (collective_timeout_s); "
        "waiting: rank 0 in seq 1 engine.lockstep; not in a collective: rank 1")


def test_a_rank_that_finished_while_a_peer_waits_is_a_mismatch(tmp_path):
    ranks = Ranks(tmp_path)
    ranks.steps(3)
    ranks.stuck_in(0, "engine.dp_sync", "all_reduce_sum", ranks.sync)
    assert ranks.watchdog.poll(0.0, {1}) is None
    assert ranks.watchdog.poll(2.0, {1}) == (
        "collective mismatch: rank 1 finished its run after seq 2 engine.lockstep, while "
        "rank 0 waits in seq 3 engine.dp_sync")


def test_finish_compares_the_last_collectives_and_the_counts(tmp_path):
    ranks = Ranks(tmp_path)
    ranks.steps(3)
    ranks.lockstep(0)
    assert ranks.watchdog.finish() == ("collective mismatch: the ranks ended with different "
                                       "collective counts (rank 0 completed 4, rank 1 "
                                       "completed 3)")


def test_more_collectives_than_the_ring_holds_between_polls(tmp_path):
    ranks = Ranks(tmp_path)
    ranks.steps(10_000)  # the ring keeps 8192: the oldest are skipped, none misread
    assert ranks.watchdog.poll(0.0, set()) is None
    ranks.rec[0]("engine.dp_sync", "all_reduce_sum", ranks.sync, lambda: None)
    ranks.rec[1]("engine.dp_sync", "all_reduce_max", ranks.sync, lambda: None)
    assert ranks.watchdog.poll(0.1, set()).startswith("collective mismatch at seq 10000: ")


def test_new_recorders_in_the_same_ranks_start_over(tmp_path):
    ranks = Ranks(tmp_path)
    ranks.steps(300)
    assert ranks.watchdog.poll(0.0, set()) is None
    fresh = Ranks.__new__(Ranks)  # same slots, new recorders (a second engine per rank)
    fresh.where, fresh.step = ranks.where, ranks.step
    fresh.rec = [CollectiveRecorder(GuardSlot.attach(str(tmp_path / "guard"), r),
                                    where=ranks.where[r]) for r in (0, 1)]
    fresh.steps(10)
    assert ranks.watchdog.poll(0.1, set()) is None
    fresh.rec[0]("engine.dp_sync", "all_reduce_sum", ranks.sync, lambda: None)
    fresh.rec[1]("engine.dp_sync", "all_reduce_max", ranks.sync, lambda: None)
    assert ranks.watchdog.poll(0.2, set()).startswith("collective mismatch at seq 10: ")


def test_descriptors_beyond_the_name_area_are_reported_by_crc(tmp_path):
    ranks = Ranks(tmp_path)
    tensors = [torch.zeros(n + 1, dtype=torch.int32) for n in range(200)]
    for tensor in tensors:  # 200 distinct shapes at one site: more names than fit
        ranks.rec[0]("engine.lockstep", "all_reduce_max", tensor, lambda: None)
    record = ranks.watchdog.records(0)["entered"]
    assert record["seq"] == 199 and "site" not in record
    assert len(record["descriptor_crc"]) == 8
    assert ranks.watchdog.describe(0).startswith(
        f"last entered collective: seq 199 (descriptor {record['descriptor_crc']})")
