"""An opt-in bound on how long DyntraLB may keep one request paused (``PauseLimit``), and
the per-rank ledger that enforces it (``PauseLedger``), handed to ``DyntraLBPolicy`` as
its pause rule (``LimitedPauses``, a ``dyntra_lb.pause_rule.PauseRule``). Not in
production: with no limit (``pause_rule_for(None)``) the policy keeps production's rule
and pauses exactly as production does.

What counts: a request's *paused time* is the sum, over each of its DyntraLB pauses, of
the time from the ``schedule()`` that paused it to the ``schedule()`` that resumed it
(each at the start of its step, the clock the scheduler is handed); a pause still open
counts up to now. A KV preemption or any other wait is not a DyntraLB pause and does not
count. The bound is on the total over the request's life, not on each pause: production
picks the first running request of the planned block count, so the same old requests are
paused again and again, and a per-pause bound would let many short pauses add up to an
unbounded delay; the total bounds every single pause too.

The rules, applied by ``DyntraLBPolicy`` at the start of each ``schedule()``:

- a request whose paused time has reached the limit ("due") is never chosen as a victim;
- a paused request that is due is resumed first: it goes to the front of the waiting
  queues and the admission gate lets it in whatever the plan admits (it still needs a
  free running slot, like any admission);
- an ``out_blk`` value whose production victim is due is served as ``victim`` says:
  ``next``, by the next running request of the same block count that is not due (the
  value is dropped when there is none); ``drop``, not at all; ``least-paused``, every
  value by the not-due request of that block count with the least paused time (spreading
  the pauses; ties in running order).

A request is due at the first ``schedule()`` at or past its limit, so it is paused at most
the limit plus one step (strict mode checks that). The ledger costs one dict entry per
request ever paused on the rank, and one lookup per running request of a planned block
count per pause.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from dyntra_lb.pause_rule import PauseRule, ProductionPauses

VICTIMS = ("next", "drop", "least-paused")


@dataclass(frozen=True)
class PauseLimit:
    """The bound: ``limit_s`` of paused time per request over its life (None: no bound,
    only the victim choice changes), and how an ``out_blk`` value is served (``victim``,
    one of ``VICTIMS``)."""

    limit_s: float | None
    victim: str = "next"

    def __post_init__(self):
        if self.victim not in VICTIMS:
            raise ValueError(f"pause victim must be one of {list(VICTIMS)}, got {self.victim!r}")
        if self.limit_s is not None and not self.limit_s > 0:
            raise ValueError(f"pause limit must be > 0 seconds, got {self.limit_s!r}")


class PauseLedger:
    """Each request's paused time on one rank: the finished pauses' total and, while
    paused, when the open pause started. Fed by the policy when it pauses a request, when
    one is scheduled again and when one is freed."""

    def __init__(self, limit: PauseLimit):
        self.limit = limit
        self.total_s: dict[str, float] = {}
        self.since_s: dict[str, float] = {}

    def paused_s(self, request_id: str, now_s: float) -> float:
        """The request's paused time up to ``now_s``."""
        since = self.since_s.get(request_id)
        total = self.total_s.get(request_id, 0.0)
        return total if since is None else total + (now_s - since)

    def is_due(self, request_id: str, now_s: float) -> bool:
        """Whether the request has reached its limit (never, without one)."""
        limit = self.limit.limit_s
        return limit is not None and self.paused_s(request_id, now_s) >= limit

    def paused(self, request_id: str, now_s: float) -> None:
        self.since_s[request_id] = now_s

    def resumed(self, request_id: str, now_s: float) -> None:
        since = self.since_s.pop(request_id, None)
        if since is not None:
            self.total_s[request_id] = self.total_s.get(request_id, 0.0) + (now_s - since)

    def forget(self, request_id: str) -> None:
        self.total_s.pop(request_id, None)
        self.since_s.pop(request_id, None)

    def due_paused(self, now_s: float) -> list[str]:
        """The paused requests that are due now, longest paused first."""
        due = [rid for rid in self.since_s if self.is_due(rid, now_s)]
        return sorted(due, key=lambda rid: -self.paused_s(rid, now_s))

    def victims(self, out_blk: Sequence[int], running_ids: Sequence[str],
                counts: Sequence[int], now_s: float) -> list[int]:
        """Indices into ``running_ids`` of the requests ``out_blk`` pauses now, in
        running order (see the module docstring for the rules)."""
        due = [self.is_due(rid, now_s) for rid in running_ids]
        victim = self.limit.victim
        if victim == "drop":
            return [i for i in _first_matches(out_blk, counts, lambda i: True) if not due[i]]
        if victim == "next":
            return _first_matches(out_blk, counts, lambda i: not due[i])
        taken: set[int] = set()
        for blk in out_blk:
            eligible = [i for i, c in enumerate(counts)
                        if c == blk and not due[i] and i not in taken]
            if eligible:
                pick = min(eligible, key=lambda i: self.paused_s(running_ids[i], now_s))
                taken.add(pick)
        return sorted(taken)


class LimitedPauses:
    """The pause rule under a ``PauseLimit``: the ledger's victims, the due requests
    resumed first, a running slot kept per paused request when there is a bound. It
    keeps the step's time from ``begin_step`` for the ledger's records."""

    def __init__(self, limit: PauseLimit):
        self.ledger = PauseLedger(limit)
        self._now_s = 0.0

    def begin_step(self, now_s: float | None) -> list[str]:
        self._now_s = now_s
        return self.ledger.due_paused(now_s)

    def victims(self, out_blk: Sequence[int], running: Sequence[Any],
                counts: Sequence[int]) -> list[int]:
        return self.ledger.victims(out_blk, [r.request_id for r in running], counts,
                                   self._now_s)

    def reserved_slots(self, paused: int) -> int:
        return paused if self.ledger.limit.limit_s is not None else 0

    def paused(self, request_id: str) -> None:
        self.ledger.paused(request_id, self._now_s)

    def resumed(self, request_id: str) -> None:
        self.ledger.resumed(request_id, self._now_s)

    def forget(self, request_id: str) -> None:
        self.ledger.forget(request_id)


def pause_rule_for(limit: PauseLimit | None) -> PauseRule:
    """The pause rule of a run: production's without a limit, else ``LimitedPauses``."""
    return ProductionPauses() if limit is None else LimitedPauses(limit)


def _first_matches(out_blk: Sequence[int], counts: Sequence[int],
                   eligible: Callable[[int], bool]) -> list[int]:
    """Production's matching restricted to ``eligible`` indices: in running order, a
    request takes a value of its block count while one is left."""
    remaining = list(out_blk)
    chosen: list[int] = []
    for i, c in enumerate(counts):
        if not remaining:
            break
        if c in remaining and eligible(i):
            remaining.remove(c)
            chosen.append(i)
    return chosen
