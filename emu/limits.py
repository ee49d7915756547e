"""Upper bounds on run settings, shared by ``emu.spec.validate`` and the CLI's flags.

A value past one of these would start rank processes that then exhaust the machine
(every rank keeps each KV block id; one process per rank) or overflow the C timeouts of
the launcher and gloo, so it is refused before anything starts.
"""

MAX_DP_SIZE = 1024
MAX_NUM_SEQS = 65_536
MAX_GPU_BLOCKS = 1_000_000
MAX_SECONDS = 1e6
