"""The pause rule, DyntraLB's one seam for what a plan pauses (dyntra_lb.pause_rule):
production's rule agrees with the strict checker's rule written apart, a run without a
limit gets production's rule, and the policy does what the rule it was handed says
(victims, requests resumed first, slots kept, and the pauses reported back)."""

import random
from types import SimpleNamespace

import pytest

from dyntra_lb.pause_limit import LimitedPauses, PauseLimit, pause_rule_for
from dyntra_lb.pause_rule import ProductionPauses
from dyntra_lb.planner.front import Plan
from dyntra_lb.policy import DyntraLBPolicy, RequestStatus
from emu.rank.invariants import plan_pauses
from tests.unit.test_policy import ListQueue, Req, ids


def test_production_s_victims_are_the_checker_s_production_pauses():
    """On random running lists and plans, ``ProductionPauses`` pauses what the strict
    checker's ``plan_pauses`` (written apart from the policy) says production pauses."""
    rng = random.Random(55)
    rule = ProductionPauses()
    for _ in range(300):
        running = [Req(f"r{i}", 4, status=RequestStatus.RUNNING)
                   for i in range(rng.randint(0, 8))]
        counts = [rng.randint(1, 4) for _ in running]
        out = [rng.randint(1, 5) for _ in range(rng.randint(0, 4))]
        chosen = [running[i].request_id for i in rule.victims(out, running, counts)]
        assert sorted(chosen) == sorted(plan_pauses(out, ids(running), counts)), \
            (out, counts)
        assert rule.begin_step(1.0) == [] and rule.reserved_slots(len(chosen)) == 0


def test_a_run_without_a_limit_gets_production_s_rule():
    assert isinstance(pause_rule_for(None), ProductionPauses)
    assert isinstance(pause_rule_for(PauseLimit(1.0)), LimitedPauses)
    scheduler = SimpleNamespace(policy="fcfs")
    assert isinstance(DyntraLBPolicy(scheduler).pause_rule, ProductionPauses)


def test_the_keyword_from_before_the_seam_still_limits():
    """``DyntraLBPolicy(pause_limit=...)``, issue 53's keyword, still gets the limited rule;
    given with ``pause_rule=`` too, it is refused in one line."""
    scheduler = SimpleNamespace(policy="fcfs")
    assert isinstance(DyntraLBPolicy(scheduler, pause_limit=PauseLimit(1.0)).pause_rule,
                      LimitedPauses)
    with pytest.raises(TypeError, match="pause_rule= or pause_limit=, not both"):
        DyntraLBPolicy(scheduler, pause_limit=PauseLimit(1.0), pause_rule=ProductionPauses())


class ScriptedRule(ProductionPauses):
    """A rule that pauses the last running request of each planned block count, resumes
    ``first`` first, keeps ``slots`` slots and records what the policy tells it."""

    def __init__(self, first=(), slots=0):
        self.first, self.slots, self.told = list(first), slots, []

    def begin_step(self, now_s):
        self.told.append(("step", now_s))
        return self.first

    def victims(self, out_blk, running, counts):
        return sorted({max(i for i, c in enumerate(counts) if c == blk)
                       for blk in out_blk if blk in counts})

    def reserved_slots(self, paused):
        return self.slots

    def paused(self, request_id):
        self.told.append(("paused", request_id))

    def resumed(self, request_id):
        self.told.append(("resumed", request_id))

    def forget(self, request_id):
        self.told.append(("forget", request_id))


def _policy(rule, running=(), waiting=(), skipped=()):
    scheduler = SimpleNamespace(
        running=list(running), waiting=ListQueue(waiting), skipped_waiting=ListQueue(skipped),
        max_num_running_reqs=3, policy="fcfs", cache_config=SimpleNamespace(block_size=4),
        kv_cache_manager=None, connector=None, scheduler_reserve_full_isl=False,
        _inflight_prefills=set(), _try_promote_blocked_waiting_request=lambda r: False)
    return scheduler, DyntraLBPolicy(scheduler, pause_rule=rule)


def test_the_policy_pauses_the_victims_its_rule_chooses_and_reports_them():
    running = [Req("a", 8, status=RequestStatus.RUNNING),
               Req("b", 8, status=RequestStatus.RUNNING),
               Req("c", 4, status=RequestStatus.RUNNING)]
    rule = ScriptedRule()
    scheduler, lb = _policy(rule, running=running)
    lb.set_plan(Plan(out_blk=[2], in_blk=[], freeze=True))
    assert ids(lb.apply_plan(2.5)) == ["b"]  # production would pause "a"
    assert ids(scheduler.running) == ["a", "c"] and ids(scheduler.waiting) == ["b"]
    assert rule.told == [("step", 2.5), ("paused", "b")]
    lb.on_scheduled(["b", "c"])
    lb.on_free(running[0])
    assert rule.told[2:] == [("resumed", "b"), ("forget", "a")]
    assert lb.paused_req_ids == set()


def test_the_rule_s_first_requests_lead_the_queue_and_pass_a_frozen_plan():
    waiting = [Req("w", 4, status=RequestStatus.PREEMPTED)]
    skipped = [Req("s", 4)]
    scheduler, lb = _policy(ScriptedRule(first=["w"]), waiting=waiting, skipped=skipped)
    lb.set_plan(Plan(out_blk=[], in_blk=[], freeze=True))
    assert lb.apply_plan(1.0) == []
    assert ids(scheduler.skipped_waiting) == ["w", "s"] and ids(scheduler.waiting) == []
    assert lb.can_admit(waiting[0]) and not lb.can_admit(skipped[0])


def test_the_slots_the_rule_keeps_hold_back_other_admissions():
    running = [Req("a", 4, status=RequestStatus.RUNNING)]
    new = Req("new", 4)
    _, lb = _policy(ScriptedRule(slots=2), running=running, waiting=[new])
    assert lb.apply_plan(1.0) == []  # no plan: unrestricted, but 1 running + 2 kept = 3
    assert not lb.can_admit(new)
    _, lb = _policy(ScriptedRule(slots=1), running=running, waiting=[new])
    lb.apply_plan(1.0)
    assert lb.can_admit(new)
