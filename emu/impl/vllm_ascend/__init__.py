"""``--impl vllm-ascend``: vllm-ascend's own DyntraLB, unmodified, in every rank.

``check`` runs in the launching process before any rank starts (tree, vLLM version,
torch_npu, scheduler variant); ``build`` runs in each rank: it routes the rank's log lines,
imports the tree, builds the rank's ``VllmConfig`` and the engine
(``engine.EmulatedRank``).

Where vllm-ascend's code gets help to run off an NPU (each one leaves its DyntraLB code
as it is):

- ``vllm_ascend.patch`` and ``vllm_ascend.patch.platform`` are registered as bare
  packages, so that their ``__init__`` (which imports every NPU-only patch) does not
  run; the DyntraLB core patch imports what it needs itself (``tree.import_tree``);
- the engine object is built without ``EngineCoreProc.__init__``'s ZMQ handshakes, its
  DP group comes from the launcher, and the executor, the KV connector and the input
  and output queues are emulated (``engine``);
- vllm-ascend's config singleton is installed with only its scheduler part (the part
  DyntraLB reads), because building the rest imports torch_npu
  (``vllm_config.preset_ascend_config``);
- ``torch.distributed.all_reduce`` / ``all_gather`` are wrapped to record every
  collective for the guard (``collectives``);
- ``_balance_load`` and ``_has_global_unfinished_reqs`` are wrapped by a subclass that
  times the planner and records the iteration after production's method returned.
"""

from __future__ import annotations

import logging
import os

from dyntra_lb.config import check_deployment
from emu.impl.vllm_ascend.tree import Tree, TreeError, resolve

__all__ = ["Tree", "TreeError", "build", "check"]


def check(config, *, dp_size: int, async_scheduling: bool, vllm_ascend=None,
          faults=None) -> Tree:
    """Everything that can fail before a rank starts (the startup checks of a decode
    node, the tree, vLLM); returns the checked tree. Every fault kind runs here as in
    the kit."""
    _variant(config, dp_size, async_scheduling)
    return resolve(vllm_ascend)


def _variant(config, dp_size: int, async_scheduling: bool) -> str:
    return check_deployment(config, kv_role="kv_consumer", data_parallel_size=dp_size,
                            async_scheduling=async_scheduling)


def build(ctx, spec, config, out_dir):
    """This rank's engine, ready to ``run()``."""
    os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")
    from emu.cluster.fault_injection import injector_for
    from emu.impl.vllm_ascend.engine import EmulatedRank
    from emu.impl.vllm_ascend.tree import import_tree
    from emu.impl.vllm_ascend.vllm_config import (
        build_vllm_config,
        max_model_len_of,
        model_dir,
        preset_ascend_config,
    )

    _route_logs(out_dir, ctx.rank, spec)
    core = import_tree(resolve(spec.vllm_ascend))
    if config.dyntra_lb.enabled:
        # What vllm-ascend's run_engine_core wrapper (not run here) logs first.
        core._print_rank_0("Enable DyntraLB DP load balancing.", ctx.rank,
                           config.dyntra_lb.enable_diagnostics)
    variant = _variant(config, spec.dp_size, spec.async_scheduling)
    vllm_config = build_vllm_config(
        spec, rank=ctx.rank, variant=variant, dyntra_lb_enabled=config.dyntra_lb.enabled,
        model_path=model_dir(out_dir, max_model_len_of(spec)), additional_config=config.raw)
    preset_ascend_config(vllm_config)
    return EmulatedRank(
        ctx, spec, vllm_config=vllm_config, core_module=core,
        dyntra_lb_enabled=core._get_dyntra_lb_config(vllm_config).enabled,
        event_log=out_dir / f"rank{ctx.rank}.events.jsonl",
        wall_log=out_dir / f"rank{ctx.rank}.wall.jsonl",
        faults=injector_for(spec.faults, ctx.rank))


def _route_logs(out_dir, rank: int, spec) -> None:
    """vLLM's and vllm-ascend's log lines of this rank: the DyntraLB lines (from
    vllm-ascend's DyntraLB modules) into ``rank<r>.log`` with vLLM's prefix minus pid
    and time, as ``dyntra-emu replay`` reads them (after a first line with the engine
    settings the planner needs, which vLLM does not log); everything else at WARNING
    and above into ``rank<r>.vllm.log``."""
    dyntra_files = ("patch_dyntra_lb_core.py", "dyntra_lb_scheduler.py",
                    "recompute_scheduler.py")
    path = out_dir / f"rank{rank}.log"
    path.write_text(f"(EngineCore_DP{rank}) INFO emulated engine: max_num_seqs="
                    f"{spec.max_num_seqs} block_size={spec.block_size}\n")
    lines = logging.FileHandler(path, mode="a")
    lines.addFilter(lambda record: record.filename in dyntra_files)
    lines.setFormatter(logging.Formatter(
        f"(EngineCore_DP{rank}) %(levelname)s [%(filename)s:%(lineno)d] %(message)s"))
    other = logging.FileHandler(out_dir / f"rank{rank}.vllm.log", mode="w")
    other.setLevel(logging.WARNING)
    other.addFilter(lambda record: record.filename not in dyntra_files)
    other.setFormatter(logging.Formatter("%(levelname)s [%(filename)s:%(lineno)d] %(message)s"))
    log = logging.getLogger("vllm")
    for handler in list(log.handlers):
        log.removeHandler(handler)
    log.addHandler(lines)
    log.addHandler(other)
    log.setLevel(logging.INFO)
    log.propagate = False

