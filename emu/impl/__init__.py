"""What runs inside each emulated rank, behind one interface: ``Implementation``.

``kit`` is our DyntraLB (``dyntra_lb``) in our stub vLLM engine loop and scheduler;
``vllm-ascend`` is vllm-ascend's own DyntraLB on vLLM's engine loop and scheduler
(its module imports vLLM only when a rank builds its engine). Both engines are a
``emu.rank.harness.RankHarness``, so both write the same logs from the same clock.

A run resolves its implementation once, in the launching process (``resolve``, called
by ``emu.spec.check``): the startup checks, and what the run needs found once (for
vllm-ascend, its tree). The resolved implementation prepares the transport (what a
rank process imports; whether ranks can share this process) and says what
``metrics.json`` records of it; ``run_rank`` is what a transport runs in every rank,
on the run's ``emu.rank.engine_spec.EngineSpec``.
"""

from __future__ import annotations

import importlib
import random
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from dyntra_lb.config import AdditionalConfig
from dyntra_lb.planner import registry as planners
from emu.rank.context import Preload, RankContext, RankSummary
from emu.rank.engine_spec import EngineSpec

if TYPE_CHECKING:  # the harness imports torch, which the CLI's parser must not wait for
    from emu.rank.harness import RankHarness

IMPLS = {"kit": "emu.impl.kit", "vllm-ascend": "emu.impl.vllm_ascend"}
# The planners a run can select (RunSpec.planner, --planner): ours from the registry
# (dyntra_lb.planner.registry; "reference" is production's algorithm), valid with either impl
# (in a vllm-ascend rank one takes the place of _balance_load), and "vllm-ascend",
# production's own _balance_load, valid only with impl "vllm-ascend".
PLANNERS = (*planners.NAMES, "vllm-ascend")


class Implementation(ABC):
    """One DyntraLB implementation as one run uses it (see the module docstring)."""

    # The planner its ranks run when the run names none (RunSpec.planner).
    own_planner: ClassVar[str]

    @classmethod
    @abstractmethod
    def resolve(cls, config: AdditionalConfig, *, dp_size: int, async_scheduling: bool,
                vllm_ascend: str | None) -> Implementation:
        """In the launching process, before any rank starts: the decode node's startup
        checks and whatever else the implementation needs (``vllm_ascend``: the tree
        ``RunSpec.vllm_ascend`` names); raises ValueError naming what cannot run."""

    def dp_sync_interval(self, requested: int | None) -> int | None:
        """The DP sync cadence its ranks run (``emu.rank.dp_sync``) for the run's
        ``RunSpec.dp_sync_interval``; raises ValueError when the implementation cannot
        run ``requested``. The kit runs the one requested."""
        return requested

    @abstractmethod
    def preload(self) -> Preload:
        """What a rank process imports before it starts (its fork server's)."""

    def check_rank_threads(self) -> None:
        """In the launching process, before the ranks start as threads of this process
        (the thread transport): raises ValueError naming what cannot share it. Nothing,
        unless the implementation says otherwise."""
        return None

    @abstractmethod
    def build(self, ctx: RankContext, spec: EngineSpec) -> RankHarness:
        """In each rank: the rank's engine for ``spec``, ready to ``run()``, writing
        into ``ctx.out_dir``."""

    @abstractmethod
    def describe(self, spec: EngineSpec) -> dict:
        """What ``metrics.json`` records of the implementation a run used."""

    def make_engine(self, ctx: RankContext, spec: EngineSpec) -> RankHarness:
        """This rank's engine, seeded. Tests that need a sabotaged rank start from here.
        Rank threads of one process seed the same process-wide RNGs with the same seed;
        no engine code draws from them (a draw would depend on how the threads
        interleave)."""
        random.seed(spec.seed)
        np.random.seed(spec.seed)
        return self.build(ctx, spec)

    def run_rank(self, ctx: RankContext, spec: EngineSpec) -> RankSummary:
        """The target every transport runs in each rank (this method, bound to the run's
        implementation, is what a rank process unpickles)."""
        return self.make_engine(ctx, spec).run()


def get(name: str) -> type[Implementation]:
    """The implementation named ``name`` (one of ``IMPLS``), to resolve for a run."""
    return importlib.import_module(IMPLS[name]).IMPLEMENTATION


def planner_name(planner: str | None, impl: str) -> str:
    """The planner a run's ranks run: ``planner`` (RunSpec.planner, --planner) if given,
    else the impl's own ("reference" for the kit, "vllm-ascend" for vllm-ascend)."""
    return planner if planner is not None else get(impl).own_planner
