"""First code of a rank process, before the rank imports or runs anything heavy.

`emu.cluster.launcher.launch` starts each rank with this module's `main` as the target, in one
of two ways (`emu.cluster.rank_start`): a CPU rank is a fork of the launcher's fork
server, which has imported torch and the engine already (`emu.cluster.rank_preload`), so the
rank starts in milliseconds; an NPU rank is spawned (a fresh interpreter, which then
imports torch itself). Spawn unpickles the target and its arguments before calling it,
so this module and `RankSpec` (`emu.cluster.rank_spec`) import only the standard
library: either way a rank is tied to its parent (Linux PR_SET_PDEATHSIG) and deaf to
Ctrl-C within a few milliseconds of existing, before it imports or runs anything else.
Only then does it import the rank's side of the launch (and torch, unless preloaded)
and run `emu.cluster.rank_process.rank_main`.

The death chain: a spawned rank's parent is the launcher, whose death kills it. A
forked rank's parent is the fork server, which exits as soon as the process that
started it is gone (it watches a pipe that only that process holds once each rank has
closed its copy, see `leave_fork_server`), and its death kills the rank. That process
is the launcher, or the batch whose job is the launcher (`emu.run_apart`): such a
server outlives a job, so a forked rank is also killed by the kernel the moment its
launcher is gone (`die_with_launcher`). SIGKILL of the launcher therefore kills every
rank, either way.

Ctrl-C in a terminal reaches the whole process group, ranks included; the launcher
handles it and stops every rank, so a rank ignores SIGINT instead of printing a
traceback from wherever the interrupt found it. A spawned rank starts with SIGINT
blocked (the launcher blocks it while starting the rank) until it ignores it.
"""

from __future__ import annotations

import ctypes
import fcntl
import multiprocessing
import os
import select
import signal
import socket
import sys

from emu.cluster.rank_spec import RankSpec

_PR_SET_PDEATHSIG = 1
_F_SETSIG = getattr(fcntl, "F_SETSIG", 10)  # Linux's value, where Python does not name it


def die_with_parent(parent_pid: int) -> None:
    """Ask Linux to SIGKILL this process when its parent goes away; exit at once if the
    parent is already gone (it died before prctl took effect). Best effort: systems
    without PR_SET_PDEATHSIG rely on the launcher's own cleanup."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent_pid:
        os._exit(1)


def die_with_launcher() -> None:
    """In a process forked by a fork server: have Linux SIGKILL it the moment the process
    that asked for it (its launcher) is gone, whatever the server does. multiprocessing
    gives the new process the read end of a pipe whose write end only the launcher holds
    and never writes to (its "parent sentinel"); armed with O_ASYNC and F_SETSIG, the
    end of the launcher, which closes that end, makes the kernel send the signal. A
    launcher already gone reads as end-of-file at once: exit."""
    sentinel = multiprocessing.parent_process().sentinel
    fcntl.fcntl(sentinel, fcntl.F_SETOWN, os.getpid())
    fcntl.fcntl(sentinel, _F_SETSIG, signal.SIGKILL)
    fcntl.fcntl(sentinel, fcntl.F_SETFL, fcntl.fcntl(sentinel, fcntl.F_GETFL) | os.O_ASYNC)
    if select.select([sentinel], [], [], 0)[0]:
        os._exit(1)


def forked_by_fork_server() -> bool:
    forkserver = sys.modules.get("multiprocessing.forkserver")
    return forkserver is not None and forkserver.get_inherited_fds() is not None


def close_server_alive_pipe() -> None:
    """In a process forked by multiprocessing's fork server: close its copy of the
    server's "alive" pipe (see ``leave_fork_server``)."""
    server = sys.modules["multiprocessing.forkserver"]._forkserver
    if server._forkserver_alive_fd is not None:
        os.close(server._forkserver_alive_fd)
        server._forkserver_alive_fd = None


def leave_fork_server(environ: dict[str, str]) -> None:
    """In a process forked by multiprocessing's fork server (a rank, or a batch's job,
    ``emu.run_apart``): close its copy of the server's "alive" pipe. The server exits
    when every holder of that pipe is gone; with its children holding it, it would
    outlive a killed launcher and so would they (their parent-death signal waits for the
    server). CPython keeps the descriptor in a private attribute, the only place to find
    it. Then undo what the process inherited from the server rather than from its
    launcher: SIGTERM, which the server ignores (`emu.cluster.rank_preload`) and a rank
    or job is stopped with, and the environment, which is the launcher's as of the
    server's start, not as of this start."""
    close_server_alive_pipe()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.environ.clear()
    os.environ.update(environ)


def main(spec: RankSpec, payload: bytes, conn, store_listener: socket.socket | None) -> None:
    """The start target of every rank launched by `emu.cluster.launcher.launch`;
    ``store_listener`` is rank 0's only (``emu.cluster.rendezvous``)."""
    die_with_parent(spec.parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # The launcher started this rank with SIGINT blocked: one that came meanwhile was
    # pending and is dropped now (emu.cluster.launch_scope.StopSignals.deferred).
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    if forked_by_fork_server():
        leave_fork_server(spec.environ)
        die_with_launcher()
    from emu.cluster.rank_process import rank_main

    rank_main(spec, payload, conn, store_listener)
