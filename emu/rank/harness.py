"""What every emulated rank has around its engine, whichever DyntraLB runs in it.

Both engines — the kit's loop (``emu.impl.kit.engine.EngineCore``) and vLLM's own loop
around vllm-ascend's code (``emu.impl.vllm_ascend.engine.EmulatedRank``) — are a
``RankHarness``: the trace as it reaches the rank (``intake.Arrivals``), the rank's
faults (``fault_injection``), its step-cost profile and the lockstep clock that turns
each step into virtual time (``clock``), the price of DyntraLB's control plane between
two forwards (``control_plane``), the recorder every collective goes through
(``recorder``), the event and wall logs (``eventlog``), the counters of the summary
handed back to the launcher, and the stall watch. The engine supplies the loop and
reads its own scheduler's queues; the harness does the rest the same way for both, so
both write the same logs from the same virtual clock.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

from emu.rank.clock import LockstepClock
from emu.rank.context import RankContext, RankSummary, StallError
from emu.rank.control_costs import ControlCharge
from emu.rank.control_plane import ControlPlane, PlannerCall, max_over_ranks
from emu.rank.engine_spec import EngineSpec
from emu.rank.eventlog import EventLog, StepRecord, WallLog
from emu.rank.fault_injection import injector_for
from emu.rank.intake import Arrivals
from emu.rank.recorder import CollectiveRecorder


class RankHarness(ABC):
    """The common parts of one rank (see the module docstring), over the run's ``spec``
    (``emu.rank.engine_spec.EngineSpec``; the control plane models the work of its
    ``planner``).

    A subclass provides the loop (``_run_loop``), its ``step_counter`` and
    ``current_wave`` (read by the recorder at every collective), its queue lengths
    (``_num_waiting``, ``_num_running``), what it knows of a stuck rank
    (``_stall_state``) and its request records (``_request_records``).

    A rank that holds unfinished requests but has scheduled no token for
    ``spec.stall_steps`` consecutive iterations raises ``StallError`` (vLLM would spin
    in dummy steps forever, e.g. when paused requests hold the KV a preempted
    head-of-line request needs).
    """

    def __init__(self, ctx: RankContext, spec: EngineSpec):
        self.ctx = ctx
        self.spec = spec
        self.dp_rank = ctx.rank
        self.dp_size = ctx.dp_size
        self.dp_group = ctx.dp_group
        self.arrivals = Arrivals(spec.trace, spec.router, ctx.dp_size, spec.max_concurrency,
                                 api_servers=spec.api_server_count, seed=spec.seed)
        # This rank's FaultInjector, or None (then no fault work at all).
        self.faults = faults = injector_for(spec.faults, ctx.rank)
        cost_model = spec.cost_model if faults is None else faults.cost_model(spec.cost_model)
        self.cost = cost_model.cost
        recorder = CollectiveRecorder(ctx.guard, where=self)
        self.recorder = recorder if faults is None else faults.wrap_recorder(recorder)
        observes = self.arrivals.observes_engines
        self.lockstep = LockstepClock(ctx.device_group, dp_rank=ctx.rank, dp_size=ctx.dp_size,
                                      device=ctx.device, observe=self.recorder,
                                      carry_finished=spec.max_concurrency is not None or observes,
                                      carry_kv_usage=observes,
                                      api_servers=self.arrivals.api_servers)
        self.control_plane = self._control_plane(spec.planner)
        self.events: EventLog | None = None
        self.wall: WallLog | None = None

        self.clock_us = 0  # this rank's virtual time
        # What the control plane charged after the last step: its finishes came before.
        self.control_us = 0
        self.iteration = 0  # non-idle iterations so far
        self.truncated = False
        self.num_arrived = 0
        self.num_dummy_steps = 0
        self.num_plans = 0
        self.num_finished = 0
        # With several API servers: this rank's finishes of each server's requests.
        self._finished_by_server = [0] * self.arrivals.api_servers
        self._last_progress = 0  # iteration of this rank's last step with tokens

    # ------------------------------------------------------------------ the run

    def run(self) -> RankSummary:
        """Run the engine's loop until the trace is exhausted and the last wave has
        ended (or ``max_steps``); returns this rank's summary."""
        out = self.ctx.out_dir
        self.events = EventLog(out, self.dp_rank)
        self.wall = WallLog(out, self.dp_rank)
        start = time.perf_counter()
        try:
            self._run_loop()
        finally:
            # A failed rank writes its requests too: the partial log of a stalled run
            # then shows where each request got to.
            loop_wall_s = time.perf_counter() - start
            self.events.requests(self._request_records())
            self.events.close()
            self.wall.close()
        return RankSummary(
            rank=self.dp_rank, steps=self.iteration, dummy_steps=self.num_dummy_steps,
            waves=self.current_wave, clock_s=self.clock_us / 1e6,
            num_finished=self.num_finished, num_plans=self.num_plans,
            num_collectives=self.recorder.seq, truncated=self.truncated,
            loop_wall_s=loop_wall_s)

    # ------------------------------------------------------------------ each step

    def join_lockstep(self, own_cost_us: int, step_start_us: int,
                      pending_finished: Sequence = ()) -> int:
        """Join the step's lockstep collective with this rank's cost and counts; returns
        the DP step time. The finishes reported are this rank's up to the step's start
        (those of an executed step come after its forward): those written so far and
        ``pending_finished``, the requests (each with its ``request_id``) the iteration
        finished before this step; a concurrency limit turns them into the next sends
        (``emu.rank.intake``), vLLM's API servers into their in-flight counts."""
        observes = self.arrivals.observes_engines
        num_finished: int | list[int] = self.num_finished + len(pending_finished)
        if len(self._finished_by_server) > 1:
            num_finished = list(self._finished_by_server)
            for request in pending_finished:
                num_finished[self.arrivals.server_of(request.request_id)] += 1
        step_us = self.lockstep.step(own_cost_us, self._num_waiting(), self._num_running(),
                                     num_finished,
                                     self._kv_usage_permille() if observes else 0)
        # the finishes reported came at the end of the last step, before its control plane
        self.arrivals.finished(self.lockstep.finished_total, step_start_us - self.control_us)
        if observes:
            self.arrivals.observe(self.lockstep.rank_stats, step_start_us)
        return step_us

    def _kv_usage_permille(self) -> int:
        """This rank's KV cache usage as vLLM's scheduler reports it to the DP
        coordinator (``BlockPool.get_usage``: the share of the usable blocks not free),
        in permille, from the free blocks the engine reports (``_stall_state``)."""
        free = self._stall_state()[2]
        return round(1000 * (1 - free / self.spec.num_gpu_blocks))

    def wave_ended(self) -> None:
        """After the iteration that ended a wave (every rank idle): every request taken
        so far has finished, at the end of that iteration's step."""
        self.arrivals.nothing_in_flight(self.clock_us - self.control_us)

    def settle_control_plane(self, step_us: int, planner_call: PlannerCall | None,
                             planner_wall_s: float) -> tuple[list[dict], ControlCharge | None]:
        """At the end of a non-idle iteration, after DyntraLB's part: the iteration's
        collectives (for its step record) and what DyntraLB's control plane charges the
        clock (None when the profile has it off). ``planner_call``: the planner's
        arguments if it ran (None otherwise), ``planner_wall_s`` its wall time;
        ``step_us``: the iteration's DP step time."""
        collectives = self.recorder.take()
        if self.control_plane is None:
            return collectives, None
        charge = self.control_plane.charge(collectives, planner_call, step_us, planner_wall_s)
        if charge.measured:
            collectives += self.recorder.take()  # the exchange of the measured time
        self.control_us = charge.charged_us
        return collectives, charge

    def _control_plane(self, planner: str) -> ControlPlane | None:
        spec = self.spec
        terms = spec.cost_model.control_plane
        if terms is None:
            return None
        exchange = (max_over_ranks(self.dp_group, self.recorder)
                    if spec.planner_cost == "measured" else None)
        return ControlPlane(terms, dp_size=self.dp_size, planner=planner,
                            overlap=spec.async_scheduling, exchange=exchange)

    def check_progress(self, executed: bool, local_unfinished: bool) -> None:
        """After each non-idle iteration: name a stuck rank instead of letting it spin
        in dummy steps."""
        if executed or not local_unfinished:
            self._last_progress = self.iteration
        elif self.iteration - self._last_progress >= self.spec.stall_steps:
            raise StallError(self._describe_stall())

    def write_iteration(self, record: StepRecord, finished: list[dict], iter_start: float,
                        planner_s: float | None, collectives_s: float | None) -> None:
        """The iteration's step record and the records of the requests it finished
        (event log), and its wall-clock times (wall log)."""
        self.num_finished += len(finished)
        if len(self._finished_by_server) > 1:
            for request in finished:
                self._finished_by_server[self.arrivals.server_of(request["request_id"])] += 1
        self.events.step(record, finished)
        self.wall.step(self.iteration, time.perf_counter() - iter_start, planner_s,
                       collectives_s)

    def _describe_stall(self) -> str:
        stuck, paused, free_blocks = self._stall_state()
        described = ", ".join(
            f"{r.request_id} ({r.status.name}"
            f"{', DyntraLB-paused' if r.request_id in paused else ''})" for r in stuck[:8])
        more = f" and {len(stuck) - 8} more" if len(stuck) > 8 else ""
        return (f"rank {self.dp_rank} is stuck: {len(stuck)} unfinished request(s) but no "
                f"token scheduled for {self.spec.stall_steps} steps (iteration "
                f"{self.iteration}, wave {self.current_wave}); {described}{more}; KV blocks "
                f"free: {free_blocks}")

    # ------------------------------------------------------------------ the engine's part

    step_counter: int  # vLLM's, of this rank's engine
    current_wave: int

    @abstractmethod
    def _run_loop(self) -> None:
        """vLLM's busy loop, until the trace is exhausted and the last wave has ended."""

    @abstractmethod
    def _request_records(self) -> list[dict]:
        """Every request still in the scheduler, as event-log records, by request id."""

    @abstractmethod
    def _num_waiting(self) -> int:
        """Requests waiting (including those skipped this step)."""

    @abstractmethod
    def _num_running(self) -> int:
        """Requests running."""

    @abstractmethod
    def _stall_state(self) -> tuple[list, Any, int]:
        """(the unfinished requests, the DyntraLB-paused ids, the free KV blocks)."""
