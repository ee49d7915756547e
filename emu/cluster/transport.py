"""How the ranks of one run are hosted, behind one interface: ``Transport.run``.

- ``ProcessTransport``: one process per rank on this machine over gloo (HCCL for the
  device group on an NPU), forked from a preloaded fork server (``emu.cluster.launcher``);
- ``ThreadTransport``: every rank a green thread of this process over in-memory
  collectives, byte-identical results (``emu.cluster.threads``);
- ``TorchrunTransport``: this process is one rank of a cluster torchrun (or any launcher
  that sets its variables) started (``emu.cluster.rank_process.join_from_env``): the one-rank
  case, with torchrun owning the processes and their failures.

Process and thread ranks share one supervision policy (``emu.cluster.supervision``).
Every transport runs ``target(ctx, args)`` in each of its ranks and returns the results
it holds, by rank (under torchrun, this rank's only): for a run, the implementation's
``run_rank`` on the run's engine spec (``emu.run``). The process and torchrun transports
take the device kind the run chose (``emu.cluster.device.select_device``).

Rank threads and torchrun's rank run in this process and import torch here, when they
run; rank processes import it themselves. So a process that only launches rank
processes (a ``dyntra-emu`` command, a batch's driver, a Ray worker) never pays for
torch's import, nor waits for it before its ranks start.
"""

from __future__ import annotations

import pathlib
from abc import ABC, abstractmethod
from typing import Any

from emu.cluster.launcher import launch
from emu.rank.context import Preload, RankTarget


class Transport(ABC):
    @abstractmethod
    def run(self, target: RankTarget, args: Any, *, dp_size: int, out_dir: pathlib.Path,
            collective_timeout_s: float, run_timeout_s: float | None) -> list:
        """Run ``target(ctx, args)`` in every rank; the results this process holds."""


class ProcessTransport(Transport):
    def __init__(self, device: str, preload: Preload):
        self.device = device
        self.preload = preload

    def run(self, target, args, *, dp_size, out_dir, collective_timeout_s, run_timeout_s):
        return launch(target, args, dp_size=dp_size, device=self.device, out_dir=out_dir,
                      collective_timeout_s=collective_timeout_s, run_timeout_s=run_timeout_s,
                      preload=self.preload)


class ThreadTransport(Transport):
    def run(self, target, args, *, dp_size, out_dir, collective_timeout_s, run_timeout_s):
        from emu.cluster.threads import run_in_threads  # torch (see the module docstring)

        return run_in_threads(target, args, dp_size=dp_size, out_dir=out_dir,
                              collective_timeout_s=collective_timeout_s,
                              run_timeout_s=run_timeout_s)


class TorchrunTransport(Transport):
    """The launcher's watchdog and run timeout are not there: torchrun owns the
    processes, a hang ends with the collective timeout, and a failure propagates as the
    rank's exception."""

    def __init__(self, device: str):
        self.device = device

    def run(self, target, args, *, dp_size, out_dir, collective_timeout_s, run_timeout_s):
        from emu.cluster.rank_process import join_from_env  # torch (the module docstring)

        return [join_from_env(target, args, device=self.device, out_dir=out_dir,
                              collective_timeout_s=collective_timeout_s)]
