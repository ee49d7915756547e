"""The stub DP engine loop of one emulated rank: vLLM 0.27.1 ``DPEngineCoreProc``
semantics (spec B.1) in virtual time, with DyntraLB's hook right after the wave sync.

One iteration, as ``run_busy_loop`` does it:

1. intake: when this rank has nothing to do and no wave runs, "block on the input
   queue" — jump the virtual clock to the next arrival; then take every trace request
   that has arrived. Every rank holds the whole trace and routes each arrival with the
   same router, so all ranks agree on every assignment and on the moment a new wave
   starts, without talking to each other;
2. ``step()``: schedule (the previous iteration's plan is applied first), price the
   batch, join the lockstep clock collective, ``update_from_output``; a rank without
   work while the wave runs joins with a dummy step instead; with no work and no wave,
   the iteration ends here (the idle ``continue``: no collective at all);
3. ``_has_global_unfinished_reqs``: ``step_counter += 1`` and on every 32nd step the SUM
   all-reduce of ``[unfinished, pending_pause]`` on the DP group; then the DyntraLB
   coordinator (only when DyntraLB is enabled) runs its part of the protocol;
4. at a wave end: ``current_wave += 1`` and ``step_counter = 0``.

Each non-idle iteration appends one step record to the rank's event log, and each
request that finishes its record; wall-clock measurements go to a separate file. In
strict mode the iteration then checks the invariants (``_check_invariants``). Every
collective goes through the rank's ``emu.guard.CollectiveRecorder``, which publishes it
with this iteration, ``step_counter`` and ``current_wave`` for the launcher's watchdog.
"""

from __future__ import annotations

import json
import logging
import pathlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from dyntra_lb import diagnostics
from dyntra_lb.blocks import num_blocks
from dyntra_lb.config import AdditionalConfig
from dyntra_lb.coordinator import DyntraLBCoordinator
from emu.clock import LockstepClock, StepCostModel
from emu.guard import CollectiveRecorder, InvariantError
from emu.kv import RemoteKVConnector
from emu.scheduler import Request, RequestStatus, Scheduler
from emu.workload import TraceRequest, arrival_us, make_router

logger = logging.getLogger("dyntra_lb")

DP_SYNC_SITE = "engine.dp_sync"
# vLLM's DPEngineCoreProc syncs the DP group's unfinished state every 32 steps.
DP_SYNC_INTERVAL = 32


@dataclass(frozen=True)
class RankSummary:
    """One rank's totals, returned to the launching process.

    ``steps``: non-idle iterations (step records), ``dummy_steps`` among them;
    ``waves``: waves completed; ``clock_s``: virtual time at the end; ``num_plans``:
    DyntraLB plans generated; ``num_collectives``: every collective issued (all groups);
    ``truncated``: stopped by ``max_steps``; ``loop_wall_s``: wall time of the loop;
    ``device``: where the lockstep collective ran ("cpu" or "npu").
    """

    rank: int
    steps: int
    dummy_steps: int
    waves: int
    clock_s: float
    num_finished: int
    num_unfinished: int
    num_plans: int
    num_collectives: int
    truncated: bool
    loop_wall_s: float
    device: str


class StallError(RuntimeError):
    """A rank holds unfinished requests but has scheduled nothing for ``stall_steps``
    iterations."""


# One encoder for every record: json.dumps with options would build a new one per call.
_dumps = json.JSONEncoder(sort_keys=True, separators=(",", ":")).encode


class EngineCore:
    """One rank's engine: scheduler, remote-KV connector, lockstep clock and (when
    DyntraLB is enabled) the coordinator, driven by ``run()``.

    ``ctx`` is the launcher's ``RankContext``. ``event_log`` / ``wall_log`` are the
    paths of ``rank<r>.events.jsonl`` and ``rank<r>.wall.jsonl`` (None: not written).
    ``max_steps`` stops the run after that many non-idle iterations on every rank (the
    iteration count is lockstep, so all ranks stop together). ``strict`` checks the
    invariants of ``_check_invariants`` every iteration. ``stall_steps`` names a stuck
    rank: one that holds unfinished requests but has scheduled no token for that many
    consecutive iterations raises ``StallError`` (vLLM would spin in dummy steps
    forever, e.g. when paused requests hold the KV a preempted head-of-line request
    needs).

    ``lb_placement`` is for tests only: "correct" runs DyntraLB's protocol right after
    the wave sync (B.2); "in_schedule" and "before_sync" put it where the reference's
    earlier design had its gather, to reproduce the two deadlocks that design had on
    NPU: inside ``schedule()`` (a rank without work runs a dummy step instead and never
    joins the gather), and before the wave sync, gated on the rank's own unfinished
    requests because the global answer is not known yet (at the tail of a wave a rank
    that has drained skips the gather a busy rank waits in).
    """

    def __init__(
        self,
        ctx: Any,
        *,
        trace: Sequence[TraceRequest],
        config: AdditionalConfig,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        block_size: int,
        num_gpu_blocks: int,
        scheduling_policy: str,
        cost_model: StepCostModel,
        kv_latency_fixed_s: float,
        kv_latency_per_block_s: float,
        router: str,
        max_steps: int,
        event_log: pathlib.Path | None,
        wall_log: pathlib.Path | None,
        faults: Any = None,
        strict: bool = False,
        lb_placement: str = "correct",
        stall_steps: int = 10_000,
    ):
        self.dp_rank = ctx.rank
        self.dp_size = ctx.dp_size
        self.dp_group = ctx.dp_group
        self.trace = list(trace)
        self.block_size = block_size
        # faults: this rank's emu.faults.FaultInjector, or None (then no fault work).
        self.faults = faults
        self.cost_model = cost_model if faults is None else faults.cost_model(cost_model)
        self.max_steps = max_steps
        self.router = make_router(router, ctx.dp_size)
        self.recorder = CollectiveRecorder(ctx.guard, where=self)
        if faults is not None:
            self.recorder = faults.wrap_recorder(self.recorder)

        lb_config = config.dyntra_lb
        self.connector = (
            RemoteKVConnector(kv_latency_fixed_s, kv_latency_per_block_s) if faults is None
            else faults.make_connector(kv_latency_fixed_s, kv_latency_per_block_s))
        self.scheduler = Scheduler(
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            block_size=block_size,
            num_gpu_blocks=num_gpu_blocks,
            connector=self.connector,
            dyntra_lb=lb_config.enabled,
            enable_diagnostics=lb_config.enabled and lb_config.enable_diagnostics,
            policy=scheduling_policy,
        )
        if faults is not None:
            faults.attach(self.scheduler)
        self.clock = LockstepClock(
            ctx.device_group, dp_rank=ctx.rank, dp_size=ctx.dp_size, device=ctx.device,
            observe=self.recorder,
        )
        self.coordinator: DyntraLBCoordinator | None = None
        if lb_config.enabled:
            if ctx.rank == 0 and lb_config.enable_diagnostics:
                logger.info(diagnostics.enable_line())
            if lb_config.enable_diagnostics:
                # vLLM does not log these; `dyntra-emu replay` of this log reads them here.
                logger.info(f"emulated engine: max_num_seqs={max_num_seqs} "
                            f"block_size={block_size}")
            # The DP group is gloo, so DyntraLB's buffers stay on the CPU (as in vLLM).
            self.coordinator = DyntraLBCoordinator(
                config,
                policy=self.scheduler.lb,
                dp_rank=ctx.rank,
                dp_size=ctx.dp_size,
                dp_group=ctx.dp_group,
                max_num_seqs=max_num_seqs,
                block_size=block_size,
                observe=self.recorder,
            )

        # DPEngineCoreProc state (B.1).
        self.step_counter = 0
        self.current_wave = 0
        self.engines_running = False
        self.pending_pause = False
        self._sync_array = np.zeros(2, dtype=np.int32)
        self._sync_tensor = torch.from_numpy(self._sync_array)

        self.clock_us = 0
        self.iteration = 0
        self.truncated = False
        self.num_dummy_steps = 0
        self.num_plans = 0
        self.num_finished = 0
        self.loop_wall_s = 0.0
        self._event_log_path = event_log
        self._wall_log_path = wall_log
        self._events: Any = None
        self._wall: Any = None

        self.device = ctx.device.type
        self.lb_placement = lb_placement
        self.stall_steps = stall_steps
        self._last_progress = 0  # iteration of this rank's last step with tokens
        # Strict mode (``_check_invariants``): what it remembers across iterations.
        self.strict = strict
        self.num_arrived = 0
        self._finished_ids: set[str] = set()
        self._paused_blocks: dict[str, int] = {}

    # ------------------------------------------------------------------ loop

    def run(self) -> RankSummary:
        """Run the busy loop until the trace is exhausted and the last wave has ended
        (or ``max_steps``); returns this rank's summary."""
        self._events = open(self._event_log_path, "w") if self._event_log_path else None
        self._wall = open(self._wall_log_path, "w") if self._wall_log_path else None
        try:
            start = time.perf_counter()
            self._busy_loop()
            self.loop_wall_s = time.perf_counter() - start
            self._write_unfinished_requests()
        finally:
            for f in (self._events, self._wall):
                if f is not None:
                    f.close()
        return self.summary()

    def _busy_loop(self) -> None:
        trace = self.trace
        arrivals = [arrival_us(r) for r in trace]
        num_arrivals = len(trace)
        next_arrival = 0
        scheduler = self.scheduler
        lb = scheduler.lb
        clock = self.clock
        cost = self.cost_model.cost
        coordinator = self.coordinator
        events = self._events
        wall = self._wall
        faults = self.faults
        strict = self.strict
        # Test-only (RunSpec.lb_placement): the DyntraLB collectives at a wrong point.
        lb_in_schedule = coordinator is not None and self.lb_placement == "in_schedule"
        lb_before_sync = coordinator is not None and self.lb_placement == "before_sync"
        lb_after_sync = coordinator is not None and self.lb_placement == "correct"

        while True:
            iter_start = time.perf_counter()
            # 1. _process_input_queue
            if not self.engines_running and not scheduler.has_requests():
                if next_arrival >= num_arrivals:
                    break
                self.clock_us = max(self.clock_us, arrivals[next_arrival])
            arrived = False
            while next_arrival < num_arrivals and arrivals[next_arrival] <= self.clock_us:
                request = trace[next_arrival]
                next_arrival += 1
                arrived = True
                if self.router.route(request, clock.counts) == self.dp_rank:
                    self._add_request(request)
            if arrived and not self.engines_running:
                # A request while all ranks are idle starts a new wave on every rank
                # (vLLM: start_wave to the coordinator, START_DP_WAVE to the others).
                self.engines_running = True

            # 2. _process_engine_step (+ dummy batch)
            clock_us = self.clock_us
            if faults is not None:
                faults.before_step(self.iteration, clock_us)
            now_s = clock_us / 1e6
            plan_applied = lb.modifications if lb is not None else None
            if lb_in_schedule and scheduler.has_requests():
                # Wrong placement (A): inside schedule(), which a rank without work (a
                # dummy step) never calls.
                coordinator.after_dp_sync(True, step_counter=self.step_counter + 1,
                                          current_wave=self.current_wave)
            output = scheduler.schedule(now_s) if scheduler.has_requests() else None
            executed = output is not None and output.total_num_scheduled_tokens > 0
            if executed:
                running = scheduler.running
                own_cost_us = cost(scheduler.running_blocks(), sum(r.num_tokens for r in running),
                                   len(running), output.total_num_scheduled_tokens, False)
                step_us = clock.step(own_cost_us, self._num_waiting(), len(scheduler.running))
                finished = scheduler.update_from_output(output, (clock_us + step_us) / 1e6)
            else:
                finished = (scheduler.update_from_output(output, now_s)
                            if output is not None else [])
                if not scheduler.has_unfinished_requests() and not self.engines_running:
                    continue
                own_cost_us = cost(0, 0, 0, 0, True)
                step_us = clock.step(own_cost_us, self._num_waiting(), len(scheduler.running))
                self.num_dummy_steps += 1
            local_unfinished = scheduler.has_unfinished_requests()
            if executed or not local_unfinished:
                self._last_progress = self.iteration
            elif self.iteration - self._last_progress >= self.stall_steps:
                self._stalled()

            # 3. _has_global_unfinished_reqs, with DyntraLB's hook around it (B.2)
            if coordinator is not None:
                coordinator.before_dp_sync(self.step_counter)
                if lb_before_sync:
                    # Wrong placement (B): before the sync, so each rank goes by its own
                    # view of whether the wave continues.
                    coordinator.after_dp_sync(local_unfinished,
                                              step_counter=self.step_counter + 1,
                                              current_wave=self.current_wave)
            self.engines_running = self._has_global_unfinished_reqs(local_unfinished)
            if lb_after_sync or (coordinator is not None and not self.engines_running):
                coordinator.after_dp_sync(self.engines_running, step_counter=self.step_counter,
                                          current_wave=self.current_wave)

            collectives = self.recorder.take()
            if events is not None:
                self._write_step(clock_us, own_cost_us, step_us, executed, output,
                                 plan_applied, finished, collectives)
            if wall is not None:
                self._write_wall(iter_start)
            if coordinator is not None and coordinator.last_plan_generated is not None:
                self.num_plans += 1
            self.num_finished += len(finished)
            if strict:
                self._check_invariants(output, finished)

            # 4. wave end
            if not self.engines_running:
                self.current_wave += 1
                self.step_counter = 0
            self.clock_us = clock_us + step_us
            self.iteration += 1
            if self.iteration >= self.max_steps:
                self.truncated = True
                break

    def _stalled(self) -> None:
        """Name the stuck rank and what its requests are waiting in."""
        scheduler = self.scheduler
        paused = scheduler.lb.paused_req_ids if scheduler.lb is not None else set()
        stuck = [*scheduler.running, *scheduler.skipped_waiting, *scheduler.waiting]
        described = ", ".join(
            f"{r.request_id} ({r.status.name}"
            f"{', DyntraLB-paused' if r.request_id in paused else ''})" for r in stuck[:8])
        more = f" and {len(stuck) - 8} more" if len(stuck) > 8 else ""
        raise StallError(
            f"rank {self.dp_rank} is stuck: {len(stuck)} unfinished request(s) but no token "
            f"scheduled for {self.stall_steps} steps (iteration {self.iteration}, wave "
            f"{self.current_wave}); {described}{more}; KV blocks free: "
            f"{scheduler.kv_cache_manager.pool.get_num_free_blocks()}")

    def _add_request(self, trace_request: TraceRequest) -> None:
        """ADD from the input queue: DyntraLB's arming sees the block count before the
        request enters the scheduler (B.4)."""
        self.num_arrived += 1
        if self.coordinator is not None:
            self.coordinator.on_add_request(
                num_blocks(trace_request.prompt_tokens, self.block_size))
        self.scheduler.add_request(Request(
            trace_request.request_id,
            trace_request.prompt_tokens,
            trace_request.output_tokens,
            arrival_time=trace_request.arrival_s,
            priority=trace_request.priority,
        ))

    def _check_invariants(self, output: Any, finished: list[Request]) -> None:
        """Strict mode, at the end of every non-idle iteration (after the DyntraLB hook,
        which may start KV loads): requests conserved, KV blocks conserved, paused
        requests keep their blocks, admission limited to the plan's set. Raises
        InvariantError naming this rank, the iteration and the request. That every rank
        reaches each collective with the same descriptor, ``step_counter`` and
        ``current_wave`` is checked across ranks by the launcher's watchdog (emu.guard)."""
        scheduler = self.scheduler
        requests = scheduler.requests
        for request in finished:
            rid = request.request_id
            if rid in self._finished_ids:
                self._violation(f"request {rid!r} finished a second time")
            if rid in requests:
                self._violation(f"request {rid!r} finished but is still in the scheduler")
            self._finished_ids.add(rid)
        if self.num_arrived != len(self._finished_ids) + len(requests):
            self._violation(f"requests not conserved: {self.num_arrived} arrived, "
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

        lb = scheduler.lb
        kv = scheduler.kv_cache_manager
        paused = lb.paused_req_ids if lb is not None else set()
        held_total = 0
        for rid, request in requests.items():
            held = kv.num_blocks_of(request)
            held_total += held
            if held * self.block_size < request.num_computed_tokens:
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
            gone = sorted(set(kv._blocks) - requests.keys())
            self._violation(f"KV blocks not conserved: the pool has {used} in use, the "
                            f"requests in flight hold {held_total}; blocks held by requests "
                            f"no longer in flight: {gone}")

        if lb is None:
            return
        paused_blocks = self._paused_blocks
        if output is not None:
            for rid in output.paused_req_ids:
                paused_blocks[rid] = kv.num_blocks_of(requests[rid])
        for rid in list(paused_blocks):
            if rid not in paused:
                del paused_blocks[rid]
        for rid in paused:
            request = requests.get(rid)
            if request is None:
                self._violation(f"paused request {rid!r} is not in flight")
            held = kv.num_blocks_of(request)
            if request.status != RequestStatus.PREEMPTED or held == 0:
                self._violation(f"paused request {rid!r} is {request.status.name} and holds "
                                f"{held} KV blocks")
            expected = paused_blocks.setdefault(rid, held)
            if held != expected:
                self._violation(f"paused request {rid!r} held {expected} KV blocks when "
                                f"paused, now {held}")
        admit = lb.admit_req_ids
        if output is not None and admit is not None:
            for rid in (*output.new_req_ids, *output.resumed_req_ids):
                if rid not in admit:
                    self._violation(f"request {rid!r} was admitted under a plan whose "
                                    f"admission set is {sorted(admit)}")

    def _violation(self, what: str) -> None:
        raise InvariantError(
            f"strict invariant violated on rank {self.dp_rank} at iteration {self.iteration} "
            f"(wave {self.current_wave}, step_counter {self.step_counter}): {what}")

    def _num_waiting(self) -> int:
        return len(self.scheduler.waiting) + len(self.scheduler.skipped_waiting)

    def _has_global_unfinished_reqs(self, local_unfinished: bool) -> bool:
        """Upstream's wave/idle sync (B.1 step 8)."""
        self.step_counter += 1
        if self.step_counter % DP_SYNC_INTERVAL != 0:
            return True
        buf = self._sync_array
        buf[0] = int(local_unfinished)
        buf[1] = int(self.pending_pause)
        self.recorder(DP_SYNC_SITE, "all_reduce_sum", self._sync_tensor, self._all_reduce_sync)
        return bool(buf[0] > 0 or buf[1] % self.dp_size != 0)

    def _all_reduce_sync(self) -> None:
        dist.all_reduce(self._sync_tensor, op=dist.ReduceOp.SUM, group=self.dp_group)

    # ------------------------------------------------------------------ logs

    def _write_step(self, clock_us, own_cost_us, step_us, executed, output, plan_applied,
                    finished, collectives) -> None:
        scheduler = self.scheduler
        coordinator = self.coordinator
        plan_generated = coordinator.last_plan_generated if coordinator is not None else None
        lb = scheduler.lb
        kv = scheduler.kv_cache_manager
        if lb is not None and lb.paused_req_ids:
            paused_kv = {rid: kv.num_blocks_of(scheduler.requests[rid])
                         for rid in lb.paused_req_ids if rid in scheduler.requests}
        else:
            paused_kv = {}
        record = {
            "kind": "step",
            "rank": self.dp_rank,
            "iter": self.iteration,
            "wave": self.current_wave,
            "step_counter": self.step_counter,
            "clock_s": clock_us / 1e6,
            "own_cost_s": own_cost_us / 1e6,
            "step_time_s": step_us / 1e6,
            "dummy": not executed,
            "num_running": len(scheduler.running),
            "num_waiting": self._num_waiting(),
            "running_blocks": scheduler.running_blocks(),
            "waiting_blocks": scheduler.waiting_blocks(),
            "scheduled_tokens": output.total_num_scheduled_tokens if output is not None else 0,
            "plan_applied": plan_applied.to_dict() if plan_applied is not None else None,
            "paused": output.paused_req_ids if output is not None else [],
            "resumed": output.resumed_req_ids if output is not None else [],
            "admitted": output.new_req_ids if output is not None else [],
            "preempted": output.preempted_req_ids if output is not None else [],
            "finished": [r.request_id for r in finished],
            "plan_generated": plan_generated.to_dict() if plan_generated is not None else None,
            "lb_active": coordinator.lb_active if coordinator is not None else False,
            "kv_free_blocks": kv.pool.get_num_free_blocks(),
            "kv_held_blocks": kv.num_held_blocks,
            "paused_kv_blocks": paused_kv,
            "collectives": collectives,
        }
        lines = [_dumps(record)]
        for request in finished:
            lines.append(self._request_line(request))
        self._events.write("\n".join(lines) + "\n")
        if finished:  # a progress display counts request records in the file
            self._events.flush()

    def _request_line(self, request: Request) -> str:
        record = request.record()
        record["kind"] = "request"
        record["rank"] = self.dp_rank
        return _dumps(record)

    def _write_unfinished_requests(self) -> None:
        if self._events is None:
            return
        for request_id in sorted(self.scheduler.requests):
            self._events.write(self._request_line(self.scheduler.requests[request_id]) + "\n")

    def _write_wall(self, iter_start: float) -> None:
        # Formatted by hand (keys sorted, as in the event log): it runs every step, and
        # this is several times cheaper than json.dumps.
        step_wall_s = time.perf_counter() - iter_start
        coordinator = self.coordinator
        if coordinator is None:
            line = f'{{"iter":{self.iteration},"step_wall_s":{step_wall_s!r}}}\n'
        else:
            line = (f'{{"dyntra_lb_collectives_s":{coordinator.last_collective_s!r},'
                    f'"iter":{self.iteration},"planner_s":{coordinator.last_planner_s!r},'
                    f'"step_wall_s":{step_wall_s!r}}}\n')
        self._wall.write(line)

    def summary(self) -> RankSummary:
        return RankSummary(
            rank=self.dp_rank,
            steps=self.iteration,
            dummy_steps=self.num_dummy_steps,
            waves=self.current_wave,
            clock_s=self.clock_us / 1e6,
            num_finished=self.num_finished,
            num_unfinished=len(self.scheduler.requests),
            num_plans=self.num_plans,
            num_collectives=self.recorder.seq,
            truncated=self.truncated,
            loop_wall_s=self.loop_wall_s,
            device=self.device,
        )
