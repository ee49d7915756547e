"""Imported once by every fork server of CPU ranks, before it forks any
(`emu.cluster.rank_start` names this module first in each server's preload list, then the
implementation's own); never by a rank or the launcher itself.

It imports what every rank would otherwise import during its own start-up: torch and
torch.distributed, the rank side of a launch (`emu.cluster.rank_process`) and the rank
target (`emu.impl.run_rank`); and it loads the compiled
planner from numba's disk cache (`dyntra_lb.planner.warm_up`, 1-2 s and some 75 modules
that each rank of a DyntraLB run would load again). Each rank, a fork of the server,
then has all of it in memory from its first instruction (`emu.cluster.rank_boot`).
Without a disk cache (the first run of a fresh install) the warm-up compiles the planner
here, once.

It also makes the server ignore SIGTERM. A SIGTERM sent to the whole process group (as
some job runners do) must reach the launcher, which stops every rank and reports where
each one was; were the server to die of it first, every rank would die of its
parent-death signal without a word. A rank sets SIGTERM back to the default at once.
"""

import signal

import emu.cluster.rank_boot  # noqa: F401  the rank's start target
import emu.cluster.rank_process  # noqa: F401  torch, the rank's side of a launch
import emu.impl  # noqa: F401  the rank target
from dyntra_lb import planner

planner.warm_up()
signal.signal(signal.SIGTERM, signal.SIG_IGN)
