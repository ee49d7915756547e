"""The promise checks of strict mode (``emu.rank.invariants``) as pure logic: how a plan
is expected to apply, and what the checker makes of what a scheduler did. (In real
ranks, with each promise broken: tests/integration/test_strict_promises.py and
tests/upstream/test_vllm_ascend_promises.py.)"""

from __future__ import annotations

from dyntra_lb.pause_limit import PauseLimit
from dyntra_lb.planner.front import Plan
from emu.rank.invariants import (
    Held,
    IterationEnd,
    PromiseChecker,
    Scheduled,
    admission_set,
    plan_pauses,
)


def test_out_blk_pauses_by_block_count_in_running_order_each_value_once():
    running, counts = ("a", "b", "c", "d"), (5, 3, 5, 9)
    assert plan_pauses([5], running, counts) == ["a"]
    assert plan_pauses([5, 5, 3], running, counts) == ["a", "b", "c"]
    assert plan_pauses([7, 9], running, counts) == ["d"]  # 7 matches nothing
    assert plan_pauses([], running, counts) == []


def test_the_admission_set_is_in_blk_matched_against_the_candidates_in_order():
    candidates = (("x", 4), ("y", 2), ("z", 4))
    assert admission_set(None, candidates) is None
    assert admission_set(Plan([], [4], freeze=True), candidates) == set()
    assert admission_set(Plan([], [4], False), candidates) == {"x"}
    assert admission_set(Plan([1], [4, 4, 8], False), candidates) == {"x", "z"}


class Rank:
    """What a checked rank holds, and the checker fed by a test iteration by iteration."""

    def __init__(self, late_outputs: bool = False):
        self.held: dict[str, Held] = {}
        self.checker = PromiseChecker(self.held.get, late_outputs)
        self.iteration = 0

    def end(self, running, counts, plan=None, candidates=()) -> list[str]:
        problems = self.checker.problems(IterationEnd(
            self.iteration, tuple(running), tuple(counts), plan, tuple(candidates)))
        self.iteration += 1
        return problems

    def schedule(self, running, preempted=(), admitted=(), resumed=None, drafts=None) -> None:
        self.checker.scheduled(Scheduled(frozenset(running), frozenset(preempted),
                                         tuple(admitted), resumed or {}, drafts or {}))


def test_a_pause_that_keeps_its_kv_and_resumes_where_it_stopped_passes():
    rank = Rank()
    rank.held.update(a=Held((1, 2), 20), b=Held((3,), 10))
    assert rank.end(["a", "b"], [2, 1], Plan([2], [], False)) == []
    rank.schedule(["b"])                                        # a paused
    assert rank.end(["b"], [1]) == []
    rank.held["a"] = Held((1, 2, 4), 20)                        # a new block for the token
    rank.schedule(["a", "b"], admitted=["a"], resumed={"a": Held((1, 2, 4), 20)})
    assert rank.end(["a", "b"], [2, 1]) == []


def test_a_kv_preemption_is_no_pause_and_unplanned_stops_are():
    rank = Rank()
    rank.held.update(a=Held((1,), 5), b=Held((2,), 5))
    assert rank.end(["a", "b"], [1, 1], Plan([], [], False)) == []
    rank.schedule(["a"], preempted=["b"])
    assert rank.end(["a"], [1]) == []
    rank.schedule([])
    (problem,) = rank.end([], [])
    assert problem.startswith("request 'a' stopped running at iteration 2 without a KV "
                              "preemption, but no plan (none was generated at iteration 1)")


def test_what_a_paused_request_holds_is_compared_with_before_the_pause():
    rank = Rank()
    rank.held.update(a=Held((1, 2), 20))
    rank.end(["a"], [2], Plan([2], [], True))
    rank.held["a"] = Held((7, 8), 20)                           # moved during the pause
    rank.schedule([])
    (problem,) = rank.end([], [])
    assert problem == ("paused request 'a' held KV blocks [1, 2] before iteration 1 "
                       "paused it, now [7, 8]")
    rank.held["a"] = Held((1, 2), 0)
    rank.schedule([])
    (problem,) = rank.end([], [])
    assert problem == ("paused request 'a' had 20 computed tokens before iteration 1 "
                       "paused it, now 0")


def test_a_paused_request_that_finishes_while_paused_is_forgotten():
    rank = Rank()
    rank.held.update(a=Held((1,), 3))
    rank.end(["a"], [1], Plan([1], [], True))
    rank.schedule([])
    rank.end([], [])
    del rank.held["a"]                                          # its late output finished it
    rank.schedule([])
    assert rank.end([], []) == []


def _paused_after_drafts(late_outputs: bool, rejected: int) -> list[str]:
    """a verifies 3 drafts in iteration 0, whose plan pauses it; in iteration 1 (the
    pausing one) that step's output lands and ``rejected`` of the drafts roll back.
    The problems of iterations 1 and 2 (a broken promise is reported in both: a real
    rank stops at the first)."""
    rank = Rank(late_outputs)
    rank.held.update(a=Held((1, 2), 24), b=Held((3,), 8))
    rank.schedule(["a", "b"], drafts={"a": 3, "b": 3})
    assert rank.end(["a", "b"], [2, 1], Plan([2], [], False)) == []
    rank.schedule(["b"])                                        # a paused
    rank.held["a"] = Held((1, 2), 24 - rejected)                # its late output landed
    problems = rank.end(["b"], [1])
    rank.schedule(["b"])
    return problems + rank.end(["b"], [1])                      # and it stays there


def test_late_outputs_may_roll_back_a_paused_requests_rejected_drafts_once():
    assert _paused_after_drafts(late_outputs=True, rejected=2) == []
    assert _paused_after_drafts(late_outputs=True, rejected=3) == []
    more_than_drafted = _paused_after_drafts(late_outputs=True, rejected=4)
    assert more_than_drafted == 2 * ["paused request 'a' had 24 computed tokens before "
                                     "iteration 1 paused it, now 20"]


def test_without_late_outputs_a_paused_request_loses_no_computed_token():
    assert _paused_after_drafts(late_outputs=False, rejected=1) == 2 * [
        "paused request 'a' had 24 computed tokens before iteration 1 paused it, now 23"]


class LimitedRank(Rank):
    """A rank under the kit's pause limit: each schedule() carries its time."""

    def __init__(self, limit_s: float, victim: str = "next"):
        super().__init__()
        self.checker = PromiseChecker(self.held.get, pause_limit=PauseLimit(limit_s, victim))

    def schedule_at(self, now_s, running, admitted=(), resumed=None) -> None:
        self.checker.scheduled(Scheduled(frozenset(running), frozenset(), tuple(admitted),
                                         resumed or {}, {}, now_s))


def test_under_a_pause_limit_a_request_left_paused_at_its_limit_is_a_broken_promise():
    rank = LimitedRank(1.0)
    rank.held.update(a=Held((1, 2), 20), b=Held((3,), 10))
    assert rank.end(["a", "b"], [2, 1], Plan([2], [], True)) == []
    rank.schedule_at(10.0, ["b"])                                # a paused at 10.0 s
    assert rank.end(["b"], [1], Plan([], [], True)) == []
    rank.schedule_at(10.9, ["b"])                                # 0.9 s: may stay paused
    assert rank.end(["b"], [1], Plan([], [], True)) == []
    rank.schedule_at(11.0, ["b"])                                # 1.0 s: must resume now
    (problem,) = rank.end(["b"], [1])
    assert problem == ("request 'a' has been paused 1000.0 ms in total, at its pause limit "
                       "of 1000 ms, but iteration 3 did not resume it: it stays paused past "
                       "the limit plus one step")


def test_under_a_pause_limit_resuming_a_request_at_its_limit_outside_the_plan_is_kept():
    rank = LimitedRank(1.0)
    rank.held.update(a=Held((1, 2), 20), b=Held((3,), 10))
    rank.end(["a", "b"], [2, 1], Plan([2], [], True))
    rank.schedule_at(10.0, ["b"])
    rank.end(["b"], [1], Plan([], [], True))                     # frozen: admits nothing
    rank.schedule_at(11.0, ["a", "b"], admitted=["a"], resumed={"a": Held((1, 2), 20)})
    assert rank.end(["a", "b"], [2, 1], Plan([2, 1], [], True)) == []
    # a has spent its budget: the plan's 2 is not its to serve, b serves the 1
    rank.schedule_at(12.0, ["a"])
    assert rank.end(["a"], [2]) == []
    rank2 = LimitedRank(1.0)
    rank2.held.update(a=Held((1, 2), 20))
    rank2.checker._paused_total["a"] = 1.0                       # a at its limit
    rank2.end(["a"], [2], Plan([2], [], True))
    rank2.schedule_at(5.0, [])                                   # paused anyway
    (problem,) = rank2.end([], [])
    assert problem.startswith("request 'a' stopped running at iteration 1 without a KV "
                              "preemption, but the plan generated at iteration 0")
