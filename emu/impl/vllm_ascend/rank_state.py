"""vLLM's and vllm-ascend's state outside the engine object, and how each rank keeps its own.

A rank process has all of it to itself. Rank threads (the thread transport) share one
process, so each piece is either kept per rank (``RankContext.host.keep_per_rank``: the
rank's value is in place whenever the rank runs), the same for every rank of a run by
construction, or refused:

- **vllm-ascend's config singleton** (``vllm_ascend.ascend_config._ASCEND_CONFIG``): set by
  ``vllm_config.preset_ascend_config`` for the rank's ``VllmConfig``, read by DyntraLB's
  ``_init_data_parallel``: kept per rank.
- **vLLM's "log once" caches** (``vllm.logger._print_{debug,info,warning}_once``, each an
  ``lru_cache``): a line logged once per process would reach only the first rank's log;
  each rank gets fresh caches, kept per rank.
- **the ``vllm`` logger**, whose records are the rank's DyntraLB log and ``rank<r>.vllm.log``:
  routed per rank (``RankContext.host.route_log``).
- **the tree's modules and the vLLM classes its patches replace on import**
  (``patch_balance_schedule`` and ``patch_dyntra_lb_core`` set
  ``vllm.v1.core.sched.scheduler.Scheduler``, ``vllm.v1.engine.core.DPEngineCoreProc`` and
  ``EngineCoreProc.run_engine_core``, keeping the originals they found): the same for every
  rank of a run, since every rank runs the same tree. A second tree cannot be imported over
  them in the same process (its patches would subclass the first tree's), so rank threads
  of a tree other than the one this process imported are refused before any rank starts
  (``check_one_tree``); rank processes, forked per tree, are never affected.
- **what vLLM's ``EngineCore.__init__`` sets process-wide**: ``gc.freeze()`` (harmless:
  the thread transport unfreezes when its last run ends), the environment-variable cache
  (the environment is the same for every rank), the prefix-cache ``NONE_HASH`` (random per
  process, unused: prefix caching is off), the general plugins (loaded once, none here).
- **the environment variable** ``VLLM_CONFIGURE_LOGGING=0`` (set before vLLM is imported,
  the same for every rank).
"""

from __future__ import annotations

import functools
import sys

from emu.impl.vllm_ascend.tree import Tree, TreeError

_ONCE_CACHES = ("_print_debug_once", "_print_info_once", "_print_warning_once")


def keep_per_rank(host) -> None:
    """In a rank, before its engine is built: the pieces kept per rank (see the module
    docstring) get their own values. ``host`` is the rank's ``RankContext.host``."""
    import vllm.logger as vllm_logger
    import vllm_ascend.ascend_config as ascend_config

    host.keep_per_rank(ascend_config, "_ASCEND_CONFIG")
    for name in _ONCE_CACHES:
        host.keep_per_rank(vllm_logger, name)
        cached = getattr(vllm_logger, name)
        setattr(vllm_logger, name, functools.lru_cache(cached.__wrapped__))


def check_one_tree(tree: Tree) -> None:
    """Before rank threads of ``tree`` start in this process: refuse when this process has
    imported another vllm-ascend already (see the module docstring)."""
    imported = sys.modules.get("vllm_ascend")
    if imported is None or imported.__file__ is None:
        return
    from pathlib import Path

    root = Path(imported.__file__).resolve().parent.parent
    wanted = tree.root if tree.root is not None else root
    if root != wanted:
        raise TreeError(
            f"rank threads run one vllm-ascend tree per process: this process imported "
            f"{root} already and cannot import {wanted} over it (its patches replace vLLM's "
            "classes); run this tree with --transport process, or in a new process")
