"""What both executors share: the batch's errors, the ``Executor`` interface and
``run_spec``, one run as a job process or a Ray task runs it (``emu.executors``). A batch
hands its executor the checked runs (``emu.spec.CheckedRun``), each spec checked once,
by the command that made it; its jobs run them as they are."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Sequence
from typing import Protocol

from emu.spec import CheckedRun, RunSpec


class ExecutorError(ValueError):
    """The executor cannot run the batch (Ray missing or unreachable, a run larger than
    any node); raised before any run starts. The message is one line."""


class RunFailed(RuntimeError):
    """Run ``index`` of the batch failed (``error``: which rank, what); the runs under
    way were stopped and the queued ones never started. Its report is ``error.txt`` in
    the run's out_dir."""

    def __init__(self, index: int, error: str):
        super().__init__(error)
        self.index = index
        self.error = error


class RunsInterrupted(Exception):
    """SIGINT or SIGTERM (``signal_name``; the ``KeyboardInterrupt`` is ``__cause__``)
    stopped the batch after ``finished`` of ``total`` runs; the runs under way were
    stopped."""

    def __init__(self, finished: int, total: int, signal_name: str):
        super().__init__(f"{signal_name}: {finished} of {total} runs finished")
        self.finished = finished
        self.total = total
        self.signal_name = signal_name


class SignalsSeen:
    """While a batch runs (in the main thread): which of SIGINT and SIGTERM arrived, so
    that ``RunsInterrupted`` names it even where a library turns the handler's exception
    into a plain KeyboardInterrupt (Ray does, inside its waits). Each signal still goes
    to the handler that was there (the command's); one left at its default raises
    KeyboardInterrupt, so that the batch stops its runs first; an ignored one stays
    ignored."""

    _SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self):
        self.name = "SIGINT"  # what a KeyboardInterrupt without a signal counts as
        self._previous: dict = {}

    def __enter__(self) -> SignalsSeen:
        if threading.current_thread() is threading.main_thread():
            for signum in self._SIGNALS:
                handler = signal.getsignal(signum)
                if handler is not signal.SIG_IGN:
                    self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def _handle(self, signum, frame) -> None:
        self.name = signal.Signals(signum).name
        previous = self._previous.get(signum)
        if callable(previous):
            previous(signum, frame)
        raise KeyboardInterrupt(self.name)


class Executor(Protocol):
    """What a batch runs on; checked against the batch's specs, then a context manager,
    entered before the batch's output directory is prepared (so that an executor that
    cannot start refuses first) and left when the batch is over (a local Ray started for
    it is shut down)."""

    def check(self, specs: Sequence[RunSpec]) -> None:
        """Called before entering: raise ExecutorError when a spec can never run here, at
        once where that can be told without starting anything, else when entered."""

    def __enter__(self) -> Executor: ...

    def __exit__(self, *exc) -> None: ...

    def run(self, runs: Sequence[CheckedRun], on_done: Callable[[int], None]) -> list[dict]:
        """Run every checked run (its out_dir made); returns each one's metrics in order,
        calling ``on_done(index)`` as each finishes; see the module docstring."""

    def slots(self, spec: RunSpec) -> int:
        """Called once entered: how many runs like ``spec`` run at once here (``dyntra-emu
        tune`` asks that many trials of its study at a time)."""


def cpus_needed(spec: RunSpec) -> int:
    """The CPUs a run holds at once: one per rank on the process transport, one on the
    thread transport."""
    return spec.dp_size if spec.transport == "process" else 1


def run_spec(checked: CheckedRun, *, apart: bool = False) -> dict:
    """In a job process or on a Ray worker: one run of the batch (``emu.run.run_checked``, which
    writes its metrics.json, and error.txt when a rank fails; in a fresh process of its
    own when ``apart``, see ``emu.run_apart``); returns the metrics, or {"error": text}
    when the cluster failed."""
    from emu.cluster.supervision import ClusterError
    from emu.run_apart import run_here_or_apart

    try:
        return run_here_or_apart(checked, apart=apart).metrics
    except ClusterError as exc:
        return {"error": f"rank {exc.rank} failed: {exc.message}" if exc.rank is not None
                else exc.message}
