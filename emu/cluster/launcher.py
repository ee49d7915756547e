"""Start the emulated DP cluster: one process per DP rank, rendezvous, groups, teardown.

Two ways in, one per-rank setup (`emu.cluster.rank_process`: the groups, the
`RankContext`), the same target signature `target(ctx: RankContext, args) -> result`:

* `launch(target, args, dp_size=...)` — the normal mode (the CLI, tests, benchmarks):
  this process starts the dp_size ranks on this machine and supervises them (CPU ranks
  are forks of a fork server that has torch imported, NPU ranks are spawned; see
  `_rank_context`). It hosts the rendezvous TCPStore on a free port (so parallel runs
  never collide), and it turns any rank failure into one `ClusterError`: a rank that
  raises sends its traceback, a rank that dies is seen through its process sentinel, a
  run that exceeds `run_timeout_s` is stopped, and the collective watchdog
  (`emu.cluster.guard`) reads what every rank publishes about its collectives and stops a run
  that hangs or whose ranks disagree on a collective. The first failure is reported,
  except that an error raised inside a torch.distributed call (how a rank sees a peer
  die or a collective time out) gives way to another rank's own failure or a watchdog
  finding arriving within a short grace. The report names, for every rank that
  recorded collectives, its last entered and last completed one. Every rank is then
  stopped (SIGTERM, which makes it dump its Python stack; SIGKILL after a grace period)
  and joined, so no rank survives (the fork server lives as long as this process and
  exits with it). SIGINT and SIGTERM to this process do the same (raised as
  `Interrupted`, a KeyboardInterrupt, once every rank is stopped and the temporary
  directory is removed). Ranks also die with SIGKILL if this process dies (Linux
  PR_SET_PDEATHSIG, set by `emu.cluster.rank_boot` in the rank's first moments) and ignore
  SIGINT (Ctrl-C reaches the whole process group; the launcher stops them).
* `emu.cluster.rank_process.join_from_env(target, args)` — one rank under `torchrun`
  (or any launcher that sets
  RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), e.g. several NPU machines or
  an Ascend job system. torchrun then owns the processes and their failure handling;
  this function only sets the rank up, runs the target and tears the groups down (no
  watchdog: a hang ends with the collective timeout).

This module is the launching process's side: the ranks' start, supervision and stop.
"""

from __future__ import annotations

import multiprocessing
import os
import pathlib
import pickle
import signal
import tempfile
import time
from multiprocessing import forkserver, resource_tracker
from multiprocessing.connection import wait
from typing import Any

import torch.distributed as dist

from dyntra_lb import planner
from emu.cluster import rank_boot
from emu.cluster.device import select_device
from emu.cluster.guard import Watchdog
from emu.cluster.launch_scope import LaunchFiles, Signalled, StopSignals
from emu.cluster.rank_boot import RankSpec
from emu.knobs import is_int

# How long a SIGTERM-ed rank gets to dump its stack and exit before SIGKILL.
_STOP_GRACE_S = 3.0
# After all ranks returned: how long a rank gets to destroy its groups and exit.
_EXIT_GRACE_S = 30.0
# A rank's error raised inside a torch.distributed call is usually the echo of another
# rank's death; wait this long for the root cause before reporting the echo.
_ECHO_GRACE_S = 2.0


class ClusterError(RuntimeError):
    """A run failed: `rank` is the first rank that failed on its own (None when the run
    timed out, hung or its ranks disagreed on a collective, with no rank failing),
    `message` one line about it, `details` a text per rank (its last entered and
    completed collective when it recorded any, then its traceback, exit status, or the
    Python stack it had when stopped) and `failed_ranks` every rank that failed before
    the launcher stopped it, `rank` first. `collectives` holds, per rank that recorded
    any, `emu.cluster.guard.Watchdog.records` (last entered / completed collective)."""

    def __init__(self, rank: int | None, message: str, details: dict[int, str],
                 failed_ranks: list[int] | None = None,
                 collectives: dict[int, dict] | None = None):
        self.rank = rank
        self.message = message
        self.details = details
        self.failed_ranks = failed_ranks if failed_ranks is not None else []
        self.collectives = collectives if collectives is not None else {}
        head = message if rank is None else f"rank {rank} failed: {message}"
        order = sorted(details, key=lambda r: (r != rank, r))
        body = "\n".join(f"--- rank {r} ---\n{details[r].rstrip()}" for r in order)
        super().__init__(f"{head}\n{body}" if body else head)

    def __reduce__(self):
        return type(self), (self.rank, self.message, self.details, self.failed_ranks,
                            self.collectives)


class Interrupted(KeyboardInterrupt):
    """The launching process got SIGINT (Ctrl-C) or SIGTERM (a CI runner, `timeout`)
    while its ranks ran: every rank was stopped (each dumped its Python stack) and
    joined, and the launcher's temporary files are gone. A KeyboardInterrupt, so code
    that handles Ctrl-C keeps working; `signal_name` says which signal, `details` is a
    text per rank (its last collective and the stack it had when stopped)."""

    def __init__(self, signal_name: str, details: dict[int, str]):
        self.signal_name = signal_name
        self.details = details
        body = "\n".join(f"--- rank {r} ---\n{details[r].rstrip()}" for r in sorted(details))
        head = f"interrupted by {signal_name}: every rank was stopped"
        super().__init__(f"{head}\n{body}" if body else head)

    @property
    def exit_code(self) -> int:
        """The shell's exit status of a process killed by that signal (130, 143)."""
        return 128 + signal.Signals[self.signal_name].value

    def __reduce__(self):
        return type(self), (self.signal_name, self.details)


# ---------------------------------------------------------------------------------------
# In the launching process


class _Rank:
    """The parent's view of one rank process."""

    def __init__(self, rank: int, process, conn, stack_path: str):
        self.rank = rank
        self.process = process
        self.conn = conn
        self.stack_path = stack_path
        self.result_received = False
        self.result: Any = None
        self.error: tuple[str, str, bool] | None = None  # (summary, traceback, is_echo)
        self.stopped = False

    def read(self) -> bool:
        """Take one message if there is one; False once the pipe is closed."""
        try:
            message = self.conn.recv()
        except (EOFError, OSError):
            return False
        if message[0] == "ok":
            self.result_received, self.result = True, message[1]
        elif self.error is None:
            self.error = message[1:]
        return True

    def drain(self) -> None:
        try:
            while self.conn.poll() and self.read():
                pass
        except (EOFError, OSError):
            pass

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

    def detail(self) -> str:
        if self.error is not None:
            return self.error[1]
        if self.stopped:
            if self.result_received:
                return "had returned its result; stopped by the launcher"
            text = f"stopped by the launcher ({self.exit_status()})"
        elif self.result_received and self.process.exitcode == 0:
            return "finished"
        else:
            text = self.exit_status()
            if not self.result_received:
                text += " before reporting a result or an error"
        stack = self.stack()
        return f"{text}; Python stack:\n{stack}" if stack else text


class _Failure(Exception):
    """Internal: the supervisor decided the run failed; turned into ClusterError once
    every rank is stopped."""

    def __init__(self, rank: int | None, message: str):
        self.rank = rank
        self.message = message


def launch(target, args, *, dp_size: int, device: str = "auto",
           out_dir: pathlib.Path | str | None = None, collective_timeout_s: float = 60.0,
           run_timeout_s: float | None = None) -> list:
    """Run `target(ctx, args)` in dp_size new rank processes on this machine and return
    their results ordered by rank. `target` must be a module-level function and `args`
    picklable (a rank unpickles them, by name). Raises DeviceError (before any
    rank starts) when the device cannot be used, ClusterError when any rank fails or
    the run, startup included, lasts longer than `run_timeout_s`, and Interrupted (a
    KeyboardInterrupt) when this process gets SIGINT or SIGTERM meanwhile (called from
    the main thread; every rank is stopped first).

    Ranks leave through os._exit (after atexit handlers when the run succeeded), so a
    target must close its own files on the way out (`with` / `finally`).
    """
    if not is_int(dp_size) or dp_size < 1:
        raise ValueError(f"dp_size must be a positive int; got {dp_size!r}")
    if collective_timeout_s <= 0:
        raise ValueError(f"collective_timeout_s must be > 0; got {collective_timeout_s!r}")
    if run_timeout_s is not None and run_timeout_s <= 0:
        raise ValueError(f"run_timeout_s must be > 0 or None; got {run_timeout_s!r}")
    device_kind = select_device(device, local_ranks=dp_size)
    try:
        payload = pickle.dumps((target, args))
    except Exception as exc:
        raise TypeError(f"launch target and args must be picklable: {exc}") from exc
    if out_dir is not None:
        out_dir = pathlib.Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
    deadline = None if run_timeout_s is None else time.monotonic() + run_timeout_s

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    ranks: list[_Rank] = []
    resource_tracker.ensure_running()  # see StopSignals.deferred and LaunchFiles
    with StopSignals() as signals, LaunchFiles() as files:
        guard_path = files.path("guard")
        watchdog = Watchdog(guard_path, dp_size, collective_timeout_s)
        try:
            with signals.armed():
                with signals.deferred():  # a fork server started here blocks SIGINT
                    mp, parent_pid = _rank_context(device_kind)
                environ = dict(os.environ)
                for rank in range(dp_size):
                    stack_path = files.path(f"rank{rank}.stack")
                    spec = RankSpec(rank, dp_size, store.port, device_kind, out_dir,
                                    collective_timeout_s, parent_pid, stack_path, guard_path,
                                    environ)
                    parent_conn, child_conn = mp.Pipe()
                    process = mp.Process(target=rank_boot.main,
                                         args=(spec, payload, child_conn),
                                         name=f"dyntra-emu-rank{rank}", daemon=True)
                    with signals.deferred():  # a started rank is always in `ranks`
                        process.start()
                        child_conn.close()
                        ranks.append(_Rank(rank, process, parent_conn, stack_path))
                _supervise(ranks, deadline, run_timeout_s, watchdog)
                _release(ranks)
        except _Failure as failure:
            _stop(ranks)
            raise _cluster_error(ranks, failure, watchdog) from None
        except Signalled as signalled:
            _stop(ranks)
            raise _interrupted(ranks, signalled.signum, watchdog) from None
        finally:
            _stop(ranks)  # no-op on success; covers start errors
            for r in ranks:
                r.conn.close()
            watchdog.close()
    return [r.result for r in ranks]


# How ranks start, per device kind (see _rank_context).
_START_METHOD = {"cpu": "forkserver", "npu": "spawn"}


def _rank_context(device_kind: str):
    """The multiprocessing context the ranks of a launch start from, and the pid of
    their parent. CPU ranks are forks of multiprocessing's fork server, started by the
    first launch of this process and reused by every later one, which has imported
    torch and the engine and loaded the compiled planner (`emu.cluster.rank_preload`): a rank
    starts in milliseconds instead of importing for seconds, and a machine with fewer
    cores than ranks no longer imports torch dp_size times at once. NPU ranks are
    spawned, each a fresh interpreter that imports torch_npu itself: whether torch_npu
    survives a fork once imported cannot be checked without the hardware, and a device
    runtime does not once initialised (vLLM, too, spawns its workers when CUDA is)."""
    if _START_METHOD[device_kind] == "forkserver" and _fork_server_socket_fits():
        context = multiprocessing.get_context("forkserver")
        # "__main__" as in multiprocessing's default: a rank need not import the launching
        # script (e.g. the dyntra-emu console script) again. No effect once the server runs.
        context.set_forkserver_preload(["__main__", "emu.cluster.rank_preload"])
        try:
            forkserver.ensure_running()
            return context, forkserver._forkserver._forkserver_pid  # no public accessor
        except OSError:  # no Unix socket to be had: spawn
            pass
    # A spawned rank loads the compiled planner from numba's disk cache: fill the cache
    # here, once, rather than have every rank compile it while its peers wait.
    planner.warm_up()
    return multiprocessing.get_context("spawn"), os.getpid()


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


def _interrupted(ranks: list[_Rank], signum: int, watchdog: Watchdog) -> Interrupted:
    for r in ranks:
        r.drain()
    details = {}
    for r in ranks:
        where = watchdog.describe(r.rank)
        details[r.rank] = f"{where}\n{r.detail()}" if where else r.detail()
    return Interrupted(signal.Signals(signum).name, details)


def _supervise(ranks: list[_Rank], deadline: float | None,
               run_timeout_s: float | None, watchdog: Watchdog) -> None:
    """Wait until every rank has returned its result; raise _Failure on the first rank
    failure, on a finding of the collective watchdog (a hang or ranks disagreeing on a
    collective), or when the deadline passes. A collective-error echo yields to a root
    cause or a watchdog finding seen within _ECHO_GRACE_S."""
    by_conn = {r.conn: r for r in ranks}
    by_sentinel = {r.process.sentinel: r for r in ranks}
    failed: list[_Rank] = []
    echo_since: float | None = None
    while not all(r.result_received for r in ranks):
        now = time.monotonic()
        if deadline is not None and now >= deadline:
            raise _Failure(None, f"run exceeded run_timeout_s={run_timeout_s} and was stopped")
        root = next((r for r in failed if not _is_echo(r)), None)
        if root is not None:
            raise _Failure(root.rank, _failure_summary(root))
        finding = watchdog.poll(now, {r.rank for r in ranks if r.result_received})
        if finding is not None:
            raise _Failure(None, finding)
        if failed and now - echo_since >= _ECHO_GRACE_S:
            raise _Failure(failed[0].rank, _failure_summary(failed[0]))
        timeouts = [watchdog.POLL_S]
        if deadline is not None:
            timeouts.append(deadline - now)
        if failed:
            timeouts.append(echo_since + _ECHO_GRACE_S - now)
        timeout = max(0.0, min(timeouts))
        for obj in wait(list(by_conn) + list(by_sentinel), timeout):
            if obj in by_conn:
                rank = by_conn[obj]
                if not rank.read():
                    del by_conn[obj]
            else:
                rank = by_sentinel.pop(obj)
                rank.drain()
                rank.process.join()
                if rank.error is None and rank.process.exitcode == 0 and rank.result_received:
                    continue  # cannot happen before the go-ahead, but is not a failure
            if rank not in failed and (rank.error is not None or rank.process.exitcode
                                       is not None):
                failed.append(rank)
                if echo_since is None:
                    echo_since = time.monotonic()
    finding = watchdog.finish()
    if finding is not None:
        raise _Failure(None, finding)


def _is_echo(rank: _Rank) -> bool:
    return rank.error is not None and rank.error[2]


def _failure_summary(rank: _Rank) -> str:
    return rank.error[0] if rank.error is not None else rank.exit_status()


def _release(ranks: list[_Rank]) -> None:
    """Every rank returned: let them tear their groups down and exit, and check they did."""
    for r in ranks:
        try:
            r.conn.send("exit")
        except OSError:  # died after reporting; its exit code tells below
            pass
    end = time.monotonic() + _EXIT_GRACE_S
    for r in ranks:
        r.process.join(max(0.0, end - time.monotonic()))
    bad = [r for r in ranks if r.process.exitcode != 0]
    if bad:
        raise _Failure(bad[0].rank, f"{bad[0].exit_status()} during teardown")


def _stop(ranks: list[_Rank]) -> None:
    """Stop every rank still alive: SIGTERM (stack dump), then SIGKILL after a grace
    period; join all of them."""
    alive = [r for r in ranks if r.process.is_alive()]
    for r in alive:
        r.stopped = True
        r.process.terminate()
    end = time.monotonic() + _STOP_GRACE_S
    for r in alive:
        r.process.join(max(0.0, end - time.monotonic()))
    for r in alive:
        if r.process.is_alive():
            r.process.kill()
    for r in ranks:
        r.process.join()


def _cluster_error(ranks: list[_Rank], failure: _Failure, watchdog: Watchdog) -> ClusterError:
    for r in ranks:
        r.drain()
    failed = [r.rank for r in ranks if r.error is not None or
              (not r.stopped and r.process.exitcode not in (0, None))]
    if failure.rank in failed:
        failed.remove(failure.rank)
        failed.insert(0, failure.rank)
    details, collectives = {}, {}
    for r in ranks:
        where = watchdog.describe(r.rank)
        details[r.rank] = f"{where}\n{r.detail()}" if where else r.detail()
        if where:
            collectives[r.rank] = watchdog.records(r.rank)
    return ClusterError(failure.rank, failure.message, details, failed, collectives)

