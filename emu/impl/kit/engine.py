"""The kit's engine loop of one emulated rank: vLLM 0.27.1's ``DPEngineCoreProc`` in
virtual time, with our DyntraLB (``dyntra_lb``) hooked in where vllm-ascend hooks its
own (``docs/protocol.md`` describes the step).

``run_busy_loop`` has vLLM's shape, one method per part:

- ``_process_input_queue``: when this rank has nothing to do and no wave runs, "block
  on the input queue" — jump the virtual clock to the next arrival; then take every
  request that has arrived (``emu.rank.intake``). A request while all ranks are idle starts
  a new wave on every rank (in vLLM the DP coordinator wakes the idle ranks);
- ``_process_engine_step``: vLLM's ``step()``: ``schedule()`` (which applies the plan
  made after the previous iteration), price the batch, join the lockstep clock
  collective, the worker's output (``emu.impl.kit.model_runner``), ``update_from_output``;
  or, with async scheduling, ``step_with_batch_queue()``: the same with two batches in
  flight, each step's output processed in the iteration after the one that ran it
  (``emu.impl.kit.async_scheduler``);
- with no work: the idle ``continue`` (no collective at all) when no wave runs, a dummy
  step (the lockstep collective at the fixed cost) when one does;
- ``_has_global_unfinished_reqs``: ``step_counter += 1``, the wave sync on the steps of
  the run's DP sync cadence (``emu.rank.dp_sync``: every 32 steps, as vLLM 0.27.1, or
  vLLM >= 0.30's step 1 and every ``dp_sync_interval`` steps), then
  DyntraLB's part of the protocol (``DyntraLBCoordinator.after_dp_sync``);
- at a wave end: ``current_wave += 1`` and ``step_counter = 0``.

Each non-idle iteration appends one step record to the rank's event log (and the
records of the requests it finished); wall-clock measurements go to the wall log. In
strict mode the checker sees what each ``schedule()`` did and the iteration then checks
the invariants (``emu.impl.kit.invariants``). Every collective goes through the rank's
``emu.rank.recorder.CollectiveRecorder``; the clock, arrivals, faults, logs and stall
watch are the rank harness's (``emu.rank.harness``).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from dyntra_lb import diagnostics
from dyntra_lb.blocks import num_blocks
from dyntra_lb.coordinator import BalanceStep, DyntraLBCoordinator
from dyntra_lb.planner import registry as planners
from dyntra_lb.planner.registry import Planner
from emu.impl.kit.async_scheduler import AsyncScheduler
from emu.impl.kit.invariants import StrictChecker
from emu.impl.kit.model_runner import ModelRunner, ModelRunnerOutput
from emu.impl.kit.scheduler import Request, Scheduler, SchedulerOutput
from emu.rank import dp_sync
from emu.rank.context import RankContext
from emu.rank.control_plane import PlannerCall
from emu.rank.engine_spec import EngineSpec
from emu.rank.eventlog import StepRecord
from emu.rank.harness import RankHarness
from emu.rank.remote_kv import RemoteKVConnector
from emu.rank.spec_decode import DraftAcceptance
from emu.sites import DP_SYNC_SITE

logger = logging.getLogger("dyntra_lb")


@dataclass
class _Step:
    """What one iteration did, for its step record."""

    clock_us: int
    plan_applied: Any
    output: SchedulerOutput | None = None
    finished: tuple = ()
    own_cost_us: int = 0
    step_us: int = 0
    executed: bool = False
    balance: BalanceStep | None = None


class EngineCore(RankHarness):
    """One kit rank's engine: scheduler, remote-KV connector and (when DyntraLB is
    enabled) the coordinator running the run's planner, over the run's ``spec``
    (``emu.rank.engine_spec.EngineSpec``), on the rank harness (clock, arrivals,
    recorder, faults, logs)."""

    def __init__(self, ctx: RankContext, spec: EngineSpec):
        super().__init__(ctx, spec)
        faults = self.faults
        lb_config = spec.config.dyntra_lb
        latencies = (spec.kv_latency_fixed_s, spec.kv_latency_per_block_s)
        self.connector = (RemoteKVConnector(*latencies) if faults is None
                          else faults.make_connector(*latencies))
        acceptance = DraftAcceptance.for_profile(spec.cost_model, spec.seed)
        scheduler_cls = AsyncScheduler if spec.async_scheduling else Scheduler
        self.scheduler = scheduler_cls(
            max_num_seqs=spec.max_num_seqs,
            max_num_batched_tokens=spec.max_num_batched_tokens,
            block_size=spec.block_size,
            num_gpu_blocks=spec.num_gpu_blocks,
            connector=self.connector,
            dyntra_lb=lb_config.enabled,
            enable_diagnostics=lb_config.enabled and lb_config.enable_diagnostics,
            policy=spec.scheduling_policy,
            num_speculative_tokens=spec.cost_model.num_speculative_tokens,
            pause_limit=spec.pause_limit,
        )
        self.model_runner = ModelRunner(acceptance, self.connector,
                                        placeholder_drafts=spec.async_scheduling)
        # vLLM's batch queue: with async scheduling, up to two steps in flight.
        self.batch_queue: deque[tuple[SchedulerOutput, ModelRunnerOutput]] | None = (
            deque() if spec.async_scheduling else None)
        self.step_fn = self.step if self.batch_queue is None else self.step_with_batch_queue
        self.coordinator = self._make_coordinator(ctx) if lb_config.enabled else None
        self.strict = StrictChecker(self) if spec.strict else None

        # DPEngineCoreProc state.
        self.step_counter = 0
        self.current_wave = 0
        self.engines_running = False
        self.pending_pause = False
        self._sync_array = np.zeros(2, dtype=np.int32)
        self._sync_tensor = torch.from_numpy(self._sync_array)
        self._balance: BalanceStep | None = None  # DyntraLB's part of this iteration

    def _make_coordinator(self, ctx: RankContext) -> DyntraLBCoordinator:
        spec = self.spec
        config, lb_config = spec.config, spec.config.dyntra_lb
        if ctx.rank == 0 and lb_config.enable_diagnostics:
            logger.info(diagnostics.enable_line())
        if lb_config.enable_diagnostics:
            # vLLM does not log these; `dyntra-emu replay` of this log reads them here.
            logger.info(f"emulated engine: max_num_seqs={spec.max_num_seqs} "
                        f"block_size={spec.block_size}")
        planner = planners.get(spec.planner)
        if ctx.host.plan_memo is not None:  # rank threads: one planner run per snapshot
            planner = _shared_plans(planner, ctx.host.plan_memo)
        # The DP group is gloo, so DyntraLB's buffers stay on the CPU (as in vLLM).
        return DyntraLBCoordinator(
            config, policy=self.scheduler.lb, dp_rank=ctx.rank, dp_size=ctx.dp_size,
            dp_group=ctx.dp_group, max_num_seqs=spec.max_num_seqs, observe=self.recorder,
            planner=planner)

    # ------------------------------------------------------------------ loop

    def _run_loop(self) -> None:
        self.run_busy_loop()

    def _request_records(self) -> list[dict]:
        requests = self.scheduler.requests
        return [requests[rid].record() for rid in sorted(requests)]

    def run_busy_loop(self) -> None:
        """vLLM's ``DPEngineCoreProc.run_busy_loop``, one non-idle iteration per pass."""
        while self._process_input_queue():
            iter_start = time.perf_counter()
            step = self._process_engine_step()
            local_unfinished = self.scheduler.has_unfinished_requests()
            if not step.executed:
                if not local_unfinished and not self.engines_running:
                    continue  # every engine is idle
                self._dummy_step(step)
            self.check_progress(step.executed, local_unfinished)
            self.engines_running = self._has_global_unfinished_reqs(local_unfinished)
            step.balance = self._balance
            control_us = self._end_iteration(step, iter_start)
            self.clock_us = step.clock_us + step.step_us + control_us
            if not self.engines_running:
                self.current_wave += 1
                self.step_counter = 0
                self.wave_ended()
            self.iteration += 1
            if self.iteration >= self.spec.max_steps:
                self.truncated = True
                return

    def _process_input_queue(self) -> bool:
        """Take the requests that have arrived; with no work and no wave, first wait
        (in virtual time) for the next one. False once the trace is exhausted and the
        rank is idle: the loop ends."""
        scheduler = self.scheduler
        if not self.engines_running and not scheduler.has_requests() and not self.batch_queue:
            if self.arrivals.exhausted():
                return False
            self.clock_us = max(self.clock_us, self.arrivals.next_arrival_us())
        arrivals = self.arrivals
        arrived = (arrivals.take(self.clock_us, self.lockstep.counts)
                   if arrivals.due(self.clock_us) else ())
        for trace_request, rank in arrived:
            if rank == self.dp_rank:
                self.add_request(trace_request)
        if arrived and not self.engines_running:
            self.engines_running = True
        return True

    def add_request(self, trace_request) -> None:
        """ADD from the input queue: DyntraLB's arming sees the block count before the
        request enters the scheduler."""
        self.num_arrived += 1
        if self.coordinator is not None:
            self.coordinator.on_add_request(
                num_blocks(trace_request.prompt_tokens, self.spec.block_size))
        self.scheduler.add_request(Request(
            trace_request.request_id, trace_request.prompt_tokens,
            trace_request.output_tokens, arrival_time=trace_request.arrival_s,
            priority=trace_request.priority))

    def _process_engine_step(self) -> _Step:
        """The iteration's engine step (``step_fn``): what it scheduled, ran and
        finished."""
        scheduler = self.scheduler
        step = _Step(self.clock_us, scheduler.lb.plan if scheduler.lb is not None else None)
        if self.faults is not None:
            self.faults.before_step(self.iteration, step.clock_us)
        step.executed = self.step_fn(step)
        return step

    def step(self, step: _Step) -> bool:
        """vLLM's ``step()``: schedule, run the batch, process its output; then, with MTP,
        the drafts the worker proposed (vLLM's ``post_step``). Returns whether tokens
        ran."""
        scheduler = self.scheduler
        if not scheduler.has_requests():
            return False
        output = self._schedule(step)
        step.finished = tuple(scheduler.update_from_output(output,
                                                           self._execute_model(step, output)))
        executed = output.total_num_scheduled_tokens > 0
        if executed and scheduler.num_spec_tokens:
            scheduler.update_draft_token_ids(self.model_runner.take_draft_token_ids())
        return executed

    def step_with_batch_queue(self, step: _Step) -> bool:
        """vLLM's ``step_with_batch_queue()`` with two batches: schedule and run a new
        batch while there is work; process the oldest batch's output only when the
        queue is full, or when nothing new ran and nothing remains to schedule. Returns
        whether tokens ran in this iteration's batch."""
        scheduler = self.scheduler
        queue = self.batch_queue
        executed = False
        if scheduler.has_requests():
            output = self._schedule(step)
            queue.appendleft((output, self._execute_model(step, output)))
            executed = output.total_num_scheduled_tokens > 0
            if len(queue) < 2 and (executed or scheduler.has_requests()):
                return executed
        elif not queue:
            return False
        output, model_output = queue.pop()
        step.finished = tuple(scheduler.update_from_output(output, model_output))
        return executed

    def _schedule(self, step: _Step) -> SchedulerOutput:
        step.output = output = self.schedule(step.clock_us / 1e6)
        if self.strict is not None:
            self.strict.scheduled(output)
        return output

    def schedule(self, now_s: float) -> SchedulerOutput:
        """The scheduler's ``schedule()``; a seam for tests that need a hook inside it."""
        return self.scheduler.schedule(now_s)

    def _execute_model(self, step: _Step, output: SchedulerOutput) -> ModelRunnerOutput:
        """The forward of ``output``: priced on the requests running now with their tokens
        as the worker has them, the lockstep collective joined (when tokens run), the
        worker's output at its end."""
        scheduler = self.scheduler
        ended_us = step.clock_us
        if output.total_num_scheduled_tokens > 0:
            runner = self.model_runner
            block_size = scheduler.block_size
            tokens = [runner.num_tokens(r) for r in scheduler.running]
            step.own_cost_us = self.cost(sum((t + block_size - 1) // block_size for t in tokens),
                                         sum(tokens), len(tokens),
                                         output.total_num_scheduled_tokens, False)
            step.step_us = self.join_lockstep(step.own_cost_us, step.clock_us)
            ended_us += step.step_us
        return self.model_runner.execute_model(output, scheduler.requests, ended_us / 1e6)

    def _dummy_step(self, step: _Step) -> None:
        """No token ran while the wave goes on: a forward without tokens, so that the
        device group's collective stays matched across ranks."""
        step.own_cost_us = self.cost(0, 0, 0, 0, True)
        step.step_us = self.join_lockstep(step.own_cost_us, step.clock_us, step.finished)
        self.num_dummy_steps += 1
        # The KV loads DyntraLB's prefetch starts after this step start once it is done.
        self.connector.set_virtual_time((step.clock_us + step.step_us) / 1e6)

    def _has_global_unfinished_reqs(self, local_unfinished: bool) -> bool:
        """The wave/idle sync, with DyntraLB's part right after it (as vllm-ascend's
        ``DyntraLBDPEngineCoreProc`` overrides it): the plan it makes is for the next
        iteration's ``schedule()``."""
        coordinator = self.coordinator
        if coordinator is not None:
            coordinator.before_dp_sync(self.step_counter)
        running = self._sync_dp_state(local_unfinished)
        self._balance = (coordinator.after_dp_sync(running, step_counter=self.step_counter,
                                                   current_wave=self.current_wave)
                         if coordinator is not None else None)
        return running

    def _sync_dp_state(self, local_unfinished: bool) -> bool:
        """vLLM's part: ``step_counter += 1`` and on a step of the cadence the SUM
        all-reduce of ``[unfinished, pending_pause]`` over the DP group."""
        self.step_counter += 1
        if not dp_sync.syncs(self.step_counter, self.spec.dp_sync_interval):
            return True
        buf = self._sync_array
        buf[0] = int(local_unfinished)
        buf[1] = int(self.pending_pause)
        self.recorder(DP_SYNC_SITE, "all_reduce_sum", self._sync_tensor, self._all_reduce_sync)
        return bool(buf[0] > 0 or buf[1] % self.dp_size != 0)

    def _all_reduce_sync(self) -> None:
        dist.all_reduce(self._sync_tensor, op=dist.ReduceOp.SUM, group=self.dp_group)

    # ------------------------------------------------------------------ checks

    def _stall_state(self) -> tuple[list, Any, int]:
        scheduler = self.scheduler
        return ([*scheduler.running, *scheduler.skipped_waiting, *scheduler.waiting],
                scheduler.lb.paused_req_ids if scheduler.lb is not None else set(),
                scheduler.kv_cache_manager.pool.get_num_free_blocks())

    def _num_waiting(self) -> int:
        return len(self.scheduler.waiting) + len(self.scheduler.skipped_waiting)

    def _num_running(self) -> int:
        return len(self.scheduler.running)

    # ------------------------------------------------------------------ logs

    def _end_iteration(self, step: _Step, iter_start: float) -> int:
        """The iteration's records, then (strict mode) the invariants; returns what
        DyntraLB's control plane charged after the forward (microseconds)."""
        balance = step.balance
        plan_generated = balance.plan if balance is not None else None
        if plan_generated is not None:
            self.num_plans += 1
        planner_call = (PlannerCall(balance.requests_by_rank, self.spec.max_num_seqs,
                                    self.coordinator.bubble_threshold)
                        if balance is not None and balance.requests_by_rank is not None
                        else None)
        collectives, charge = self.settle_control_plane(
            step.step_us, planner_call, balance.planner_s if balance is not None else 0.0)
        self.write_iteration(self._step_record(step, plan_generated, collectives, charge),
                             [r.record() for r in step.finished], iter_start,
                             balance.planner_s if balance is not None else None,
                             balance.collectives_s if balance is not None else None)
        if self.strict is not None:
            self.strict.check(step.balance, step.finished)
        return charge.charged_us if charge is not None else 0

    def _step_record(self, step: _Step, plan_generated, collectives: list,
                     control_plane) -> StepRecord:
        scheduler = self.scheduler
        output = step.output
        lb = scheduler.lb
        kv = scheduler.kv_cache_manager
        paused_kv = ({rid: kv.num_blocks_of(scheduler.requests[rid])
                      for rid in lb.paused_req_ids if rid in scheduler.requests}
                     if lb is not None and lb.paused_req_ids else {})
        num_waiting = self._num_waiting()
        return StepRecord(
            iter=self.iteration, wave=self.current_wave, step_counter=self.step_counter,
            clock_us=step.clock_us, own_cost_us=step.own_cost_us, step_us=step.step_us,
            dummy=not step.executed, num_running=len(scheduler.running),
            num_waiting=num_waiting, running_blocks=scheduler.running_blocks(),
            waiting_blocks=scheduler.waiting_blocks() if num_waiting else 0,
            scheduled_tokens=output.total_num_scheduled_tokens if output is not None else 0,
            plan_applied=(step.plan_applied.to_dict() if step.plan_applied is not None
                          else None),
            paused=output.paused_req_ids if output is not None else [],
            resumed=output.resumed_req_ids if output is not None else [],
            admitted=output.new_req_ids if output is not None else [],
            preempted=output.preempted_req_ids if output is not None else [],
            finished=[r.request_id for r in step.finished],
            plan_generated=plan_generated.to_dict() if plan_generated is not None else None,
            kv_free_blocks=kv.pool.get_num_free_blocks(), kv_held_blocks=kv.pool.num_used_blocks,
            paused_kv_blocks=paused_kv, collectives=collectives, control_plane=control_plane)


def _shared_plans(planner: Planner, plan_memo: Callable[[Any, Callable[[], Any]], Any]
                  ) -> Planner:
    """``planner`` for a rank whose DP group's ranks share its address space (rank
    threads; ``plan_memo`` from ``RankContext.host``): every rank plans the same gathered
    snapshot, so the first rank to plan one runs the planner and the others take its
    plans, keyed on everything they depend on (the planner is pure): the planner, its
    arguments, every rank's block counts and split. The plans are only read afterwards
    (each rank keeps its own row, rank 0 logs them), never changed."""
    def plan(requests_by_rank, dp_size, **kwargs):
        key = (planner, dp_size, *sorted(kwargs.items()),
               *[(blocks.tobytes(), split) for blocks, split in requests_by_rank])
        return plan_memo(key, lambda: planner(requests_by_rank, dp_size, **kwargs))

    return plan
