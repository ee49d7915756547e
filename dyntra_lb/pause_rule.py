"""Which running requests a plan's ``out_blk`` pauses, and what the policy tells the rule
about pauses: the one seam between ``DyntraLBPolicy`` and how pausing is decided.

``DyntraLBPolicy`` is handed one ``PauseRule`` when it is built and asks it, at the start
of every ``schedule()``, which paused requests must be resumed first (``begin_step``),
which running requests the plan pauses (``victims``) and how many running slots the
paused requests keep (``reserved_slots``); it reports every pause, resume and free to it.
``ProductionPauses`` is production's rule and the default; the kit's opt-in bound on
paused time (``dyntra_lb.pause_limit.LimitedPauses``) is the other one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol


class PauseRule(Protocol):
    """How one rank's DyntraLB chooses what to pause, and what it keeps about pauses."""

    def begin_step(self, now_s: float | None) -> list[str]:
        """Called first thing in ``apply_plan`` with the step's time (None where the
        scheduler keeps no clock): the paused requests that must be resumed first this
        step, in the order they go to the front of the waiting queues."""

    def victims(self, out_blk: Sequence[int], running: Sequence[Any],
                counts: Sequence[int]) -> list[int]:
        """Indices into ``running`` (whose block counts are ``counts``) of the requests
        the plan's ``out_blk`` pauses, in the order they are paused."""

    def reserved_slots(self, paused: int) -> int:
        """After the plan's pauses: how many running slots the ``paused`` requests keep
        free for themselves (a request that is not paused is admitted only beside them)."""

    def paused(self, request_id: str) -> None:
        """The request was paused by this step's plan."""

    def resumed(self, request_id: str) -> None:
        """The request left its pause: scheduled again, or preempted (KV freed)."""

    def forget(self, request_id: str) -> None:
        """The request finished and is about to be freed."""


class ProductionPauses:
    """Production's rule (vllm-ascend's ``DyntraLBPolicyMixin``): each ``out_blk`` value
    pauses the first running request of that block count, in running-list order;
    unmatched values are ignored. Nothing is resumed first, no slot is kept, nothing about
    pauses is remembered.

    A first pass prefers requests flagged ``lb_newly_added``. Nothing ever sets that flag
    (a production quirk), so the pass is inert; it is kept because it is the reference
    behaviour and an adapter could set the flag."""

    def begin_step(self, now_s: float | None) -> list[str]:
        return []

    def victims(self, out_blk: Sequence[int], running: Sequence[Any],
                counts: Sequence[int]) -> list[int]:
        remaining_out = list(out_blk)
        chosen: list[int] = []
        for newly_added_only in (True, False):
            for index, (request, blk) in enumerate(zip(running, counts, strict=True)):
                if not remaining_out:
                    return chosen
                if newly_added_only and not getattr(request, "lb_newly_added", False):
                    continue
                if not newly_added_only and index in chosen:
                    continue
                if blk in remaining_out:
                    remaining_out.remove(blk)
                    chosen.append(index)
        return chosen

    def reserved_slots(self, paused: int) -> int:
        return 0

    def paused(self, request_id: str) -> None:
        pass

    def resumed(self, request_id: str) -> None:
        pass

    def forget(self, request_id: str) -> None:
        pass
