"""Unit tests of the kit's async scheduling bookkeeping (emu.impl.kit.async_scheduler,
the async parts of emu.impl.kit.scheduler, the worker of emu.impl.kit.model_runner): a
step is scheduled before the previous step's output lands, as vLLM 0.27.1's
``AsyncScheduler`` under ``step_with_batch_queue``."""

from collections import deque

import pytest

from dyntra_lb.planner.front import Plan
from emu.impl.kit.async_scheduler import AsyncScheduler
from emu.impl.kit.model_runner import ModelRunner
from emu.impl.kit.request import Request, RequestStatus
from emu.impl.kit.scheduler import SchedulerOutput
from emu.rank.remote_kv import RemoteKVConnector
from emu.rank.spec_decode import DraftAcceptance
from tests.kit_steps import execute, use_drafts

BS = 4
K = 3


def make_scheduler(rate: float | None = None, **kwargs) -> AsyncScheduler:
    """An async scheduler whose prompts load from the prefill node at once; with
    ``rate``, MTP with K drafts accepted at that rate."""
    args = dict(max_num_seqs=4, max_num_batched_tokens=64, block_size=BS,
                num_gpu_blocks=100, connector=RemoteKVConnector(0.0, 0.0),
                num_speculative_tokens=K if rate is not None else 0)
    args.update(kwargs)
    scheduler = AsyncScheduler(**args)
    use_drafts(scheduler, DraftAcceptance(K, rate, seed=0) if rate is not None else None)
    return scheduler


# Steps a test may take before it counts as stuck (a broken scheduler can loop forever).
MAX_STEPS = 200


class BatchQueue:
    """The engine's two batches in flight, without the engine: each ``step`` schedules
    at ``t`` (its forward ends at ``t + 1``) and then processes the oldest output once
    two are in flight, or at once when nothing ran."""

    def __init__(self, scheduler):
        self.scheduler = scheduler
        self.queue: deque = deque()
        self.t = 0

    def step(self) -> tuple[SchedulerOutput, list[Request]]:
        assert self.t < MAX_STEPS, "stuck"
        scheduler, t = self.scheduler, float(self.t)
        output = scheduler.schedule(t)
        self.queue.appendleft((output, execute(scheduler, output, t + 1.0)))
        self.t += 1
        if len(self.queue) < 2 and output.total_num_scheduled_tokens:
            return output, []
        return output, scheduler.update_from_output(*self.queue.pop())


def admitted(scheduler, *requests) -> BatchQueue:
    """Add the requests and step until their prompt KV has loaded and each has been
    scheduled from the waiting queue (its output not processed yet)."""
    for request in requests:
        scheduler.add_request(request)
    steps = BatchQueue(scheduler)
    while not all(r.status == RequestStatus.RUNNING for r in requests):
        steps.step()
    return steps


def test_the_next_step_is_scheduled_after_the_placeholders_of_the_one_in_flight():
    scheduler = make_scheduler()
    a = Request("a", 8, 20)
    steps = admitted(scheduler, a)
    # its first decode step: the last prompt token, whose output is in flight
    assert (a.num_computed_tokens, a.num_output_placeholders, a.num_tokens) == (8, 1, 8)
    output, _ = steps.step()
    # scheduled before that output landed: the one token after the placeholder
    assert output.num_scheduled_tokens == {"a": 1}
    assert a.num_tokens == 9 and a.num_output_tokens == 1  # now it has landed
    assert (a.num_computed_tokens, a.num_output_placeholders) == (9, 1)
    for _ in range(5):
        steps.step()
        assert a.num_computed_tokens == a.num_tokens + a.num_output_placeholders - 1


@pytest.mark.parametrize("rate", [0.0, 0.7, 1.0])
def test_the_landed_output_takes_its_rejected_drafts_out_of_the_placeholders(rate):
    """Each decode step schedules 1 + K tokens after the placeholders of the step in
    flight; when its output lands the rejected drafts leave the computed tokens and the
    placeholders, the emitted tokens move from the placeholders into the request."""
    scheduler = make_scheduler(rate)
    a = Request("a", 8, 40)
    steps = admitted(scheduler, a)
    emitted = []
    while a.num_output_tokens < 20:
        before = a.num_output_tokens
        output, _ = steps.step()
        emitted.append(a.num_output_tokens - before)
        assert output.num_scheduled_tokens.get("a") in (None, 1, 1 + K)
        assert a.num_computed_tokens == a.num_tokens + a.num_output_placeholders - 1
        assert a.num_output_placeholders in (1, 1 + K)  # only the step in flight's
        assert scheduler.kv_cache_manager.num_blocks_of(a) * BS >= a.num_computed_tokens
    if rate == 0.0:
        assert set(emitted[1:]) == {1}
    elif rate == 1.0:
        assert set(emitted[2:]) == {1 + K}  # from the first step that verified drafts


def test_no_step_is_scheduled_for_a_request_sure_to_end_in_the_step_in_flight():
    """The last-token rule: a request whose step in flight reaches its output length
    even if every draft is rejected is not scheduled again (without drafts: exactly
    one step per output token)."""
    scheduler = make_scheduler()
    a = Request("a", 8, 5)
    steps = admitted(scheduler, a)
    scheduled = 1  # the step that admitted it
    while a.status == RequestStatus.RUNNING:
        output, _ = steps.step()
        scheduled += "a" in output.num_scheduled_tokens
    assert a.num_output_tokens == 5 and scheduled == 5


def test_with_drafts_the_rule_allows_the_step_whose_drafts_may_all_be_rejected():
    scheduler = make_scheduler(1.0)
    a = Request("a", 8, 6)
    steps = admitted(scheduler, a)
    # a's output: 1 (admission step), then 4 per step: 1 + 4 = 5 < 6 needs another step,
    # scheduled while the 5th is in flight; that step emits past the length (trimmed).
    finished = []
    while not finished:
        finished = steps.step()[1]
    assert finished == [a] and a.num_output_tokens == 6
    assert a.token_times_s.count(a.finish_s) == 1  # the last step's tokens cut to one


def _preempted_with_output_in_flight():
    """Two decoding requests on 7 blocks, stepped until ``b`` is preempted for ``a``'s
    new block while ``b``'s previous step is in flight; that output not processed."""
    scheduler = make_scheduler(num_gpu_blocks=7)
    a, b = Request("a", 8, 20), Request("b", 8, 20)
    steps = admitted(scheduler, a, b)
    for _ in range(MAX_STEPS):
        output = scheduler.schedule(float(steps.t))
        steps.queue.appendleft((output, execute(scheduler, output, steps.t + 1.0)))
        steps.t += 1
        if output.preempted_req_ids:
            assert output.preempted_req_ids == ["b"]
            return scheduler, steps, a, b
        scheduler.update_from_output(*steps.queue.pop())
    raise AssertionError("b was never preempted")


def test_a_request_preempted_with_output_in_flight_takes_it_as_stale():
    """Its in-flight output still arrives (the token is delivered) but changes neither
    its computed tokens, reset by the preemption, nor its placeholders."""
    scheduler, steps, a, b = _preempted_with_output_in_flight()
    assert b.status == RequestStatus.PREEMPTED
    assert (b.num_computed_tokens, b.num_output_placeholders) == (0, 0)
    assert b.num_stale_output_tokens == 1
    tokens = b.num_output_tokens
    scheduler.update_from_output(*steps.queue.pop())
    assert b.num_output_tokens == tokens + 1  # delivered
    assert (b.num_computed_tokens, b.num_output_placeholders) == (0, 0)
    assert (b.num_stale_output_tokens, b.num_in_flight_tokens) == (0, 0)


def test_its_blocks_return_to_the_pool_once_the_step_in_flight_is_processed():
    """A preempted request's blocks may still be written by its step in flight: they
    leave the request at once but reach the pool only after that step's output, so the
    schedule() that preempted it cannot reuse them."""
    scheduler, steps, a, b = _preempted_with_output_in_flight()
    kv = scheduler.kv_cache_manager
    assert kv.num_blocks_of(b) == 0 and scheduler.num_deferred_blocks == 3
    assert kv.pool.get_num_free_blocks() == 0
    assert kv.pool.num_used_blocks == kv.num_held_blocks + 3
    scheduler.update_from_output(*steps.queue.pop())
    assert scheduler.num_deferred_blocks == 0 and kv.pool.get_num_free_blocks() == 3


def test_a_request_whose_stale_output_is_in_flight_is_not_resumed():
    """vLLM's waiting loop skips a preempted request until its stale output has landed
    (resuming could sample a position that output delivers). With two batches in
    flight that output lands in the iteration that preempted it; a second
    ``schedule()`` before it shows the rule."""
    scheduler = make_scheduler()
    a, b = Request("a", 8, 20), Request("b", 8, 20)
    steps = admitted(scheduler, a, b)
    steps.step()
    scheduler.running.remove(b)  # preempted, as the running loop does for KV
    scheduler._preempt_request(b)
    assert b.num_stale_output_tokens == 1
    output = scheduler.schedule(float(steps.t))
    assert output.num_scheduled_tokens == {"a": 1} and b in scheduler.skipped_waiting
    while steps.queue:
        scheduler.update_from_output(*steps.queue.pop())
    assert b.num_stale_output_tokens == 0
    assert scheduler.schedule(float(steps.t + 1)).resumed_req_ids == ["b"]


def test_a_finished_requests_blocks_wait_for_its_step_in_flight():
    """A request that finishes while its next step is already in flight (its drafts
    got it to the end sooner than the last-token rule could know) keeps its blocks out
    of the pool until that step's output is processed."""
    scheduler = make_scheduler(1.0)
    a = Request("a", 8, 5)
    steps = admitted(scheduler, a)
    kv = scheduler.kv_cache_manager
    finished = []
    while not finished:
        output, finished = steps.step()
    assert "a" in output.num_scheduled_tokens  # scheduled again before it finished
    assert scheduler.num_deferred_blocks > 0
    held = scheduler.num_deferred_blocks
    assert kv.pool.num_used_blocks == held
    steps.step()  # processes the step in flight: nothing of a left in flight
    assert scheduler.num_deferred_blocks == 0 and kv.pool.num_used_blocks == 0


def test_a_paused_request_rolls_back_the_rejected_drafts_of_its_output_in_flight():
    """DyntraLB pauses a request whose step is in flight (not a preemption: nothing is
    stale). When that output lands, vLLM rolls back its rejected drafts once: its
    computed tokens drop by them, its blocks stay."""
    scheduler = make_scheduler(0.0, dyntra_lb=True)
    a, b = Request("a", 8, 40), Request("b", 16, 40)
    steps = admitted(scheduler, a, b)
    for _ in range(3):
        steps.step()
    kv = scheduler.kv_cache_manager
    blocks = kv.get_blocks("a")
    computed = a.num_computed_tokens
    assert a.num_output_placeholders == 1 + K  # a step verifying K drafts in flight
    scheduler.lb.set_plan(Plan(out_blk=[scheduler.lb.running_block_counts()[0]],
                               in_blk=[], freeze=True))
    output, _ = steps.step()
    assert output.paused_req_ids == ["a"] and a.status == RequestStatus.PREEMPTED
    assert a.num_computed_tokens == computed - K  # all K rejected (rate 0)
    assert a.num_output_placeholders == 0 and a.num_stale_output_tokens == 0
    assert kv.get_blocks("a") == blocks
    assert a.num_computed_tokens == a.num_tokens - 1  # resumes with one token to compute


def test_async_drafts_are_the_workers_own_only_for_its_previous_batch():
    """Under async scheduling every scheduled draft is a placeholder; the worker
    verifies its own drafts in their place for the requests that sampled in its
    previous forward, and nothing for the others (a request back from the waiting
    queue, padded to 1 + K)."""
    runner = ModelRunner(DraftAcceptance(K, 1.0, seed=0), None, placeholder_drafts=True)
    requests = {rid: Request(rid, 8, 40) for rid in "ab"}
    for request in requests.values():
        request.num_computed_tokens = 8 + K

    def forward(*req_ids):
        output = SchedulerOutput({rid: 1 + K for rid in req_ids}, (1 + K) * len(req_ids),
                                 scheduled_spec_decode_tokens=dict.fromkeys(req_ids, K))
        return runner.execute_model(output, requests, 1.0).sampled

    assert forward("a") == {"a": 1}  # nothing before: a placeholder
    assert forward("a", "b") == {"a": 1 + K, "b": 1}
    assert forward("b") == {"b": 1 + K}
    assert forward("a") == {"a": 1}  # not in the previous forward
    # positions run ahead of the scheduler's count (nothing processed here)
    assert runner.num_tokens(requests["b"]) == 8 + 1 + (1 + K)
