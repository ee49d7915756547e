"""Strict mode for a vllm-ascend rank: the kit's invariants that can be read off vLLM's
scheduler state, checked at the end of every non-idle iteration.

- requests are conserved: every arrived request is finished or still in the scheduler;
- a DyntraLB-paused request keeps exactly the KV block ids it held when it was paused,
  until it is scheduled again (vllm-ascend's pause must not free or move its KV);
- while a plan is present, only its admission set is admitted.

A violation raises ``emu.guard.InvariantError`` naming the rank, iteration and request.
"""

from __future__ import annotations

from emu.guard import InvariantError


class StrictChecker:
    """The checks of one vllm-ascend rank (``rank`` is its ``EmulatedRank``)."""

    def __init__(self, rank):
        self.rank = rank
        self._paused_blocks: dict[str, list[int]] = {}

    def check(self, paused_now: list[str], admitted: list[str], admit_ids) -> None:
        rank = self.rank
        scheduler = rank.scheduler
        in_flight = len(scheduler.requests)
        if rank.num_arrived != rank.num_finished + in_flight:
            self._violation(f"requests not conserved: {rank.num_arrived} arrived, "
                            f"{rank.num_finished} finished, {in_flight} in flight")
        kv = scheduler.kv_cache_manager
        paused = getattr(scheduler, "_lb_paused_req_ids", set())
        remembered = self._paused_blocks
        for rid in paused_now:
            remembered[rid] = list(kv.get_block_ids(rid)[0])
        for rid in list(remembered):
            if rid not in paused:
                del remembered[rid]
        for rid, blocks in remembered.items():
            now = list(kv.get_block_ids(rid)[0])
            if now != blocks:
                self._violation(f"paused request {rid!r} held KV blocks {blocks} when "
                                f"paused, now {now}")
        if admit_ids is not None:
            for rid in admitted:
                if rid not in admit_ids:
                    self._violation(f"request {rid!r} was admitted under a plan whose "
                                    f"admission set is {sorted(admit_ids)}")

    def _violation(self, what: str) -> None:
        rank = self.rank
        raise InvariantError(
            f"strict invariant violated on rank {rank.dp_rank} at iteration {rank.iteration} "
            f"(wave {rank.engine.current_wave}, step_counter {rank.engine.step_counter}): "
            f"{what}")
