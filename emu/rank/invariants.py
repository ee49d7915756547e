"""Strict mode's parts that both engines share: the error a violation raises and the
checks that read the same promise off either scheduler (a paused request keeps its KV,
admission stays within the plan's set). Each engine's own checker
(``emu.impl.kit.invariants``, ``emu.impl.vllm_ascend.invariants``) calls them at the
end of every non-idle iteration."""

from __future__ import annotations


class InvariantError(AssertionError):
    """A strict-mode invariant does not hold on this rank (the message names the rank,
    the iteration and the request)."""


class PausedBlocks:
    """The KV block ids each DyntraLB-paused request held when it was paused, for the
    check that it keeps exactly those until it runs again (both impls' strict mode)."""

    def __init__(self):
        self._held: dict[str, list[int]] = {}

    def problems(self, paused_now, paused, blocks_of) -> list[str]:
        """After an iteration that paused ``paused_now``, with ``paused`` the ids still
        paused and ``blocks_of(rid)`` a request's block ids now."""
        for rid in paused_now:
            self._held[rid] = blocks_of(rid)
        for rid in list(self._held):
            if rid not in paused:
                del self._held[rid]
        for rid in paused:
            self._held.setdefault(rid, blocks_of(rid))
        return [f"paused request {rid!r} held KV blocks {blocks} when paused, now {now}"
                for rid, blocks in self._held.items() if (now := blocks_of(rid)) != blocks]


def admission_problems(admitted, admit_ids) -> list[str]:
    """Requests admitted outside the plan's admission set (None: no plan, no limit)."""
    if admit_ids is None:
        return []
    return [f"request {rid!r} was admitted under a plan whose admission set is "
            f"{sorted(admit_ids)}" for rid in admitted if rid not in admit_ids]


def violation(rank: int, iteration: int, wave: int, step_counter: int,
              what: str) -> InvariantError:
    """The error of a strict-mode violation, naming where it happened."""
    return InvariantError(
        f"strict invariant violated on rank {rank} at iteration {iteration} (wave {wave}, "
        f"step_counter {step_counter}): {what}")
