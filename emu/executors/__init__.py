"""Where the runs of a batch execute: the points of ``dyntra-emu sweep`` and the seeds of
``dyntra-emu ab --seeds`` and the trials of ``dyntra-emu tune``, each run one
``emu.run.run_checked(checked)`` of the checked run (``emu.spec.CheckedRun``) the
command made, checked once, on this machine.

One seam, two executors, chosen by name (``open_executor``):

- ``local`` (``emu.executors.local``): job processes on this machine, ``jobs`` at a
  time, each a fresh process that runs one checked run into its ``out_dir``;
- ``ray`` (``emu.executors.ray_cluster``): one Ray task per run on a Ray cluster (a
  local one started for the batch, or the one at an address); a process-transport run
  reserves its ``dp_size`` CPUs together on one node, a thread-transport run one CPU,
  and each run's files travel back to its ``out_dir`` here.

Both behave the same to their caller: ``run(runs, on_done)`` returns every run's
metrics in the order of ``runs`` and calls ``on_done(index)`` as each finishes; a
failed run stops the batch (``RunFailed``), SIGINT or SIGTERM too (``RunsInterrupted``),
and either way every run under way is stopped (its ``run.json`` says "interrupted") and
no queued run starts. ``ExecutorError`` is an executor that cannot take the batch,
raised before any run starts.
"""

from __future__ import annotations

from collections.abc import Callable

from emu.executors.base import (
    Executor,
    ExecutorError,
    RunFailed,
    RunsInterrupted,
    cpus_needed,
)
from emu.executors.local import LocalExecutor
from emu.executors.ray_cluster import RayExecutor

__all__ = ["EXECUTORS", "Executor", "ExecutorError", "RunFailed", "RunsInterrupted",
           "cpus_needed", "open_executor"]

# Each executor by name, made from the batch's flags: jobs (local) and the Ray address.
EXECUTORS: dict[str, Callable[[int, str | None], Executor]] = {
    "local": lambda jobs, address: LocalExecutor(jobs),
    "ray": lambda jobs, address: RayExecutor(address),
}


def open_executor(name: str, *, jobs: int = 1, address: str | None = None) -> Executor:
    """The executor ``name`` (a key of EXECUTORS): ``local`` with ``jobs`` job processes,
    ``ray`` on the cluster at ``address`` (None: a local Ray started for the batch).
    Nothing starts until it is entered."""
    return EXECUTORS[name](jobs, address)
