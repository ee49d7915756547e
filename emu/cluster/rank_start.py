"""How a rank process comes to exist: forked from a fork server that has imported what
the rank needs (CPU), or spawned (NPU). A batch's job processes, each hosting one run
(``emu.run_apart``), start the same way.

A rank that imports torch, vLLM and a vllm-ascend tree itself spends seconds of CPU
before its first step, many more for vllm-ascend than for the kit (benchmarks/RESULTS.md,
"Start-up and teardown costs"), and with more ranks than cores they all import at once.
So CPU ranks are forks of a multiprocessing fork server that has
imported it all once: ``emu.cluster.rank_preload`` (torch, the rank's side of a launch,
the compiled planner) plus the implementation's ``Preload`` (``emu.impl``: the kit's
engine; vLLM, vllm-ascend's tree and its engine). One server per ``Preload``, started by
the first launch that needs it and reused by every later one of this process (a pytest
worker, a CLI command that runs twice); at most ``MAX_SERVERS`` are kept, the least
recently used is stopped. A ``Preload`` with a ``base`` gets a server forked from the
base's server (``_ForkedServer``): every vllm-ascend tree's server is a fork of one that
imported vLLM, and costs only its tree's import, a small part of vLLM's. A server's
environment is the launcher's at the time it started plus the preload's variables; a
forked rank takes the launcher's environment as of its own launch
(``emu.cluster.rank_boot``).

NPU ranks are spawned, each a fresh interpreter that imports torch_npu itself: whether
torch_npu survives a fork once imported cannot be checked without the hardware, and a
device runtime does not once initialised (vLLM, too, spawns its workers when CUDA is).
"""

from __future__ import annotations

import collections
import contextlib
import importlib
import multiprocessing
import os
import socket
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from multiprocessing import connection, forkserver, util

from dyntra_lb.planner import front as planner
from emu.rank.context import Preload

MAX_SERVERS = 3
# How often a process being stopped is sent SIGTERM again (see stop_processes).
RESEND_S = 0.1
# How ranks start, per device kind (see the module docstring).
START_METHOD = {"cpu": "forkserver", "npu": "spawn"}

_servers: collections.OrderedDict[Preload, forkserver.ForkServer] = collections.OrderedDict()
# Held while a rank starts from a fork server (``RankStarter.starting``); reentrant, as
# starting a rank may start a forked server, which starts from its base server.
_STARTING = threading.RLock()
# A fork server's client side (CPython's private fields, no public accessor): its socket,
# its pid and, in newer Pythons, the key each connection authenticates with.
_CONNECTION = ("_forkserver_address", "_forkserver_pid", "_forkserver_authkey")


class RankStarter:
    """Where the ranks of one launch come from: ``context`` makes their processes and
    pipes, ``parent_pid`` is their parent (the fork server, or this process), and
    ``starting()`` is held while a rank process starts."""

    def __init__(self, context, parent_pid: int, server: forkserver.ForkServer | None = None):
        self.context = context
        self.parent_pid = parent_pid
        self._server = server

    def shared_server(self) -> dict | None:
        """How to reach the fork server, for a process it forks to start processes of its
        own from the same server (``use_parent_server``); None when spawning."""
        if self._server is None:
            return None
        return {name: getattr(self._server, name) for name in _CONNECTION
                if hasattr(self._server, name)}

    @contextlib.contextmanager
    def starting(self) -> Iterator[None]:
        """multiprocessing asks its one module-level fork server for every new process
        (``multiprocessing.forkserver.connect_to_new_process``); while a rank starts, that
        is this launch's server. One rank starts at a time in this process (launches in
        two threads): were one thread to put the default back while the other's rank
        starts, that rank would be forked by multiprocessing's own server, not its
        launch's, and exit at once, its parent not the one it was told of."""
        if self._server is None:
            yield
            return
        with _STARTING:
            default = forkserver.connect_to_new_process
            forkserver.connect_to_new_process = self._server.connect_to_new_process
            try:
                yield
            finally:
                forkserver.connect_to_new_process = default


def rank_starter(device_kind: str, preload: Preload) -> RankStarter:
    """The starter of a launch's ranks (see the module docstring)."""
    if START_METHOD[device_kind] == "forkserver" and _fork_server_socket_fits():
        try:
            server = _server(preload)
            return RankStarter(multiprocessing.get_context("forkserver"),
                               server._forkserver_pid, server)  # no public accessor
        except OSError:  # no Unix socket to be had: spawn
            pass
    # A spawned rank loads the compiled planner from numba's disk cache: fill the cache
    # here, once, rather than have every rank compile it while its peers wait.
    planner.warm_up()
    return RankStarter(multiprocessing.get_context("spawn"), os.getpid())


def server_pids() -> set[int]:
    """The pids of the fork servers this process runs (a test tells them from ranks)."""
    return {server._forkserver_pid for server in _servers.values()
            if server._forkserver_pid is not None}


def use_parent_server(preload: Preload, server: dict) -> None:
    """In a job forked by the fork server of ``preload`` (``emu.run_apart``): start the
    job's ranks from that server too (``server``: how to reach it, from
    ``RankStarter.shared_server``), rather than from a server of the job's own, which
    would import everything again (torch and the kit, or vLLM and a tree).
    The ranks' parent is then the server, which lives as long as the batch's process,
    not the job: a rank dies with its job all the same (``rank_boot.die_with_launcher``).
    """
    _servers[preload] = _ParentServer(server)


class _ParentServer(forkserver.ForkServer):
    """The fork server that forked this process, asked for new processes over its
    socket. The process that started it runs and stops it; this one only connects."""

    def __init__(self, connection: dict):
        super().__init__()
        vars(self).update(connection)
        # Handed to each new process as the server's "alive" pipe, which a rank closes
        # at once (rank_boot.leave_fork_server); the server never watches this one.
        self._forkserver_alive_fd = os.open(os.devnull, os.O_RDONLY)

    def ensure_running(self) -> None:
        """It runs while this process does: this process dies with it (its parent)."""


# The fork server's socket: <TMPDIR>/pymp-XXXXXXXX/listener-XXXXXXXX (multiprocessing's
# names, 8 random characters each); a Unix socket's path holds at most 107 bytes (Linux).
_FORK_SERVER_SOCKET = len("/pymp-XXXXXXXX/listener-XXXXXXXX")
_SOCKET_PATH_MAX = 107


def _fork_server_socket_fits() -> bool:
    """Whether the fork server's socket path fits a Unix socket address. When it does
    not (a long TMPDIR, as pytest's under xdist), ranks are spawned; multiprocessing
    would otherwise make its temporary directory, fail to bind the socket in it, and
    leave the directory for this process's exit to remove, which a SIGKILL skips."""
    return len(os.fsencode(tempfile.gettempdir())) + _FORK_SERVER_SOCKET <= _SOCKET_PATH_MAX


def _server(preload: Preload) -> forkserver.ForkServer:
    """The running fork server of ``preload``, started if needed."""
    server = _servers.pop(preload, None)
    if server is None and preload.base is not None:
        server = _ForkedServer(preload)
    elif server is None:
        server = forkserver.ForkServer()
        # "__main__" as in multiprocessing's default: a rank need not run the launching
        # script (e.g. the dyntra-emu console script) again. CPython before 3.13 never
        # hands the server the script's path (its gh-126631), so there each rank runs the
        # script again, ignoring SIGTERM meanwhile (stop_processes).
        server.set_forkserver_preload(
            ["__main__", "emu.cluster.rank_preload", *preload.modules])
    with _environment(dict(preload.environ)):
        server.ensure_running()  # restarts a server that died
    if preload.base in _servers:  # used as recently as the servers forked from it
        _servers.move_to_end(preload.base)
    _servers[preload] = server
    while len(_servers) > MAX_SERVERS:  # evicted after the new one runs (rank_preload)
        _stop(_servers.popitem(last=False)[1])
    return server


class _ForkedServer(forkserver.ForkServer):
    """The fork server of a ``Preload`` with a ``base``: a process forked from the base's
    server that sets the preload's environment, imports its modules and then serves as
    a fork server of its own (``_serve``). This process binds its socket and holds the
    pipe it watches: closing that (``_stop``, or this process's end) stops it."""

    def __init__(self, preload: Preload):
        super().__init__()
        self._preload = preload
        self._process = None
        # Stopped before multiprocessing, at exit, joins this process's children.
        util.Finalize(self, self._stop, exitpriority=10)

    def ensure_running(self) -> None:
        # _STARTING first, as a rank's start takes it before it reaches this lock.
        with _STARTING, self._lock:
            if self._process is not None and self._process.is_alive():
                return
            self._stop_unlocked()
            base = _server(self._preload.base)
            address = connection.arbitrary_address("AF_UNIX")
            alive_r, alive_w = os.pipe()
            alive = connection.Connection(alive_r, writable=False)
            starter = RankStarter(multiprocessing.get_context("forkserver"),
                                  base._forkserver_pid, base)
            with socket.socket(socket.AF_UNIX) as listener, alive:
                listener.bind(address)
                os.chmod(address, 0o600)
                listener.listen()
                process = starter.context.Process(
                    target=_serve, args=(self._preload, listener, alive),
                    name="dyntra-emu fork server", daemon=True)
                with starter.starting():
                    process.start()
            self._process = process
            self._forkserver_address = address
            self._forkserver_alive_fd = alive_w
            self._forkserver_pid = process.pid

    def _stop_unlocked(self) -> None:
        if self._process is None:
            return
        os.close(self._forkserver_alive_fd)  # the server sees end-of-file and exits
        self._process.join()
        self._process = self._forkserver_pid = self._forkserver_alive_fd = None
        with contextlib.suppress(FileNotFoundError):  # it removes its socket as it exits
            os.unlink(self._forkserver_address)
        self._forkserver_address = None


def stop_processes(processes: Sequence[multiprocessing.process.BaseProcess],
                   grace_s: float) -> None:
    """Stop ``processes`` (a launch's ranks, a batch's jobs) and join them: SIGTERM, sent
    again every ``RESEND_S`` while one lives, then SIGKILL to those still alive
    ``grace_s`` later. Why again: a fork of a fork server ignores SIGTERM until it has
    left the server (``emu.cluster.rank_boot.leave_fork_server``; the server ignores
    it, ``emu.cluster.rank_preload``), and a job outside its launch (``emu.run_apart``),
    so one SIGTERM in those first moments was lost and the process ran on for the whole
    grace: a run stopped while its ranks started ended only with the SIGKILL
    (benchmarks/RESULTS.md, "Start-up and teardown costs")."""
    end = time.monotonic() + grace_s
    while True:
        alive = [p for p in processes if p.is_alive()]
        left = end - time.monotonic()
        if not alive or left <= 0:
            break
        for process in alive:
            process.terminate()
        connection.wait([p.sentinel for p in alive], min(RESEND_S, left))
    for process in processes:
        if process.is_alive():
            process.kill()
        process.join()


def _serve(preload: Preload, listener: socket.socket, alive: connection.Connection) -> None:
    """In a process forked from the server of ``preload.base``: become ``preload``'s fork
    server. It leaves its parent server as a rank does (its copy of that server's alive
    pipe closed), imports the preload's modules with its environment set, then runs
    multiprocessing's server loop on ``listener`` until ``alive`` reads end-of-file."""
    from emu.cluster import rank_preload
    from emu.cluster.rank_boot import close_server_alive_pipe

    close_server_alive_pipe()
    os.environ.update(dict(preload.environ))
    for module in preload.modules:
        importlib.import_module(module)
    rank_preload.serve_here()
    try:
        forkserver.main(listener.detach(), alive.fileno(), [])
    finally:
        rank_preload.remove_socket()


def _stop(server: forkserver.ForkServer) -> None:
    """Stop an evicted server. It removes its own socket as it exits
    (``emu.cluster.rank_preload``), before multiprocessing tries to."""
    with contextlib.suppress(FileNotFoundError):
        server._stop()


@contextlib.contextmanager
def _environment(variables: dict[str, str]) -> Iterator[None]:
    """``variables`` set in this process's environment (which a server started now takes
    over), as they were afterwards."""
    saved = {name: os.environ.get(name) for name in variables}
    os.environ.update(variables)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
