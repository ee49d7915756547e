"""DyntraLB: data-parallel load balancing for the decode side of a P/D-disaggregated
deployment, engine-agnostic. The public names are below (``__all__``); docs/api.md has
an example of each, docs/architecture.md the modules behind them.

The public names are the ones an engine needs to run DyntraLB, in the order it needs
them: parse and check the node's ``--additional-config`` (``load_additional_config``,
``AdditionalConfig``, ``DyntraLBConfig``, ``check_deployment``), hold DyntraLB's state
on each rank's scheduler (``DyntraLBPolicy``) and engine (``DyntraLBCoordinator``), and
plan a step (``balance_load`` and the ``Plan`` rows it returns).

Each name is imported on first use, so ``import dyntra_lb`` stays light: only
``DyntraLBCoordinator`` imports torch, and only ``balance_load`` and ``Plan`` load the
planner (numba's compiled kernel among it).

Modules that moved keep their old dotted names as aliases of the new ones
(``_MOVED``): ``import dyntra_lb.planners`` is ``dyntra_lb.planner.registry``.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dyntra_lb.config import (
        AdditionalConfig,
        DyntraLBConfig,
        check_deployment,
        load_additional_config,
    )
    from dyntra_lb.coordinator import DyntraLBCoordinator
    from dyntra_lb.planner.front import Plan, balance_load
    from dyntra_lb.policy import DyntraLBPolicy

# Each public name -> the module that defines it.
_HOMES = {
    "load_additional_config": "dyntra_lb.config",
    "AdditionalConfig": "dyntra_lb.config",
    "DyntraLBConfig": "dyntra_lb.config",
    "check_deployment": "dyntra_lb.config",
    "DyntraLBPolicy": "dyntra_lb.policy",
    "DyntraLBCoordinator": "dyntra_lb.coordinator",
    "balance_load": "dyntra_lb.planner.front",
    "Plan": "dyntra_lb.planner.front",
}
__all__ = ["load_additional_config", "AdditionalConfig", "DyntraLBConfig", "check_deployment",
           "DyntraLBPolicy", "DyntraLBCoordinator", "balance_load", "Plan"]


def __getattr__(name: str):
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'dyntra_lb' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # the next lookup does not come here
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


# Modules that moved (old dotted name -> new), importable under both: the flat planner
# modules became the package dyntra_lb/planner/ (its __init__ keeps the names of the
# old dyntra_lb/planner.py).
_MOVED = {
    "dyntra_lb.planners": "dyntra_lb.planner.registry",
    "dyntra_lb.planner_python": "dyntra_lb.planner.python",
    "dyntra_lb.planner_python_card": "dyntra_lb.planner.python_card",
    "dyntra_lb.planner_native": "dyntra_lb.planner.compiled",
    "dyntra_lb.planner_native_steps": "dyntra_lb.planner.compiled_steps",
    "dyntra_lb.planner_native_card": "dyntra_lb.planner.compiled_card",
}


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports an old name of ``_MOVED`` as its new module: the same module object, under
    both names in ``sys.modules``, its own ``__spec__`` kept."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in _MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        module = importlib.import_module(_MOVED[spec.name])
        spec.loader_state = module.__spec__
        return module

    def exec_module(self, module) -> None:
        # The import system set the old name's spec on the module; give it its own back.
        module.__spec__ = module.__spec__.loader_state


if not any(isinstance(finder, _MovedModules) for finder in sys.meta_path):
    sys.meta_path.append(_MovedModules())
