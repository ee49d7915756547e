"""DyntraLB's planner (docs/planner.md): the gathered snapshot -> one plan per DP rank.

Every rank runs it after each active decode step, so it is pure (no torch, no state
between calls) and exact (all ranks must agree). Its modules:

- ``front``: the entry point, ``balance_load``, the ``Plan`` rows it returns and the
  reference's constants; it picks which implementation serves a call.
- ``registry``: the planners a run can select by name (``reference``, production's and
  the default, and the opt-in ones), each called like ``balance_load``.
- ``python`` (with ``python_card``): the Python planner, for calls with an observer,
  inputs the compiled planner declines, and installs without numba.
- ``compiled`` (with ``compiled_steps`` and ``compiled_card``): the same decisions
  compiled with numba into one loop, disk-cached per environment.
"""

from __future__ import annotations

import importlib

# ``front``'s public names, also here: this package was the module
# ``dyntra_lb/planner.py`` until the planner became a package, and callers import
# ``dyntra_lb.planner.balance_load``. Loaded on first use (``front`` loads the compiled
# planner), so the other modules of the package import without it.
_FRONT = ("balance_load", "Plan", "IMPLEMENTATION", "THROUGHPUT_FIXED",
          "THROUGHPUT_PER_BLOCK", "warm_up", "balance_load_native", "balance_load_python")
__all__ = list(_FRONT)


def __getattr__(name: str):
    if name not in _FRONT:
        raise AttributeError(f"module 'dyntra_lb.planner' has no attribute {name!r}")
    return getattr(importlib.import_module("dyntra_lb.planner.front"), name)
