"""``--impl vllm-ascend``: vllm-ascend's own DyntraLB, unmodified, in every rank.

``resolve`` runs in the launching process before any rank starts (tree, vLLM version,
torch_npu, scheduler variant), once per run; ``build`` runs in each rank on the run's
engine spec: it routes the rank's log lines, imports the resolved tree, builds the rank's
``VllmConfig`` and the engine (``engine.EmulatedRank``).

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
from dataclasses import dataclass

from dyntra_lb.config import check_deployment
from emu.impl import Implementation
from emu.impl.vllm_ascend import tree as trees
from emu.impl.vllm_ascend.tree import ENV_VAR, Tree, TreeError
from emu.rank import dp_sync
from emu.rank.context import Preload

# The tree a fork server of vllm-ascend ranks imports ("": the installed vllm_ascend).
PRELOAD_TREE_VAR = "DYNTRA_EMU_PRELOAD_TREE"
# What every tree's fork server has before it imports its tree: vLLM's engine core and
# scheduler, and the rank's engine (no tree: see rank_state).
VLLM_PRELOAD = Preload(("emu.impl.vllm_ascend.engine",), (("VLLM_CONFIGURE_LOGGING", "0"),))

__all__ = ["IMPLEMENTATION", "Tree", "TreeError"]


@dataclass(frozen=True)
class VllmAscendImplementation(Implementation):
    """vllm-ascend's DyntraLB from ``tree`` (checked, its commit read once; its content
    hashed once, when described), on the scheduler ``variant`` the config selects
    (``dyntra_lb.config.check_deployment``: plain, async, recompute)."""

    tree: Tree
    variant: str

    own_planner = "vllm-ascend"
    # What RunSpec.vllm_ascend (--vllm-ascend) is when not given.
    tree_default = f"${ENV_VAR}, else the installed vllm_ascend"

    @classmethod
    def resolve(cls, config, *, dp_size: int, async_scheduling: bool,
                vllm_ascend: str | None) -> VllmAscendImplementation:
        """Everything that can fail before a rank starts: the startup checks of a decode
        node, the tree, vLLM."""
        variant = check_deployment(config, kv_role="kv_consumer", data_parallel_size=dp_size,
                                   async_scheduling=async_scheduling)
        return cls(trees.resolve(vllm_ascend), variant)

    def dp_sync_interval(self, requested: int | None) -> int | None:
        """The installed vLLM's DP sync cadence (``emu.rank.dp_sync``): vLLM >= 0.30's
        step 1 and every ``requested`` steps (its default 16 when None); vLLM < 0.30's
        32-step cadence, which no interval can change."""
        version = self.tree.vllm_version
        if dp_sync.has_configurable_cadence(version):
            return dp_sync.DEFAULT_INTERVAL if requested is None else requested
        if requested is not None:
            raise ValueError(
                f"the installed vLLM {version} syncs the DP group every "
                f"{dp_sync.LEGACY_INTERVAL} steps and has no --dp-sync-interval (vLLM >= "
                "0.30 has): leave the flag out, or run a vLLM >= 0.30")
        return None

    def preload(self) -> Preload:
        """The tree (``emu.impl.vllm_ascend.preload``), in a server forked from the one
        that imported vLLM and the engine (``VLLM_PRELOAD``), which every tree shares."""
        root = self.tree.root
        return Preload(("emu.impl.vllm_ascend.preload",),
                       ((PRELOAD_TREE_VAR, "" if root is None else str(root)),),
                       base=VLLM_PRELOAD)

    def check_rank_threads(self) -> None:
        """One vllm-ascend tree per process (``rank_state``)."""
        from emu.impl.vllm_ascend.rank_state import check_one_tree

        check_one_tree(self.tree)

    def run_rank(self, ctx, spec):
        """The rank, run; on a vLLM the tree does not pin, an error of the kind that
        API drift raises is the tree's one line (``Tree.drift_error``)."""
        try:
            return super().run_rank(ctx, spec)
        except _DRIFT_ERRORS as exc:
            if self.tree.on_pinned_vllm:
                raise
            raise self.tree.drift_error(exc) from exc

    def build(self, ctx, spec):
        """This rank's engine, ready to ``run()``."""
        os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")
        from emu.impl.vllm_ascend import rank_state
        from emu.impl.vllm_ascend.engine import EmulatedRank
        from emu.impl.vllm_ascend.tree import import_tree
        from emu.impl.vllm_ascend.vllm_config import (
            build_vllm_config,
            max_model_len_of,
            model_dir,
            preset_ascend_config,
        )

        config = spec.config
        _route_logs(ctx, spec)
        core = import_tree(self.tree.root)
        rank_state.keep_per_rank(ctx.host)
        if config.dyntra_lb.enabled:
            # What vllm-ascend's run_engine_core wrapper (not run here) logs first.
            core._print_rank_0("Enable DyntraLB DP load balancing.", ctx.rank,
                               config.dyntra_lb.enable_diagnostics)
        model_path = model_dir(ctx.out_dir, max_model_len_of(spec))
        vllm_config = build_vllm_config(
            spec, rank=ctx.rank, dp_size=ctx.dp_size, variant=self.variant,
            dyntra_lb_enabled=config.dyntra_lb.enabled, model_path=model_path,
            additional_config=config.raw)
        preset_ascend_config(vllm_config)
        return EmulatedRank(
            ctx, spec, vllm_config=vllm_config, core_module=core,
            dyntra_lb_enabled=core._get_dyntra_lb_config(vllm_config).enabled)

    def describe(self, spec) -> dict:
        return {"impl": "vllm-ascend", "async_scheduling": spec.async_scheduling,
                "planner": spec.planner, **self.tree.describe()}


IMPLEMENTATION = VllmAscendImplementation

# What code written against another vLLM raises when an API it uses moved or changed.
_DRIFT_ERRORS = (ImportError, AttributeError, TypeError, NameError, NotImplementedError)

# The files of vllm-ascend's DyntraLB, whose log lines are the rank's DyntraLB log.
_DYNTRA_FILES = ("patch_dyntra_lb_core.py", "dyntra_lb_scheduler.py",
                 "recompute_scheduler.py")


def _route_logs(ctx, spec) -> None:
    """vLLM's and vllm-ascend's log lines of this rank: the DyntraLB lines (from
    vllm-ascend's DyntraLB modules) into ``rank<r>.log`` with vLLM's prefix minus pid
    and time, as ``dyntra-emu replay`` reads them (after a first line with the engine
    settings the planner needs, which vLLM does not log); everything else at WARNING
    and above into ``rank<r>.vllm.log``."""
    rank, out_dir = ctx.rank, ctx.out_dir
    path = out_dir / f"rank{rank}.log"
    path.write_text(f"(EngineCore_DP{rank}) INFO emulated engine: max_num_seqs="
                    f"{spec.max_num_seqs} block_size={spec.block_size}\n")
    lines = logging.FileHandler(path, mode="a")
    lines.addFilter(lambda record: record.filename in _DYNTRA_FILES)
    lines.setFormatter(logging.Formatter(
        f"(EngineCore_DP{rank}) %(levelname)s [%(filename)s:%(lineno)d] %(message)s"))
    other = logging.FileHandler(out_dir / f"rank{rank}.vllm.log", mode="w")
    other.setLevel(logging.WARNING)
    other.addFilter(lambda record: record.filename not in _DYNTRA_FILES)
    other.setFormatter(logging.Formatter("%(levelname)s [%(filename)s:%(lineno)d] %(message)s"))
    ctx.host.route_log("vllm", [lines, other])
