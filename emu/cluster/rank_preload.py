"""Imported once by every fork server of CPU ranks, before it forks any
(`emu.cluster.rank_start` names this module first in each server's preload list, then the
implementation's own); never by a rank or the launcher itself.

It imports what every rank would otherwise import during its own start-up: torch and
torch.distributed, the rank side of a launch (`emu.cluster.rank_process`) and the rank
target (`emu.impl.Implementation.run_rank`); and it loads the compiled planner from
numba's disk cache (`dyntra_lb.planner.front.warm_up`: numba and its modules, which each
rank of a DyntraLB run would load again). Each rank, a fork of the server, then has all
of it in memory from its first instruction (`emu.cluster.rank_boot`).
Without a disk cache (the first run of a fresh install) the warm-up compiles the planner
here, once.

Before any of it, the server points itself at the kit's bytecode cache
(`emu.bytecode.use_cache`), so that what it imports is compiled once, not at every run.

It also makes the server ignore SIGTERM. A SIGTERM sent to the whole process group (as
some job runners do) must reach the launcher, which stops every rank and reports where
each one was; were the server to die of it first, every rank would die of its
parent-death signal without a word. A rank sets SIGTERM back to the default at once.

And it makes the server remove its socket when it exits, and the socket's directory if
no sibling's socket is left there. The launcher's multiprocessing makes that directory
(``pymp-*`` in TMPDIR, one per launcher, shared by all its fork servers) and removes it
at its own exit; a launcher killed by SIGKILL cannot, and the directory was left behind.
A server outlives it by design (it exits once the launcher is gone,
``emu.cluster.rank_boot``), so the last server to go removes the directory then. While
the launcher lives, the directory keeps a running server's socket (``emu.cluster.
rank_start`` starts a server before it stops the one it evicts).

Having removed its socket, the server leaves without interpreter finalization (module
teardown, C++ static destructors), which with torch loaded is long for a process about
to vanish (benchmarks/RESULTS.md, "Start-up and teardown costs"), and an evicted
server's launcher waits for it.
"""

import atexit
import os
import signal
import sys
from multiprocessing import forkserver

from emu import collector
from emu.bytecode import use_cache

# The server may have been started with -B (PYTHONDONTWRITEBYTECODE in the command's
# flags): it compiles what it imports below once, into the kit's cache, not at every run.
# Its ranks inherit the command's collector pace (emu/collector.py).
use_cache()
collector.tune()

import emu.cluster.rank_boot  # noqa: E402,F401  the rank's start target
import emu.cluster.rank_process  # noqa: E402,F401  torch, the rank's side of a launch
import emu.impl  # noqa: E402,F401  the rank target
from dyntra_lb.planner import front as planner  # noqa: E402

_SERVER_PID = os.getpid()


def serve_here() -> None:
    """In a process forked from this server that becomes a fork server itself
    (``emu.cluster.rank_start._serve``): it is the server ``leave`` is for now."""
    global _SERVER_PID
    _SERVER_PID = os.getpid()


def remove_socket() -> None:
    """At the server's exit: remove its socket, and the ``pymp-*`` directory it lies in
    when no sibling's socket is left there. The server's main loop records the socket's
    address where the launcher keeps it (CPython has no public accessor). Called in the
    server only (``leave``, ``emu.cluster.rank_start._serve``)."""
    address = forkserver._forkserver._forkserver_address
    if not isinstance(address, str):
        return  # no address, or one in the abstract namespace (bytes)
    try:
        os.unlink(address)
    except OSError:
        pass
    directory = os.path.dirname(address)
    if os.path.basename(directory).startswith("pymp-"):
        try:
            os.rmdir(directory)  # only when empty: the last server to go removes it
        except OSError:
            pass


def leave() -> None:
    """At the server's exit: ``remove_socket``, then exit at once. atexit calls the last
    registered handler first, so the handlers of the modules the server imports after
    this one (the implementation's) have run; the earlier ones (torch's, logging's,
    multiprocessing's) have nothing to do in a server. The exit status is the one the
    interpreter would give: 1 after an uncaught exception (a preload that failed to
    import), which leaves ``sys.last_value`` behind, else 0 (the loop's SystemExit once
    the launcher is gone). It does nothing in the ranks and jobs that inherit it (a rank
    runs its atexit handlers before its ``os._exit``)."""
    if os.getpid() != _SERVER_PID:
        return
    remove_socket()
    os._exit(1 if hasattr(sys, "last_value") else 0)


planner.warm_up()
signal.signal(signal.SIGTERM, signal.SIG_IGN)
atexit.register(leave)
