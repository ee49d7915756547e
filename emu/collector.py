"""How often a command's processes run Python's cyclic garbage collector.

The rank loop allocates many short-lived objects (requests' dicts, step records,
collective records, router snapshots) and few cycles. Under CPython's default
thresholds (a young collection every 700 net allocations, a full one after 100 of them)
one PR-recipe run of the kit collected the young generation 1,311 times and the whole
heap 10 times, each full collection walking every live object: about a tenth of the
command's CPU time. With a young generation of ``YOUNG_OBJECTS`` the same run collects
it some 40 times and never the whole heap; cycles are still freed, a little later, and
what the run computes does not change (no object's life decides an output).

``tune()`` is called first by the ``dyntra-emu`` command (``emu.cli``) and by every fork
server of CPU ranks (``emu.cluster.rank_preload``), whose ranks inherit it.
"""

from __future__ import annotations

import gc

# Net allocations of tracked objects between two young collections (CPython's: 700).
YOUNG_OBJECTS = 20_000


def tune() -> None:
    """Collect the young generation every ``YOUNG_OBJECTS`` allocations; the older
    generations keep CPython's ratios (see the module docstring)."""
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_OBJECTS, middle, old)
