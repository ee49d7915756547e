"""The collectives a step of an emulated rank can enter, by the name the event log, the
guard and ``--fault delay:site=...`` use for them.

One place for the names (torch-free, so that the CLI can list them at parse time): the
engine's own two here, DyntraLB's two from ``dyntra_lb.sites``.
"""

from dyntra_lb.sites import ALLGATHER_SITE, FLAG_SITE

# The all-reduce (MAX) of the lockstep clock after every forward, on the device group.
LOCKSTEP_SITE = "engine.lockstep"
# vLLM's DP-state all-reduce every 32nd step (whether any rank has unfinished work).
DP_SYNC_SITE = "engine.dp_sync"

# --planner-cost measured only: the emulator's MAX all-reduce of each rank's planner wall
# time on the DP group, so every rank charges the slowest (emu.rank.control_plane).
PLANNER_COST_SITE = "emu.planner_cost"

# In the order a step can enter them (the faults' sites: PLANNER_COST_SITE is not one).
COLLECTIVE_SITES = (LOCKSTEP_SITE, DP_SYNC_SITE, FLAG_SITE, ALLGATHER_SITE)
