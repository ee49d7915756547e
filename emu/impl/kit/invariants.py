"""Strict mode: the kit engine's invariants, checked at the end of every non-idle
iteration (after DyntraLB's hook, which may start KV loads).

- requests are conserved: every arrived request is finished or in exactly one queue,
  and none finishes twice;
- at most ``max_num_seqs`` run;
- KV blocks are conserved: the pool's used blocks are the blocks the requests in flight
  hold, and a request holds blocks only while it runs, is paused, loads remote KV or
  has computed tokens;
- a DyntraLB-paused request keeps exactly the block ids it held when it was paused,
  until it resumes;
- while a plan is present, only its admission set is admitted.

A violation raises ``emu.rank.invariants.InvariantError`` naming the rank, the iteration and the
request. That every rank reaches each collective with the same descriptor,
``step_counter`` and ``current_wave`` is checked across ranks by the launcher's
watchdog (``emu.cluster.watchdog``).
"""

from __future__ import annotations

from typing import Any

from emu.impl.kit.scheduler import RequestStatus
from emu.rank.invariants import PausedBlocks, admission_problems, violation


class StrictChecker:
    """The checks of one kit rank (``engine`` is its ``emu.impl.kit.engine.EngineCore``)."""

    def __init__(self, engine: Any):
        self.engine = engine
        self._finished_ids: set[str] = set()
        self._paused_blocks = PausedBlocks()

    def check(self, output: Any, finished: tuple) -> None:
        scheduler = self.engine.scheduler
        self._requests_conserved(scheduler, finished)
        self._kv_conserved(scheduler)
        if scheduler.lb is not None:
            self._paused_keep_blocks(scheduler, output)
            self._admission_within_plan(scheduler, output)

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
        if used != held_total:
            gone = sorted(kv.holders() - scheduler.requests.keys())
            self._violation(f"KV blocks not conserved: the pool has {used} in use, the "
                            f"requests in flight hold {held_total}; blocks held by requests "
                            f"no longer in flight: {gone}")

    def _paused_keep_blocks(self, scheduler, output) -> None:
        kv = scheduler.kv_cache_manager
        paused = scheduler.lb.paused_req_ids
        for rid in paused:
            request = scheduler.requests.get(rid)
            if request is None:
                self._violation(f"paused request {rid!r} is not in flight")
            blocks = kv.get_blocks(rid)
            if request.status != RequestStatus.PREEMPTED or not blocks:
                self._violation(f"paused request {rid!r} is {request.status.name} and holds "
                                f"{len(blocks)} KV blocks")
        paused_now = output.paused_req_ids if output is not None else ()
        for problem in self._paused_blocks.problems(paused_now, paused, kv.get_blocks):
            self._violation(problem)

    def _admission_within_plan(self, scheduler, output) -> None:
        if output is not None:
            admitted = (*output.new_req_ids, *output.resumed_req_ids)
            for problem in admission_problems(admitted, scheduler.lb.admit_req_ids):
                self._violation(problem)

    def _violation(self, what: str) -> None:
        engine = self.engine
        raise violation(engine.dp_rank, engine.iteration, engine.current_wave,
                        engine.step_counter, what)
