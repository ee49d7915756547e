"""The thread transport: every rank of a run in this process, each a green thread of one
runner thread (``emu.cluster.rank_scheduler``).

``run_cluster`` picks it with ``RunSpec(transport="thread")``; ``run_in_threads`` is the
counterpart of ``emu.cluster.launcher.launch``: same target signature (``target(ctx, args)``,
``ctx`` an ``emu.rank.context.RankContext``), same results, same supervision
(``emu.cluster.supervision``: ``ClusterError`` on a failure). Rank processes spend their
time in gloo collectives, and with more ranks than cores each collective costs several
context switches per rank; a rank thread waiting in a collective gives way to the next
rank inside the interpreter instead.

The collectives, and the plans the ranks of a group share, are
``emu.cluster.thread_collectives``: each rank gets a ``ThreadGroup`` of the run's DP and
device groups; a failed run is aborted (``RankScheduler.abort``), so every rank unwinds.

The guard is the process transport's: every rank's ``CollectiveRecorder`` publishes into
its ``GuardSlot`` of one shared mapping, and the same ``Watchdog`` reads it from the
launching thread, so a hang or a disagreement is reported naming the ranks exactly as
with processes. The launching thread supervises (a ``kill`` fault raises
``emu.faults.RankKilled`` in its rank thread); to stop the run, every rank's Python
stack is taken, the run is aborted so that every rank unwinds, and the runner is joined
(it is a daemon thread: a rank stuck outside a collective cannot block the interpreter's
exit, and the report says it did not stop).

Process-wide state the ranks would each set in their own process is either set once for
the run or kept per rank. Each rank's ``RankContext.host`` is a ``ThreadHost``: a logger a
rank routes its records of (``route_log``) gets one handler that sends each record to the
handlers of the rank that logged it; module-level state an engine sets for itself (a
config singleton) is swapped in and out as the ranks take turns (``keep_per_rank``,
``RankScheduler.keep``); the DP group's ``PlanMemo`` is shared. ``_ProcessState`` holds
``torch.set_num_threads(1)`` while thread runs are under way, and restores it and the
routed loggers afterwards; each rank's groups carry their collectives through
``emu.rank.collective_hooks`` while the rank runs. Python's and numpy's global RNGs
are shared: every rank seeds them with the run's seed, and no engine code draws from
them (a draw would make a result depend on the order the ranks run in).
"""

from __future__ import annotations

import contextlib
import functools
import gc
import logging
import mmap
import threading
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import greenlet
import torch

from emu.cluster.launch_scope import LaunchFiles, StopSignals
from emu.cluster.rank_scheduler import CollectiveAborted, RankScheduler
from emu.cluster.supervision import supervise
from emu.cluster.thread_collectives import (
    CollectiveTimeout,
    GroupCarrier,
    Hub,
    PlanMemo,
    ThreadGroup,
)
from emu.faults import RankKilled
from emu.rank import collective_hooks
from emu.rank.context import RankContext
from emu.rank.recorder import SLOT_BYTES, GuardSlot

# How long rank threads get to unwind after the collectives were aborted.
_STOP_GRACE_S = 5.0


# ---------------------------------------------------------------------------------------
# Process-wide state, shared by every thread run in this process


class _RankLogRouter(logging.Handler):
    """The one handler of a logger that rank threads route (``ThreadHost.route_log``): a
    record logged by a rank thread goes to that rank's handlers, any other to the root
    logger (where it would have gone without thread runs)."""

    def __init__(self, fallback_level: int):
        super().__init__()
        self.fallback_level = fallback_level
        self.by_rank: dict[greenlet.greenlet, list[logging.Handler]] = {}

    def handle(self, record: logging.LogRecord) -> bool:
        handlers = self.by_rank.get(greenlet.getcurrent())
        if handlers is not None:
            for handler in handlers:
                if record.levelno >= handler.level:
                    handler.handle(record)
            return True
        if record.levelno >= self.fallback_level:
            logging.getLogger().handle(record)
        return True

    def emit(self, record: logging.LogRecord) -> None:  # handle() does the work
        pass


class _ProcessState:
    """What thread runs change in this process while any of them is under way, each
    restored after the last one: one intra-op torch thread; the loggers the ranks route
    (``router``: each gets one ``_RankLogRouter`` as its only handler); and the objects
    that existed before (torch's, numba's, the trace's) frozen out of the garbage
    collector's full collections, which the ranks' allocations trigger and which would
    walk every one of them again."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.users = 0
        self.num_threads = 0
        self.routers: dict[str, tuple[_RankLogRouter, tuple]] = {}

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        with self.lock:
            if self.users == 0:
                self.num_threads = torch.get_num_threads()
                torch.set_num_threads(1)
                gc.freeze()
            self.users += 1
        try:
            yield
        finally:
            with self.lock:
                self.users -= 1
                if self.users == 0:
                    for name, (_, saved) in self.routers.items():
                        log = logging.getLogger(name)
                        log.handlers, level, log.propagate = saved
                        log.setLevel(level)
                    self.routers.clear()
                    torch.set_num_threads(self.num_threads)
                    gc.unfreeze()

    def router(self, logger_name: str) -> _RankLogRouter:
        """The router of ``logger_name``, installed on first use."""
        entry = self.routers.get(logger_name)
        if entry is None:
            log = logging.getLogger(logger_name)
            saved = (list(log.handlers), log.level, log.propagate)
            router = _RankLogRouter(log.getEffectiveLevel())
            log.handlers = [router]
            log.setLevel(logging.INFO)
            log.propagate = False
            entry = self.routers[logger_name] = (router, saved)
        return entry[0]

    def unroute(self, rank_greenlet: greenlet.greenlet) -> None:
        """At the end of a rank thread: its handlers are closed."""
        for router, _ in self.routers.values():
            for handler in router.by_rank.pop(rank_greenlet, ()):
                handler.close()


_state = _ProcessState()


class ThreadHost:
    """What a rank thread is offered (``emu.rank.context.ProcessHost`` for a rank process):
    its log records routed to its own handlers, the plans its DP group shares
    (``PlanMemo``), and module-level state kept per rank (``RankScheduler.keep``)."""

    def __init__(self, scheduler: RankScheduler, plan_memo: PlanMemo):
        self._scheduler = scheduler
        self.plan_memo = plan_memo

    def route_log(self, logger_name: str, handlers: list[logging.Handler]) -> None:
        with _state.lock:
            router = _state.router(logger_name)
        router.by_rank[greenlet.getcurrent()] = list(handlers)

    def keep_per_rank(self, module, name: str) -> None:
        self._scheduler.keep(module, name)


# ---------------------------------------------------------------------------------------
# The launching thread


class _RankThread:
    """The launching thread's view of one rank thread (a ``supervision.RankHandle``)."""

    def __init__(self, rank: int):
        self.rank = rank
        self.done = False  # its body has ended, either way
        self.returned = False
        self.result: Any = None
        self.error: tuple[str, str, bool] | None = None  # (summary, traceback, is_echo)
        self.aborted = False  # ended by the launcher's abort of the collectives
        self.stack = ""  # taken when the run failed while this rank still ran
        self.held_by: int | None = None  # the rank holding the runner, when this one waits

    def failure(self) -> tuple[str, bool] | None:
        return None if self.error is None else (self.error[0], self.error[2])

    def failed_on_its_own(self) -> bool:
        return self.error is not None and not self.aborted

    def report(self) -> str:
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
    ``run_timeout_s``, and ``Interrupted`` on SIGINT or SIGTERM
    (``emu.cluster.supervision``). Every rank has ended (or is reported as not stopping)
    when this returns or raises."""
    with _state.held():
        ranks = _RankThreads(target, args, dp_size, out_dir, collective_timeout_s)
        return supervise(ranks, dp_size=dp_size, collective_timeout_s=collective_timeout_s,
                         run_timeout_s=run_timeout_s)


class _RankThreads:
    """The rank threads of one run, as the supervision sees them
    (``emu.cluster.supervision.Ranks``): one greenlet per rank, all run by ``runner``."""

    def __init__(self, target, args, dp_size: int, out_dir, collective_timeout_s: float):
        self.scheduler = RankScheduler()
        self._dp_hub = Hub("dp", dp_size, collective_timeout_s, self.scheduler)
        self._device_hub = Hub("device", dp_size, collective_timeout_s, self.scheduler)
        self._target, self._args = target, args
        self._dp_size, self._out_dir = dp_size, out_dir
        self.handles: list[_RankThread] = []
        self.runner: threading.Thread | None = None
        self._changed = threading.Event()

    def start(self, files: LaunchFiles, signals: StopSignals) -> None:
        """Start the runner with every rank in it. A daemon thread: a rank stuck outside
        a collective cannot block the interpreter's exit (the report says it did not
        stop)."""
        with open(files.path("guard"), "r+b") as f:
            guard = mmap.mmap(f.fileno(), 0)
        states = [_RankThread(r) for r in range(self._dp_size)]
        runner = threading.Thread(
            target=self.scheduler.run, daemon=True, name="dyntra-emu-ranks",
            args=([functools.partial(self._body, guard, state) for state in states],))
        with signals.deferred():  # the ranks are in `handles` once they run
            runner.start()
            self.runner, self.handles = runner, states

    def _body(self, guard: mmap.mmap, state: _RankThread) -> None:
        """One rank thread's life: its groups, the target, its result or error."""
        rank = state.rank
        groups = ThreadGroup(self._dp_hub, rank), ThreadGroup(self._device_hub, rank)
        for group in groups:
            collective_hooks.attach(group, carry=GroupCarrier(group))
        ctx = RankContext(rank, self._dp_size, rank, *groups, torch.device("cpu"),
                          self._out_dir, GuardSlot(guard, rank * SLOT_BYTES),
                          ThreadHost(self.scheduler, self._dp_hub.plan_memo))
        try:
            state.result = self._target(ctx, self._args)
            state.returned = True
        except BaseException as exc:  # noqa: BLE001 - reported by the launching thread
            text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
            echo = isinstance(exc, (CollectiveTimeout, CollectiveAborted))
            state.error = (_summary(exc), text, echo)
            state.aborted = isinstance(exc, CollectiveAborted)
        finally:
            for group in groups:
                collective_hooks.detach(group)
            _state.unroute(greenlet.getcurrent())
            state.done = True
            self._changed.set()

    def wait(self, timeout_s: float) -> None:
        self._changed.wait(timeout_s)
        self._changed.clear()

    def release(self) -> None:
        """Every rank returned: the runner ends with the last one."""
        self.runner.join()

    def settle(self, timeout_s: float) -> None:
        """Nothing to wait for: a rank thread that raised leaves its peers waiting in
        their collectives until the run is aborted."""

    def stop(self, reason: str) -> None:
        """Take the stack of every rank still running, abort the run and join the runner
        (each rank unwinds at its next collective); a rank still running then names the
        rank that holds the runner."""
        scheduler = self.scheduler
        for state in self.handles:
            frame = None if state.done else scheduler.frame(state.rank)
            if frame is not None:
                state.stack = "".join(traceback.format_stack(frame)).rstrip()
        if self.runner is None or not self.runner.is_alive():
            return
        scheduler.abort(reason)
        self.runner.join(_STOP_GRACE_S)
        holder = scheduler.running_rank()
        for state in self.handles:
            if not state.done and holder != state.rank:
                state.held_by = holder
