"""What runs inside each emulated rank, behind one interface.

An implementation is a module with two functions:

- ``check(config, *, dp_size, async_scheduling, vllm_ascend, faults)`` — in the launching
  process, before any rank starts: the decode node's startup checks and whatever else
  the implementation needs; raises ValueError naming what cannot run;
- ``build(ctx, spec, config, out_dir)`` — in each rank process: the rank's engine, an
  object whose ``run()`` returns the rank's ``emu.engine.core.RankSummary``.

``kit`` is our DyntraLB (``dyntra_lb``) in our stub vLLM engine loop and scheduler;
``vllm-ascend`` is vllm-ascend's own DyntraLB on vLLM's engine loop and scheduler
(imported only in the ranks of such a run: it needs vLLM).
"""

from __future__ import annotations

import importlib
from types import ModuleType

from dyntra_lb import planners

IMPLS = {"kit": "emu.impl.kit", "vllm-ascend": "emu.impl.vllm_ascend"}
# The planners a run can select (RunSpec.planner, --planner): ours from the registry
# (dyntra_lb.planners; "reference" is production's algorithm), valid with either impl
# (in a vllm-ascend rank one takes the place of _balance_load), and "vllm-ascend",
# production's own _balance_load, valid only with impl "vllm-ascend".
PLANNERS = (*planners.NAMES, "vllm-ascend")


def planner_name(planner: str | None, impl: str) -> str:
    """The planner a run's ranks run: ``planner`` (RunSpec.planner, --planner) if given,
    else the impl's own ("reference" for the kit, "vllm-ascend" for vllm-ascend)."""
    if planner is not None:
        return planner
    return planners.REFERENCE if impl == "kit" else "vllm-ascend"


def get(name: str) -> ModuleType:
    """The implementation module named ``name`` (one of ``IMPLS``)."""
    return importlib.import_module(IMPLS[name])


def check(name: str, config, *, dp_size: int, async_scheduling: bool = False,
          vllm_ascend=None, faults=None):
    """Run implementation ``name``'s checks (see the module docstring); ``faults`` is
    the run's ``emu.cluster.faults.FaultPlan`` or None."""
    return get(name).check(config, dp_size=dp_size, async_scheduling=async_scheduling,
                           vllm_ascend=vllm_ascend, faults=faults)
