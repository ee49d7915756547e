"""Engine-side DyntraLB protocol (docs/protocol.md): what a DP engine does right after
its wave/idle synchronization on every non-idle iteration.

The engine owns one ``DyntraLBCoordinator`` per rank when DyntraLB is enabled and calls:

- ``on_add_request(num_blocks)`` for every request it adds (dynamic-mode arming);
- ``before_dp_sync(step_counter)`` just before ``_has_global_unfinished_reqs``;
- ``after_dp_sync(engines_running, ...)`` with that call's result; it returns what the
  iteration did (``BalanceStep``: the plan generated, the planner's and the
  collectives' wall time).

While engines run, the coordinator decides whether this iteration plans (static mode,
or dynamic mode after a long request; inside the ``start_step``/``end_step`` window),
gathers every rank's snapshot over the DP group, runs the planner — identically on every
rank — and leaves this rank's row on the scheduler policy, where ``schedule()`` of the
next iteration applies it. All its collectives go to the DP group it is given, in the
order docs/protocol.md lists, so every rank issues the same sequence.

This is the only ``dyntra_lb`` module that imports torch.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.distributed as dist

from dyntra_lb import diagnostics
from dyntra_lb.config import AdditionalConfig, diagnostics_enabled
from dyntra_lb.payload import block_slots, pack, payload_len, unpack
from dyntra_lb.planner.front import Plan, balance_load, warm_up
from dyntra_lb.planner.registry import Planner
from dyntra_lb.sites import ALLGATHER_SITE, FLAG_SITE

logger = logging.getLogger("dyntra_lb")

Observe = Callable[[str, str, torch.Tensor, Callable[[], Any]], Any]



class BalanceStep(NamedTuple):
    """What DyntraLB did in one iteration: this rank's plan generated (None when no
    all-gather ran), the wall time of the planner and of DyntraLB's collectives, and the
    gathered snapshot the planner ran on (``requests_by_rank``, None without an
    all-gather; views of the receive buffers, valid until the next all-gather)."""

    plan: Plan | None
    planner_s: float
    collectives_s: float
    requests_by_rank: list | None = None


_NO_BALANCE = BalanceStep(None, 0.0, 0.0)


class _SharedBuffer:
    """An int32 numpy array (``array``, or a new one of ``length``) and a CPU tensor over
    the same memory, plus (off CPU) a device tensor of the same shape that the collective
    runs on. Allocated once."""

    def __init__(self, length: int, device: torch.device, array: np.ndarray | None = None):
        self.array = np.zeros(length, dtype=np.int32) if array is None else array
        self.cpu = torch.from_numpy(self.array)
        self.tensor = self.cpu if device.type == "cpu" else torch.zeros_like(
            self.cpu, device=device
        )

    def to_device(self) -> None:
        if self.tensor is not self.cpu:
            self.tensor.copy_(self.cpu)

    def from_device(self) -> None:
        if self.tensor is not self.cpu:
            self.cpu.copy_(self.tensor)


class DyntraLBCoordinator:
    """DyntraLB's state on one DP engine rank (the reference keeps it on its
    ``DPEngineCoreProc`` subclass, initialized in ``_init_data_parallel``).

    ``config`` is the parsed ``additional_config``: the validated ``dyntra_lb`` block
    drives the protocol and the engine-side diagnostics, while the per-iteration
    step-counter line is gated by the raw config (``diagnostics_enabled``, as vllm-ascend gates it).
    ``policy`` is the scheduler-side ``DyntraLBPolicy``. ``observe``, when given, wraps
    every collective: ``observe(site, op, tensor, fn)`` must call ``fn()`` and return
    its result (the emulator records the collective sequence through it). ``planner``
    is the planner every rank runs on the gathered snapshot, called as
    ``dyntra_lb.planner.registry`` describes (default: ``balance_load``, "reference",
    production's); an engine may hand in a wrapper of one.
    """

    def __init__(
        self,
        config: AdditionalConfig,
        *,
        policy: Any,
        dp_rank: int,
        dp_size: int,
        dp_group: Any,
        max_num_seqs: int,
        device: str | torch.device = "cpu",
        observe: Observe | None = None,
        planner: Planner = balance_load,
    ):
        cfg = config.dyntra_lb
        self._balance_load = planner
        self.policy = policy
        self.dp_rank = dp_rank
        self.dp_size = dp_size
        self.dp_group = dp_group
        self.max_num_seqs = max_num_seqs
        self._observe = observe

        self.mode = cfg.mode
        self.start_step = cfg.start_step
        self.end_step = cfg.end_step
        self.bubble_threshold = cfg.bubble_threshold
        self.long_req_block_threshold = cfg.long_req_block_threshold
        self.dynamic_max_step = cfg.dynamic_max_step
        self.enable_diagnostics = cfg.enable_diagnostics
        self._log_step_counter = diagnostics_enabled(config.raw)
        self._log_rank0 = cfg.enable_diagnostics and dp_rank == 0

        # Dynamic-mode state; deliberately not reset at wave ends (a production quirk).
        self.dynamic_enable = False
        self.dynamic_step = 0
        self.pending_long_req = False
        self.pending_long_req_blk = 0

        device = torch.device(device)
        self._flag = _SharedBuffer(2, device)
        length = payload_len(max_num_seqs)
        self._send = _SharedBuffer(length, device)
        # The gathered buffers are the rows of one block: unpacked and keyed in one go,
        # and a backend may fill them with one copy.
        self._recv_block = np.zeros((dp_size, length), dtype=np.int32)
        self._recv = [_SharedBuffer(length, device, row) for row in self._recv_block]
        self._recv_tensors = [buf.tensor for buf in self._recv]
        self._recv_slots = block_slots(self._recv_block)
        self._on_device = device.type != "cpu"

        self._step = _NO_BALANCE

        # The compiled planner compiles (or loads numba's disk cache) here, at rank
        # start-up, instead of inside the first planned decode step.
        warm_up()

        if self._log_rank0:
            for line in diagnostics.config_lines(cfg):
                logger.info(line)

    # ------------------------------------------------------------------ engine hooks

    def on_add_request(self, num_blocks: int) -> None:
        """Called for every request the engine adds, before it enters the scheduler:
        in dynamic mode a request longer than ``long_req_block_threshold`` blocks arms
        the pending flag that the next DyntraLB collective shares."""
        if self.mode == "dynamic" and num_blocks > self.long_req_block_threshold:
            self.pending_long_req = True
            self.pending_long_req_blk = max(self.pending_long_req_blk, num_blocks)

    def before_dp_sync(self, step_counter: int) -> None:
        """Called right before the wave/idle sync with the not-yet-incremented step
        counter; logs the step-counter line on every rank."""
        if self._log_step_counter:
            logger.info(diagnostics.step_counter_line(step_counter))

    def after_dp_sync(self, engines_running: bool, *, step_counter: int,
                      current_wave: int) -> BalanceStep:
        """Called with the result of the wave/idle sync. ``step_counter`` is the
        incremented value and ``current_wave`` the wave this iteration belongs to.

        While engines run this may issue the dynamic flag all-reduce and the snapshot
        all-gather, and hands this rank's plan to the policy for the next
        ``schedule()``; at a wave end it only clears the plan (no collective,
        consistently on every rank).
        """
        self._step = _NO_BALANCE
        if engines_running:
            self._run_balance_load(step_counter, current_wave)
            return self._step
        self.policy.clear_plan()
        if self.enable_diagnostics:
            logger.info(diagnostics.wave_end_line(current_wave + 1))
        return self._step

    # ------------------------------------------------------------------ protocol

    def _run_balance_load(self, step_counter: int, current_wave: int) -> None:
        """vllm-ascend's ``run_balance_load``, in its order: the dynamic-mode flag, the
        step window, the snapshot, the all-gather and plan, the dynamic countdown."""
        static = self.mode == "static"
        dynamic = self.mode == "dynamic"
        activated_this_step = False
        if dynamic and not self.dynamic_enable:
            flag = self._flag.array
            flag[0] = int(self.pending_long_req)
            flag[1] = self.pending_long_req_blk
            self._collective(FLAG_SITE, "all_reduce_max", self._flag.tensor, self._all_reduce_flag)
            if flag[0]:
                self.dynamic_enable = True
                self.dynamic_step = 0
                activated_this_step = True
                if self._log_rank0:
                    logger.info(
                        diagnostics.activation_line(
                            int(flag[1]), self.long_req_block_threshold, current_wave,
                            step_counter,
                        )
                    )
            self.pending_long_req = False
            self.pending_long_req_blk = 0

        lb_active = (
            (static or self.dynamic_enable)
            and step_counter >= self.start_step
            and (self.end_step < 0 or step_counter < self.end_step)
        )
        if not lb_active:
            self.policy.clear_plan()
            return

        candidates = self.policy.prepare_step()
        has_new_long = self._gather_and_plan(candidates)
        if dynamic and self.dynamic_enable:
            if activated_this_step or has_new_long:
                self.dynamic_step = 0
            else:
                self.dynamic_step += 1
                if self.dynamic_step >= self.dynamic_max_step:
                    self.dynamic_enable = False
                    if self._log_rank0:
                        logger.info(
                            diagnostics.deactivation_line(
                                self.dynamic_step, current_wave, step_counter
                            )
                        )

    def _gather_and_plan(self, candidates: list[Any]) -> bool:
        """Pack this rank's snapshot (running requests, then admission candidates),
        all-gather, plan on every rank, keep this rank's row. Returns whether any rank
        reported a new long request."""
        pack(
            self._send.array,
            self.policy.running_block_counts(),
            self.policy.block_counts(candidates),
            self.pending_long_req,
        )
        self.pending_long_req = False
        self.pending_long_req_blk = 0
        self._collective(ALLGATHER_SITE, "all_gather", self._send.tensor, self._all_gather)
        requests_by_rank, has_new_long = unpack(self._recv_block, self._recv_slots)

        start = time.perf_counter()
        plans = self._balance_load(requests_by_rank, self.dp_size,
                                   max_num_seqs=self.max_num_seqs,
                                   threshold=self.bubble_threshold)
        planner_s = time.perf_counter() - start
        if self._log_rank0:
            logger.info(diagnostics.requests_table(requests_by_rank))
            logger.info(diagnostics.modifications_table(plans))

        plan = plans[self.dp_rank]
        self.policy.set_plan(plan)
        self._step = BalanceStep(plan, planner_s, self._step.collectives_s, requests_by_rank)
        return has_new_long

    # ------------------------------------------------------------------ collectives

    def _collective(self, site: str, op: str, tensor: torch.Tensor, fn: Callable[[], None]) -> None:
        start = time.perf_counter()
        if self._observe is None:
            fn()
        else:
            self._observe(site, op, tensor, fn)
        step = self._step
        self._step = step._replace(collectives_s=step.collectives_s + time.perf_counter() - start)

    def _all_reduce_flag(self) -> None:
        self._flag.to_device()
        dist.all_reduce(self._flag.tensor, op=dist.ReduceOp.MAX, group=self.dp_group)
        self._flag.from_device()

    def _all_gather(self) -> None:
        self._send.to_device()
        dist.all_gather(self._recv_tensors, self._send.tensor, group=self.dp_group)
        if self._on_device:
            for buf in self._recv:
                buf.from_device()
