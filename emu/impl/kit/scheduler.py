"""Stub scheduler of one emulated rank, with vLLM 0.27.1's request lifecycle.

The engine calls ``add_request`` for arrivals, then each step ``schedule(now_s)`` and,
once the (modelled) forward has run, ``update_from_output(output, model_output)`` with
what the worker sampled (``emu.impl.kit.model_runner``). There is no model: a
scheduled request simply gets its tokens computed, and a request whose computed tokens
reach its length samples. Everything that decides *which* requests run is kept:
running requests first, preemption of the last running request on KV exhaustion, the
waiting loop with blocked-status promotion, remote KV loads through the connector, the
token budget and ``max_num_seqs``.

With speculative decoding (``num_speculative_tokens`` k > 0) a decoding request holds k
draft tokens after each step, as vLLM's after ``update_draft_token_ids``; the next
``schedule()`` schedules them with its one real token, and ``update_from_output`` rolls
back the rejected ones and emits the accepted ones plus one, never past the request's
output length. As vLLM 0.27.1 with an MTP drafter, every allocation also reserves k
lookahead slots (``num_lookahead_tokens``), and a request that comes back from the
waiting queue with one token to compute is padded to 1 + k tokens with placeholder
drafts, which are never accepted, when only decodes run.

vLLM's async scheduling (``emu.impl.kit.async_scheduler.AsyncScheduler``) schedules a
step before the previous step's output is processed. The parts of it that vLLM keeps in
its base scheduler are here, and do nothing without it: the output placeholders a
request's computed tokens already count, the rule that skips a request sure to reach
its output length in the step in flight, the output still in flight when a request is
preempted (delivered later without changing its counts; it waits until that has
drained), and KV blocks freed only once no step in flight can write them
(``defer_block_free``).

With ``dyntra_lb=True`` a ``DyntraLBPolicy`` is attached as ``lb`` and hooked in where
the DyntraLB scheduler hooks vLLM's: ``apply_plan()`` first in ``schedule()``, the
admission gate in the waiting loop, and the paused-id hooks. With it off there is no
policy object and the scheduler behaves like plain vLLM.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field

from dyntra_lb.blocks import block_counts, num_blocks
from dyntra_lb.diagnostics import scheduler_summary_line
from dyntra_lb.pause_limit import PauseLimit, pause_rule_for
from dyntra_lb.policy import BLOCKED_STATUSES, DyntraLBPolicy, RequestStatus
from emu.impl.kit.kv import BlockPool, KVCacheManager
from emu.impl.kit.model_runner import ModelRunnerOutput
from emu.impl.kit.request import Request
from emu.impl.kit.request_queue import (
    FCFSRequestQueue,
    PriorityRequestQueue,
    create_request_queue,
)
from emu.rank.engine_spec import SCHEDULING_POLICIES
from emu.rank.remote_kv import RemoteKVConnector

__all__ = ["Request", "RequestStatus", "Scheduler", "SchedulerOutput"]

logger = logging.getLogger("dyntra_lb")


@dataclass
class CacheConfig:
    block_size: int


@dataclass(slots=True)
class SchedulerOutput:
    """What one ``schedule()`` decided. Id lists are in scheduling order; ``paused``
    are the requests DyntraLB paused at the start of this step, ``preempted`` those the
    running loop preempted for KV; ``scheduled_spec_decode_tokens`` counts the draft
    tokens scheduled per request (vLLM keeps their ids), included in its
    ``num_scheduled_tokens``; ``padded_spec_decode_req_ids`` are the requests among them
    whose drafts are placeholders (vLLM's -1 ids), which the target never accepts;
    ``finished_req_ids`` the requests finished since the previous ``schedule()``."""

    num_scheduled_tokens: dict[str, int]
    total_num_scheduled_tokens: int
    new_req_ids: list[str] = field(default_factory=list)
    resumed_req_ids: list[str] = field(default_factory=list)
    paused_req_ids: list[str] = field(default_factory=list)
    preempted_req_ids: list[str] = field(default_factory=list)
    scheduled_spec_decode_tokens: dict[str, int] = field(default_factory=dict)
    padded_spec_decode_req_ids: set[str] = field(default_factory=set)
    finished_req_ids: list[str] = field(default_factory=list)


class Scheduler:
    """The stub scheduler; attribute names follow vLLM's ``Scheduler`` so that
    ``DyntraLBPolicy`` reads it through the same surface as a real one.

    ``policy`` is "fcfs" (default) or "priority"; ``num_speculative_tokens`` k > 0 turns
    on speculative decoding (MTP with k drafts per step); ``pause_limit`` is DyntraLB's
    opt-in bound on paused time (``dyntra_lb.pause_limit``; None: production's pauses).
    """

    # Freed blocks wait for the steps in flight (vLLM: a kv_consumer connector with more
    # than one batch in flight); the async scheduler turns it on.
    defer_block_free = False

    def __init__(self, *, max_num_seqs: int, max_num_batched_tokens: int, block_size: int,
                 num_gpu_blocks: int, connector: RemoteKVConnector | None = None,
                 dyntra_lb: bool = False, enable_diagnostics: bool = False,
                 policy: str = "fcfs", num_speculative_tokens: int = 0,
                 pause_limit: PauseLimit | None = None):
        if policy not in SCHEDULING_POLICIES:
            raise ValueError(f"scheduling policy must be one of {SCHEDULING_POLICIES}, "
                             f"got {policy!r}")
        if max_num_seqs < 1 or max_num_batched_tokens < 1:
            raise ValueError("max_num_seqs and max_num_batched_tokens must be >= 1")
        num_blocks(0, block_size)  # the DyntraLB block-size check, once
        self.max_num_running_reqs = max_num_seqs
        self.max_num_scheduled_tokens = max_num_batched_tokens
        self.block_size = block_size
        self.cache_config = CacheConfig(block_size)
        self.kv_cache_manager = KVCacheManager(BlockPool(num_gpu_blocks), block_size)
        self.connector = connector
        self.policy = policy
        # vLLM's num_spec_tokens, and the KV slots an MTP drafter needs beyond the
        # scheduled tokens (its num_lookahead_tokens: k, as for every EAGLE-type drafter).
        self.num_spec_tokens = self.num_lookahead_tokens = num_speculative_tokens
        self.scheduler_reserve_full_isl = False
        self.waiting = create_request_queue(policy)
        self.skipped_waiting = create_request_queue(policy)
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self.finished_recving_kv_req_ids: set[str] = set()
        self.failed_recving_kv_req_ids: set[str] = set()
        self._inflight_prefills: set[Request] = set()
        # Requests finished since the last schedule() (vLLM's finished_req_ids).
        self.finished_req_ids: list[str] = []
        # Deferred frees (defer_block_free): steps scheduled and steps whose output was
        # processed so far (those that ran tokens), and the blocks each waits for.
        self.sched_step_seq = 0
        self.processed_step_seq = 0
        self.deferred_frees: deque[tuple[int, list[int]]] = deque()
        self.enable_diagnostics = enable_diagnostics
        self.lb = DyntraLBPolicy(self, enable_diagnostics=enable_diagnostics,
                                 pause_rule=pause_rule_for(pause_limit)) if dyntra_lb else None
        self._now_s = 0.0

    # ------------------------------------------------------------------ intake

    def add_request(self, request: Request) -> None:
        if request.request_id in self.requests:
            raise ValueError(f"duplicate request id {request.request_id!r}")
        self.requests[request.request_id] = request
        self.waiting.add_request(request)

    def has_unfinished_requests(self) -> bool:
        """Running, waiting or skipped requests exist (LB-paused ones count)."""
        return bool(self.running or self.waiting or self.skipped_waiting)

    def has_requests(self) -> bool:
        """vLLM: unfinished requests, or requests finished since the last ``schedule()``
        (vLLM schedules once more to hand their ids to the workers)."""
        return self.has_unfinished_requests() or bool(self.finished_req_ids)

    def running_blocks(self) -> int:
        """Sum of the DyntraLB block counts of ``running``."""
        return sum(block_counts(self.running, self.cache_config.block_size))

    def waiting_blocks(self) -> int:
        """Sum of the block counts of ``waiting`` and ``skipped_waiting``."""
        bs = self.cache_config.block_size
        return sum(block_counts(self.waiting, bs)) + sum(block_counts(self.skipped_waiting, bs))

    # ---------------------------------------------------------------- schedule

    def schedule(self, now_s: float | None = None) -> SchedulerOutput:
        """One scheduling pass, as vLLM's. ``now_s`` is the virtual time at the start of the
        step; it stamps the request records and remote transfers started now. Without
        it the time of the last ``update_from_output`` is used."""
        if now_s is None:
            now_s = self._now_s
        else:
            self._now_s = now_s
        connector = self.connector
        if connector is not None:
            connector.set_virtual_time(now_s)
        lb = self.lb
        paused = lb.apply_plan(now_s) if lb is not None else ()
        for request in paused:
            request.pauses.append([now_s, None])

        allocate_slots = self.kv_cache_manager.allocate_slots
        running = self.running
        token_budget = self.max_num_scheduled_tokens
        num_scheduled_tokens: dict[str, int] = {}
        scheduled_spec: dict[str, int] = {}
        preempted: list[Request] = []
        lookahead = self.num_lookahead_tokens
        prefill_scheduled = False  # a running request still in its prompt was scheduled

        # Running requests first, in list order.
        req_index = 0
        while req_index < len(running) and token_budget > 0:
            request = running[req_index]
            placeholders = request.num_output_placeholders
            if placeholders and (request.num_computed_tokens + 2 - placeholders
                                 >= request.prompt_tokens + request.output_tokens):
                # Async scheduling: the step in flight reaches the output length even
                # if all its drafts are rejected; no step more.
                req_index += 1
                continue
            num_new_tokens = (request.num_tokens + request.num_spec_tokens + placeholders
                              - request.num_computed_tokens)
            if num_new_tokens > token_budget:
                num_new_tokens = token_budget
            elif num_new_tokens <= 0:
                req_index += 1
                continue
            while True:
                new_blocks = allocate_slots(request, num_new_tokens,
                                            num_lookahead_tokens=lookahead)
                if new_blocks is not None:
                    break
                if self.policy == "priority":
                    victim = max(running, key=lambda r: (r.priority, r.arrival_time))
                    running.remove(victim)
                    undo = num_scheduled_tokens.pop(victim.request_id, None)
                    scheduled_spec.pop(victim.request_id, None)
                    if undo is not None:
                        token_budget += undo
                        req_index -= 1
                else:
                    victim = running.pop()
                self._preempt_request(victim)
                preempted.append(victim)
                if victim is request:
                    break
            if new_blocks is None:
                break
            prefill_scheduled |= request.is_prefill_chunk
            num_scheduled_tokens[request.request_id] = num_new_tokens
            token_budget -= num_new_tokens
            req_index += 1
            if request.num_spec_tokens:
                # The drafts that fit the budget are scheduled; all are used up.
                num_drafts = (request.num_computed_tokens + num_new_tokens
                              - request.num_tokens - placeholders)
                if num_drafts > 0:
                    scheduled_spec[request.request_id] = num_drafts
                request.num_spec_tokens = 0

        new_req_ids: list[str] = []
        resumed_req_ids: list[str] = []
        padded: set[str] = set()
        if not preempted:
            # vLLM pads a request from the waiting queue to 1 + k tokens only when the
            # running requests scheduled this step are all decodes.
            pad_to = (1 + self.num_spec_tokens
                      if self.num_spec_tokens and num_scheduled_tokens
                      and not prefill_scheduled else 0)
            token_budget = self._schedule_waiting(
                token_budget, num_scheduled_tokens, new_req_ids, resumed_req_ids, now_s,
                pad_to, padded)
            for request_id in padded:
                scheduled_spec[request_id] = self.num_spec_tokens

        output = SchedulerOutput(
            num_scheduled_tokens=num_scheduled_tokens,
            total_num_scheduled_tokens=self.max_num_scheduled_tokens - token_budget,
            new_req_ids=new_req_ids,
            resumed_req_ids=resumed_req_ids,
            paused_req_ids=[r.request_id for r in paused],
            preempted_req_ids=[r.request_id for r in preempted],
            scheduled_spec_decode_tokens=scheduled_spec,
            padded_spec_decode_req_ids=padded,
            finished_req_ids=self.finished_req_ids,
        )
        self.finished_req_ids = []
        if self.defer_block_free and output.total_num_scheduled_tokens > 0:
            self.sched_step_seq += 1
        self._update_after_schedule(output)
        if lb is not None:
            lb.on_scheduled(num_scheduled_tokens)
            if self.enable_diagnostics:
                logger.info(scheduler_summary_line(
                    self.running, self.waiting, self.skipped_waiting, lb.paused_req_ids,
                    self.block_size, self.cache_config.block_size))
        return output

    def _update_after_schedule(self, output: SchedulerOutput) -> None:
        """As vLLM at the end of ``schedule()``: the scheduled tokens count as computed
        (and in flight) from now on, so a second ``schedule()`` before the update
        schedules the rest."""
        requests = self.requests
        inflight = self._inflight_prefills
        seq = self.sched_step_seq
        for req_id, num_tokens in output.num_scheduled_tokens.items():
            request = requests[req_id]
            request.num_computed_tokens += num_tokens
            request.num_in_flight_tokens += num_tokens
            request.last_sched_seq = seq
            request.is_prefill_chunk = (request.num_computed_tokens
                                        < request.num_tokens + request.num_output_placeholders)
            if inflight and not request.is_prefill_chunk:
                inflight.discard(request)

    def _schedule_waiting(self, token_budget: int, num_scheduled_tokens: dict[str, int],
                          new_req_ids: list[str], resumed_req_ids: list[str],
                          now_s: float, pad_to: int, padded: set[str]) -> int:
        """The waiting loop; returns the remaining token budget. Requests that cannot
        enter this step are parked and end up at the front of ``skipped_waiting``.
        With ``pad_to`` (1 + k, or 0) a request with one token to compute is scheduled
        with k placeholder drafts, or not at all when the budget cannot hold them; its
        id goes into ``padded``."""
        lb = self.lb
        connector = self.connector
        kv_cache_manager = self.kv_cache_manager
        running = self.running
        waiting, skipped_waiting = self.waiting, self.skipped_waiting
        parked: list[Request] = []
        while (waiting or skipped_waiting) and token_budget > 0:
            if len(running) >= self.max_num_running_reqs:
                break
            queue = self._select_waiting_queue_for_scheduling()
            request = queue.peek_request()
            if (request.status in BLOCKED_STATUSES
                    and not self._try_promote_blocked_waiting_request(request)):
                parked.append(queue.pop_request())
                continue
            if request.num_stale_output_tokens:
                # Output of a step from before its preemption is still in flight:
                # resuming now could sample again a position that output delivers.
                parked.append(queue.pop_request())
                continue
            if lb is not None and not lb.can_admit(request):
                parked.append(queue.pop_request())
                continue

            num_local = num_external = 0
            computed_blocks = None
            load_kv_async = False
            if request.num_computed_tokens == 0:
                computed_blocks, num_local = kv_cache_manager.get_computed_blocks(request)
                if connector is not None:
                    ext, load_kv_async = connector.get_num_new_matched_tokens(
                        request, num_local)
                    if ext is None:
                        parked.append(queue.pop_request())
                        continue
                    num_external = ext
                num_computed_tokens = num_local + num_external
            else:
                num_computed_tokens = request.num_computed_tokens
            pad = False
            if load_kv_async:
                num_new_tokens = 0
            else:
                num_new_tokens = request.num_tokens - num_computed_tokens
                if pad_to and num_new_tokens == 1:
                    if pad_to > token_budget:
                        break  # vLLM prefers not scheduling it to scheduling it unpadded
                    num_new_tokens = pad_to
                    pad = True
                num_new_tokens = min(num_new_tokens, token_budget)
            new_blocks = kv_cache_manager.allocate_slots(
                request, num_new_tokens,
                num_new_computed_tokens=num_local,
                new_computed_blocks=computed_blocks,
                num_lookahead_tokens=0 if load_kv_async else self.num_lookahead_tokens,
                num_external_computed_tokens=num_external,
                delay_cache_blocks=load_kv_async,
            )
            if new_blocks is None:
                break
            if connector is not None:
                connector.update_state_after_alloc(
                    request, kv_cache_manager.get_blocks(request.request_id), num_external)
            queue.pop_request()
            request.num_computed_tokens = num_computed_tokens
            if load_kv_async:
                request.status = RequestStatus.WAITING_FOR_REMOTE_KVS
                self._inflight_prefills.add(request)
                parked.append(request)
                continue

            running.append(request)
            if request.status == RequestStatus.PREEMPTED:
                resumed_req_ids.append(request.request_id)
                pauses = request.pauses
                if pauses and pauses[-1][1] is None:
                    pauses[-1][1] = now_s
            else:
                new_req_ids.append(request.request_id)
            if request.first_scheduled_s is None:
                request.first_scheduled_s = now_s
            request.status = RequestStatus.RUNNING
            if pad:
                padded.add(request.request_id)
            if num_computed_tokens + num_new_tokens < request.num_tokens:
                self._inflight_prefills.add(request)
            num_scheduled_tokens[request.request_id] = num_new_tokens
            token_budget -= num_new_tokens
        if parked:
            skipped_waiting.prepend_requests(parked)
        return token_budget

    def _select_waiting_queue_for_scheduling(self) -> FCFSRequestQueue | PriorityRequestQueue:
        if self.policy == "fcfs":
            return self.skipped_waiting or self.waiting
        if not self.skipped_waiting:
            return self.waiting
        if not self.waiting:
            return self.skipped_waiting
        if self.waiting.peek_request() < self.skipped_waiting.peek_request():
            return self.waiting
        return self.skipped_waiting

    def _try_promote_blocked_waiting_request(self, request: Request) -> bool:
        """A request waiting for remote KV becomes schedulable once its transfer has
        been reported finished; a full-prompt hit leaves one token to compute (it
        samples the first output token), a failed load releases its blocks."""
        if request.status != RequestStatus.WAITING_FOR_REMOTE_KVS:
            return False
        if request.request_id not in self.finished_recving_kv_req_ids:
            return False
        self.finished_recving_kv_req_ids.discard(request.request_id)
        if request.request_id in self.failed_recving_kv_req_ids:  # nothing valid arrived
            self.failed_recving_kv_req_ids.discard(request.request_id)
            self.kv_cache_manager.free(request)
        elif request.num_computed_tokens >= request.num_tokens:
            request.num_computed_tokens = request.num_tokens - 1
        request.status = (RequestStatus.PREEMPTED if request.num_preemptions > 0
                          else RequestStatus.WAITING)
        return True

    def _preempt_request(self, request: Request) -> None:
        """KV exhausted: free the request's blocks and send it back to the front of
        ``waiting``; it recomputes from scratch when admitted again."""
        assert request.status == RequestStatus.RUNNING
        if self.lb is not None:
            self.lb.on_preempt(request)
        self._free_request_blocks(request)
        self._inflight_prefills.discard(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_spec_tokens = 0
        # Async scheduling: the output in flight is still delivered but counts as stale.
        request.num_stale_output_tokens = request.num_in_flight_tokens
        request.num_output_placeholders = 0
        request.num_preemptions += 1
        self.waiting.prepend_request(request)

    # ------------------------------------------------------------ after forward

    def _recompute_failed_loads(self, failed: dict[str, list[int]]) -> None:
        """vLLM's recompute policy (``kv_load_failure_policy="recompute"``) for loads whose
        every block arrived invalid: keep the valid prefix, i.e. truncate the computed
        tokens at the first invalid block -- block 0, so to 0. The blocks are released
        when the request is promoted (``_try_promote_blocked_waiting_request``); it then
        prefills its prompt here."""
        for request_id in failed:
            self.requests[request_id].num_computed_tokens = 0
        self.failed_recving_kv_req_ids.update(failed)

    def update_from_output(self, output: SchedulerOutput,
                           model_output: ModelRunnerOutput) -> list[Request]:
        """The forward of ``output`` has run and the worker handed back
        ``model_output``: count its step as processed (deferred frees waiting for it
        return to the pool), roll back the rejected drafts, emit the sampled tokens
        (never past the output length) with the forward's end time, finish the requests
        at their output length, and collect the remote KV loads that had landed.
        Returns the finished requests in scheduling order."""
        now_s = self._now_s = model_output.ended_s
        if self.defer_block_free and output.total_num_scheduled_tokens > 0:
            self.processed_step_seq += 1
            self._drain_deferred_frees()
        if model_output.failed_recving:
            self._recompute_failed_loads(model_output.failed_recving)
        requests = self.requests
        sampled = model_output.sampled
        scheduled_spec = output.scheduled_spec_decode_tokens
        finished: list[Request] = []
        finished_waiting: list[Request] = []
        for req_id, num_scheduled in output.num_scheduled_tokens.items():
            request = requests.get(req_id)
            if request is None:
                continue  # finished while this step was in flight (async scheduling)
            request.num_in_flight_tokens -= num_scheduled
            stale = request.num_stale_output_tokens > 0
            if stale:
                request.num_stale_output_tokens -= num_scheduled
            num_sampled = sampled.get(req_id)
            if not num_sampled:
                continue  # a prefill chunk
            num_drafts = scheduled_spec.get(req_id)
            if num_drafts and not stale:
                # The rejected drafts were computed for nothing (and were placeholders).
                rejected = num_drafts - (num_sampled - 1)
                request.num_computed_tokens -= rejected
                if request.num_output_placeholders:
                    request.num_output_placeholders -= rejected
            self._update_request_with_output(request, num_sampled, now_s, stale)
            if request.num_output_tokens >= request.output_tokens:
                if request.status != RequestStatus.RUNNING:
                    finished_waiting.append(request)
                request.status = RequestStatus.FINISHED_LENGTH_CAPPED
                request.finish_s = now_s
                self._free_request(request)
                finished.append(request)
        if finished:
            self.running[:] = [r for r in self.running if r.status == RequestStatus.RUNNING]
        if finished_waiting:
            # Paused (by DyntraLB) or preempted after the step whose output this is, as
            # happens when the output arrives a step late (async scheduling): as vLLM,
            # the finished request leaves the waiting queues too.
            self.waiting.remove_requests(finished_waiting)
            self.skipped_waiting.remove_requests(finished_waiting)
        if model_output.finished_recving:
            self.finished_recving_kv_req_ids.update(model_output.finished_recving)
        return finished

    def _update_request_with_output(self, request: Request, num_sampled: int, now_s: float,
                                    stale: bool) -> int:
        """Append the sampled tokens, stopping at the output length; returns how many."""
        num_new = min(num_sampled, request.output_tokens - request.num_output_tokens)
        request.num_output_tokens += num_new
        request.num_tokens += num_new
        if num_new == 1:
            request.token_times_s.append(now_s)
        else:
            request.token_times_s.extend([now_s] * num_new)
        return num_new

    def update_draft_token_ids(self, req_ids: list[str]) -> None:
        """Synchronous scheduling with MTP, after each step that ran: the drafter proposed
        k drafts for every request that sampled (``ModelRunner.take_draft_token_ids``),
        which the next ``schedule()`` verifies."""
        requests = self.requests
        for req_id in req_ids:
            request = requests.get(req_id)
            if request is not None:
                request.num_spec_tokens = (0 if request.is_prefill_chunk
                                           else self.num_spec_tokens)

    def _free_request(self, request: Request) -> None:
        if self.lb is not None:
            self.lb.on_free(request)
        self._inflight_prefills.discard(request)
        if self.connector is not None:
            self.connector.request_finished(request)
        self.finished_req_ids.append(request.request_id)
        self._free_request_blocks(request)
        del self.requests[request.request_id]

    def _free_request_blocks(self, request: Request) -> None:
        """Return the request's KV blocks to the pool, or, while a step in flight may
        still write them (``defer_block_free``: the request was scheduled in a step
        whose output is not processed yet), once the steps scheduled so far are."""
        if not self.defer_block_free or request.last_sched_seq <= self.processed_step_seq:
            self.kv_cache_manager.free(request)
            return
        blocks = self.kv_cache_manager.pop_blocks_for_free(request)
        if blocks:
            self.deferred_frees.append((self.sched_step_seq, blocks))

    def _drain_deferred_frees(self) -> None:
        """The deferred blocks whose step has been processed go back to the pool."""
        deferred = self.deferred_frees
        pool = self.kv_cache_manager.pool
        while deferred and deferred[0][0] <= self.processed_step_seq:
            pool.free_blocks(deferred.popleft()[1])

    @property
    def num_deferred_blocks(self) -> int:
        """Blocks freed but not yet back in the pool (strict mode's KV conservation)."""
        return sum(len(blocks) for _, blocks in self.deferred_frees)
