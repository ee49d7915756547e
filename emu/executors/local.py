"""The ``local`` executor: a batch's runs in job processes on this machine, ``jobs`` at a
time, each run in a fresh spawned process (``max_tasks_per_child=1``: no state of one
run reaches the next) that writes straight into the run's out_dir.

A stop event shared with the job processes ends the batch early: once set (a failed run,
SIGINT, SIGTERM), a job that has not started its run returns at once, and the jobs
under way are terminated, which their runs handle as SIGTERM (every rank stopped,
``run.json`` "interrupted").
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
from collections.abc import Callable, Sequence
from typing import Any

from emu.executors.base import RunFailed, RunsInterrupted, SignalsSeen, run_spec
from emu.spec import RunSpec

# In a job process: the batch's stop event (``_start_job``).
_stop_event: Any = None


def _start_job(stop_event) -> None:
    """A job process's initializer."""
    global _stop_event
    _stop_event = stop_event


def _run_job(spec: RunSpec) -> dict:
    """In a job process: the run of ``spec`` (``run_spec``), or {"stopped": True} when
    the batch stopped before it started."""
    if _stop_event.is_set():
        return {"stopped": True}
    return run_spec(spec)


class LocalExecutor:
    """Job processes on this machine (see the module docstring)."""

    def __init__(self, jobs: int):
        self.jobs = jobs

    def __enter__(self) -> LocalExecutor:
        return self

    def __exit__(self, *exc) -> None:
        pass

    def check(self, specs: Sequence[RunSpec]) -> None:
        """Every spec runs here (a process-transport run larger than the machine is
        only slower)."""

    def run(self, specs: Sequence[RunSpec], on_done: Callable[[int], None]) -> list[dict]:
        results: dict[int, dict] = {}
        context = multiprocessing.get_context("spawn")
        stop_event = context.Event()
        with SignalsSeen() as signals, concurrent.futures.ProcessPoolExecutor(
                max_workers=self.jobs, mp_context=context, max_tasks_per_child=1,
                initializer=_start_job, initargs=(stop_event,)) as pool:
            futures = {pool.submit(_run_job, spec): i for i, spec in enumerate(specs)}
            try:
                for future in concurrent.futures.as_completed(futures):
                    index = futures[future]
                    metrics = future.result()
                    if "error" in metrics:
                        raise RunFailed(index, metrics["error"])
                    results[index] = metrics
                    on_done(index)
            except BaseException as exc:  # a failed run, SIGINT, SIGTERM
                # Runs not started yet end at once (the pool may have handed some to a
                # job process already); the runs under way stop their clusters as on
                # SIGTERM and record themselves as interrupted (run.json).
                stop_event.set()
                for future in futures:
                    future.cancel()
                for job in multiprocessing.active_children():
                    job.terminate()
                if not isinstance(exc, KeyboardInterrupt):
                    raise
                raise RunsInterrupted(len(results), len(specs), signals.name) from exc
        return [results[i] for i in range(len(specs))]
