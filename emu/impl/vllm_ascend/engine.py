"""One emulated DP rank running vllm-ascend's DyntraLB inside vLLM's own engine loop.

What runs is vLLM 0.27.1's ``DPEngineCoreProc.run_busy_loop`` on vLLM's scheduler
machinery and KV-cache manager: with DyntraLB enabled, vllm-ascend's
``DyntraLBDPEngineCoreProc`` (its ``add_request``, ``_has_global_unfinished_reqs``,
``run_balance_load``, ``_do_lb_allgather``, ``_balance_load``) and the DyntraLB scheduler
class production selects, on a real gloo DP group. Emulated are only the parts around a
model:

- the model executor (``executor.EmulatedExecutor``): each forward is priced by the
  kit's cost model and joins the lockstep collective (``emu.rank.clock``), in virtual time;
  what it samples, and the MTP drafts it proposes, are ``sampler.EmulatedSampler``'s;
- the input queue (``TraceInputQueue``): the trace, released as the virtual clock
  passes each arrival, plus the coordinator's ``START_DP_WAVE`` to ranks that are idle
  when a request arrives elsewhere;
- the output queue (``OutputSink``): where vLLM puts each step's outputs, read for the
  request records;
- the KV connector (``connector.EmulatedRemoteKVConnector``);
- the ZMQ handshakes of ``EngineCoreProc.__init__``: ``EmulatedEngine.__init__`` sets
  the loop's state itself and calls ``EngineCore.__init__``; the DP group comes from
  the launcher (``_LauncherDPGroup`` takes the place of vLLM's stateless DP group).

The rank observes the loop at two points — the executor's forward and the end of
``_has_global_unfinished_reqs`` — and writes the same event log as the kit.
"""

from __future__ import annotations

import inspect
import pickle
import queue
import time
from collections import deque

from vllm.sampling_params import SamplingParams
from vllm.v1.engine import EngineCoreRequestType
from vllm.v1.engine.core import DPEngineCoreProc, EngineCore, EngineShutdownState
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
from vllm.v1.request import Request

from dyntra_lb.blocks import block_counts, num_blocks
from dyntra_lb.planner import registry as planners
from emu.impl.vllm_ascend import collectives
from emu.impl.vllm_ascend.executor import EmulatedExecutor
from emu.impl.vllm_ascend.invariants import StrictChecker
from emu.impl.vllm_ascend.sampler import SAMPLED_TOKEN, EmulatedSampler
from emu.rank.context import RankContext
from emu.rank.control_plane import PlannerCall
from emu.rank.engine_spec import EngineSpec
from emu.rank.eventlog import StepRecord
from emu.rank.harness import RankHarness
from emu.rank.spec_decode import DraftAcceptance
from emu.sites import ALLGATHER_SITE


class _Truncated(Exception):
    """``max_steps`` iterations ran: every rank stops at the same iteration."""


class _RequestRecord:
    """What the event log records of one request (same fields as the kit's)."""

    __slots__ = ("request_id", "arrival_s", "prompt_tokens", "output_tokens",
                 "first_scheduled_s", "token_times_s", "finish_s", "pauses")

    def __init__(self, trace_request):
        self.request_id = trace_request.request_id
        self.arrival_s = trace_request.arrival_s
        self.prompt_tokens = trace_request.prompt_tokens
        self.output_tokens = trace_request.output_tokens
        self.first_scheduled_s = None
        self.token_times_s: list[float] = []
        self.finish_s = None
        self.pauses: list[list] = []

    def to_dict(self) -> dict:
        return {"request_id": self.request_id, "arrival_s": self.arrival_s,
                "prompt_tokens": self.prompt_tokens, "output_tokens": self.output_tokens,
                "first_scheduled_s": self.first_scheduled_s,
                "token_times_s": list(self.token_times_s), "finish_s": self.finish_s,
                "pauses": [list(p) for p in self.pauses]}


class TraceInputQueue:
    """Stands in for ``EngineCoreProc.input_queue`` (filled by ZMQ threads in vLLM).

    vLLM's loop asks ``empty()`` / ``get_nowait()`` at the start of every iteration and
    blocks in ``get()`` when it has no work; here blocking means jumping the virtual
    clock to the next arrival. When the trace is exhausted and the rank is idle, the
    queue requests the engine's shutdown, which ends ``run_busy_loop``.
    """

    def __init__(self, rank: EmulatedRank):
        self.rank = rank
        self._pending: deque = deque()

    def empty(self) -> bool:
        rank = self.rank
        if rank.iteration >= rank.spec.max_steps:
            raise _Truncated
        self._take(rank.clock_us)
        return not self._pending

    def get_nowait(self):
        return self._pending.popleft()

    def get(self, block: bool = True, timeout: float | None = None):
        rank = self.rank
        if not self._pending:
            if rank.arrivals.exhausted():
                rank.engine.shutdown_state = EngineShutdownState.REQUESTED
                raise queue.Empty
            rank.clock_us = max(rank.clock_us, rank.arrivals.next_arrival_us())
            self._take(rank.clock_us)
        return self._pending.popleft()

    def _take(self, clock_us: int) -> None:
        rank = self.rank
        engine = rank.engine
        woken = engine.engines_running
        for trace_request, target in rank.arrivals.take(clock_us, rank.lockstep.counts):
            if target == rank.dp_rank:
                self._pending.append((EngineCoreRequestType.ADD,
                                      (rank.make_request(trace_request), engine.current_wave)))
            elif not woken:
                # The DP coordinator wakes the idle ranks when a request starts a wave.
                self._pending.append((EngineCoreRequestType.START_DP_WAVE,
                                      (engine.current_wave, target)))
                woken = True


class OutputSink:
    """Stands in for ``EngineCoreProc.output_queue``: each step's outputs are read for
    the request records (token times, finishes) instead of being sent to a front-end."""

    def __init__(self, rank: EmulatedRank):
        self.rank = rank

    def put_nowait(self, item) -> None:
        _client, outputs = item
        for output in getattr(outputs, "outputs", None) or ():
            self.rank.on_output(output)


class _LauncherDPGroup(DPEngineCoreProc):
    """vLLM's DP setup, with the launcher's gloo DP group instead of a stateless one."""

    def _init_data_parallel(self, vllm_config) -> None:
        parallel = vllm_config.parallel_config
        self.dp_rank = parallel.data_parallel_rank
        self.dp_size = parallel.data_parallel_size
        self.dp_group = self._emu_rank.ctx.dp_group
        self.dp_store = None


class _EmulatedEngine:
    """Our layer on top of the engine class production runs (see ``engine_class``)."""

    def __init__(self, vllm_config, rank: EmulatedRank):
        self._emu_rank = rank
        # EngineCoreProc.__init__, without its ZMQ handshakes and socket threads:
        self.input_queue = TraceInputQueue(rank)
        self.output_queue = OutputSink(rank)
        self.engine_index = vllm_config.parallel_config.data_parallel_rank
        self.engines_running = False
        self.shutdown_state = EngineShutdownState.RUNNING
        self.tensor_ipc_receiver = None
        self.has_coordinator = True  # START_DP_WAVE comes from TraceInputQueue
        self.frontend_stats_publish_address = None
        self.publish_dp_lb_stats = False
        self.last_counts = (0, 0)
        self.process_input_queue_block = True
        self.enable_fault_tolerance = False
        # DPEngineCoreProc.__init__:
        self.prefill_schedule_interval = vllm_config.scheduler_config.prefill_schedule_interval
        if rank.spec.dp_sync_interval is not None:  # vLLM >= 0.30 (emu.rank.dp_sync)
            self.dp_sync_interval = vllm_config.parallel_config.dp_sync_interval
        self.step_counter = 0
        self.current_wave = 0
        self.pending_pause = False
        self.ignore_start_dp_wave = False
        self.eep_scaling_state = None
        self._init_data_parallel(vllm_config)
        EngineCore.__init__(self, vllm_config,
                            lambda config: EmulatedExecutor(config, rank), log_stats=False)

    def _has_global_unfinished_reqs(self, local_unfinished: bool) -> bool:
        """Production's method runs unchanged; the rank records the iteration after it
        (DyntraLB's hook included), before vLLM bumps the wave."""
        plan_applied = getattr(self.scheduler, "modifications", None)
        result = super()._has_global_unfinished_reqs(local_unfinished)
        self._emu_rank.end_iteration(local_unfinished, plan_applied)
        if not result:  # the wave ends: whatever was sent has finished
            self._emu_rank.wave_ended()
        return result

    def _balance_load(self, *args, **kwargs):
        """The planner of ``_do_lb_allgather``, timed for the wall log: vllm-ascend's
        own, or with another ``RunSpec.planner`` ours from ``dyntra_lb.planner.registry`` (same
        arguments), its plans handed back as the ``{"out_blk", "in_blk", "freeze"}``
        dicts vllm-ascend reads.

        Ranks that share a process and a pure planner share its plans
        (``EmulatedRank.plan_memo``): the first rank to plan a snapshot runs the planner,
        every rank gets its own copy of the result, keyed on the planner and every
        argument (the gathered snapshot included)."""
        rank = self._emu_rank
        rank.planner_call = PlannerCall(args[0], kwargs.get("max_num_seqs"),
                                        kwargs.get("threshold", 5.0))
        start = time.perf_counter()
        try:
            if rank.plan_memo is None:
                plans = self._plans(*args, **kwargs)
            else:
                # The planner's arguments as bytes: lists of ints, one C call to make and
                # compare.
                key = pickle.dumps((args, sorted(kwargs.items())), pickle.HIGHEST_PROTOCOL)
                memo = rank.plan_memo(key, lambda: pickle.dumps(self._plans(*args, **kwargs),
                                                                pickle.HIGHEST_PROTOCOL))
                plans = pickle.loads(memo)  # this rank's own copy
        finally:
            rank.planner_s += time.perf_counter() - start
        rank.plans = plans  # what strict mode holds the next schedule() to
        return plans

    def _plans(self, *args, **kwargs):
        ours = self._emu_rank.our_planner
        if ours is not None:
            return [plan.to_dict() for plan in ours(*args, **kwargs)]
        return super()._balance_load(*args, **kwargs)

    def _do_lb_allgather(self, admission_candidates):
        """Production's method runs unchanged; strict mode keeps the admission candidates
        it publishes (the plan's admission set is matched against them)."""
        self._emu_rank.candidates = admission_candidates
        return super()._do_lb_allgather(admission_candidates)


def _pure_planner(core_module, our_planner) -> bool:
    """Whether the planner's plans depend on its arguments alone: ours are pure, and so is
    production's ``_balance_load`` while it stays a ``staticmethod`` (a contributor's tree
    that makes it an instance method may read the rank's state)."""
    if our_planner is not None:
        return True
    found = inspect.getattr_static(core_module.DyntraLBDPEngineCoreProc, "_balance_load", None)
    return isinstance(found, staticmethod)


def engine_class(core_module, dyntra_lb_enabled: bool) -> type:
    """The engine class production runs for this config, under our emulation layer:
    vllm-ascend's DyntraLB engine core when DyntraLB is enabled (as its
    ``run_engine_core`` wrapper swaps it in), vLLM's ``DPEngineCoreProc`` otherwise."""
    if dyntra_lb_enabled:
        bases = (_EmulatedEngine, core_module.DyntraLBDPEngineCoreProc, _LauncherDPGroup)
    else:
        bases = (_EmulatedEngine, _LauncherDPGroup)
    return type("EmulatedDPEngineCore", bases, {})


class EmulatedRank(RankHarness):
    """One rank on the rank harness: builds the engine production runs (``engine_class``)
    and runs vLLM's busy loop; ``spec.planner`` is "vllm-ascend" (production's
    ``_balance_load``) or one of ``dyntra_lb.planner.registry`` in its place."""

    def __init__(self, ctx: RankContext, spec: EngineSpec, *, vllm_config, core_module,
                 dyntra_lb_enabled: bool):
        super().__init__(ctx, spec)
        planner = spec.planner
        self.our_planner = None if planner == "vllm-ascend" else planners.get(planner)
        # Plans shared by rank threads (None in a rank process, or with an impure planner).
        self.plan_memo = (ctx.host.plan_memo if dyntra_lb_enabled
                          and _pure_planner(core_module, self.our_planner) else None)
        collectives.install(ctx.dp_group, self.recorder, self._time_collective)
        self.dyntra_lb = dyntra_lb_enabled
        self.strict = StrictChecker(self) if spec.strict else None
        self.records: dict[str, _RequestRecord] = {}
        self._running_ids: list[str] = []  # running at the end of the last iteration
        self.output_clock_us = 0  # when the forward whose output vLLM processes ended
        self.sampler = EmulatedSampler(DraftAcceptance.for_profile(spec.cost_model, spec.seed))
        self._new_iteration()
        self.engine = engine_class(core_module, dyntra_lb_enabled)(vllm_config, self)
        self.scheduler = self.engine.scheduler
        self.scheduler.connector.bind(self, self.faults)

    @property
    def step_counter(self) -> int:
        """The engine's, live (the collective recorder reads it at every collective)."""
        return self.engine.step_counter

    @property
    def current_wave(self) -> int:
        return self.engine.current_wave

    # ------------------------------------------------------------------ the loop

    def _run_loop(self) -> None:
        try:
            self.engine.run_busy_loop()
        except SystemExit:  # the input queue asked for shutdown: the trace is done
            pass
        except _Truncated:
            self.truncated = True

    def _request_records(self) -> list[dict]:
        return [self.records[rid].to_dict() for rid in sorted(self.scheduler.requests)
                if rid in self.records]

    def make_request(self, trace_request) -> Request:
        """The vLLM request of a trace arrival (prompt token ids are placeholders)."""
        self.records[trace_request.request_id] = _RequestRecord(trace_request)
        self.num_arrived += 1
        params = SamplingParams(max_tokens=trace_request.output_tokens, ignore_eos=True)
        return Request(trace_request.request_id, [SAMPLED_TOKEN] * trace_request.prompt_tokens,
                       params, None, arrival_time=trace_request.arrival_s,
                       priority=trace_request.priority)

    def _new_iteration(self) -> None:
        self._iter_start = time.perf_counter()
        self._step_start_us: int | None = None
        self._own_cost_us = 0
        self._step_us = 0
        self._executed = False
        self._scheduled_tokens = 0
        self._paused: list[str] = []
        self._resumed: list[str] = []
        self._admitted: list[str] = []
        self._preempted: list[str] = []
        self._finished: list[_RequestRecord] = []
        self.planner_s = 0.0
        self.planner_call: PlannerCall | None = None  # _balance_load's arguments, if it ran
        self.collectives_s = 0.0
        self.plans = None  # the plans _balance_load returned in this iteration
        self.candidates: list = []  # the admission candidates _do_lb_allgather published

    # ------------------------------------------------------------------ forward

    def forward(self, scheduler_output) -> ModelRunnerOutput:
        """The executor's ``execute_model``: what the scheduler decided, priced. A batch
        without tokens starts no step: when the engine then runs a dummy batch, that
        starts it (at the same clock); when the loop pass turns out idle (every engine
        idle: vLLM's ``continue``), nothing of it belongs to the next recorded step."""
        now_s = self.clock_us / 1e6
        self._note_schedule(scheduler_output, now_s)
        if self.strict is not None:
            self.strict.scheduled(scheduler_output)
        scheduler = self.scheduler
        total = scheduler_output.total_num_scheduled_tokens
        if total > 0:
            self._begin_step()
            self._executed = True
            self._scheduled_tokens = total
            # Each running request's tokens as the worker has them (the scheduler's
            # count lags by the step in flight under async scheduling).
            tokens = [self.sampler.num_tokens(r) for r in scheduler.running]
            self._own_cost_us = self.cost(
                sum(num_blocks(t, self.spec.block_size) for t in tokens), sum(tokens),
                len(tokens), total, False)
            self._lockstep()
        req_ids = list(scheduler_output.num_scheduled_tokens)
        sampled = self.sampler.sample(scheduler_output, scheduler.requests)
        done, invalid = scheduler.connector.finished_recving(self.clock_us)
        return ModelRunnerOutput(
            req_ids=req_ids, req_id_to_index={rid: i for i, rid in enumerate(req_ids)},
            sampled_token_ids=sampled,
            kv_connector_output=KVConnectorOutput(finished_recving=done or None,
                                                  invalid_block_ids=invalid))

    def dummy_forward(self) -> None:
        """The executor's ``execute_dummy_batch``: the lockstep collective at the fixed
        cost, so the device group stays matched."""
        self._begin_step()
        self.num_dummy_steps += 1
        self._own_cost_us = self.cost(0, 0, 0, 0, True)
        # this iteration's finishes (update_from_output ran before the dummy batch) count
        self._lockstep(self._finished)

    def _lockstep(self, pending_finished=()) -> None:
        """Join the lockstep collective and advance the clock by the DP step time
        (``pending_finished``: the iteration's finishes before it)."""
        self._step_us = self.join_lockstep(self._own_cost_us, self.clock_us, pending_finished)
        self.clock_us += self._step_us

    def _begin_step(self) -> None:
        if self._step_start_us is None:
            self._step_start_us = self.clock_us
            if self.faults is not None:
                self.faults.before_step(self.iteration, self.clock_us)

    def _note_schedule(self, scheduler_output, now_s: float) -> None:
        """Pauses, resumes, admissions and preemptions of this ``schedule()``."""
        paused_ids = getattr(self.scheduler, "_lb_paused_req_ids", ())
        records = self.records
        for rid in self._running_ids:
            if rid in paused_ids and rid not in scheduler_output.num_scheduled_tokens:
                self._paused.append(rid)
                records[rid].pauses.append([now_s, None])
        for new in scheduler_output.scheduled_new_reqs:
            self._admitted.append(new.req_id)
            if records[new.req_id].first_scheduled_s is None:
                records[new.req_id].first_scheduled_s = now_s
        cached = scheduler_output.scheduled_cached_reqs
        for rid in cached.req_ids:
            if rid in cached.resumed_req_ids:
                self._resumed.append(rid)
                pauses = records[rid].pauses
                if pauses and pauses[-1][1] is None:
                    pauses[-1][1] = now_s
        self._preempted = sorted(scheduler_output.preempted_req_ids or ())

    def on_output(self, output) -> None:
        """A request's output (``OutputSink``), stamped with the end of the forward that
        produced it (``output_clock_us``, which the executor sets when vLLM's engine reads
        that forward's output: this step's, or with async scheduling the previous one's)."""
        record = self.records[output.request_id]
        now_s = self.output_clock_us / 1e6
        record.token_times_s.extend([now_s] * len(output.new_token_ids))
        if output.finish_reason is not None:
            record.finish_s = now_s
            self._finished.append(record)

    def _num_waiting(self) -> int:
        return len(self.scheduler.waiting) + len(self.scheduler.skipped_waiting)

    def _num_running(self) -> int:
        return len(self.scheduler.running)

    # ------------------------------------------------------------------ records

    def end_iteration(self, local_unfinished: bool, plan_applied) -> None:
        """After the wave sync and DyntraLB's hook of a non-idle iteration: its records,
        and DyntraLB's control plane charged to the clock."""
        scheduler = self.scheduler
        collectives_done, charge = self.settle_control_plane(self._step_us, self.planner_call,
                                                             self.planner_s)
        gathered = any(c["site"] == ALLGATHER_SITE for c in collectives_done)
        plan_generated = scheduler.modifications if gathered else None
        if gathered:
            self.num_plans += 1
        self.check_progress(self._executed, local_unfinished)
        self.write_iteration(self._step_record(plan_applied, plan_generated, collectives_done,
                                               charge),
                             [r.to_dict() for r in self._finished], self._iter_start,
                             self.planner_s if self.dyntra_lb else None,
                             self.collectives_s if self.dyntra_lb else None)
        if self.strict is not None:
            self.strict.check(None if self.plans is None else self.plans[self.dp_rank],
                              self.candidates)
        if charge is not None:
            self.clock_us += charge.charged_us
        self.iteration += 1
        self._running_ids = [r.request_id for r in scheduler.running]
        self._new_iteration()

    def _time_collective(self, site: str, seconds: float) -> None:
        if site.startswith("dyntra_lb."):
            self.collectives_s += seconds

    def _step_record(self, plan_applied, plan_generated, collectives_done,
                     control_plane) -> StepRecord:
        scheduler = self.scheduler
        engine = self.engine
        bs = self.spec.block_size
        kv = scheduler.kv_cache_manager
        free = kv.block_pool.get_num_free_blocks()
        paused = getattr(scheduler, "_lb_paused_req_ids", ())
        return StepRecord(
            iter=self.iteration, wave=engine.current_wave, step_counter=engine.step_counter,
            clock_us=self._step_start_us, own_cost_us=self._own_cost_us, step_us=self._step_us,
            dummy=not self._executed, num_running=len(scheduler.running),
            num_waiting=self._num_waiting(),
            running_blocks=sum(block_counts(scheduler.running, bs)),
            waiting_blocks=(sum(block_counts(scheduler.waiting, bs))
                            + sum(block_counts(scheduler.skipped_waiting, bs))),
            scheduled_tokens=self._scheduled_tokens, plan_applied=_plan_dict(plan_applied),
            paused=self._paused, resumed=self._resumed, admitted=self._admitted,
            preempted=self._preempted, finished=[r.request_id for r in self._finished],
            plan_generated=_plan_dict(plan_generated), kv_free_blocks=free,
            kv_held_blocks=kv.block_pool.num_gpu_blocks - 1 - free,
            paused_kv_blocks={rid: len(kv.get_block_ids(rid)[0]) for rid in paused
                              if rid in scheduler.requests},
            collectives=collectives_done, control_plane=control_plane)

    def _stall_state(self) -> tuple[list, object, int]:
        scheduler = self.scheduler
        return ([*scheduler.running, *scheduler.skipped_waiting, *scheduler.waiting],
                getattr(scheduler, "_lb_paused_req_ids", ()),
                scheduler.kv_cache_manager.block_pool.get_num_free_blocks())


def _plan_dict(plan) -> dict | None:
    if plan is None:
        return None
    return {"out_blk": list(plan["out_blk"]), "in_blk": list(plan["in_blk"]),
            "freeze": bool(plan["freeze"])}

