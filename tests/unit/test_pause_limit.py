"""The kit's opt-in pause limit (dyntra_lb.pause_limit, docs/pause-limit.md): the ledger's
bookkeeping of paused time, the victim rules, and the policy on the kit's stub scheduler
(a request at its limit is never a victim, is resumed first whatever the plan admits,
and finds a slot because paused requests keep theirs)."""

import functools
import random

import pytest

from dyntra_lb.pause_limit import PauseLedger, PauseLimit
from dyntra_lb.planner.front import Plan
from emu.rank.invariants import limited_pauses, plan_pauses
from tests.unit.test_policy import add_waiting, ids, make_scheduler, start_running, step

# ------------------------------------------------------------------ the ledger


def test_paused_time_sums_every_pause_and_an_open_one_counts_to_now():
    ledger = PauseLedger(PauseLimit(1.0))
    ledger.paused("a", 10.0)
    assert ledger.paused_s("a", 10.25) == pytest.approx(0.25)
    ledger.resumed("a", 10.5)
    assert ledger.paused_s("a", 99.0) == pytest.approx(0.5)  # closed: no longer grows
    ledger.paused("a", 20.0)
    assert ledger.paused_s("a", 20.4) == pytest.approx(0.9)
    assert not ledger.is_due("a", 20.49)
    assert ledger.is_due("a", 20.5)  # exactly the limit: due
    assert ledger.due_paused(20.5) == ["a"]
    ledger.resumed("a", 20.6)
    assert ledger.due_paused(30.0) == []  # due, but no longer paused
    assert ledger.is_due("a", 30.0)  # its budget is spent for good
    ledger.forget("a")
    assert ledger.paused_s("a", 40.0) == 0.0


def test_no_limit_is_never_due_and_a_bad_limit_or_victim_is_refused():
    ledger = PauseLedger(PauseLimit(None, "least-paused"))
    ledger.paused("a", 0.0)
    assert not ledger.is_due("a", 1e9)
    with pytest.raises(ValueError, match="pause victim must be one of"):
        PauseLimit(1.0, "oldest")
    with pytest.raises(ValueError, match="pause limit must be > 0"):
        PauseLimit(0.0)


def test_due_paused_lists_the_longest_paused_first():
    ledger = PauseLedger(PauseLimit(1.0))
    ledger.paused("short", 8.5)
    ledger.paused("long", 8.0)
    ledger.paused("fresh", 9.9)
    assert ledger.due_paused(10.0) == ["long", "short"]


# ------------------------------------------------------------------ the victims


def _ledger(victim: str, spent: dict[str, float], limit: float | None = 1.0) -> PauseLedger:
    """A ledger whose requests have already spent ``spent`` seconds paused."""
    ledger = PauseLedger(PauseLimit(limit, victim))
    for rid, seconds in spent.items():
        ledger.paused(rid, 0.0)
        ledger.resumed(rid, seconds)
    return ledger


RUNNING = ["a", "b", "c", "d"]
COUNTS = [5, 5, 3, 5]


def test_next_skips_a_request_at_its_limit_for_the_next_of_its_block_count():
    ledger = _ledger("next", {"a": 1.0, "b": 0.2})
    assert [RUNNING[i] for i in ledger.victims([5], RUNNING, COUNTS, 2.0)] == ["b"]
    assert [RUNNING[i] for i in ledger.victims([5, 5], RUNNING, COUNTS, 2.0)] == ["b", "d"]
    # none left of that block count: the value is dropped, the others still served
    assert [RUNNING[i] for i in ledger.victims([5, 5, 5, 3], RUNNING, COUNTS, 2.0)] == \
        ["b", "c", "d"]


def test_drop_never_substitutes_a_victim_at_its_limit():
    ledger = _ledger("drop", {"a": 1.0})
    assert ledger.victims([5], RUNNING, COUNTS, 2.0) == []
    assert [RUNNING[i] for i in ledger.victims([5, 5], RUNNING, COUNTS, 2.0)] == ["b"]


def test_least_paused_spreads_the_pauses_and_skips_requests_at_their_limit():
    ledger = _ledger("least-paused", {"a": 0.3, "b": 0.1, "d": 0.9})
    assert [RUNNING[i] for i in ledger.victims([5], RUNNING, COUNTS, 2.0)] == ["b"]
    assert [RUNNING[i] for i in ledger.victims([5, 5], RUNNING, COUNTS, 2.0)] == ["a", "b"]
    ledger = _ledger("least-paused", {"a": 0.0, "b": 1.0, "d": 0.0})  # tie: running order
    assert [RUNNING[i] for i in ledger.victims([5], RUNNING, COUNTS, 2.0)] == ["a"]
    assert [RUNNING[i] for i in ledger.victims([5, 5, 5], RUNNING, COUNTS, 2.0)] == ["a", "d"]


@pytest.mark.parametrize("victim", ["next", "drop", "least-paused"])
def test_the_checker_s_own_rule_agrees_and_without_anyone_due_next_is_production(victim):
    """On random running lists and plans: the strict checker's ``limited_pauses`` (written
    apart) gives the ledger's victims; with nobody due, ``next`` and ``drop`` pause
    exactly production's (``plan_pauses``)."""
    rng = random.Random(53)
    for _ in range(300):
        n = rng.randint(0, 8)
        running = [f"r{i}" for i in range(n)]
        counts = [rng.randint(1, 4) for _ in running]
        out = [rng.randint(1, 5) for _ in range(rng.randint(0, 4))]
        spent = {rid: rng.choice([0.0, 0.4, 1.0, 1.5]) for rid in running}
        ledger = _ledger(victim, spent)
        ours = [running[i] for i in ledger.victims(out, running, counts, 5.0)]
        theirs = limited_pauses(out, running, counts,
                                functools.partial(ledger.paused_s, now_s=5.0), 1.0, victim)
        assert ours == theirs, (out, running, counts, spent)
        if victim != "least-paused":
            fresh = _ledger(victim, {})
            assert [running[i] for i in fresh.victims(out, running, counts, 5.0)] == \
                plan_pauses(out, running, counts)


# ------------------------------------------------------------------ the policy


def limited(limit_s=1.0, victim="next", **kwargs):
    return make_scheduler(pause_limit=PauseLimit(limit_s, victim), **kwargs)


def test_a_request_at_its_limit_is_resumed_first_even_by_a_frozen_plan():
    scheduler = limited(1.0, max_num_seqs=4)
    r0, r1 = start_running(scheduler, [3, 7])  # 1 and 2 blocks
    scheduler.lb.set_plan(Plan(out_blk=[2], in_blk=[], freeze=True))
    out = step(scheduler, 1.0)
    assert out.paused_req_ids == ["r1"]
    out = step(scheduler, 1.6)  # paused 0.6 s: still frozen out
    assert out.resumed_req_ids == [] and "r1" not in ids(scheduler.running)
    out = step(scheduler, 2.0)  # paused 1.0 s: at its limit, resumed whatever the plan
    assert out.resumed_req_ids == ["r1"]
    assert r1.pauses == [[1.0, 2.0]]
    assert scheduler.lb.pause_rule.ledger.paused_s("r1", 9.0) == pytest.approx(1.0)


def test_a_request_at_its_limit_is_never_paused_again():
    scheduler = limited(1.0)
    start_running(scheduler, [7, 7])  # two requests of 2 blocks
    scheduler.lb.set_plan(Plan(out_blk=[2], in_blk=[], freeze=True))
    assert step(scheduler, 1.0).paused_req_ids == ["r0"]
    scheduler.lb.set_plan(Plan(out_blk=[], in_blk=[], freeze=True))
    assert step(scheduler, 2.0).resumed_req_ids == ["r0"]  # r0 has spent its budget
    running = ids(scheduler.running)
    blocks = dict(zip(running, scheduler.lb.running_block_counts(), strict=True))
    scheduler.lb.set_plan(Plan(out_blk=[blocks["r0"]], in_blk=[], freeze=True))
    out = step(scheduler, 3.0)
    assert "r0" not in out.paused_req_ids and "r0" in ids(scheduler.running)
    # the value went to the next request of that block count, if there is one
    assert out.paused_req_ids == (["r1"] if blocks["r1"] == blocks["r0"] else [])


def test_paused_requests_keep_their_slots_from_new_admissions():
    """max_num_seqs 2, r1 paused, a plan that admits a new request and not r1: production
    fills r1's slot with it; under a limit the slot stays r1's, which resumes at its
    limit."""
    for limit in (1.0, None):
        scheduler = (limited(limit, max_num_seqs=2) if limit
                     else make_scheduler(max_num_seqs=2))
        start_running(scheduler, [3, 7])
        scheduler.lb.set_plan(Plan(out_blk=[2], in_blk=[], freeze=False))
        step(scheduler, 1.0)
        add_waiting(scheduler, "new", 3)  # 1 block
        scheduler.lb.prepare_step()
        scheduler.lb.set_plan(Plan(out_blk=[], in_blk=[1], freeze=False))
        out = step(scheduler, 1.5)
        assert ("new" in out.new_req_ids) is (limit is None)
        scheduler.lb.set_plan(Plan(out_blk=[], in_blk=[], freeze=True))
        out = step(scheduler, 2.0)
        assert ("r1" in out.resumed_req_ids) is (limit is not None)
