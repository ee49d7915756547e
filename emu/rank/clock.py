"""Virtual time of the emulated cluster: the step-cost model and the lockstep clock.

No model runs, so each rank prices its own batch with a cost profile
(``emu.rank.costs.StepCostModel``) and then joins
one MAX all-reduce on the device group — the stand-in for the MoE collectives inside a
real forward, which make every DP rank wait for the slowest. The reduced value is the
DP step time; a rank's bubble is ``step time - own cost``. The same collective carries
every rank's (waiting, running) counts, which the router of the next intake reads (vLLM's
front-end also routes on counts that are one step old), and, under a concurrency limit
(``RunSpec.max_concurrency``), every rank's cumulative finished count, from which each
rank's intake releases the next requests (``emu.rank.intake``). vLLM's own DP load
balancer (``--router vllm``, ``emu.routers.vllm_dp_lb``) also needs each rank's finished
count, per API server when there are several (each server learns only its own requests'
finishes), and KV cache usage, what its front end learns from the engines' outputs and
stats. Without these the buffer keeps the two-counts layout, so the recorded collective
is unchanged.

Virtual time is integer microseconds throughout the engine.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.distributed as dist

from emu.sites import LOCKSTEP_SITE


class RankStats(NamedTuple):
    """One rank's numbers as the last lockstep collective carried them: its queues, its
    requests finished so far (in all, and per API server) and its KV cache usage in
    permille (0 and empty unless the clock carries them). A named tuple: every rank
    makes one per rank at every step a router observes."""

    waiting: int
    running: int
    finished: int
    kv_usage_permille: int
    finished_by_server: tuple[int, ...] = ()


class LockstepClock:
    """The per-step MAX all-reduce on the device group. Every rank calls ``step`` once
    per non-idle iteration (real or dummy step), so the device group stays matched.

    Buffer layout (int32, allocated once): ``[own_cost_us, w0, r0, w1, r1, ...]``; with
    ``carry_finished`` each rank's slots are ``w, r, f``, with ``api_servers`` N > 1
    ``w, r, f_0 .. f_N-1`` (its finishes of each server's requests), with
    ``carry_kv_usage`` also ``kv`` (permille) after them. Each rank fills its own cost
    and its own slots and leaves the others zero, so the MAX gives the DP step time and
    everyone's counts at once. On an NPU the collective runs on a device copy of the buffer.
    """

    def __init__(
        self,
        device_group: Any,
        *,
        dp_rank: int,
        dp_size: int,
        device: str | torch.device = "cpu",
        observe: Callable[[str, str, torch.Tensor, Callable[[], Any]], Any] | None = None,
        carry_finished: bool = False,
        carry_kv_usage: bool = False,
        api_servers: int = 1,
    ):
        self.device_group = device_group
        self.dp_rank = dp_rank
        self.dp_size = dp_size
        self._observe = observe
        self._servers = api_servers if carry_finished else 0
        self._finished_slot = 2 if carry_finished else None
        self._kv_slot = 2 + self._servers if carry_kv_usage else None
        self._width = 2 + self._servers + carry_kv_usage
        self._array = np.zeros(1 + self._width * dp_size, dtype=np.int32)
        self._cpu = torch.from_numpy(self._array)
        device = torch.device(device)
        self._tensor = self._cpu if device.type == "cpu" else torch.zeros_like(
            self._cpu, device=device
        )
        self._values = [0] * len(self._array)  # the last collective's result
        self._counts: list[tuple[int, int]] | None = None
        self.finished_total = 0

    @property
    def counts(self) -> list[tuple[int, int]]:
        """Every rank's ``(waiting, running)`` as reported to the last collective; made
        when first read after it (the intake reads it only when a request arrives)."""
        if self._counts is None:
            values, width = self._values, self._width
            self._counts = list(zip(values[1::width], values[2::width], strict=True))
        return self._counts

    @property
    def rank_stats(self) -> list[RankStats]:
        """Every rank's ``RankStats`` as reported to the last collective."""
        values, width, servers, kv_slot = self._values, self._width, self._servers, self._kv_slot
        out = []
        for slot in range(1, 1 + width * self.dp_size, width):
            by_server = tuple(values[slot + 2:slot + 2 + servers])
            out.append(RankStats(
                values[slot], values[slot + 1], sum(by_server),
                0 if kv_slot is None else values[slot + kv_slot],
                by_server if servers > 1 else ()))
        return out

    def step(self, own_cost_us: int, num_waiting: int, num_running: int,
             num_finished: int | Sequence[int] = 0, kv_usage_permille: int = 0) -> int:
        """Join this step's lockstep collective; returns the DP step time (the maximum
        own cost over ranks, microseconds) and refreshes ``counts``, every rank's
        ``(waiting, running)`` as reported to this collective, and (``carry_finished``)
        ``finished_total``, the sum of every rank's ``num_finished`` (its requests
        finished so far: a count, or with several API servers one per server);
        ``kv_usage_permille`` travels with ``carry_kv_usage``."""
        buf = self._array
        buf.fill(0)
        buf[0] = own_cost_us
        slot = 1 + self._width * self.dp_rank
        buf[slot] = num_waiting
        buf[slot + 1] = num_running
        if self._servers > 1:
            buf[slot + 2:slot + 2 + self._servers] = num_finished
        elif self._finished_slot is not None:
            buf[slot + self._finished_slot] = num_finished
        if self._kv_slot is not None:
            buf[slot + self._kv_slot] = kv_usage_permille
        if self._observe is None:
            self._all_reduce()
        else:
            self._observe(LOCKSTEP_SITE, "all_reduce_max", self._tensor, self._all_reduce)
        self._values = values = buf.tolist()
        self._counts = None
        if self._finished_slot is not None:
            self.finished_total = sum(sum(values[first:first + self._servers])
                                      for first in range(3, len(values), self._width))
        return values[0]

    def _all_reduce(self) -> None:
        if self._tensor is not self._cpu:
            self._tensor.copy_(self._cpu)
        dist.all_reduce(self._tensor, op=dist.ReduceOp.MAX, group=self.device_group)
        if self._tensor is not self._cpu:
            self._cpu.copy_(self._tensor)
