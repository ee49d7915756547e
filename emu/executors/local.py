"""The ``local`` executor: a batch's runs in job processes on this machine, ``jobs`` at a
time, each run in a process of its own that has run nothing before (no state of one run
reaches the next), writes straight into the run's out_dir, sends its outcome back
through a pipe and dies with the batch's process (``emu.run_apart.start_job``).

The executor starts a job only when a slot is free, and watches every job's pipe and
its process together: a job that dies without an outcome is a failed run. Stopping the
batch early (a failed run, SIGINT, SIGTERM) starts no more jobs and terminates the jobs
under way, which their runs handle as SIGTERM (every rank stopped, ``run.json``
"interrupted"); a job still alive after ``STOP_GRACE_S`` is killed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from multiprocessing.connection import wait

from emu.cluster.rank_start import stop_processes
from emu.executors.base import RunFailed, RunsInterrupted, SignalsSeen, run_spec
from emu.run_apart import start_job
from emu.spec import CheckedRun, RunSpec

# How long the jobs under way get to stop their runs' ranks and exit.
STOP_GRACE_S = 90.0


def _run_job(checked: CheckedRun, conn) -> None:
    """In a job process: the run (``run_spec``), its outcome sent on ``conn``; nothing is
    sent when the batch stopped the run (its run.json says so), nor when the batch
    stopped listening: a run that ended just as the batch was stopped finds the pipe
    closed, and its run.json is complete."""
    try:
        outcome = run_spec(checked)
    except KeyboardInterrupt:
        return
    try:
        conn.send(outcome)
    except BrokenPipeError:
        return


class LocalExecutor:
    """Job processes on this machine (see the module docstring)."""

    def __init__(self, jobs: int):
        self.jobs = jobs

    def check(self, specs: Sequence[RunSpec]) -> None:
        """Every spec runs here (a process-transport run larger than the machine is
        only slower)."""

    def __enter__(self) -> LocalExecutor:
        return self

    def __exit__(self, *exc) -> None:
        pass

    def slots(self, spec: RunSpec) -> int:
        return self.jobs

    def run(self, runs: Sequence[CheckedRun], on_done: Callable[[int], None]) -> list[dict]:
        queued = list(range(len(runs)))
        running: dict[int, tuple] = {}  # index -> (job process, its end of the pipe)
        results: dict[int, dict] = {}
        with SignalsSeen() as signals:
            try:
                while queued or running:
                    while queued and len(running) < self.jobs:
                        index = queued.pop(0)
                        running[index] = start_job(_run_job, runs[index],
                                                   f"dyntra-emu-job-{index}")
                    index, outcome = self._next_outcome(running)
                    if "error" in outcome:
                        raise RunFailed(index, outcome["error"])
                    results[index] = outcome
                    on_done(index)
            except BaseException as exc:  # a failed run, SIGINT, SIGTERM
                _stop(running)
                if not isinstance(exc, KeyboardInterrupt):
                    raise
                raise RunsInterrupted(len(results), len(runs), signals.name) from exc
        return [results[i] for i in range(len(runs))]

    @staticmethod
    def _next_outcome(running: dict[int, tuple]) -> tuple[int, dict]:
        """Wait for a job to send its outcome or to end; returns (index, outcome), the
        job joined and off ``running``. A job that ended without one failed."""
        by_handle = {}
        for index, (job, conn) in running.items():
            by_handle[conn] = by_handle[job.sentinel] = index
        ready = wait(list(by_handle))
        index = by_handle[ready[0]]
        job, conn = running.pop(index)
        try:
            outcome = conn.recv()
        except EOFError:
            job.join()
            outcome = {"error": f"its job process ended without a result (exit code "
                                f"{job.exitcode})"}
        conn.close()
        job.join()
        return index, outcome


def _stop(running: dict[int, tuple]) -> None:
    """Terminate the jobs under way (their runs stop as on SIGTERM) and wait for them;
    kill one still alive after STOP_GRACE_S."""
    stop_processes([job for job, _ in running.values()], STOP_GRACE_S)
    for _, conn in running.values():
        conn.close()
    running.clear()
