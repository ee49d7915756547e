"""The contract between a transport and what runs in a rank.

A transport (``emu.cluster``: rank processes, rank threads, torchrun) makes each rank's
groups and hands the rank a ``RankContext``; the rank's engine runs and hands back a
``RankSummary``. What depends on how ranks are hosted, and nothing else, reaches the
rank through ``RankContext.host``: a rank process owns its process (``ProcessHost``),
while the rank threads of one process share it (``emu.cluster.threads``) and need the
process's logging and module-level state kept per rank.
"""

from __future__ import annotations

import logging
import pathlib
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # torch: the CLI imports this module and must not wait for torch
    import torch
    import torch.distributed as dist

    from emu.rank.recorder import GuardSlot


class StallError(RuntimeError):
    """A rank holds unfinished requests but has scheduled nothing for ``stall_steps``
    iterations."""


@dataclass(frozen=True)
class RankSummary:
    """One rank's totals, returned to the launching process.

    ``steps``: non-idle iterations (step records), ``dummy_steps`` among them;
    ``waves``: waves completed; ``clock_s``: virtual time at the end; ``num_plans``:
    DyntraLB plans generated; ``num_collectives``: every collective issued (all groups);
    ``truncated``: stopped by ``max_steps``; ``loop_wall_s``: wall time of the loop.
    """

    rank: int
    steps: int
    dummy_steps: int
    waves: int
    clock_s: float
    num_finished: int
    num_plans: int
    num_collectives: int
    truncated: bool
    loop_wall_s: float


class Host(Protocol):
    """What the process a rank runs in offers it (see the module docstring)."""

    # Shares the plans of one snapshot among ranks in one address space: ``plan_memo(key,
    # compute)`` returns the result of the first rank's ``compute()`` for ``key``. None
    # where no other rank shares it.
    plan_memo: Callable[[Any, Callable[[], Any]], Any] | None

    def route_log(self, logger_name: str, handlers: list[logging.Handler]) -> None:
        """Records this rank logs on ``logger_name`` go to ``handlers``, nowhere else."""

    def keep_per_rank(self, module: ModuleType, name: str) -> None:
        """``module.name`` is set by the rank's engine for itself alone."""


class ProcessHost:
    """What a rank that owns its process is offered: its log records go straight to its
    handlers, no plans are shared, module-level state is its own. The thread transport's
    host (``emu.cluster.threads.ThreadHost``) offers the same three for rank threads."""

    plan_memo = None  # no other rank shares this address space

    def route_log(self, logger_name: str, handlers: list[logging.Handler]) -> None:
        """Records this rank logs on ``logger_name`` go to ``handlers`` (INFO and up,
        each handler filtering further), and nowhere else."""
        log = logging.getLogger(logger_name)
        for handler in list(log.handlers):
            log.removeHandler(handler)
        for handler in handlers:
            log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False

    def keep_per_rank(self, module: ModuleType, name: str) -> None:
        """``module.name`` is set by the rank's engine for itself alone (a config
        singleton): in a process of its own, it is."""


@dataclass
class RankContext:
    """Handed to each rank by its transport. Tensors for ``device_group`` collectives
    must live on ``device``; ``dp_group`` collectives take CPU tensors. ``guard`` is the
    slot the rank's collective recorder publishes into (None: a private one, nobody
    watches); ``host`` is what the rank's process offers it (see the module docstring)."""

    rank: int  # DP rank
    dp_size: int
    local_rank: int
    dp_group: dist.ProcessGroup  # gloo, CPU tensors: wave sync + DyntraLB collectives
    device_group: dist.ProcessGroup  # gloo on CPU / HCCL on NPU: the lockstep collective
    device: torch.device  # cpu, or npu:<local_rank>
    out_dir: pathlib.Path | None
    guard: GuardSlot | None = None
    host: Host = field(default_factory=ProcessHost)


# A rank's target: what a transport runs in each rank with the rank's context.
RankTarget = Callable[[RankContext, Any], Any]


@dataclass(frozen=True)
class Preload:
    """What a rank process of an implementation imports before its run starts: a fork
    server imports ``modules`` once, with ``environ`` set, and every rank forked from it
    has them in memory from its first instruction (``emu.cluster.rank_start``).

    With a ``base``, the server is a fork of the base's server (shared by every preload
    with that base) that then sets ``environ`` and imports ``modules``: one vllm-ascend
    tree's server costs the import of the tree, not of vLLM again."""

    modules: tuple[str, ...] = ()
    environ: tuple[tuple[str, str], ...] = ()
    base: Preload | None = None
