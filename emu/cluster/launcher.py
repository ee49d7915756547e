"""The process transport: one process per DP rank on this machine, real gloo groups.

``launch(target, args, dp_size=...)`` is how the CLI, tests and benchmarks run ranks as
processes: this process binds the rendezvous socket on 127.0.0.1 only, at a free port
(so parallel runs never collide), which rank 0 serves the store on
(``emu.cluster.rendezvous``; torch is imported by the ranks, never here), starts
``dp_size`` rank processes (``emu.cluster.rank_start``: CPU ranks forked from a fork
server that has imported what they need, NPU ranks spawned), and supervises them
with the policy every transport shares (``emu.cluster.supervision``): the first
failure is reported as ``ClusterError``, SIGINT and SIGTERM as ``Interrupted``, once
every rank is stopped — SIGTERM, which makes a rank dump its Python stack, then SIGKILL
after a grace period — and joined, so no rank survives (a fork server lives as long as
this process and exits with it). Ranks also die with SIGKILL if this process dies
(Linux PR_SET_PDEATHSIG, set by ``emu.cluster.rank_boot`` in the rank's first moments)
and ignore SIGINT (Ctrl-C reaches the whole process group; the launcher stops them).

A rank's own side (its groups, the target, the report, the teardown; and one rank under
torchrun) is ``emu.cluster.rank_process``. This module is the launching process's side.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import pickle
import signal
import socket
import time
from multiprocessing import resource_tracker
from multiprocessing.connection import wait
from typing import Any

from emu.cluster import rank_boot
from emu.cluster.device import check_kind
from emu.cluster.launch_scope import LaunchFiles, StopSignals
from emu.cluster.rank_spec import RankSpec
from emu.cluster.rank_start import rank_starter, stop_processes
from emu.cluster.rendezvous import store_listener
from emu.cluster.supervision import supervise
from emu.knobs import is_int
from emu.rank.context import Preload

# How long a SIGTERM-ed rank gets to dump its stack and exit before SIGKILL.
_STOP_GRACE_S = 3.0
# After all ranks returned: how long a rank gets to destroy its groups and exit.
_EXIT_GRACE_S = 30.0
_NOTHING_MORE = Preload()  # ranks import only what every rank does


def launch(target, args, *, dp_size: int, device: str = "cpu",
           out_dir: pathlib.Path | str | None = None, collective_timeout_s: float = 60.0,
           run_timeout_s: float | None = None, preload: Preload = _NOTHING_MORE) -> list:
    """Run ``target(ctx, args)`` in dp_size new rank processes on this machine and return
    their results ordered by rank. ``target`` must be picklable by reference (a
    module-level function, or a method of a picklable object) and ``args`` picklable (a
    rank unpickles them); ``device`` is the kind the run's device group uses, "cpu" or
    "npu" (``emu.cluster.device.select_device`` chose it); ``preload`` is what the ranks'
    fork server imports for them. Raises ClusterError when any rank fails or the run,
    startup included, lasts longer than ``run_timeout_s``, and Interrupted (a
    KeyboardInterrupt) when this process gets SIGINT or SIGTERM meanwhile (called from
    the main thread; every rank is stopped first).

    Ranks leave through os._exit (after atexit handlers when the run succeeded), so a
    target must close its own files on the way out (``with`` / ``finally``).
    """
    if not is_int(dp_size) or dp_size < 1:
        raise ValueError(f"dp_size must be a positive int; got {dp_size!r}")
    if collective_timeout_s <= 0:
        raise ValueError(f"collective_timeout_s must be > 0; got {collective_timeout_s!r}")
    if run_timeout_s is not None and run_timeout_s <= 0:
        raise ValueError(f"run_timeout_s must be > 0 or None; got {run_timeout_s!r}")
    check_kind(device)
    try:
        payload = pickle.dumps((target, args))
    except Exception as exc:
        raise TypeError(f"launch target and args must be picklable: {exc}") from exc
    if out_dir is not None:
        out_dir = pathlib.Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)

    listener = store_listener()  # 127.0.0.1 only; see emu.cluster.rendezvous
    resource_tracker.ensure_running()  # see StopSignals.deferred and LaunchFiles
    template = RankSpec(0, dp_size, listener.getsockname()[1], device, out_dir,
                        collective_timeout_s, parent_pid=0, stack_path="", guard_path="",
                        environ=dict(os.environ))
    ranks = _RankProcesses(template, payload, preload, listener)
    try:
        return supervise(ranks, dp_size=dp_size, collective_timeout_s=collective_timeout_s,
                         run_timeout_s=run_timeout_s)
    finally:
        ranks.stop("the launch ended")  # no-op once every rank has exited
        ranks.close()


class _RankProcesses:
    """The rank processes of one launch, as the supervision sees them
    (``emu.cluster.supervision.Ranks``). ``template`` is every rank's ``RankSpec`` but
    for what each start fills in: its rank, the starter's pid, its scratch files.
    ``store_listener`` goes to rank 0, which serves the rendezvous store on it; this
    process closes its own copy once rank 0 has started."""

    def __init__(self, template: RankSpec, payload: bytes, preload: Preload,
                 store_listener: socket.socket) -> None:
        self.handles: list[_Rank] = []
        self._template = template
        self._payload = payload
        self._preload = preload
        self._store_listener = store_listener

    def start(self, files: LaunchFiles, signals: StopSignals) -> None:
        """Start the ranks in rank order; each is in ``handles`` once it runs."""
        with signals.deferred():  # a fork server started here blocks SIGINT
            starter = rank_starter(self._template.device_kind, self._preload)
        for rank in range(self._template.dp_size):
            stack_path = files.path(f"rank{rank}.stack")
            spec = dataclasses.replace(self._template, rank=rank,
                                       parent_pid=starter.parent_pid,
                                       stack_path=stack_path, guard_path=files.path("guard"))
            parent_conn, child_conn = starter.context.Pipe()
            listener = self._store_listener if rank == 0 else None
            process = starter.context.Process(
                target=rank_boot.main, args=(spec, self._payload, child_conn, listener),
                name=f"dyntra-emu-rank{rank}", daemon=True)
            with signals.deferred(), starter.starting():  # a started rank is in `handles`
                process.start()
                child_conn.close()
                self.handles.append(_Rank(rank, process, parent_conn, stack_path))
            if listener is not None:
                listener.close()  # rank 0 has its own copy

    def wait(self, timeout_s: float) -> None:
        """Take every message and exit that arrives within ``timeout_s``."""
        by_conn = {r.conn: r for r in self.handles if not r.conn_closed}
        by_sentinel = {r.process.sentinel: r for r in self.handles
                       if r.process.exitcode is None}
        for obj in wait(list(by_conn) + list(by_sentinel), timeout_s):
            if obj in by_conn:
                by_conn[obj].read()
            else:
                rank = by_sentinel[obj]
                rank.drain()
                rank.process.join()

    def release(self) -> tuple[int | None, str] | None:
        """Every rank returned: let them tear their groups down and exit, and check they
        did."""
        for r in self.handles:
            try:
                r.conn.send("exit")
            except OSError:  # died after reporting; its exit code tells below
                pass
        end = time.monotonic() + _EXIT_GRACE_S
        for r in self.handles:
            r.process.join(max(0.0, end - time.monotonic()))
        bad = [r for r in self.handles if r.process.exitcode != 0]
        if bad:
            return bad[0].rank, f"{bad[0].exit_status()} during teardown"
        return None

    def settle(self, timeout_s: float) -> None:
        """Wait until every rank has exited or ``timeout_s``: a peer of a dead rank sees its
        collective fail and reports that traceback, unless SIGTERM cuts it short."""
        end = time.monotonic() + timeout_s
        while any(r.process.exitcode is None for r in self.handles):
            left = end - time.monotonic()
            if left <= 0:
                return
            self.wait(left)

    def stop(self, reason: str) -> None:
        """Stop every rank still alive: SIGTERM (stack dump), then SIGKILL after a grace
        period (``stop_processes``); join all of them and take their last messages."""
        alive = [r for r in self.handles if r.process.is_alive()]
        for r in alive:
            r.stopped = True
        stop_processes([r.process for r in alive], _STOP_GRACE_S)
        for r in self.handles:
            r.process.join()
            r.drain()

    def close(self) -> None:
        self._store_listener.close()  # when no rank 0 started
        for r in self.handles:
            r.conn.close()


class _Rank:
    """The parent's view of one rank process."""

    def __init__(self, rank: int, process, conn, stack_path: str):
        self.rank = rank
        self.process = process
        self.conn = conn
        self.stack_path = stack_path
        self.returned = False
        self.result: Any = None
        self.error: tuple[str, str, bool] | None = None  # (summary, traceback, is_echo)
        self.stopped = False
        self.conn_closed = False  # the rank's end of the pipe is gone

    def read(self) -> None:
        """Take one message (called when the pipe has one, or is closed)."""
        try:
            message = self.conn.recv()
        except (EOFError, OSError):
            self.conn_closed = True
            return
        if message[0] == "ok":
            self.returned, self.result = True, message[1]
        elif self.error is None:
            self.error = message[1:]

    def drain(self) -> None:
        try:
            while not self.conn_closed and self.conn.poll():
                self.read()
        except (EOFError, OSError):
            pass

    def failure(self) -> tuple[str, bool] | None:
        """Its error (an echo when raised inside torch.distributed), or its exit when it
        ended without returning and exiting cleanly."""
        if self.error is not None:
            return self.error[0], self.error[2]
        code = self.process.exitcode
        if code is None or (code == 0 and self.returned):
            return None
        return self.exit_status(), False

    def failed_on_its_own(self) -> bool:
        return self.error is not None or (not self.stopped and
                                          self.process.exitcode not in (0, None))

    def exit_status(self) -> str:
        code = self.process.exitcode
        if code is None:
            return "still running"
        if code < 0:
            return f"killed by signal {signal.Signals(-code).name}"
        return f"exited with code {code}"

    def stack(self) -> str:
        """The Python stack the rank dumped when stopped or crashed, without the frames of
        start-up below rank_main (fork server or spawn, multiprocessing, rank_boot)."""
        try:
            lines = pathlib.Path(self.stack_path).read_text().splitlines()
        except OSError:
            return ""
        bootstrap = ("multiprocessing/process.py", "multiprocessing/spawn.py",
                     "multiprocessing/forkserver.py", '"<string>"', "emu/cluster/rank_boot.py")
        return "\n".join(ln for ln in lines if not any(b in ln for b in bootstrap)).strip()

    def report(self) -> str:
        if self.error is not None:
            return self.error[1]
        if self.stopped:
            if self.returned:
                return "had returned its result; stopped by the launcher"
            text = f"stopped by the launcher ({self.exit_status()})"
        elif self.returned and self.process.exitcode == 0:
            return "finished"
        else:
            text = self.exit_status()
            if not self.returned:
                text += " before reporting a result or an error"
        stack = self.stack()
        return f"{text}; Python stack:\n{stack}" if stack else text
