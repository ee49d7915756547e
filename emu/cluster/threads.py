"""The thread transport: every rank of a run in this process, each a green thread of one
runner thread (``emu.cluster.rank_scheduler``).

``run_cluster`` picks it with ``RunSpec(transport="thread")``; ``run_in_threads`` is the
counterpart of ``emu.cluster.launcher.launch``: same target signature (``target(ctx, args)``,
``ctx`` an ``emu.cluster.rank_process.RankContext``), same results, same ``ClusterError`` on a
failure. Rank processes spend their time in gloo collectives, and with more ranks than
cores each collective costs several context switches per rank; a rank thread waiting in
a collective gives way to the next rank inside the interpreter instead.

The collectives, and the plans the ranks of a group share, are
``emu.cluster.thread_collectives``: each rank gets a ``ThreadGroup`` of the run's DP and
device groups; a failed run is aborted (``RankScheduler.abort``), so every rank unwinds.

The guard is the process transport's: every rank's ``CollectiveRecorder`` publishes into
its ``GuardSlot`` of one shared mapping, and the same ``Watchdog`` reads it from the
launching thread, so a hang or a disagreement is reported naming the ranks exactly as
with processes. The launching thread supervises: the first rank that raises (a
``kill`` fault raises ``emu.cluster.faults.RankKilled`` in its rank thread), a watchdog
finding or the run timeout fails the run. Then every rank's Python stack is taken, the
run is aborted so that every rank unwinds, and the runner is joined (it is a daemon
thread: a rank stuck outside a collective cannot block the interpreter's exit, and the
report says it did not stop). SIGINT and SIGTERM stop the run the same way
(``emu.cluster.launch_scope.StopSignals``, as for rank processes) and raise
``emu.cluster.launcher.Interrupted`` with every rank's report.

Process-wide state the ranks would each set in their own process is set once for the
run instead: the ``dyntra_lb`` logger gets one handler that sends each record to the
``rank<r>.log`` of the rank that logged it (``route_rank_log``); ``torch.set_num_threads(1)``
holds while thread runs are under way and is restored afterwards, and so do the
transport's own ``dist.all_reduce`` and ``dist.all_gather``
(``emu.cluster.thread_collectives``). Python's and numpy's global RNGs are shared: every
rank seeds them with the run's seed, and no engine code draws from them (a draw would
make a result depend on the order the ranks run in).
"""

from __future__ import annotations

import contextlib
import functools
import gc
import logging
import mmap
import os
import signal
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import greenlet
import torch

from emu.cluster.faults import RankKilled
from emu.cluster.guard import SLOT_BYTES, GuardSlot, Watchdog
from emu.cluster.launch_scope import Signalled, StopSignals
from emu.cluster.launcher import ClusterError, Interrupted
from emu.cluster.rank_process import RankContext
from emu.cluster.rank_scheduler import CollectiveAborted, RankScheduler
from emu.cluster.thread_collectives import (
    CollectiveTimeout,
    Hub,
    ThreadGroup,
    install_dist_functions,
    restore_dist_functions,
)

# A rank error that is only the echo of the run failing elsewhere yields to a root cause
# or a watchdog finding arriving within this long (as in emu.cluster.launcher).
_ECHO_GRACE_S = 2.0
# How long rank threads get to unwind after the collectives were aborted.
_STOP_GRACE_S = 5.0


# ---------------------------------------------------------------------------------------
# Process-wide state, shared by every thread run in this process


class _RankLogRouter(logging.Handler):
    """The one handler of the ``dyntra_lb`` logger during thread runs: a record logged by
    a rank thread goes to that rank's handler, any other to the root logger (where it
    would have gone without thread runs)."""

    def __init__(self, fallback_level: int):
        super().__init__()
        self.fallback_level = fallback_level
        self.by_rank: dict[greenlet.greenlet, logging.Handler] = {}

    def handle(self, record: logging.LogRecord) -> bool:
        handler = self.by_rank.get(greenlet.getcurrent())
        if handler is not None:
            return handler.handle(record)
        if record.levelno >= self.fallback_level:
            logging.getLogger().handle(record)
        return True

    def emit(self, record: logging.LogRecord) -> None:  # handle() does the work
        pass


_state_lock = threading.Lock()
_state_users = 0
_saved: dict[str, Any] = {}
_router: _RankLogRouter | None = None


@contextlib.contextmanager
def _process_state() -> Iterator[_RankLogRouter]:
    """While any thread run is under way: one intra-op torch thread, the ``dyntra_lb``
    logger routed per rank thread (yields the router), our ``dist.all_reduce`` /
    ``dist.all_gather``, and the objects that existed before (torch's, numba's, the
    trace's; some 250,000) frozen out of the garbage collector's full collections,
    which the ranks' allocations trigger about once per run at 0.2 s each; all restored
    after the last run."""
    global _state_users, _router
    with _state_lock:
        if _state_users == 0:
            log = logging.getLogger("dyntra_lb")
            _saved.update(num_threads=torch.get_num_threads(), level=log.level,
                          propagate=log.propagate, handlers=list(log.handlers))
            install_dist_functions()
            _router = _RankLogRouter(log.getEffectiveLevel())
            torch.set_num_threads(1)
            log.handlers = [_router]
            log.setLevel(logging.INFO)
            log.propagate = False
            gc.freeze()
        _state_users += 1
    try:
        yield _router
    finally:
        with _state_lock:
            _state_users -= 1
            if _state_users == 0:
                log = logging.getLogger("dyntra_lb")
                log.handlers = _saved["handlers"]
                log.setLevel(_saved["level"])
                log.propagate = _saved["propagate"]
                torch.set_num_threads(_saved["num_threads"])
                restore_dist_functions()
                gc.unfreeze()
                _router = None


def route_rank_log(handler: logging.Handler) -> None:
    """In a rank thread: the ``dyntra_lb`` records it logs go to ``handler`` until the
    rank ends (``run_in_threads`` then closes it)."""
    router = _router
    if router is None:
        raise RuntimeError("route_rank_log is for the rank threads of run_in_threads")
    router.by_rank[greenlet.getcurrent()] = handler


def _unroute_rank_log(router: _RankLogRouter) -> None:
    """At the end of a rank thread (``router``: its run's, which a rank that outlived
    the run still finds)."""
    handler = router.by_rank.pop(greenlet.getcurrent(), None)
    if handler is not None:
        handler.close()


# ---------------------------------------------------------------------------------------
# The launching thread


class _RankThread:
    """The launching thread's view of one rank thread."""

    def __init__(self, rank: int):
        self.rank = rank
        self.done = False
        self.result: Any = None
        self.error: tuple[str, str, bool] | None = None  # (summary, traceback, is_echo)
        self.aborted = False  # ended by the launcher's abort of the collectives
        self.stack = ""  # taken when the run failed while this rank still ran
        self.held_by: int | None = None  # the rank holding the runner, when this one waits

    def detail(self) -> str:
        if self.error is not None and not self.aborted:
            return self.error[1]
        if self.done and self.error is None:
            return "finished"
        text = "stopped by the launcher"
        if not self.done:
            text += f" but still running {_STOP_GRACE_S:g} s later"
            if self.held_by is not None:
                text += (f" (it cannot unwind while rank {self.held_by} holds the runner "
                         "thread)")
        return f"{text}; Python stack:\n{self.stack}" if self.stack else text


def _summary(exc: BaseException) -> str:
    if isinstance(exc, RankKilled):
        return str(exc)
    return traceback.format_exception_only(type(exc), exc)[-1].strip()


def run_in_threads(target: Callable[[RankContext, Any], Any], args: Any, *, dp_size: int,
                   out_dir, collective_timeout_s: float,
                   run_timeout_s: float | None) -> list:
    """Run ``target(ctx, args)`` once per rank, each in its own rank thread of this
    process, and return the results ordered by rank; raise ``ClusterError`` when a rank
    fails, the watchdog finds a hang or a disagreement, or the run lasts longer than
    ``run_timeout_s``, and ``Interrupted`` on SIGINT or SIGTERM. Every rank has ended
    (or is reported as not stopping) when this returns or raises."""
    scheduler = RankScheduler()
    dp_hub = Hub("dp", dp_size, collective_timeout_s, scheduler)
    device_hub = Hub("device", dp_size, collective_timeout_s, scheduler)
    ranks = [_RankThread(r) for r in range(dp_size)]
    changed = threading.Event()
    deadline = None if run_timeout_s is None else time.monotonic() + run_timeout_s

    watchdog, guard = _guard_record(dp_size, collective_timeout_s)
    with _process_state() as router:
        def body(state: _RankThread) -> None:
            rank = state.rank
            ctx = RankContext(rank, dp_size, rank, ThreadGroup(dp_hub, rank),
                              ThreadGroup(device_hub, rank), torch.device("cpu"), out_dir,
                              GuardSlot(guard, rank * SLOT_BYTES))
            try:
                state.result = target(ctx, args)
            except BaseException as exc:  # noqa: BLE001 - reported by the launching thread
                text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
                echo = isinstance(exc, (CollectiveTimeout, CollectiveAborted))
                state.error = (_summary(exc), text, echo)
                state.aborted = isinstance(exc, CollectiveAborted)
            finally:
                _unroute_rank_log(router)
                state.done = True
                changed.set()

        runner = threading.Thread(target=scheduler.run, daemon=True, name="dyntra-emu-ranks",
                                  args=([functools.partial(body, s) for s in ranks],))
        def stop(reason: str) -> dict[int, tuple[str, dict]]:
            """End the run early: what each rank was doing (the watchdog's view and its
            stack), taken before the ranks unwind; then every rank stopped."""
            _take_stacks(ranks, scheduler)
            where = {r: (watchdog.describe(r), watchdog.records(r)) for r in range(dp_size)}
            _stop(ranks, runner, scheduler, reason)
            return where

        with StopSignals() as signals:
            try:
                with signals.armed():
                    runner.start()
                    failure = _supervise(ranks, changed, watchdog, deadline, run_timeout_s)
            except Signalled as exc:  # SIGINT or SIGTERM
                where = stop("the launcher was interrupted")
                error = Interrupted(signal.Signals(exc.signum).name, _details(ranks, where))
            except BaseException:
                stop("the launcher failed")
                watchdog.close()
                raise
            else:
                if failure is None:
                    runner.join()
                    error = None
                else:
                    error = _cluster_error(ranks, failure, stop("another rank failed"))
            watchdog.close()  # the slots' views keep `guard` mapped until they are gone
    if error is not None:
        raise error
    return [state.result for state in ranks]


def _guard_record(dp_size: int, timeout_s: float) -> tuple[Watchdog, mmap.mmap]:
    """The watchdog and the rank threads' view of the guard record it reads: one file
    mapped twice, with no name once both mappings exist (every rank is a thread of this
    process), so that nothing is left behind whatever ends the process, SIGKILL
    included. On Linux the file is a memfd, which never has a name; elsewhere a file in
    a temporary directory removed at once."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("dyntra-emu-guard")
        try:
            return _map_twice(f"/proc/self/fd/{fd}", dp_size, timeout_s)
        finally:
            os.close(fd)
    with tempfile.TemporaryDirectory(prefix="dyntra-emu-threads-") as tmp:
        return _map_twice(os.path.join(tmp, "guard"), dp_size, timeout_s)


def _map_twice(path: str, dp_size: int, timeout_s: float) -> tuple[Watchdog, mmap.mmap]:
    watchdog = Watchdog(path, dp_size, timeout_s)
    with open(path, "r+b") as f:
        return watchdog, mmap.mmap(f.fileno(), 0)


def _supervise(ranks: list[_RankThread], changed: threading.Event, watchdog: Watchdog,
               deadline: float | None, run_timeout_s: float | None):
    """Wait until every rank has returned; returns None, or (rank or None, message) of
    the failure: a rank's own error, a watchdog finding, the run timeout, or a
    collective error (the echo of a failure) nothing else explained within the grace."""
    echo_since: float | None = None
    while True:
        changed.clear()
        now = time.monotonic()
        failed = [s for s in ranks if s.error is not None]
        root = next((s for s in failed if not s.error[2]), None)
        if root is not None:
            return root.rank, root.error[0]
        if all(s.done for s in ranks):
            finding = watchdog.finish()
            if finding is not None:
                return None, finding
            return (failed[0].rank, failed[0].error[0]) if failed else None
        if deadline is not None and now >= deadline:
            return None, f"run exceeded run_timeout_s={run_timeout_s} and was stopped"
        finding = watchdog.poll(now, {s.rank for s in ranks if s.done and s.error is None})
        if finding is not None:
            return None, finding
        if failed:
            echo_since = now if echo_since is None else echo_since
            if now - echo_since >= _ECHO_GRACE_S:
                return failed[0].rank, failed[0].error[0]
        timeouts = [watchdog.POLL_S]
        if deadline is not None:
            timeouts.append(deadline - now)
        changed.wait(max(0.0, min(timeouts)))


def _take_stacks(ranks: list[_RankThread], scheduler: RankScheduler) -> None:
    """The Python stack of every rank still running (for the report)."""
    for state in ranks:
        frame = None if state.done else scheduler.frame(state.rank)
        if frame is not None:
            state.stack = "".join(traceback.format_stack(frame)).rstrip()


def _stop(ranks: list[_RankThread], runner: threading.Thread, scheduler: RankScheduler,
          reason: str) -> None:
    """Abort the run and join the runner (each rank unwinds at its next collective); a
    rank still running then names the rank that holds the runner."""
    scheduler.abort(reason)
    runner.join(_STOP_GRACE_S)
    holder = scheduler.running_rank()
    for state in ranks:
        if not state.done and holder != state.rank:
            state.held_by = holder


def _details(ranks: list[_RankThread], where: dict[int, tuple[str, dict]]) -> dict[int, str]:
    """Every rank's report: where the watchdog saw it (``where``: each rank's
    ``Watchdog.describe`` and ``records``) and how it ended."""
    return {s.rank: f"{where[s.rank][0]}\n{s.detail()}" if where[s.rank][0] else s.detail()
            for s in ranks}


def _cluster_error(ranks: list[_RankThread], failure,
                   where: dict[int, tuple[str, dict]]) -> ClusterError:
    """``failure``: ``_supervise``'s (rank or None, message)."""
    rank, message = failure
    failed = [s.rank for s in ranks if s.error is not None and not s.aborted]
    if rank is not None:
        if rank in failed:
            failed.remove(rank)
        failed.insert(0, rank)
    collectives = {r: records for r, (text, records) in where.items() if text}
    return ClusterError(rank, message, _details(ranks, where), failed, collectives)
