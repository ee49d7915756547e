"""Virtual time of the emulated cluster: the step-cost model and the lockstep clock.

No model runs, so each rank prices its own batch with a cost profile
(``emu.costs.StepCostModel``) and then joins
one MAX all-reduce on the device group — the stand-in for the MoE collectives inside a
real forward, which make every DP rank wait for the slowest. The reduced value is the
DP step time; a rank's bubble is ``step time - own cost``. The same collective carries
every rank's (waiting, running) counts, which the router of the next intake reads (vLLM's
front-end also routes on counts that are one step old).

Virtual time is integer microseconds throughout the engine.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from emu.sites import LOCKSTEP_SITE


class LockstepClock:
    """The per-step MAX all-reduce on the device group. Every rank calls ``step`` once
    per non-idle iteration (real or dummy step), so the device group stays matched.

    Buffer layout (int32, allocated once): ``[own_cost_us, w0, r0, w1, r1, ...]``; each
    rank fills its own cost and its own (waiting, running) slots and leaves the others
    zero, so the MAX gives the DP step time and everyone's counts at once. On an NPU the
    collective runs on a device copy of the buffer.
    """

    def __init__(
        self,
        device_group: Any,
        *,
        dp_rank: int,
        dp_size: int,
        device: str | torch.device = "cpu",
        observe: Callable[[str, str, torch.Tensor, Callable[[], Any]], Any] | None = None,
    ):
        self.device_group = device_group
        self.dp_rank = dp_rank
        self.dp_size = dp_size
        self._observe = observe
        self._array = np.zeros(1 + 2 * dp_size, dtype=np.int32)
        self._cpu = torch.from_numpy(self._array)
        device = torch.device(device)
        self._tensor = self._cpu if device.type == "cpu" else torch.zeros_like(
            self._cpu, device=device
        )
        self.counts: list[tuple[int, int]] = [(0, 0)] * dp_size

    def step(self, own_cost_us: int, num_waiting: int, num_running: int) -> int:
        """Join this step's lockstep collective; returns the DP step time (the maximum
        own cost over ranks, microseconds) and refreshes ``counts``, every rank's
        ``(waiting, running)`` as reported to this collective."""
        buf = self._array
        buf.fill(0)
        buf[0] = own_cost_us
        slot = 1 + 2 * self.dp_rank
        buf[slot] = num_waiting
        buf[slot + 1] = num_running
        if self._observe is None:
            self._all_reduce()
        else:
            self._observe(LOCKSTEP_SITE, "all_reduce_max", self._tensor, self._all_reduce)
        values = buf.tolist()
        self.counts = list(zip(values[1::2], values[2::2], strict=True))
        return values[0]

    def _all_reduce(self) -> None:
        if self._tensor is not self._cpu:
            self._tensor.copy_(self._cpu)
        dist.all_reduce(self._tensor, op=dist.ReduceOp.MAX, group=self.device_group)
        if self._tensor is not self._cpu:
            self._cpu.copy_(self._tensor)
