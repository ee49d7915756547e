"""Scheduler-side DyntraLB: the part of the balancer that lives inside a
rank's scheduler.

Two moments of a step involve it. Right before the all-gather the coordinator calls
``prepare_step()``: blocked requests are refreshed, remote KV loads are started early,
and the admission candidates are fixed in schedule order; their block counts and those
of the running requests are what this rank publishes. The coordinator hands the
planner's row for this rank over with ``set_plan()`` (or drops it with
``clear_plan()``). At the start of the next ``schedule()`` the scheduler calls
``apply_plan()``: running requests matching ``out_blk`` are paused (they keep their
KV), and candidates matching ``in_blk`` form the admit set that ``can_admit()``
enforces in the waiting loop. The remaining hooks keep the set of paused ids honest.
vllm-ascend keeps the same state on its scheduler (``DyntraLBPolicyMixin``): ``plan``
is its ``modifications``, ``prepare_step`` its ``prepare_dyntra_lb_step``.

The policy is engine-agnostic: it only touches the narrow, vLLM-named scheduler surface
described by ``SchedulerLike`` below, so the emulator's stub scheduler and a thin
adapter around a real vLLM ``Scheduler`` can both host it.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Iterable, Iterator
from typing import Any, Protocol

from dyntra_lb.blocks import block_counts
from dyntra_lb.diagnostics import pause_line
from dyntra_lb.pause_limit import PauseLimit, pause_rule_for
from dyntra_lb.pause_rule import PauseRule, ProductionPauses
from dyntra_lb.planner.front import Plan

logger = logging.getLogger("dyntra_lb")


class RequestStatus(enum.IntEnum):
    """vLLM 0.27.1's request statuses, same order and values; finished ⇔ > PREEMPTED.

    Being an ``IntEnum`` numbered like vLLM's, its members compare equal to vLLM's, so
    the policy works unchanged on real vLLM requests.
    """

    WAITING = enum.auto()
    WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR = enum.auto()
    WAITING_FOR_REMOTE_KVS = enum.auto()
    WAITING_FOR_STREAMING_REQ = enum.auto()
    RUNNING = enum.auto()
    PREEMPTED = enum.auto()
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH_CAPPED = enum.auto()
    FINISHED_ABORTED = enum.auto()
    FINISHED_IGNORED = enum.auto()
    FINISHED_ERROR = enum.auto()
    FINISHED_REPETITION = enum.auto()


BLOCKED_STATUSES = frozenset({
    RequestStatus.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR,
    RequestStatus.WAITING_FOR_REMOTE_KVS,
    RequestStatus.WAITING_FOR_STREAMING_REQ,
})
"""Statuses that live in ``skipped_waiting`` until the scheduler promotes them."""

_ADMITTABLE = frozenset({RequestStatus.WAITING, RequestStatus.PREEMPTED})


class RequestLike(Protocol):
    request_id: str
    status: int
    num_computed_tokens: int

    @property
    def num_tokens(self) -> int: ...  # prompt + generated output tokens

    def __lt__(self, other: Any) -> bool: ...  # PRIORITY order: priority, arrival, id


class RequestQueueLike(Protocol):
    """vLLM's ``RequestQueue``: iteration yields requests in scheduling order."""

    def add_request(self, request: Any) -> None: ...

    def prepend_request(self, request: Any) -> None: ...

    def remove_requests(self, requests: Iterable[Any]) -> None: ...

    def __iter__(self) -> Iterator[Any]: ...

    def __len__(self) -> int: ...


class KVCacheManagerLike(Protocol):
    def get_computed_blocks(self, request: Any) -> tuple[Any, int]: ...

    def allocate_slots(self, request: Any, num_new_tokens: int, *,
                       num_new_computed_tokens: int = 0, new_computed_blocks: Any = None,
                       num_lookahead_tokens: int = 0, num_external_computed_tokens: int = 0,
                       delay_cache_blocks: bool = False,
                       full_sequence_must_fit: bool = False) -> Any | None: ...

    def get_blocks(self, request_id: str) -> Any: ...


class KVConnectorLike(Protocol):
    """Scheduler side of a ``kv_consumer`` connector (vLLM ``KVConnectorBase_V1``)."""

    def get_num_new_matched_tokens(self, request: Any,
                                   num_computed_tokens: int) -> tuple[int | None, bool]: ...

    def update_state_after_alloc(self, request: Any, blocks: Any,
                                 num_external_tokens: int) -> None: ...


class CacheConfigLike(Protocol):
    block_size: int


class SchedulerLike(Protocol):
    """What DyntraLB reads and changes on the scheduler, named as in vLLM 0.27.1.

    ``policy`` is "fcfs" or "priority" (or an enum whose ``value`` is one of those);
    ``cache_config.block_size`` is the DyntraLB block size; ``_inflight_prefills`` is
    vLLM's set of requests still prefilling (async KV loads included).
    """

    running: list[Any]
    waiting: RequestQueueLike
    skipped_waiting: RequestQueueLike
    max_num_running_reqs: int
    policy: Any
    cache_config: CacheConfigLike
    kv_cache_manager: KVCacheManagerLike
    connector: KVConnectorLike | None
    scheduler_reserve_full_isl: bool
    _inflight_prefills: set[Any]

    def _try_promote_blocked_waiting_request(self, request: Any) -> bool: ...


class DyntraLBPolicy:
    """DyntraLB's state and rules on one rank's scheduler.

    ``plan`` is this rank's plan for the next ``schedule()`` (``None`` = no plan,
    unrestricted admission); ``admit_req_ids`` is ``None`` when admission is
    unrestricted, else the ids the waiting loop may admit this step. ``pause_rule``
    decides what a plan pauses (``dyntra_lb.pause_rule``): production's by default; the
    kit's opt-in pause limit hands in ``dyntra_lb.pause_limit.pause_rule_for(limit)``
    (``pause_limit=limit``, the keyword from before this seam, does the same).
    """

    def __init__(self, scheduler: SchedulerLike, *, enable_diagnostics: bool = False,
                 pause_rule: PauseRule | None = None, pause_limit: PauseLimit | None = None):
        self.scheduler = scheduler
        self.enable_diagnostics = enable_diagnostics
        self.plan: Plan | None = None
        self.paused_req_ids: set[str] = set()
        self.admission_candidates: list[Any] = []
        self.admit_req_ids: set[str] | None = None
        policy = scheduler.policy
        self._priority = getattr(policy, "value", policy) == "priority"
        if pause_limit is not None:  # the keyword before the seam: still taken
            if pause_rule is not None:
                raise TypeError("DyntraLBPolicy: pass pause_rule= or pause_limit=, not both")
            pause_rule = pause_rule_for(pause_limit)
        self.pause_rule: PauseRule = pause_rule or ProductionPauses()
        self._due: set[str] = set()  # paused requests resumed first this step
        self._reserved = 0  # running slots the paused requests keep (the rule's)

    # ----------------------------------------------------------- snapshot

    def prepare_step(self) -> list[Any]:
        """Called by the coordinator right before the all-gather of an active step.

        Returns (and keeps) the admission candidates: the waiting requests in schedule
        order that are WAITING or PREEMPTED and were not reported "not ready" by the KV
        prefetch. LB-paused and normally preempted requests are included.
        """
        scheduler = self.scheduler
        if not scheduler.waiting and not scheduler.skipped_waiting:
            # Nothing waits (most decode steps): no candidate, nothing to refresh or
            # prefetch, as the steps below would find.
            self.admission_candidates = []
            return self.admission_candidates
        self._refresh_blocked_waiting_requests()
        not_ready = self._run_kv_prefetch()
        order = self._schedule_order()
        if not_ready:
            self.admission_candidates = [
                r for r in order if r.status in _ADMITTABLE and r.request_id not in not_ready]
        else:
            self.admission_candidates = [r for r in order if r.status in _ADMITTABLE]
        return self.admission_candidates

    def running_block_counts(self) -> list[int]:
        """Block counts of the running requests, in list order (the payload's running part)."""
        return block_counts(self.scheduler.running, self.scheduler.cache_config.block_size)

    def block_counts(self, requests: Iterable[Any]) -> list[int]:
        """Block counts of ``requests``, in order (the candidates' part of the payload)."""
        return block_counts(requests, self.scheduler.cache_config.block_size)

    def set_plan(self, plan: Plan) -> None:
        """The coordinator's hand-over after an active step's all-gather: this rank's
        row of the plan, applied by the next ``schedule()``."""
        self.plan = plan

    def clear_plan(self) -> None:
        """Drop the plan: at a wave end and on steps where balancing is inactive."""
        self.plan = None

    def _refresh_blocked_waiting_requests(self) -> None:
        """Let requests whose remote KV has landed become WAITING/PREEMPTED again so
        that they can be published as candidates; they stay in ``skipped_waiting``."""
        scheduler = self.scheduler
        for request in list(scheduler.skipped_waiting):
            if request.status in BLOCKED_STATUSES:
                scheduler._try_promote_blocked_waiting_request(request)

    def _schedule_order(self) -> list[Any]:
        """The waiting requests in the order the waiting loop would visit them.

        FCFS: all of ``skipped_waiting``, then all of ``waiting``. PRIORITY: merge of
        the two sorted queues, taking the ``waiting`` head only when strictly smaller.
        """
        scheduler = self.scheduler
        skipped = list(scheduler.skipped_waiting)
        waiting = list(scheduler.waiting)
        if not self._priority:
            return skipped + waiting
        order = []
        i = j = 0
        while i < len(skipped) and j < len(waiting):
            if waiting[j] < skipped[i]:
                order.append(waiting[j])
                j += 1
            else:
                order.append(skipped[i])
                i += 1
        order.extend(skipped[i:])
        order.extend(waiting[j:])
        return order

    def _run_kv_prefetch(self) -> set[str]:
        """Start remote KV loads early for up to ``2*max_num_running_reqs - len(running)``
        fresh requests, so that admitted requests have their KV on arrival. (vllm-ascend
        gates this on ``_lb_kv_prefetch_enabled``, which is always true here: the
        coordinator calls ``prepare_step`` only on active steps.)

        Returns the ids the connector called not ready (or that could not get blocks,
        or that are beyond the limit): these are not published as candidates. Every
        considered request counts toward the limit before its outcome is known (as in production).
        """
        scheduler = self.scheduler
        connector = scheduler.connector
        not_ready: set[str] = set()
        if connector is None:
            return not_ready
        kv_cache_manager = scheduler.kv_cache_manager
        limit = 2 * scheduler.max_num_running_reqs - len(scheduler.running)
        in_skipped = {id(r) for r in scheduler.skipped_waiting}
        count = 0
        moved = []
        for request in self._schedule_order():
            if request.status not in _ADMITTABLE or request.num_computed_tokens != 0:
                continue
            if count >= limit:
                not_ready.add(request.request_id)
                continue
            count += 1
            computed_blocks, num_local = kv_cache_manager.get_computed_blocks(request)
            num_external, load_kv_async = connector.get_num_new_matched_tokens(
                request, num_local)
            if num_external is None:
                not_ready.add(request.request_id)
                continue
            if not load_kv_async or num_external == 0:
                continue
            new_blocks = kv_cache_manager.allocate_slots(
                request, 0,
                num_new_computed_tokens=num_local,
                new_computed_blocks=computed_blocks,
                num_lookahead_tokens=0,
                num_external_computed_tokens=num_external,
                delay_cache_blocks=True,
                full_sequence_must_fit=scheduler.scheduler_reserve_full_isl,
            )
            if new_blocks is None:
                not_ready.add(request.request_id)
                continue
            connector.update_state_after_alloc(
                request, kv_cache_manager.get_blocks(request.request_id), num_external)
            request.num_computed_tokens = num_local + num_external
            request.status = RequestStatus.WAITING_FOR_REMOTE_KVS
            scheduler._inflight_prefills.add(request)
            if id(request) not in in_skipped:
                moved.append(request)
        if moved:
            scheduler.waiting.remove_requests(moved)
            for request in moved:
                scheduler.skipped_waiting.add_request(request)
        return not_ready

    # ------------------------------------------------------- plan application

    def apply_plan(self, now_s: float | None = None) -> list[Any]:
        """Called first thing in ``schedule()``: apply the plan made after the previous
        step. Pauses the running requests matched by ``out_blk`` and builds the admit
        set from ``in_blk`` (empty when frozen). Returns the paused requests in pause
        order (empty without a plan) so the scheduler can report them.

        ``now_s`` is the step's time, for the pause rule: the requests it names go to the
        front of the waiting queues first, and it chooses the victims
        (``dyntra_lb.pause_rule``).
        """
        self.admit_req_ids = None
        self._resume_first(self.pause_rule.begin_step(now_s))
        plan = self.plan
        out_blk = plan.out_blk if plan is not None else []
        paused = self._pause_out_matches(out_blk) if out_blk else []
        self._reserved = self.pause_rule.reserved_slots(len(self.paused_req_ids))
        if plan is None:
            return []
        remaining_in = [] if plan.freeze else list(plan.in_blk)
        admit: set[str] = set()
        if remaining_in:
            counts = self.block_counts(self.admission_candidates)
            for request, blk in zip(self.admission_candidates, counts, strict=True):
                if blk in remaining_in:
                    remaining_in.remove(blk)
                    admit.add(request.request_id)
                    if not remaining_in:
                        break
        self.admit_req_ids = admit
        return paused

    def _pause_out_matches(self, out_blk: list[int]) -> list[Any]:
        """Out matching: the pause rule's victims among the running requests, by their
        current block counts, paused in the rule's order."""
        running = self.scheduler.running
        snapshot = list(running)
        paused = [snapshot[i] for i in self.pause_rule.victims(
            out_blk, snapshot, self.running_block_counts())]
        for request in paused:
            running.remove(request)
            self._pause_request(request)
        return paused

    def _resume_first(self, due: list[str]) -> None:
        """The paused requests the rule names (under a pause limit: those at their
        limit, longest paused first) go to the front of ``skipped_waiting`` (the queue
        the FCFS waiting loop visits first) and pass the admission gate whatever the
        plan admits."""
        scheduler = self.scheduler
        self._due = set(due)
        if not due:
            return
        by_id = {r.request_id: r for r in (*scheduler.skipped_waiting, *scheduler.waiting)
                 if r.request_id in self._due}
        requests = [by_id[rid] for rid in due if rid in by_id]
        scheduler.waiting.remove_requests(requests)
        scheduler.skipped_waiting.remove_requests(requests)
        for request in reversed(requests):
            scheduler.skipped_waiting.prepend_request(request)

    def _pause_request(self, request: Any) -> None:
        """Stop decoding a request but keep its KV blocks and computed tokens, so
        it later resumes as a cached request. Unlike a preemption nothing is freed and
        ``num_preemptions`` is unchanged. The caller removed it from ``running``."""
        assert request.status == RequestStatus.RUNNING, \
            "Only running requests can be lb-paused"
        request.status = RequestStatus.PREEMPTED
        self.paused_req_ids.add(request.request_id)
        self.pause_rule.paused(request.request_id)
        if self.enable_diagnostics:
            logger.info(pause_line(request.request_id))
        self.scheduler.waiting.prepend_request(request)

    # ------------------------------------------------------ scheduler hooks

    def can_admit(self, request: Any) -> bool:
        """Waiting-loop gate, after blocked-status promotion and before any KV lookup:
        without a plan everything may enter, with one only the admit set."""
        admit = self.admit_req_ids
        rid = request.request_id
        if self._reserved and rid not in self.paused_req_ids and (
                len(self.scheduler.running) + self._reserved
                >= self.scheduler.max_num_running_reqs):
            return False
        return admit is None or rid in admit or rid in self._due

    def on_scheduled(self, req_ids: Iterable[str]) -> None:
        """After scheduling (vLLM ``_update_after_schedule``): a scheduled request is
        no longer paused."""
        if self.paused_req_ids:
            for rid in self.paused_req_ids.intersection(req_ids):
                self.pause_rule.resumed(rid)
            self.paused_req_ids.difference_update(req_ids)

    def on_free(self, request: Any) -> None:
        """Before the scheduler frees a finished request."""
        self.paused_req_ids.discard(request.request_id)
        self.pause_rule.forget(request.request_id)

    def on_preempt(self, request: Any) -> None:
        """When the scheduler preempts a request (KV freed): it is no longer LB-paused."""
        self.paused_req_ids.discard(request.request_id)
        self.pause_rule.resumed(request.request_id)
