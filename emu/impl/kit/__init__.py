"""``--impl kit``: our DyntraLB (``dyntra_lb``) in the stub vLLM engine of ``engine``."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from dyntra_lb.config import check_deployment
from dyntra_lb.planner import registry as planners
from emu.impl import Implementation
from emu.rank.context import Preload


@dataclass(frozen=True)
class KitImplementation(Implementation):
    """Ours: nothing to find before a run, the same for every run."""

    own_planner = planners.REFERENCE

    @classmethod
    def resolve(cls, config, *, dp_size: int, async_scheduling: bool,
                vllm_ascend: str | None) -> KitImplementation:
        """The startup checks of a decode node; the kit emulates vLLM's scheduler,
        synchronous or async, not vllm-ascend's recompute scheduler."""
        variant = check_deployment(config, kv_role="kv_consumer", data_parallel_size=dp_size,
                                   async_scheduling=async_scheduling)
        if variant not in ("plain", "async"):
            raise ValueError(
                "the kit runs vLLM's own scheduler (synchronous or async); the additional "
                "config selects vllm-ascend's recompute scheduler (scheduler_config."
                "recompute_scheduler_enable runs with --impl vllm-ascend)")
        return cls()

    def preload(self) -> Preload:
        return Preload(("emu.impl.kit.engine",))

    def build(self, ctx, spec):
        """This rank's kit engine; its ``dyntra_lb`` log goes to ``rank<r>.log`` with a
        fixed prefix (no timestamps, so the file is as deterministic as the event log)."""
        from emu.impl.kit.engine import EngineCore

        handler = logging.FileHandler(ctx.out_dir / f"rank{ctx.rank}.log", mode="w")
        handler.setFormatter(logging.Formatter(
            f"(EngineCore_DP{ctx.rank}) %(levelname)s %(message)s"))
        ctx.host.route_log("dyntra_lb", [handler])
        return EngineCore(ctx, spec)

    def describe(self, spec) -> dict:
        described = {"impl": "kit", "async_scheduling": spec.async_scheduling,
                     "planner": spec.planner}
        limit = spec.pause_limit
        if limit is not None:  # the opt-in only: production's runs record what they did
            described["pause_limit"] = {
                "limit_ms": None if limit.limit_s is None else round(limit.limit_s * 1e3, 6),
                "victim": limit.victim}
        return described


IMPLEMENTATION = KitImplementation
