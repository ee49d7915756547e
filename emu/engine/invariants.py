"""Strict mode: the invariants of a rank, checked in every non-idle iteration; the kit
engine's checker, and the checks of DyntraLB's promises that both impls share
(``PromiseChecker``, also used by ``emu.impl.vllm_ascend.invariants``).

The kit engine's own invariants, at the end of the iteration (after DyntraLB's hook,
which may start KV loads):

- requests are conserved: every arrived request is finished or in exactly one queue,
  and none finishes twice;
- at most ``max_num_seqs`` run;
- KV blocks are conserved: the pool's used blocks are the blocks the requests in flight
  hold, and a request holds blocks only while it runs, is paused, loads remote KV or
  has computed tokens.

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
  with those blocks (no silent recompute).

A violation raises ``emu.cluster.guard.InvariantError`` naming the rank, the iteration
and the request. The last promise, that every rank enters the same collectives (same
descriptor, ``step_counter`` and ``current_wave``), is checked across ranks by the
launcher's watchdog (``emu.cluster.guard``), which names the ranks and where each waits.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from dyntra_lb.blocks import block_counts
from dyntra_lb.planner import Plan
from emu.cluster.guard import InvariantError
from emu.impl.kit.scheduler import RequestStatus


@dataclass(frozen=True)
class Held:
    """What a request holds at one moment: its KV block ids and computed tokens."""

    blocks: tuple[int, ...]
    computed: int


@dataclass(frozen=True)
class Scheduled:
    """What one ``schedule()`` did, read right after it: the requests running then, those
    it preempted for KV, those it admitted (new and resumed, in order), and what each
    resumed one holds with ``computed`` counting the tokens computed before this step."""

    running: frozenset[str]
    preempted: frozenset[str]
    admitted: tuple[str, ...]
    resumed: dict[str, Held]


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


def plan_pauses(out_blk: Sequence[int], running: Sequence[str],
                counts: Sequence[int]) -> list[str]:
    """The running requests a plan's ``out_blk`` pauses: matched by block count in running
    order, each value once; a value no request matches is ignored."""
    remaining = list(out_blk)
    paused = []
    for rid, blocks in zip(running, counts, strict=True):
        if not remaining:
            break
        if blocks in remaining:
            remaining.remove(blocks)
            paused.append(rid)
    return paused


def admission_set(plan: Plan | None, candidates: Iterable[tuple[str, int]]) -> set[str] | None:
    """The requests a plan lets the waiting loop admit (None: no plan, no limit): none when
    it freezes the rank, else the candidates its ``in_blk`` matches, in their order."""
    if plan is None:
        return None
    if plan.freeze:
        return set()
    remaining = list(plan.in_blk)
    admit = set()
    for rid, blocks in candidates:
        if not remaining:
            break
        if blocks in remaining:
            remaining.remove(blocks)
            admit.add(rid)
    return admit


@dataclass(frozen=True)
class _Pause:
    iteration: int  # the iteration that paused the request
    before: Held  # what it held at the end of the iteration before


class PromiseChecker:
    """DyntraLB's promises on one rank, for either impl. Its engine hands over what each
    ``schedule()`` did (``scheduled``, right after it) and the state at the end of each
    non-idle iteration (``problems``), with ``held_of(request_id)``: what a request in
    flight holds now (None when it is not in flight)."""

    def __init__(self, held_of: Callable[[str], Held | None]):
        self.held_of = held_of
        self._before: IterationEnd | None = None
        self._to_pause: dict[str, Held] = {}  # what the last plan pauses, held before
        self._scheduled: Scheduled | None = None
        self._paused: dict[str, _Pause] = {}

    def scheduled(self, scheduled: Scheduled) -> None:
        self._scheduled = scheduled

    def problems(self, end: IterationEnd) -> list[str]:
        """The promises broken in iteration ``end.iteration``, one text per request."""
        scheduled = self._scheduled
        if scheduled is None:  # nothing was scheduled: no plan applied, nobody admitted
            scheduled = Scheduled(frozenset(end.running), frozenset(), (), {})
        problems = []
        if self._before is not None:
            problems += self._plan_applied(self._before, scheduled, end.iteration)
        problems += self._resumed_where_paused(scheduled)
        problems += self._paused_keep_what_they_held()
        self._before, self._scheduled = end, None
        if end.plan is not None:
            pauses = plan_pauses(end.plan.out_blk, end.running, end.counts)
            self._to_pause = {rid: self.held_of(rid) for rid in pauses}
        else:
            self._to_pause = {}
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
                self._paused[rid] = _Pause(iteration, self._to_pause[rid])
        admit = admission_set(plan, before.candidates)
        if admit is not None:
            for rid in scheduled.admitted:
                if rid in admit:
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
            if now.computed != before.computed:
                problems.append(
                    f"paused request {rid!r} had {before.computed} computed tokens before "
                    f"iteration {pause.iteration} paused it, now {now.computed}")
        return problems


def _show(blocks: Sequence[int]) -> str:
    """Block ids for a message: all of a few, the ends of many."""
    if len(blocks) <= 8:
        return str(list(blocks))
    return f"[{', '.join(map(str, blocks[:4]))}, ..., {blocks[-1]}] ({len(blocks)} blocks)"


def violation(rank: int, iteration: int, wave: int, step_counter: int,
              what: str) -> InvariantError:
    """The error of a strict-mode violation, naming where it happened."""
    return InvariantError(
        f"strict invariant violated on rank {rank} at iteration {iteration} (wave {wave}, "
        f"step_counter {step_counter}): {what}")


class StrictChecker:
    """The checks of one kit rank (``engine`` is its ``emu.engine.core.EngineCore``): the
    engine calls ``scheduled`` right after each ``schedule()`` and ``check`` at the end
    of each non-idle iteration."""

    def __init__(self, engine: Any):
        self.engine = engine
        self._finished_ids: set[str] = set()
        lb_enabled = engine.scheduler.lb is not None
        self._promises = PromiseChecker(self._held) if lb_enabled else None

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
            (*output.new_req_ids, *output.resumed_req_ids), resumed))

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
        if used != held_total:
            gone = sorted(kv.holders() - scheduler.requests.keys())
            self._violation(f"KV blocks not conserved: the pool has {used} in use, the "
                            f"requests in flight hold {held_total}; blocks held by requests "
                            f"no longer in flight: {gone}")

    def _violation(self, what: str) -> None:
        engine = self.engine
        raise violation(engine.dp_rank, engine.iteration, engine.current_wave,
                        engine.step_counter, what)
