"""Unit tests of dyntra_lb.policy (docs/protocol.md, "Plan application on the scheduler"),
on the emulator's stub scheduler and,
for engine-agnostic details, on a minimal stand-in scheduler."""

import logging
from types import SimpleNamespace

import pytest

from dyntra_lb.planner.front import Plan
from dyntra_lb.policy import DyntraLBPolicy, RequestStatus
from emu.impl.kit.request import Request
from emu.impl.kit.scheduler import Scheduler
from emu.rank.remote_kv import RemoteKVConnector
from tests.kit_steps import forward

BS = 4


def make_scheduler(**kwargs):
    args = dict(max_num_seqs=4, max_num_batched_tokens=64, block_size=BS,
                num_gpu_blocks=100, dyntra_lb=True)
    args.update(kwargs)
    return Scheduler(**args)


def step(scheduler, now_s):
    output = scheduler.schedule(now_s)
    forward(scheduler, output, now_s + 1.0)
    return output


def start_running(scheduler, prompts, output_tokens=20):
    """Admit one request per prompt length and run one step: each then decodes with
    ``prompt + 1`` tokens (prompt 3 -> 1 block, 7 -> 2 blocks, 11 -> 3 blocks)."""
    requests = [Request(f"r{i}", p, output_tokens) for i, p in enumerate(prompts)]
    for request in requests:
        scheduler.add_request(request)
    step(scheduler, 0.0)
    assert scheduler.running == requests
    return requests


def add_waiting(scheduler, name, prompt, output_tokens=20):
    request = Request(name, prompt, output_tokens)
    scheduler.add_request(request)
    return request


def ids(requests):
    return [r.request_id for r in requests]


# ------------------------------------------------------------------------ state


def test_initial_state_and_no_plan_means_unrestricted_admission():
    scheduler = make_scheduler()
    lb = scheduler.lb
    assert lb.plan is None and lb.paused_req_ids == set()
    assert lb.admission_candidates == [] and lb.admit_req_ids is None
    # a frozen plan restricts admission; once cleared, its freeze does not linger
    lb.set_plan(Plan(out_blk=[], in_blk=[], freeze=True))
    assert lb.apply_plan() == [] and lb.admit_req_ids == set()
    assert not lb.can_admit(Request("x", 1, 1))
    lb.clear_plan()
    assert lb.apply_plan() == []
    assert lb.admit_req_ids is None
    assert lb.can_admit(Request("x", 1, 1))


def test_set_and_clear_plan_leave_the_prefetch_on():
    scheduler = make_scheduler(connector=RemoteKVConnector(1.0, 0.0))
    lb = scheduler.lb
    plan = Plan([1], [], True)
    lb.set_plan(plan)
    assert lb.plan is plan
    lb.clear_plan()
    assert lb.plan is None
    # dropping the plan does not stop the next snapshot from prefetching
    waiting = add_waiting(scheduler, "w", 8)
    assert lb.prepare_step() == []
    assert waiting.status == RequestStatus.WAITING_FOR_REMOTE_KVS


def test_block_counts_of_running_and_candidates():
    scheduler = make_scheduler(max_num_seqs=2)
    start_running(scheduler, [3, 11])
    add_waiting(scheduler, "w0", 7)
    add_waiting(scheduler, "w1", 20)
    lb = scheduler.lb
    assert ids(lb.prepare_step()) == ["w0", "w1"]
    assert lb.running_block_counts() == [1, 3]
    assert lb.block_counts(lb.admission_candidates) == [2, 5]


def test_invalid_block_size_raises():
    scheduler = make_scheduler()
    start_running(scheduler, [3])
    scheduler.cache_config.block_size = 0
    with pytest.raises(RuntimeError, match="Invalid DyntraLB block size: 0"):
        scheduler.lb.running_block_counts()


# ---------------------------------------------------------------------- pause


def test_pause_keeps_kv_and_computed_tokens():
    scheduler = make_scheduler()
    r0, r1 = start_running(scheduler, [3, 7])
    kv = scheduler.kv_cache_manager
    blocks = kv.get_blocks("r1")
    computed = r1.num_computed_tokens
    used = kv.pool.num_used_blocks
    lb = scheduler.lb
    lb.prepare_step()
    lb.set_plan(Plan(out_blk=[2], in_blk=[], freeze=True))
    output = scheduler.schedule(1.0)
    assert output.paused_req_ids == ["r1"]
    assert output.num_scheduled_tokens == {"r0": 1}
    assert r1.status == RequestStatus.PREEMPTED
    assert r1.num_computed_tokens == computed
    assert r1.num_preemptions == 0
    assert kv.get_blocks("r1") == blocks and kv.pool.num_used_blocks == used
    assert lb.paused_req_ids == {"r1"}
    assert r1 not in scheduler.running
    # prepended to waiting, then parked by the (empty) admit set
    assert list(scheduler.skipped_waiting) == [r1] and not scheduler.waiting
    assert r1.pauses == [[1.0, None]]
    assert scheduler.has_unfinished_requests()


def test_out_matching_by_block_count_in_running_order():
    scheduler = make_scheduler()
    start_running(scheduler, [7, 11, 7, 3])  # blocks 2, 3, 2, 1
    lb = scheduler.lb
    lb.set_plan(Plan(out_blk=[2, 5, 2], in_blk=[], freeze=True))
    output = scheduler.schedule(1.0)
    assert output.paused_req_ids == ["r0", "r2"]  # 5 matches nothing: ignored
    assert ids(scheduler.running) == ["r1", "r3"]
    # each pause prepends to waiting: the last paused ends up first
    assert ids(scheduler.skipped_waiting) == ["r2", "r0"]


def test_pause_logs_diagnostics_line_only_when_enabled(caplog):
    caplog.set_level(logging.INFO, logger="dyntra_lb")
    for enable in (False, True):
        scheduler = make_scheduler(enable_diagnostics=enable)
        start_running(scheduler, [3])
        scheduler.lb.set_plan(Plan(out_blk=[1], in_blk=[], freeze=True))
        scheduler.schedule(1.0)
    pause_lines = [r.getMessage() for r in caplog.records
                   if r.getMessage().startswith("DYNTRA_LB_PAUSE")]
    assert pause_lines == ["DYNTRA_LB_PAUSE request_id=r0"]
    assert all(r.name == "dyntra_lb" for r in caplog.records)


def test_paused_request_is_not_readmitted_in_the_same_step():
    scheduler = make_scheduler()
    start_running(scheduler, [7])
    waiting = add_waiting(scheduler, "w", 8)  # 2 blocks, like the paused one
    lb = scheduler.lb
    lb.prepare_step()
    lb.set_plan(Plan(out_blk=[2], in_blk=[2], freeze=False))
    output = scheduler.schedule(1.0)
    assert output.paused_req_ids == ["r0"]
    assert output.new_req_ids == ["w"] and output.resumed_req_ids == []
    assert scheduler.running == [waiting]


# ---------------------------------------------------------- resume and freeze


def test_paused_request_resumes_as_cached_request_without_plan():
    scheduler = make_scheduler()
    (r0,) = start_running(scheduler, [7])
    kv = scheduler.kv_cache_manager
    lb = scheduler.lb
    lb.set_plan(Plan(out_blk=[2], in_blk=[], freeze=True))
    forward(scheduler, scheduler.schedule(1.0), 2.0)
    blocks = kv.get_blocks("r0")
    computed = r0.num_computed_tokens
    lb.clear_plan()
    output = step(scheduler, 2.0)
    assert output.resumed_req_ids == ["r0"] and output.new_req_ids == []
    assert output.num_scheduled_tokens == {"r0": r0.num_tokens - 1 - computed}
    assert r0.status == RequestStatus.RUNNING
    assert kv.get_blocks("r0")[:len(blocks)] == blocks
    assert lb.paused_req_ids == set()
    assert r0.pauses == [[1.0, 2.0]]
    assert r0.num_preemptions == 0


def test_paused_request_becomes_candidate_and_is_admitted_by_in_blk():
    scheduler = make_scheduler()
    (r0,) = start_running(scheduler, [7])
    lb = scheduler.lb
    lb.prepare_step()
    lb.set_plan(Plan(out_blk=[2], in_blk=[], freeze=True))
    step(scheduler, 1.0)
    assert lb.prepare_step() == [r0]  # paused: a candidate from the next snapshot on
    lb.set_plan(Plan(out_blk=[], in_blk=[2], freeze=False))
    output = step(scheduler, 2.0)
    assert output.resumed_req_ids == ["r0"]
    assert "r0" not in lb.paused_req_ids


def test_freeze_admits_nothing_including_new_arrivals():
    scheduler = make_scheduler()
    start_running(scheduler, [3])
    add_waiting(scheduler, "w0", 7)
    lb = scheduler.lb
    lb.prepare_step()
    lb.set_plan(Plan(out_blk=[], in_blk=[2], freeze=True))
    add_waiting(scheduler, "late", 7)  # arrived after the snapshot
    output = scheduler.schedule(1.0)
    assert output.num_scheduled_tokens == {"r0": 1}
    assert lb.plan.freeze is True and lb.admit_req_ids == set()
    assert ids(scheduler.skipped_waiting) == ["w0", "late"]


def test_empty_in_blk_without_freeze_also_admits_nothing():
    scheduler = make_scheduler()
    add_waiting(scheduler, "w0", 7)
    lb = scheduler.lb
    lb.prepare_step()
    lb.set_plan(Plan(out_blk=[], in_blk=[], freeze=False))
    output = scheduler.schedule(0.0)
    assert output.num_scheduled_tokens == {} and not scheduler.running


def test_new_arrival_is_not_a_candidate_of_the_current_plan():
    scheduler = make_scheduler()
    add_waiting(scheduler, "w0", 3)
    lb = scheduler.lb
    lb.prepare_step()
    lb.set_plan(Plan(out_blk=[], in_blk=[2], freeze=False))
    add_waiting(scheduler, "late", 7)  # 2 blocks, but not in the snapshot
    output = scheduler.schedule(0.0)
    assert output.num_scheduled_tokens == {}
    assert lb.admit_req_ids == set()


# ------------------------------------------------------------------ admission


def test_admission_by_block_count_in_candidate_order():
    scheduler = make_scheduler()
    for name, prompt in (("a", 8), ("b", 11), ("c", 7), ("d", 5)):  # blocks 2, 3, 2, 2
        add_waiting(scheduler, name, prompt)
    lb = scheduler.lb
    assert ids(lb.prepare_step()) == ["a", "b", "c", "d"]
    lb.set_plan(Plan(out_blk=[], in_blk=[2, 3, 2, 9], freeze=False))
    output = scheduler.schedule(0.0)
    assert lb.admit_req_ids == {"a", "b", "c"}
    assert output.new_req_ids == ["a", "b", "c"]
    assert ids(scheduler.skipped_waiting) == ["d"]


def test_same_block_count_admits_first_candidate():
    scheduler = make_scheduler()
    first = add_waiting(scheduler, "first", 6)
    second = add_waiting(scheduler, "second", 6)
    lb = scheduler.lb
    lb.prepare_step()
    lb.set_plan(Plan(out_blk=[], in_blk=[2], freeze=False))
    scheduler.schedule(0.0)
    assert scheduler.running == [first]
    assert list(scheduler.skipped_waiting) == [second]


def test_admitted_requests_still_obey_max_num_seqs():
    scheduler = make_scheduler(max_num_seqs=1)
    add_waiting(scheduler, "a", 6)
    add_waiting(scheduler, "b", 6)
    lb = scheduler.lb
    lb.prepare_step()
    lb.set_plan(Plan(out_blk=[], in_blk=[2, 2], freeze=False))
    output = scheduler.schedule(0.0)
    assert output.new_req_ids == ["a"]


def test_plan_is_not_cleared_after_use():
    scheduler = make_scheduler()
    add_waiting(scheduler, "a", 6)
    lb = scheduler.lb
    lb.prepare_step()
    plan = Plan(out_blk=[], in_blk=[], freeze=True)
    lb.set_plan(plan)
    step(scheduler, 0.0)
    assert lb.plan is plan
    assert step(scheduler, 1.0).num_scheduled_tokens == {}


# --------------------------------------------------------------- prepare step


def test_prefetch_limit_counts_before_outcome(monkeypatch):
    scheduler = make_scheduler(max_num_seqs=1, connector=RemoteKVConnector(1.0, 0.0))
    for i in range(4):
        add_waiting(scheduler, f"w{i}", 8)
    answers = iter([(None, False), (0, False)])
    monkeypatch.setattr(scheduler.connector, "get_num_new_matched_tokens",
                        lambda request, num_local: next(answers))
    lb = scheduler.lb
    # limit = 2 * 1 - 0: w0 (not ready) and w1 (nothing to load) use it up
    assert ids(lb.prepare_step()) == ["w1"]
    assert ids(scheduler.waiting) == ["w0", "w1", "w2", "w3"]


def test_prefetch_starts_remote_loads_and_moves_them_to_skipped_end():
    connector = RemoteKVConnector(latency_fixed_s=1.0, latency_per_block_s=0.0)
    scheduler = make_scheduler(max_num_seqs=2, connector=connector)
    parked = add_waiting(scheduler, "parked", 8)
    connector.set_not_ready("parked", queries=1)
    scheduler.schedule(0.0)  # the waiting loop parks it: not ready
    assert list(scheduler.skipped_waiting) == [parked]
    start = [add_waiting(scheduler, f"w{i}", 8) for i in range(5)]
    lb = scheduler.lb
    candidates = lb.prepare_step()
    # limit 4: parked (skipped, first in order), w0, w1, w2 start loading; w3, w4 not ready
    loading = [parked] + start[:3]
    for request in loading:
        assert request.status == RequestStatus.WAITING_FOR_REMOTE_KVS
        assert request.num_computed_tokens == 8
        assert request in scheduler._inflight_prefills
        assert scheduler.kv_cache_manager.num_blocks_of(request) == 2
    assert list(scheduler.skipped_waiting) == loading  # parked kept its place
    assert list(scheduler.waiting) == start[3:]
    assert candidates == []  # loading ones are blocked, the rest not ready
    # a frozen step (no admission, hence no lookups), then the next snapshot after the
    # transfers landed: promoted in place, now candidates; its prefetch starts the
    # loads of w3 and w4 (limit 4, the promoted ones have computed tokens: not counted)
    lb.set_plan(Plan(out_blk=[], in_blk=[], freeze=True))
    forward(scheduler, scheduler.schedule(0.5), 1.0)
    assert lb.prepare_step() == loading
    assert [r.status for r in loading] == [RequestStatus.WAITING] * 4
    assert [r.num_computed_tokens for r in loading] == [7] * 4
    assert [r.status for r in start[3:]] == [RequestStatus.WAITING_FOR_REMOTE_KVS] * 2
    assert list(scheduler.skipped_waiting) == loading + start[3:]
    assert not scheduler.waiting


def test_prefetched_transfer_starts_at_the_end_of_the_step():
    connector = RemoteKVConnector(latency_fixed_s=2.0, latency_per_block_s=0.5)
    scheduler = make_scheduler(connector=connector)
    step(scheduler, 0.0)  # an empty step ending at 1.0
    waiting = add_waiting(scheduler, "w", 8)
    scheduler.lb.prepare_step()
    assert waiting.status == RequestStatus.WAITING_FOR_REMOTE_KVS
    assert connector.finished_recving(3.99) == set()
    assert connector.finished_recving(4.0) == {"w"}  # 1.0 + 2.0 + 2 blocks * 0.5


def test_prefetch_limit_shrinks_with_running_and_may_be_negative():
    connector = RemoteKVConnector(1.0, 0.0)
    scheduler = make_scheduler(max_num_seqs=2, connector=connector)
    lb = scheduler.lb
    for i in range(3):
        add_waiting(scheduler, f"w{i}", 8)
    scheduler.running.extend(Request(f"x{i}", 1, 1) for i in range(5))  # limit -1
    assert lb.prepare_step() == []
    assert all(r.status == RequestStatus.WAITING for r in scheduler.waiting)


def test_prefetch_allocation_failure_leaves_request_in_waiting():
    connector = RemoteKVConnector(1.0, 0.0)
    scheduler = make_scheduler(connector=connector, num_gpu_blocks=2)
    big = add_waiting(scheduler, "big", 12)
    small = add_waiting(scheduler, "small", 4)
    lb = scheduler.lb
    assert lb.prepare_step() == []
    assert big.status == RequestStatus.WAITING and big.num_computed_tokens == 0
    assert list(scheduler.waiting) == [big]
    assert small.status == RequestStatus.WAITING_FOR_REMOTE_KVS


def test_without_connector_the_snapshot_loads_nothing():
    scheduler = make_scheduler(connector=None)
    requests = [add_waiting(scheduler, f"w{i}", 8) for i in range(3)]
    assert scheduler.lb.prepare_step() == requests
    assert scheduler.kv_cache_manager.pool.num_used_blocks == 0
    assert [r.status for r in requests] == [RequestStatus.WAITING] * 3
    assert [r.num_computed_tokens for r in requests] == [0] * 3
    assert list(scheduler.waiting) == requests and not scheduler.skipped_waiting


def test_paused_requests_are_candidates_but_never_prefetched():
    connector = RemoteKVConnector(1.0, 0.0)
    scheduler = make_scheduler(max_num_seqs=1, connector=connector)
    scheduler.add_request(Request("p", 7, 20))
    step(scheduler, 0.0)  # loads
    step(scheduler, 1.0)  # promoted and decoding
    (paused,) = scheduler.running
    lb = scheduler.lb
    lb.set_plan(Plan(out_blk=[2], in_blk=[], freeze=True))
    step(scheduler, 2.0)
    fresh = [add_waiting(scheduler, f"w{i}", 8) for i in range(3)]
    # limit 2 - 0: the paused request (KV kept) neither counts nor loads
    assert lb.prepare_step() == [paused]
    assert [r.status for r in fresh[:2]] == [RequestStatus.WAITING_FOR_REMOTE_KVS] * 2
    assert fresh[2].status == RequestStatus.WAITING


def test_candidates_include_preempted_exclude_blocked():
    connector = RemoteKVConnector(latency_fixed_s=100.0, latency_per_block_s=0.0)
    scheduler = make_scheduler(connector=connector)
    loading = add_waiting(scheduler, "loading", 8)
    scheduler.schedule(0.0)
    assert loading.status == RequestStatus.WAITING_FOR_REMOTE_KVS
    preempted = add_waiting(scheduler, "pre", 4)
    preempted.status = RequestStatus.PREEMPTED
    preempted.num_preemptions = 1
    # its prompt was loaded before the preemption: the connector offers nothing more,
    # so the snapshot's prefetch leaves it as it is (it recomputes locally)
    connector.update_state_after_alloc(preempted, [0], preempted.prompt_tokens)
    assert scheduler.lb.prepare_step() == [preempted]
    assert preempted.status == RequestStatus.PREEMPTED and preempted.num_computed_tokens == 0
    assert list(scheduler.waiting) == [preempted]


# -------------------------------------------------------- paused-id lifecycle


def test_paused_ids_leave_on_schedule_free_and_preempt():
    lb = make_scheduler().lb
    lb.paused_req_ids.update({"a", "b", "c", "d"})
    lb.on_scheduled({"a": 1, "x": 1})
    lb.on_free(SimpleNamespace(request_id="b"))
    lb.on_preempt(SimpleNamespace(request_id="c"))
    assert lb.paused_req_ids == {"d"}


def test_scheduler_calls_free_and_preempt_hooks(monkeypatch):
    scheduler = make_scheduler(num_gpu_blocks=2)
    calls = []
    monkeypatch.setattr(scheduler.lb, "on_free", lambda r: calls.append(("free", r.request_id)))
    monkeypatch.setattr(scheduler.lb, "on_preempt",
                        lambda r: calls.append(("preempt", r.request_id)))
    scheduler.add_request(Request("a", 3, 5))  # needs a 2nd block at its 5th token
    scheduler.add_request(Request("b", 2, 1))
    step(scheduler, 0.0)  # b finishes after one token
    scheduler.add_request(Request("c", 4, 5))
    step(scheduler, 1.0)  # c takes the last block
    output = step(scheduler, 2.0)  # a needs a block: c, the last running, is preempted
    assert output.preempted_req_ids == ["c"]
    assert calls == [("free", "b"), ("preempt", "c")]


# ------------------------------------- consequences (docs/protocol.md, Q5, Q9)


def test_paused_kv_can_stall_a_preempted_head_of_line_request_for_good():
    """Quirk Q5 taken to its end on a KV-tight rank. The pause frees no KV; in the same step
    the remaining running request cannot grow and preempts itself, so no waiting loop
    runs and it is prepended ahead of the paused request. Recomputing it needs more
    blocks than the paused request leaves free, and the FCFS waiting loop stops at it
    every step: the paused request (which needs no new block) never resumes."""
    scheduler = make_scheduler(num_gpu_blocks=4)
    a, b = start_running(scheduler, [7, 8])  # 2 + 2 blocks: the pool is full
    assert (a.num_tokens, b.num_tokens) == (8, 9)  # block counts 2 and 3
    lb = scheduler.lb
    lb.set_plan(Plan(out_blk=[2], in_blk=[], freeze=True))
    output = step(scheduler, 1.0)
    assert output.paused_req_ids == ["r0"] and output.preempted_req_ids == ["r1"]
    assert list(scheduler.waiting) == [b, a]
    lb.clear_plan()
    for t in range(2, 12):
        assert step(scheduler, float(t)).num_scheduled_tokens == {}
    assert scheduler.kv_cache_manager.pool.get_num_free_blocks() == 2
    assert lb.paused_req_ids == {"r0"} and not scheduler.running


# --------------------------------------------- engine-agnostic (stand-in scheduler)


class ListQueue(list):
    def add_request(self, request):
        self.append(request)

    def prepend_request(self, request):
        self.insert(0, request)

    def remove_requests(self, requests):
        drop = {id(r) for r in requests}
        self[:] = [r for r in self if id(r) not in drop]


class Req:
    """A request that orders by priority only, so that ties can be tested."""

    def __init__(self, request_id, num_tokens, priority=0,
                 status=RequestStatus.WAITING, lb_newly_added=False):
        self.request_id = request_id
        self.num_tokens = num_tokens
        self.priority = priority
        self.status = status
        self.num_computed_tokens = 0
        if lb_newly_added:
            self.lb_newly_added = True

    def __lt__(self, other):
        return self.priority < other.priority


def stand_in(policy="fcfs", running=(), waiting=(), skipped=()):
    scheduler = SimpleNamespace(
        running=list(running), waiting=ListQueue(waiting), skipped_waiting=ListQueue(skipped),
        max_num_running_reqs=4, policy=policy, cache_config=SimpleNamespace(block_size=4),
        kv_cache_manager=None, connector=None, scheduler_reserve_full_isl=False,
        _inflight_prefills=set(), _try_promote_blocked_waiting_request=lambda r: False)
    return scheduler, DyntraLBPolicy(scheduler)


def test_fcfs_schedule_order_is_skipped_then_waiting():
    w = [Req("w0", 4), Req("w1", 4)]
    s = [Req("s0", 4), Req("s1", 4, status=RequestStatus.WAITING_FOR_REMOTE_KVS)]
    _, lb = stand_in(waiting=w, skipped=s)
    assert ids(lb.prepare_step()) == ["s0", "w0", "w1"]


def test_priority_schedule_order_merges_taking_waiting_only_when_strictly_smaller():
    w = [Req("w1", 4, priority=1), Req("w3", 4, priority=3)]
    s = [Req("s1", 4, priority=1), Req("s2", 4, priority=2), Req("s5", 4, priority=5)]
    _, lb = stand_in(policy=SimpleNamespace(value="priority"), waiting=w, skipped=s)
    assert ids(lb.prepare_step()) == ["s1", "w1", "s2", "w3", "s5"]


def test_blocked_requests_are_refreshed_through_the_scheduler():
    blocked = Req("b", 4, status=RequestStatus.WAITING_FOR_REMOTE_KVS)
    scheduler, lb = stand_in(skipped=[Req("s", 4), blocked])
    promoted = []

    def promote(request):
        promoted.append(request)
        request.status = RequestStatus.WAITING
        return True

    scheduler._try_promote_blocked_waiting_request = promote
    assert ids(lb.prepare_step()) == ["s", "b"]
    assert promoted == [blocked]


def test_newly_added_first_pass_is_preferred_when_flag_is_set():
    running = [Req("old", 8, status=RequestStatus.RUNNING),
               Req("new", 8, status=RequestStatus.RUNNING, lb_newly_added=True)]
    scheduler, lb = stand_in(running=running)
    lb.set_plan(Plan(out_blk=[2], in_blk=[], freeze=True))
    assert ids(lb.apply_plan()) == ["new"]
    assert ids(scheduler.running) == ["old"] and ids(scheduler.waiting) == ["new"]


def test_pausing_a_non_running_request_is_an_error():
    scheduler, lb = stand_in(running=[Req("odd", 8, status=RequestStatus.WAITING)])
    lb.set_plan(Plan(out_blk=[2], in_blk=[], freeze=True))
    with pytest.raises(AssertionError, match="Only running requests can be lb-paused"):
        lb.apply_plan()


def test_status_values_compare_with_plain_ints():
    # vLLM numbers its IntEnum from 1 in the same order; the policy relies on it
    request = Req("x", 4, status=int(RequestStatus.PREEMPTED))
    _, lb = stand_in(waiting=[request])
    assert lb.prepare_step() == [request]
