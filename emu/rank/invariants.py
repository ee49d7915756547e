"""Strict mode's parts that both engines share: the error a violation raises and the
checks of DyntraLB's promises (``PromiseChecker``), read off what either scheduler did.
Each engine's own checker (``emu.impl.kit.invariants``, ``emu.impl.vllm_ascend.
invariants``) hands it each ``schedule()`` and the end of every non-idle iteration.

DyntraLB's promises (docs/protocol.md, "Plan application"; docs/strict-mode.md has each
one broken on purpose and the message it produced), checked on what the scheduler did,
not on what DyntraLB's state says about itself:

- a plan generated at iteration k is applied at iteration k+1: exactly the running
  requests its ``out_blk`` matches (by block count, in running order, each value once)
  stop running, and no other request stops running except by a KV preemption;
- only the plan's admission set is admitted (its ``in_blk`` matched the same way
  against the admission candidates the plan was made on); a frozen rank admits nothing;
- a paused request keeps the KV block ids and the computed tokens it had before the
  iteration that paused it, for as long as it is paused, and resumes from those tokens
  with those blocks (no silent recompute);
- with the kit's opt-in pause limit (``dyntra_lb.pause_limit``), the checker keeps its
  own count of each request's paused time from the pauses and resumes it sees, at each
  ``schedule()``'s time: a request at its limit is never paused (the plan's values go to
  the victims the limit's rule gives), is admitted whatever the plan admits, and is
  resumed by the first ``schedule()`` at or past its limit; one still paused then has
  been paused past the limit plus one step.

The last promise, that every rank enters the same collectives (same descriptor,
``step_counter`` and ``current_wave``), is checked across ranks by the watchdog
(``emu.cluster.watchdog``), which names the ranks and where each waits.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from dyntra_lb.pause_limit import PauseLimit
from dyntra_lb.planner.front import Plan


class InvariantError(AssertionError):
    """A strict-mode invariant does not hold on this rank (the message names the rank,
    the iteration and the request)."""


def violation(rank: int, iteration: int, wave: int, step_counter: int,
              what: str) -> InvariantError:
    """The error of a strict-mode violation, naming where it happened."""
    return InvariantError(
        f"strict invariant violated on rank {rank} at iteration {iteration} (wave {wave}, "
        f"step_counter {step_counter}): {what}")


@dataclass(frozen=True)
class Held:
    """What a request holds at one moment: its KV block ids and computed tokens."""

    blocks: tuple[int, ...]
    computed: int


@dataclass(frozen=True)
class Scheduled:
    """What one ``schedule()`` did, read right after it: the requests running then, those
    it preempted for KV, those it admitted (new and resumed, in order), what each
    resumed one holds with ``computed`` counting the tokens computed before this step,
    and how many draft tokens it scheduled per request (MTP)."""

    running: frozenset[str]
    preempted: frozenset[str]
    admitted: tuple[str, ...]
    resumed: dict[str, Held]
    drafts: Mapping[str, int] = field(default_factory=dict)
    now_s: float = 0.0  # the step's time the scheduler was handed (the pause limit's clock)


@dataclass(frozen=True)
class IterationEnd:
    """A rank's scheduler at the end of an iteration, after DyntraLB's hook: the running
    requests in order with their DyntraLB block counts, this rank's plan generated in
    this iteration (None when no all-gather ran) and the admission candidates it was
    made on, as (request id, block count) in schedule order."""

    iteration: int
    running: tuple[str, ...]
    counts: tuple[int, ...]
    plan: Plan | None
    candidates: tuple[tuple[str, int], ...]


def _matched(values: Sequence[int], requests: Iterable[tuple[str, int]]) -> list[str]:
    """The requests (id, block count) that ``values`` match by block count, in the
    requests' order, each value once; a value no request matches is ignored. How DyntraLB
    applies a plan's ``out_blk`` to the running requests and ``in_blk`` to the waiting."""
    remaining = list(values)
    matched = []
    for rid, blocks in requests:
        if not remaining:
            break
        if blocks in remaining:
            remaining.remove(blocks)
            matched.append(rid)
    return matched


def plan_pauses(out_blk: Sequence[int], running: Sequence[str],
                counts: Sequence[int]) -> list[str]:
    """The running requests a plan's ``out_blk`` pauses (``_matched``)."""
    return _matched(out_blk, zip(running, counts, strict=True))


def limited_pauses(out_blk: Sequence[int], running: Sequence[str], counts: Sequence[int],
                   paused_s: Callable[[str], float], limit_s: float | None,
                   victim: str) -> list[str]:
    """The running requests ``out_blk`` pauses under a pause limit: a request paused
    ``limit_s`` or more is not a victim; ``next`` skips it for the next request of the
    same block count, ``drop`` drops its value, ``least-paused`` gives each value to the
    request of that count paused least (ties in running order)."""
    def due(rid: str) -> bool:
        return limit_s is not None and paused_s(rid) >= limit_s

    pairs = list(zip(running, counts, strict=True))
    if victim == "drop":
        return [rid for rid in _matched(out_blk, pairs) if not due(rid)]
    if victim == "next":
        return _matched(out_blk, [(rid, blk) for rid, blk in pairs if not due(rid)])
    chosen: set[str] = set()
    for value in out_blk:
        eligible = [rid for rid, blk in pairs
                    if blk == value and rid not in chosen and not due(rid)]
        if eligible:
            chosen.add(min(eligible, key=paused_s))
    return [rid for rid in running if rid in chosen]


def admission_set(plan: Plan | None, candidates: Iterable[tuple[str, int]]) -> set[str] | None:
    """The requests a plan lets the waiting loop admit (None: no plan, no limit): none when
    it freezes the rank, else the candidates its ``in_blk`` matches (``_matched``)."""
    if plan is None:
        return None
    return set() if plan.freeze else set(_matched(plan.in_blk, candidates))


@dataclass(frozen=True)
class _Pause:
    iteration: int  # the iteration that paused the request
    before: Held  # what it held at the end of the iteration before
    # Draft tokens of its last step whose output had not landed when it was paused
    # (``late_outputs``): their rejection may still lower ``before.computed`` once.
    in_flight_drafts: int = 0


class PromiseChecker:
    """DyntraLB's promises on one rank, for either impl. Its engine hands over what each
    ``schedule()`` did (``scheduled``, right after it) and the state at the end of each
    non-idle iteration (``problems``), with ``held_of(request_id)``: what a request in
    flight holds now (None when it is not in flight).

    ``late_outputs``: a step's output is processed in the next iteration, after that
    iteration's ``schedule()`` (vLLM's async scheduling). A request paused right after a
    step in which it verified drafts then has its rejected drafts rolled back once that
    output lands, in the pausing iteration: vLLM lowers its computed tokens by them,
    keeping its blocks. The checker allows exactly that, and only then."""

    def __init__(self, held_of: Callable[[str], Held | None], late_outputs: bool = False,
                 pause_limit: PauseLimit | None = None):
        self.held_of = held_of
        self.late_outputs = late_outputs
        self.pause_limit = pause_limit
        self._paused_total: dict[str, float] = {}  # the pause limit's count, its own
        self._paused_since: dict[str, float] = {}
        self._before: IterationEnd | None = None
        self._to_pause: dict[str, Held] = {}  # what the last plan pauses, held before
        self._scheduled: Scheduled | None = None
        self._last_drafts: Mapping[str, int] = {}  # drafts of the last iteration's step
        self._paused: dict[str, _Pause] = {}
        self._due: set[str] = set()  # requests at their pause limit this step

    def scheduled(self, scheduled: Scheduled) -> None:
        self._scheduled = scheduled

    def problems(self, end: IterationEnd) -> list[str]:
        """The promises broken in iteration ``end.iteration``, one text per request."""
        scheduled = self._scheduled
        if scheduled is None:  # nothing was scheduled: no plan applied, nobody admitted
            scheduled = Scheduled(frozenset(end.running), frozenset(), (), {})
        problems = []
        if self.pause_limit is not None and self._before is not None:
            problems += self._limit_kept(self._before, scheduled, end.iteration)
        if self._before is not None:
            problems += self._plan_applied(self._before, scheduled, end.iteration)
        problems += self._resumed_where_paused(scheduled)
        problems += self._paused_keep_what_they_held()
        self._before, self._scheduled, self._last_drafts = end, None, scheduled.drafts
        if end.plan is None:
            self._to_pause = {}
        elif self.pause_limit is not None:  # the victims depend on the next step's time
            out = set(end.plan.out_blk)
            self._to_pause = {rid: self.held_of(rid)
                              for rid, blk in zip(end.running, end.counts, strict=True)
                              if blk in out}
        else:
            pauses = plan_pauses(end.plan.out_blk, end.running, end.counts)
            self._to_pause = {rid: self.held_of(rid) for rid in pauses}
        return problems

    def _paused_s(self, rid: str, now_s: float) -> float:
        since = self._paused_since.get(rid)
        total = self._paused_total.get(rid, 0.0)
        return total if since is None else total + now_s - since

    def _limit_kept(self, before: IterationEnd, scheduled: Scheduled,
                    iteration: int) -> list[str]:
        """Under a pause limit, at this ``schedule()``'s time: every request paused up to
        its limit is resumed now; the plan's victims are the limit's (``_to_pause``
        narrowed to them); the paused-time count follows what the scheduler did."""
        limit, now = self.pause_limit, scheduled.now_s
        paused_s = functools.partial(self._paused_s, now_s=now)
        problems = []
        for rid in list(self._paused_since):
            if self.held_of(rid) is None:  # finished
                self._paused_since.pop(rid)
                self._paused_total.pop(rid, None)
                continue
            if (limit.limit_s is not None and paused_s(rid) >= limit.limit_s
                    and rid not in scheduled.resumed):
                problems.append(
                    f"request {rid!r} has been paused {paused_s(rid) * 1e3:.1f} ms in total, "
                    f"at its pause limit of {limit.limit_s * 1e3:g} ms, but iteration "
                    f"{iteration} did not resume it: it stays paused past the limit plus "
                    f"one step")
        self._due = {rid for rid in self._paused_since
                     if limit.limit_s is not None and paused_s(rid) >= limit.limit_s}
        if before.plan is not None:
            victims = limited_pauses(before.plan.out_blk, before.running, before.counts,
                                     paused_s, limit.limit_s, limit.victim)
            self._to_pause = {rid: self._to_pause[rid] for rid in victims}
        for rid in scheduled.resumed:
            since = self._paused_since.pop(rid, None)
            if since is not None:
                self._paused_total[rid] = self._paused_total.get(rid, 0.0) + now - since
        for rid in self._to_pause:
            if rid not in scheduled.running and rid not in scheduled.preempted:
                self._paused_since[rid] = now
        return problems

    def _plan_applied(self, before: IterationEnd, scheduled: Scheduled,
                      iteration: int) -> list[str]:
        plan, k = before.plan, before.iteration
        made = (f"the plan generated at iteration {k} (out_blk {plan.out_blk}, in_blk "
                f"{plan.in_blk}, freeze {plan.freeze})" if plan is not None
                else f"no plan (none was generated at iteration {k})")
        stopped = [rid for rid in before.running
                   if rid not in scheduled.running and rid not in scheduled.preempted]
        problems = [f"request {rid!r} stopped running at iteration {iteration} without a KV "
                    f"preemption, but {made} does not pause it"
                    for rid in stopped if rid not in self._to_pause]
        problems += [f"request {rid!r} still runs at iteration {iteration}, but {made} "
                     f"pauses it" for rid in self._to_pause if rid in scheduled.running]
        for rid in stopped:
            if rid in self._to_pause:
                drafts = self._last_drafts.get(rid, 0) if self.late_outputs else 0
                self._paused[rid] = _Pause(iteration, self._to_pause[rid], drafts)
        admit = admission_set(plan, before.candidates)
        if admit is not None:
            for rid in scheduled.admitted:
                if rid in admit or rid in self._due:  # a request at its limit: resumed first
                    continue
                if plan.freeze:
                    problems.append(f"{made} freezes this rank, yet request {rid!r} was "
                                    f"admitted at iteration {iteration}")
                else:
                    problems.append(f"request {rid!r} was admitted at iteration {iteration} "
                                    f"outside the admission set {sorted(admit)} of {made}")
        return problems

    def _resumed_where_paused(self, scheduled: Scheduled) -> list[str]:
        problems = []
        for rid, now in scheduled.resumed.items():
            pause = self._paused.pop(rid, None)
            if pause is None:
                continue
            before = pause.before
            if now.computed != before.computed:
                problems.append(
                    f"request {rid!r}, paused at iteration {pause.iteration} with "
                    f"{before.computed} computed tokens, resumed from {now.computed}: it "
                    f"recomputes instead of continuing")
            if now.blocks[:len(before.blocks)] != before.blocks:
                problems.append(
                    f"request {rid!r}, paused at iteration {pause.iteration} holding KV "
                    f"blocks {_show(before.blocks)}, resumed holding {_show(now.blocks)}")
        return problems

    def _paused_keep_what_they_held(self) -> list[str]:
        problems = []
        for rid, pause in list(self._paused.items()):
            now = self.held_of(rid)
            if now is None:  # finished while paused (its last output arrived late)
                del self._paused[rid]
                continue
            before = pause.before
            if now.blocks != before.blocks:
                problems.append(
                    f"paused request {rid!r} held KV blocks {_show(before.blocks)} before "
                    f"iteration {pause.iteration} paused it, now {_show(now.blocks)}")
            rolled_back = before.computed - now.computed
            if 0 < rolled_back <= pause.in_flight_drafts:  # its last output landed late
                self._paused[rid] = _Pause(pause.iteration, Held(before.blocks, now.computed))
            elif now.computed != before.computed:
                problems.append(
                    f"paused request {rid!r} had {before.computed} computed tokens before "
                    f"iteration {pause.iteration} paused it, now {now.computed}")
        return problems


def _show(blocks: Sequence[int]) -> str:
    """Block ids for a message: all of a few, the ends of many."""
    if len(blocks) <= 8:
        return str(list(blocks))
    return f"[{', '.join(map(str, blocks[:4]))}, ..., {blocks[-1]}] ({len(blocks)} blocks)"
