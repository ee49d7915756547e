"""Strict mode for a vllm-ascend rank: the kit's invariants that can be read off vLLM's
scheduler state, checked at the end of every non-idle iteration.

- requests are conserved: every arrived request is finished or still in the scheduler;
- a DyntraLB-paused request keeps exactly the KV block ids it held when it was paused,
  until it is scheduled again (vllm-ascend's pause must not free or move its KV);
- while a plan is present, only its admission set is admitted.

A violation raises ``emu.rank.invariants.InvariantError`` naming the rank, iteration and
request.
"""

from __future__ import annotations

from emu.rank.invariants import PausedBlocks, admission_problems, violation


class StrictChecker:
    """The checks of one vllm-ascend rank (``rank`` is its ``EmulatedRank``)."""

    def __init__(self, rank):
        self.rank = rank
        self._paused_blocks = PausedBlocks()

    def check(self, paused_now: list[str], admitted: list[str], admit_ids) -> None:
        rank = self.rank
        scheduler = rank.scheduler
        in_flight = len(scheduler.requests)
        if rank.num_arrived != rank.num_finished + in_flight:
            self._violation(f"requests not conserved: {rank.num_arrived} arrived, "
                            f"{rank.num_finished} finished, {in_flight} in flight")
        kv = scheduler.kv_cache_manager
        paused = getattr(scheduler, "_lb_paused_req_ids", set())
        problems = self._paused_blocks.problems(paused_now, paused,
                                                lambda rid: list(kv.get_block_ids(rid)[0]))
        for problem in problems + admission_problems(admitted, admit_ids):
            self._violation(problem)

    def _violation(self, what: str) -> None:
        rank = self.rank
        raise violation(rank.dp_rank, rank.iteration, rank.engine.current_wave,
                        rank.engine.step_counter, what)
