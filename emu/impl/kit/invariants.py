"""Strict mode for a kit rank, checked in every non-idle iteration: the kit engine's own
invariants, and DyntraLB's promises (``emu.rank.invariants.PromiseChecker``, shared with
``emu.impl.vllm_ascend.invariants``).

The kit engine's own invariants, at the end of the iteration (after DyntraLB's hook,
which may start KV loads):

- requests are conserved: every arrived request is finished or in exactly one queue,
  and none finishes twice;
- at most ``max_num_seqs`` run;
- KV blocks are conserved: the pool's used blocks are the blocks the requests in flight
  hold plus, under async scheduling, the freed blocks still waiting for a step in flight
  (the scheduler's ``deferred_frees``), and a request holds blocks only while it runs,
  is paused, loads remote KV or has computed tokens.

A violation raises ``emu.rank.invariants.InvariantError`` naming the rank, the iteration
and the request.
"""

from __future__ import annotations

from typing import Any

from dyntra_lb.blocks import block_counts
from emu.impl.kit.scheduler import RequestStatus
from emu.rank.invariants import Held, IterationEnd, PromiseChecker, Scheduled, violation


class StrictChecker:
    """The checks of one kit rank (``engine`` is its ``emu.impl.kit.engine.EngineCore``): the
    engine calls ``scheduled`` right after each ``schedule()`` and ``check`` at the end
    of each non-idle iteration."""

    def __init__(self, engine: Any):
        self.engine = engine
        self._finished_ids: set[str] = set()
        lb_enabled = engine.scheduler.lb is not None
        self._promises = (PromiseChecker(self._held,
                                         late_outputs=engine.spec.async_scheduling,
                                         pause_limit=engine.spec.pause_limit)
                          if lb_enabled else None)

    def scheduled(self, output: Any) -> None:
        """What ``schedule()`` returned (``emu.impl.kit.scheduler.SchedulerOutput``)."""
        if self._promises is None:
            return
        scheduler = self.engine.scheduler
        kv = scheduler.kv_cache_manager
        resumed = {}
        for rid in output.resumed_req_ids:  # computed tokens before this step's
            computed = (scheduler.requests[rid].num_computed_tokens
                        - output.num_scheduled_tokens.get(rid, 0))
            resumed[rid] = Held(tuple(kv.get_blocks(rid)), computed)
        self._promises.scheduled(Scheduled(
            frozenset(r.request_id for r in scheduler.running),
            frozenset(output.preempted_req_ids),
            (*output.new_req_ids, *output.resumed_req_ids), resumed,
            output.scheduled_spec_decode_tokens, scheduler._now_s))

    def check(self, balance: Any, finished: tuple) -> None:
        """At the end of an iteration: ``balance`` is DyntraLB's part of it (its plan
        generated, if any), ``finished`` the requests it finished."""
        scheduler = self.engine.scheduler
        if self._promises is not None:
            for problem in self._promises.problems(self._iteration_end(scheduler, balance)):
                self._violation(problem)
        self._requests_conserved(scheduler, finished)
        self._kv_conserved(scheduler)

    def _iteration_end(self, scheduler, balance) -> IterationEnd:
        plan = balance.plan if balance is not None else None
        block_size = scheduler.cache_config.block_size
        candidates = scheduler.lb.admission_candidates if plan is not None else []
        return IterationEnd(
            self.engine.iteration, tuple(r.request_id for r in scheduler.running),
            tuple(block_counts(scheduler.running, block_size)), plan,
            tuple(zip((r.request_id for r in candidates),
                      block_counts(candidates, block_size), strict=True)))

    def _held(self, request_id: str) -> Held | None:
        request = self.engine.scheduler.requests.get(request_id)
        if request is None:
            return None
        kv = self.engine.scheduler.kv_cache_manager
        return Held(tuple(kv.get_blocks(request_id)), request.num_computed_tokens)

    def _requests_conserved(self, scheduler, finished: tuple) -> None:
        requests = scheduler.requests
        for request in finished:
            rid = request.request_id
            if rid in self._finished_ids:
                self._violation(f"request {rid!r} finished a second time")
            if rid in requests:
                self._violation(f"request {rid!r} finished but is still in the scheduler")
            self._finished_ids.add(rid)
        arrived = self.engine.num_arrived
        if arrived != len(self._finished_ids) + len(requests):
            self._violation(f"requests not conserved: {arrived} arrived, "
                            f"{len(self._finished_ids)} finished, {len(requests)} in flight")
        queued = [*scheduler.running, *scheduler.waiting, *scheduler.skipped_waiting]
        queued_ids = {r.request_id for r in queued}
        if len(queued) != len(requests) or queued_ids != requests.keys():
            lost = sorted(requests.keys() - queued_ids)
            extra = sorted(queued_ids - requests.keys())
            twice = sorted({r.request_id for r in queued
                            if sum(q is r for q in queued) > 1})
            self._violation(f"requests in flight and queues disagree: in no queue {lost}, "
                            f"queued but not in flight {extra}, in two queues {twice}")
        if len(scheduler.running) > scheduler.max_num_running_reqs:
            self._violation(f"{len(scheduler.running)} requests running, more than "
                            f"max_num_seqs={scheduler.max_num_running_reqs}")

    def _kv_conserved(self, scheduler) -> None:
        kv = scheduler.kv_cache_manager
        paused = scheduler.lb.paused_req_ids if scheduler.lb is not None else set()
        block_size = kv.block_size
        held_total = 0
        for rid, request in scheduler.requests.items():
            held = kv.num_blocks_of(request)
            held_total += held
            if held * block_size < request.num_computed_tokens:
                self._violation(f"request {rid!r} ({request.status.name}) has "
                                f"{request.num_computed_tokens} computed tokens but holds "
                                f"{held} KV blocks")
            if held and not (request.status == RequestStatus.RUNNING or rid in paused
                             or request.status == RequestStatus.WAITING_FOR_REMOTE_KVS
                             or request.num_computed_tokens > 0):
                self._violation(f"request {rid!r} ({request.status.name}; not running, "
                                f"paused or loading) holds {held} KV blocks")
        used = kv.pool.num_used_blocks
        deferred = scheduler.num_deferred_blocks
        if used != held_total + deferred:
            gone = sorted(kv.holders() - scheduler.requests.keys())
            self._violation(f"KV blocks not conserved: the pool has {used} in use, the "
                            f"requests in flight hold {held_total} and {deferred} wait for a "
                            f"step in flight; blocks held by requests no longer in flight: "
                            f"{gone}")

    def _violation(self, what: str) -> None:
        engine = self.engine
        raise violation(engine.dp_rank, engine.iteration, engine.current_wave,
                        engine.step_counter, what)
