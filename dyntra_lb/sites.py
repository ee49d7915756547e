"""The names of DyntraLB's collectives, as ``DyntraLBCoordinator`` reports them to its
``collective`` hook (an emulator's recorder, a fault plan's ``site=``).

Kept apart from the coordinator, which imports torch, so that a command line can list
them without importing it.
"""

# The dynamic-mode all-reduce (MAX) of the "some rank holds a long request" flag.
FLAG_SITE = "dyntra_lb.flag"
# The all-gather of every rank's block-count snapshot.
ALLGATHER_SITE = "dyntra_lb.allgather"
