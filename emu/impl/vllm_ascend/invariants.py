"""Strict mode for a vllm-ascend rank, read off vLLM's scheduler state: requests are
conserved (every arrived request is finished or still in the scheduler), and, with
DyntraLB enabled, DyntraLB's promises (``emu.rank.invariants.PromiseChecker``): the
plan generated at iteration k is applied at k+1, only its admission set is admitted, a
frozen rank admits nothing, a paused request keeps the KV blocks and computed tokens it
had before the iteration that paused it and resumes from them.

The rank hands over what vllm-ascend did, not what its DyntraLB state says: each
``schedule()``'s output (``scheduled``, from the executor's forward), and at the end of
each non-idle iteration the plan ``_balance_load`` returned and the admission
candidates ``_do_lb_allgather`` published it with. A violation raises
``emu.rank.invariants.InvariantError`` naming the rank, iteration and request.
"""

from __future__ import annotations

from dyntra_lb.blocks import block_counts
from dyntra_lb.planner.front import Plan
from emu.rank.invariants import Held, IterationEnd, PromiseChecker, Scheduled, violation


class StrictChecker:
    """The checks of one vllm-ascend rank (``rank`` is its ``EmulatedRank``)."""

    def __init__(self, rank):
        self.rank = rank
        self._promises = (PromiseChecker(self._held, late_outputs=rank.spec.async_scheduling)
                          if rank.dyntra_lb else None)

    def scheduled(self, scheduler_output) -> None:
        """Right after ``schedule()``: what it decided (vLLM's ``SchedulerOutput``)."""
        if self._promises is None:
            return
        scheduled_tokens = scheduler_output.num_scheduled_tokens
        cached = scheduler_output.scheduled_cached_reqs
        resumed = {}
        for rid in cached.req_ids:
            if rid in cached.resumed_req_ids:  # computed tokens before this step's
                now = self._held(rid)
                resumed[rid] = Held(now.blocks, now.computed - scheduled_tokens.get(rid, 0))
        self._promises.scheduled(Scheduled(
            frozenset(r.request_id for r in self.rank.scheduler.running),
            frozenset(scheduler_output.preempted_req_ids or ()),
            (*(r.req_id for r in scheduler_output.scheduled_new_reqs), *resumed), resumed,
            {rid: len(tokens) for rid, tokens
             in scheduler_output.scheduled_spec_decode_tokens.items()}))

    def check(self, plan: dict | None, candidates: list) -> None:
        """At the end of an iteration: ``plan`` is this rank's row of the plans generated
        in it (None when no all-gather ran), ``candidates`` the requests it was made on."""
        rank = self.rank
        scheduler = rank.scheduler
        if self._promises is not None:
            running = scheduler.running
            block_size = rank.spec.block_size
            end = IterationEnd(
                rank.iteration, tuple(r.request_id for r in running),
                tuple(block_counts(running, block_size)),
                None if plan is None else Plan(list(plan["out_blk"]), list(plan["in_blk"]),
                                               bool(plan["freeze"])),
                tuple(zip((r.request_id for r in candidates),
                          block_counts(candidates, block_size), strict=True)))
            for problem in self._promises.problems(end):
                self._violation(problem)
        in_flight = len(scheduler.requests)
        if rank.num_arrived != rank.num_finished + in_flight:
            self._violation(f"requests not conserved: {rank.num_arrived} arrived, "
                            f"{rank.num_finished} finished, {in_flight} in flight")

    def _held(self, request_id: str) -> Held | None:
        scheduler = self.rank.scheduler
        request = scheduler.requests.get(request_id)
        if request is None:
            return None
        blocks = scheduler.kv_cache_manager.get_block_ids(request_id)[0]
        return Held(tuple(blocks), request.num_computed_tokens)

    def _violation(self, what: str) -> None:
        rank = self.rank
        raise violation(rank.dp_rank, rank.iteration, rank.engine.current_wave,
                        rank.engine.step_counter, what)
