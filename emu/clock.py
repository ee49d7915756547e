"""Virtual time of the emulated cluster: the step-cost model and the lockstep clock.

No model runs, so each rank prices its own batch with ``StepCostModel`` and then joins
one MAX all-reduce on the device group — the stand-in for the MoE collectives inside a
real forward, which make every DP rank wait for the slowest. The reduced value is the
DP step time; a rank's bubble is ``step time - own cost``. The same collective carries
every rank's (waiting, running) counts, which the router of the next intake reads (vLLM's
front-end also routes on counts that are one step old).

Virtual time is integer microseconds throughout the engine.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

LOCKSTEP_SITE = "engine.lockstep"


@dataclass(frozen=True)
class StepCostModel:
    """Cost of one forward on one rank, in seconds:

    ``fixed_s + per_block_s * running_blocks + per_token_s * scheduled_tokens``.

    - ``fixed_s`` (s per step, default 0.020): weights, MoE dispatch, launch overheads —
      paid by every step, dummy steps included.
    - ``per_block_s`` (s per KV block held by running requests, default 19.2e-6):
      attention reads the whole KV; with ``fixed_s`` this is the planner's own linear
      latency model (spec D.6: ``20000 + 19.2 * M`` microseconds).
    - ``per_token_s`` (s per scheduled token, default 5e-6): token-proportional compute;
      small on a decode node, where a step schedules about one token per request.

    A dummy step (no real tokens) costs ``fixed_s`` only.
    """

    fixed_s: float = 0.020
    per_block_s: float = 19.2e-6
    per_token_s: float = 5e-6

    def __post_init__(self) -> None:
        for name in ("fixed_s", "per_block_s", "per_token_s"):
            value = getattr(self, name)
            if (
                not isinstance(value, (int, float))
                or isinstance(value, bool)
                or not value >= 0
                or value == float("inf")
            ):
                raise ValueError(
                    f"cost model {name} must be a finite number >= 0 (seconds), got {value!r}"
                )
        if round(self.fixed_s * 1e6) < 1:
            raise ValueError(
                f"cost model fixed_s must be at least 1 microsecond, got {self.fixed_s!r}"
            )

    def cost(self, running_blocks: int, scheduled_tokens: int, dummy: bool) -> int:
        """This rank's cost of the step it is about to run, in integer microseconds."""
        if dummy:
            return round(self.fixed_s * 1e6)
        return round(
            (self.fixed_s + self.per_block_s * running_blocks + self.per_token_s * scheduled_tokens)
            * 1e6
        )


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
