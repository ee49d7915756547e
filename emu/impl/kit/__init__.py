"""``--impl kit``: our DyntraLB (``dyntra_lb``) in the stub vLLM engine of ``emu.engine.core``."""

from __future__ import annotations

import logging

from dyntra_lb.config import check_deployment


def check(config, *, dp_size: int, async_scheduling: bool, vllm_ascend=None,
          faults=None) -> None:
    """The startup checks of a decode node; the kit emulates vLLM's plain synchronous
    scheduler only."""
    if async_scheduling:
        raise ValueError("the kit emulates synchronous scheduling only; async scheduling "
                         "runs with --impl vllm-ascend")
    variant = check_deployment(config, kv_role="kv_consumer", data_parallel_size=dp_size)
    if variant != "plain":
        raise ValueError(
            f"the kit runs vLLM's plain synchronous scheduler; the additional config "
            f"selects the {variant!r} scheduler (scheduler_config.recompute_scheduler_enable "
            "runs with --impl vllm-ascend)")


def build(ctx, spec, config, out_dir):
    """This rank's kit engine; its ``dyntra_lb`` log goes to ``rank<r>.log``."""
    from emu.engine.core import EngineCore

    _setup_rank_logging(out_dir, ctx.rank, spec.transport)
    return EngineCore(ctx, spec, config, out_dir)


def _setup_rank_logging(out_dir, rank: int, transport: str) -> None:
    """Send this rank's ``dyntra_lb`` log to ``rank<r>.log`` with a fixed prefix (no
    timestamps, so the file is as deterministic as the event log). A rank process owns
    the logger; a rank thread shares it, so its records are routed by thread."""
    handler = logging.FileHandler(out_dir / f"rank{rank}.log", mode="w")
    handler.setFormatter(logging.Formatter(f"(EngineCore_DP{rank}) %(levelname)s %(message)s"))
    if transport == "thread":
        from emu.cluster.threads import route_rank_log

        route_rank_log(handler)
        return
    log = logging.getLogger("dyntra_lb")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
