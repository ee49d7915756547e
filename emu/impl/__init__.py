"""What runs inside each emulated rank, behind one interface: ``Implementation``.

``kit`` is our DyntraLB (``dyntra_lb``) in our stub vLLM engine loop and scheduler;
``vllm-ascend`` is vllm-ascend's own DyntraLB on vLLM's engine loop and scheduler
(its module imports vLLM only when a rank builds its engine). Both engines are a
``emu.rank.harness.RankHarness``, so both write the same logs from the same clock.

``run_rank`` is what a transport runs in every rank: the implementation's engine for
the run's spec, run to the end.
"""

from __future__ import annotations

import importlib
import random
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any

import numpy as np

from dyntra_lb.config import AdditionalConfig
from dyntra_lb.planner import registry as planners
from emu.rank.context import Preload, RankContext, RankSummary

if TYPE_CHECKING:  # the harness imports torch, which the CLI's parser must not wait for
    from emu.rank.harness import RankHarness

IMPLS = {"kit": "emu.impl.kit", "vllm-ascend": "emu.impl.vllm_ascend"}
# The planners a run can select (RunSpec.planner, --planner): ours from the registry
# (dyntra_lb.planner.registry; "reference" is production's algorithm), valid with either impl
# (in a vllm-ascend rank one takes the place of _balance_load), and "vllm-ascend",
# production's own _balance_load, valid only with impl "vllm-ascend".
PLANNERS = (*planners.NAMES, "vllm-ascend")


def planner_name(planner: str | None, impl: str) -> str:
    """The planner a run's ranks run: ``planner`` (RunSpec.planner, --planner) if given,
    else the impl's own ("reference" for the kit, "vllm-ascend" for vllm-ascend)."""
    if planner is not None:
        return planner
    return planners.REFERENCE if impl == "kit" else "vllm-ascend"


class Implementation(ABC):
    """One DyntraLB implementation as the emulator runs it."""

    @abstractmethod
    def check(self, config: AdditionalConfig, *, dp_size: int, async_scheduling: bool,
              vllm_ascend: str | None) -> None:
        """In the launching process, before any rank starts: the decode node's startup
        checks and whatever else the implementation needs; raises ValueError naming what
        cannot run."""

    @abstractmethod
    def preload(self, spec: Any) -> Preload:
        """What a rank process of ``spec`` imports before it starts (its fork server's)."""

    def check_rank_threads(self, spec: Any) -> None:
        """In the launching process, before the ranks of ``spec`` start as threads of this
        process (the thread transport): raises ValueError naming what cannot share it.
        Nothing, unless the implementation says otherwise."""
        return None

    @abstractmethod
    def build(self, ctx: RankContext, spec: Any, config: AdditionalConfig) -> RankHarness:
        """In each rank: the rank's engine for the validated ``spec`` (``emu.spec.RunSpec``),
        ready to ``run()``, writing into ``ctx.out_dir``."""

    @abstractmethod
    def describe(self, spec: Any) -> dict:
        """What ``metrics.json`` records of the implementation a run used."""


def get(name: str) -> Implementation:
    """The implementation named ``name`` (one of ``IMPLS``)."""
    return importlib.import_module(IMPLS[name]).IMPLEMENTATION


def make_engine(ctx: RankContext, spec: Any, config: AdditionalConfig) -> RankHarness:
    """This rank's engine for ``spec`` (validated), seeded. Tests that need a sabotaged
    rank start from here. Rank threads of one process seed the same process-wide RNGs
    with the same seed; no engine code draws from them (a draw would depend on how the
    threads interleave)."""
    random.seed(spec.seed)
    np.random.seed(spec.seed)
    return get(spec.impl).build(ctx, spec, config)


def run_rank(ctx: RankContext, args: tuple[Any, AdditionalConfig]) -> RankSummary:
    """The target every transport runs in each rank: ``args`` is the run's validated
    spec and its parsed additional config."""
    spec, config = args
    return make_engine(ctx, spec, config).run()
