"""Unit tests of emu.impl.kit.scheduler: vLLM 0.27.1 request lifecycle of the stub scheduler."""

import logging
import random

import pytest

from dyntra_lb.blocks import num_blocks
from dyntra_lb.planner.front import Plan
from emu.impl.kit.request import Request, RequestStatus
from emu.impl.kit.scheduler import Scheduler
from emu.rank.remote_kv import RemoteKVConnector
from tests.kit_steps import forward

BS = 4


def make_scheduler(**kwargs):
    args = dict(max_num_seqs=4, max_num_batched_tokens=64, block_size=BS, num_gpu_blocks=100)
    args.update(kwargs)
    return Scheduler(**args)


def step(scheduler, now_s, dt=1.0):
    output = scheduler.schedule(now_s)
    finished = forward(scheduler, output, now_s + dt)
    return output, finished


def check_kv_conservation(scheduler):
    """Pool blocks in use == blocks held by running + waiting (paused, loading) requests;
    a request holds blocks outside ``running`` only while it keeps computed tokens."""
    kv = scheduler.kv_cache_manager
    queued = list(scheduler.waiting) + list(scheduler.skipped_waiting)
    holders = list(scheduler.running) + queued
    assert len({id(r) for r in holders}) == len(holders)
    assert kv.pool.num_used_blocks == sum(kv.num_blocks_of(r) for r in holders)
    assert kv.pool.num_used_blocks == kv.num_held_blocks
    for request in holders:
        assert kv.num_blocks_of(request) >= num_blocks(request.num_computed_tokens, BS)
    for request in queued:
        # (a promoted 1-token prompt has num_computed_tokens = num_tokens - 1 = 0)
        if request.num_computed_tokens == 0 and request.prompt_tokens > 1:
            assert kv.num_blocks_of(request) == 0
    for request in scheduler.running:
        assert request.status == RequestStatus.RUNNING


def test_request_status_matches_vllm_order():
    names = [s.name for s in RequestStatus]
    assert names == [
        "WAITING", "WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR", "WAITING_FOR_REMOTE_KVS",
        "WAITING_FOR_STREAMING_REQ", "RUNNING", "PREEMPTED", "FINISHED_STOPPED",
        "FINISHED_LENGTH_CAPPED", "FINISHED_ABORTED", "FINISHED_IGNORED", "FINISHED_ERROR",
        "FINISHED_REPETITION"]
    assert RequestStatus.WAITING == 1


def test_constructor_rejects_bad_arguments():
    with pytest.raises(ValueError, match="scheduling policy"):
        make_scheduler(policy="lifo")
    with pytest.raises(ValueError, match="max_num_seqs"):
        make_scheduler(max_num_seqs=0)
    with pytest.raises(ValueError, match="output_tokens"):
        Request("a", 4, 0)
    scheduler = make_scheduler()
    scheduler.add_request(Request("a", 4, 1))
    with pytest.raises(ValueError, match="duplicate"):
        scheduler.add_request(Request("a", 4, 1))


def test_prefill_chunks_by_budget_then_decodes_and_finishes_at_output_length():
    scheduler = make_scheduler(max_num_batched_tokens=4)
    request = Request("a", 10, 3, arrival_time=0.5)
    scheduler.add_request(request)
    assert scheduler.has_requests() and scheduler.has_unfinished_requests()
    scheduled = []
    finished = []
    for i in range(6):
        output, done = step(scheduler, float(i))
        scheduled.append(output.num_scheduled_tokens.get("a"))
        finished += done
        check_kv_conservation(scheduler)
    assert scheduled == [4, 4, 2, 1, 1, None]
    assert finished == [request]
    assert request.status == RequestStatus.FINISHED_LENGTH_CAPPED
    assert request.num_output_tokens == 3 and request.num_tokens == 13
    assert request.token_times_s == [3.0, 4.0, 5.0]
    assert request.finish_s == 5.0
    assert request.first_scheduled_s == 0.0
    assert scheduler.kv_cache_manager.pool.num_used_blocks == 0
    assert not scheduler.has_unfinished_requests() and "a" not in scheduler.requests
    record = request.record()
    assert record["arrival_s"] == 0.5 and record["pauses"] == []
    assert record["token_times_s"] == [3.0, 4.0, 5.0]


def test_second_schedule_before_the_update_schedules_the_next_chunk():
    """As vLLM, ``schedule()`` counts the tokens it scheduled as computed when it ends,
    so a second ``schedule()`` before ``update_from_output`` does not schedule them
    again: a prefill chunked by the token budget continues with its next chunk."""
    scheduler = make_scheduler(max_num_batched_tokens=4)
    request = Request("a", 10, 3)
    scheduler.add_request(request)
    first = scheduler.schedule(0.0)
    assert first.num_scheduled_tokens == {"a": 4} and first.new_req_ids == ["a"]
    assert request.num_computed_tokens == 4
    assert scheduler.kv_cache_manager.num_blocks_of(request) == 1
    second = scheduler.schedule(0.5)
    assert second.num_scheduled_tokens == {"a": 4}
    assert second.new_req_ids == [] and second.resumed_req_ids == []
    assert request.num_computed_tokens == 8
    assert scheduler.kv_cache_manager.num_blocks_of(request) == 2
    assert scheduler.running == [request]
    check_kv_conservation(scheduler)


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_a_paused_request_finishing_when_its_late_output_arrives_leaves_the_queues(policy):
    """With async scheduling the output of a step arrives after the next ``schedule()``.
    A request DyntraLB pauses in that next step, whose late output is its last token,
    finishes while it waits: as in vLLM's ``update_from_output`` (and vllm-ascend's
    ``_handle_stopped_request``) it leaves ``waiting`` and ``skipped_waiting`` too, and
    the next ``schedule()`` runs without it (it raised KeyError scheduling it again)."""
    scheduler = make_scheduler(dyntra_lb=True, policy=policy)
    short, other = Request("short", 4, 2), Request("other", 12, 10)
    scheduler.add_request(short)
    scheduler.add_request(other)
    step(scheduler, 0.0)                        # prefills: the first token of each
    last = scheduler.schedule(1.0)              # short's last token is computed ...
    assert last.num_scheduled_tokens == {"short": 1, "other": 1}
    blocks = num_blocks(short.num_tokens, BS)
    scheduler.lb.set_plan(Plan(out_blk=[blocks], in_blk=[], freeze=True))
    paused = scheduler.schedule(2.0)            # ... and short is paused before it arrives
    assert paused.paused_req_ids == ["short"]
    assert short in scheduler.skipped_waiting
    finished = forward(scheduler, last, 2.0)
    assert finished == [short] and short.status == RequestStatus.FINISHED_LENGTH_CAPPED
    assert short not in scheduler.waiting and short not in scheduler.skipped_waiting
    assert "short" not in scheduler.requests and not scheduler.lb.paused_req_ids
    forward(scheduler, paused, 3.0)
    scheduler.lb.clear_plan()
    output, _ = step(scheduler, 3.0)
    assert output.num_scheduled_tokens == {"other": 1}
    check_kv_conservation(scheduler)


def test_new_request_reported_once_and_running_first():
    scheduler = make_scheduler(max_num_batched_tokens=6)
    scheduler.add_request(Request("a", 5, 4))
    output, _ = step(scheduler, 0.0)
    assert output.new_req_ids == ["a"] and output.total_num_scheduled_tokens == 5
    scheduler.add_request(Request("b", 8, 4))
    output, _ = step(scheduler, 1.0)
    # the running decode goes first, the new prefill takes the rest of the budget
    assert output.num_scheduled_tokens == {"a": 1, "b": 5}
    assert output.new_req_ids == ["b"]
    assert output.total_num_scheduled_tokens == 6


def test_max_num_seqs_limits_running():
    scheduler = make_scheduler(max_num_seqs=2)
    for i in range(3):
        scheduler.add_request(Request(f"r{i}", 4, 2))
    output, _ = step(scheduler, 0.0)
    assert output.new_req_ids == ["r0", "r1"]
    assert [r.request_id for r in scheduler.waiting] == ["r2"]
    step(scheduler, 1.0)  # r0, r1 finish
    output, _ = step(scheduler, 2.0)
    assert output.new_req_ids == ["r2"]


def test_kv_exhaustion_preempts_last_running_and_blocks_waiting_loop():
    scheduler = make_scheduler(num_gpu_blocks=2)
    scheduler.add_request(Request("r0", 4, 5))  # needs a 2nd block at its 5th token
    scheduler.add_request(Request("r1", 2, 5))
    step(scheduler, 0.0)
    scheduler.add_request(Request("r2", 1, 1))
    output, _ = step(scheduler, 1.0)
    r1 = next(r for r in scheduler.waiting if r.request_id == "r1")
    assert output.preempted_req_ids == ["r1"]
    assert output.num_scheduled_tokens == {"r0": 1}  # no waiting admission this step
    assert r1.status == RequestStatus.PREEMPTED
    assert r1.num_computed_tokens == 0 and r1.num_preemptions == 1
    assert [r.request_id for r in scheduler.waiting] == ["r1", "r2"]
    assert scheduler.kv_cache_manager.num_blocks_of(r1) == 0
    check_kv_conservation(scheduler)
    # once r0 finishes, r1 resumes and recomputes prompt + generated tokens
    for t in range(2, 6):
        output, _ = step(scheduler, float(t))
        check_kv_conservation(scheduler)
        if "r1" in output.num_scheduled_tokens:
            break
    assert output.resumed_req_ids == ["r1"]
    assert output.num_scheduled_tokens["r1"] == 3  # 2 prompt + 1 generated


def test_request_that_cannot_grow_preempts_itself():
    scheduler = make_scheduler(num_gpu_blocks=1)
    scheduler.add_request(Request("a", 4, 3))
    step(scheduler, 0.0)
    output, _ = step(scheduler, 1.0)
    assert output.preempted_req_ids == ["a"]
    assert output.num_scheduled_tokens == {}
    assert scheduler.kv_cache_manager.pool.num_used_blocks == 0


def test_remote_kv_load_latency_then_promotion():
    connector = RemoteKVConnector(latency_fixed_s=0.5, latency_per_block_s=0.25)
    scheduler = make_scheduler(block_size=16, connector=connector)
    request = Request("a", 40, 2)
    scheduler.add_request(request)
    output, _ = step(scheduler, 0.0, dt=0.25)
    assert output.num_scheduled_tokens == {}
    assert request.status == RequestStatus.WAITING_FOR_REMOTE_KVS
    assert request.num_computed_tokens == 40
    assert list(scheduler.skipped_waiting) == [request]
    assert scheduler.kv_cache_manager.num_blocks_of(request) == 3  # done at 0.5 + 3*0.25
    assert request in scheduler._inflight_prefills
    t = 0.25
    while not output.num_scheduled_tokens:
        output, _ = step(scheduler, t, dt=0.25)
        t += 0.25
    assert t == 1.5  # scheduled at 1.25, the first step after the transfer completed
    assert output.num_scheduled_tokens == {"a": 1}
    assert output.new_req_ids == ["a"]
    assert request.first_scheduled_s == 1.25 and request.token_times_s == [1.5]
    assert request not in scheduler._inflight_prefills
    assert scheduler.has_unfinished_requests()


def test_not_ready_and_loading_requests_are_parked_in_order():
    connector = RemoteKVConnector(latency_fixed_s=10.0, latency_per_block_s=0.0)
    scheduler = make_scheduler(connector=connector)
    connector.set_not_ready("r0", queries=1)
    for i in range(3):
        scheduler.add_request(Request(f"r{i}", 8, 2))
    step(scheduler, 0.0)
    assert [r.request_id for r in scheduler.skipped_waiting] == ["r0", "r1", "r2"]
    assert [r.status for r in scheduler.skipped_waiting] == [
        RequestStatus.WAITING, RequestStatus.WAITING_FOR_REMOTE_KVS,
        RequestStatus.WAITING_FOR_REMOTE_KVS]
    step(scheduler, 1.0)
    assert scheduler.skipped_waiting[0].status == RequestStatus.WAITING_FOR_REMOTE_KVS
    check_kv_conservation(scheduler)


def test_preempted_remote_request_recomputes_locally():
    connector = RemoteKVConnector(0.0, 0.0)
    scheduler = make_scheduler(connector=connector, num_gpu_blocks=2)
    scheduler.add_request(Request("a", 4, 3))
    step(scheduler, 0.0)  # the load starts and completes at once
    scheduler.add_request(Request("b", 2, 3))
    output, _ = step(scheduler, 1.0)  # a promoted and decodes (5 tokens); b loads
    assert output.new_req_ids == ["a"]
    assert scheduler.kv_cache_manager.pool.get_num_free_blocks() == 0
    output, _ = step(scheduler, 2.0)
    # a needs a 2nd block, loading b holds the other one: a preempts itself
    assert output.preempted_req_ids == ["a"]
    a = scheduler.waiting[0]
    assert a.num_computed_tokens == 0
    # the remote prompt was consumed: after preemption a recomputes locally
    assert connector.get_num_new_matched_tokens(a, 0) == (0, False)
    check_kv_conservation(scheduler)


def test_priority_policy_admits_by_priority_and_preempts_lowest():
    scheduler = make_scheduler(policy="priority", max_num_seqs=1)
    scheduler.add_request(Request("low", 4, 1, arrival_time=0.0, priority=5))
    scheduler.add_request(Request("high", 4, 1, arrival_time=1.0, priority=0))
    output, _ = step(scheduler, 0.0)
    assert output.new_req_ids == ["high"]

    scheduler = make_scheduler(policy="priority", num_gpu_blocks=2)
    scheduler.add_request(Request("p1", 2, 5, priority=1))
    scheduler.add_request(Request("p0", 4, 5, priority=0))
    step(scheduler, 0.0)
    assert [r.request_id for r in scheduler.running] == ["p0", "p1"]
    output, _ = step(scheduler, 1.0)
    assert output.preempted_req_ids == ["p1"]
    assert output.num_scheduled_tokens == {"p0": 1}


def test_plain_scheduler_has_no_policy_and_matches_dyntra_lb_without_plan():
    def run(dyntra_lb):
        connector = RemoteKVConnector(0.5, 0.1)
        scheduler = make_scheduler(connector=connector, dyntra_lb=dyntra_lb,
                                   num_gpu_blocks=12, max_num_seqs=3)
        rng = random.Random(7)
        for i in range(12):
            scheduler.add_request(Request(f"r{i}", rng.randint(1, 12), rng.randint(1, 6)))
        trace = []
        for t in range(80):
            output, finished = step(scheduler, float(t))
            trace.append((output, [r.request_id for r in finished]))
        return scheduler, trace

    plain, plain_trace = run(False)
    balanced, balanced_trace = run(True)
    assert plain.lb is None and balanced.lb is not None
    assert plain_trace == balanced_trace
    assert not plain.has_unfinished_requests()


def test_block_totals():
    scheduler = make_scheduler(max_num_seqs=1)
    scheduler.add_request(Request("a", 5, 4))
    scheduler.add_request(Request("b", 9, 4))
    step(scheduler, 0.0)
    assert scheduler.running_blocks() == 2  # 6 tokens
    assert scheduler.waiting_blocks() == 3


def test_scheduler_summary_logged_only_with_dyntra_lb_diagnostics(caplog):
    caplog.set_level(logging.INFO, logger="dyntra_lb")
    for dyntra_lb, enable in ((False, True), (True, False)):
        scheduler = make_scheduler(dyntra_lb=dyntra_lb, enable_diagnostics=enable)
        scheduler.add_request(Request("a", 5, 4))
        scheduler.schedule(0.0)
    assert not [r for r in caplog.records if "scheduler req num" in r.getMessage()]
    scheduler = make_scheduler(dyntra_lb=True, enable_diagnostics=True, max_num_seqs=1)
    scheduler.add_request(Request("a", 17, 4))
    scheduler.add_request(Request("b", 9, 4))
    scheduler.schedule(0.0)
    lines = [r.getMessage() for r in caplog.records if "scheduler req num" in r.getMessage()]
    assert lines == ["schedule() | scheduler req num: [1, 1, 1, 0, 0, 0] | blk num [5, 3, 3] "
                     "| block size [scheduler=4, dyntra_lb=4]"]


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("pauses", [True, False])
def test_random_run_conserves_kv_and_finishes_every_request_once(seed, pauses):
    """Remote loads with not-ready windows and slow transfers, prefetch on random
    steps. With ``pauses``: random plans drawn from the current block counts (on every
    step that prefetches) and an ample pool. Without: no plans and a small pool, so
    that KV preemptions happen. (Plans under KV
    pressure can stall a rank for good, see test_policy's head-of-line tests.)"""
    rng = random.Random(seed)
    connector = RemoteKVConnector(latency_fixed_s=1.0, latency_per_block_s=0.5)
    scheduler = make_scheduler(connector=connector, dyntra_lb=True,
                               num_gpu_blocks=200 if pauses else 20,
                               max_num_seqs=4, max_num_batched_tokens=16)
    lb = scheduler.lb
    pending = [Request(f"r{i}", rng.randint(1, 20), rng.randint(1, 12),
                       arrival_time=float(rng.randint(0, 40))) for i in range(30)]
    for request in pending[:5]:
        connector.set_not_ready(request.request_id, queries=rng.randint(1, 3))
    pending.sort(key=lambda r: r.arrival_time)
    expected = {r.request_id: r.output_tokens for r in pending}
    finished_ids = []
    num_preempted = num_paused = 0
    t = 0.0
    while (pending or scheduler.has_unfinished_requests()) and t < 1000:
        while pending and pending[0].arrival_time <= t:
            scheduler.add_request(pending.pop(0))
        output, finished = step(scheduler, t)
        t += 1.0
        num_preempted += len(output.preempted_req_ids)
        num_paused += len(output.paused_req_ids)
        for request in finished:
            finished_ids.append(request.request_id)
            assert len(request.token_times_s) == expected[request.request_id]
            assert all(p[1] is not None for p in request.pauses)
        check_kv_conservation(scheduler)
        assert lb.paused_req_ids <= {r.request_id for r in scheduler.waiting} | {
            r.request_id for r in scheduler.skipped_waiting}
        # As the coordinator: on a random half of the steps (more with ``pauses``)
        # balancing is active, so the snapshot (with its KV prefetch) is taken and,
        # with ``pauses``, a plan handed over; otherwise the plan is dropped.
        if rng.random() < (0.7 if pauses else 0.5):
            candidates = lb.prepare_step()
            if pauses:
                running = lb.running_block_counts()
                cands = lb.block_counts(candidates)
                out = rng.sample(running, k=rng.randint(0, min(2, len(running))))
                inn = rng.sample(cands, k=rng.randint(0, min(3, len(cands))))
                lb.set_plan(Plan(out_blk=out, in_blk=inn, freeze=not inn))
        else:
            lb.clear_plan()
    assert sorted(finished_ids) == sorted(expected)
    assert (num_paused > 0) if pauses else (num_preempted > 0)
    assert scheduler.kv_cache_manager.pool.num_used_blocks == 0
    assert not lb.paused_req_ids
