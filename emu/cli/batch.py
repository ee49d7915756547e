"""A batch of runs for a command: the points of ``sweep`` and the seeds of ``ab --seeds``,
run on an executor (``emu.executors``: ``--executor local|ray``, ``--jobs``,
``--ray-address``) under one progress bar, the executor's errors turned into the CLI's.

The command enters the executor (``batch_executor``) before it prepares its output
directory, so that Ray missing or unreachable, or a run larger than every Ray node, is
refused before anything is written or run.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
from collections.abc import Sequence
from pathlib import Path

from emu.cli.errors import ClusterFailed, RunInterrupted, UsageError
from emu.cli.progress import Progress, Show, note, show_for
from emu.executors import (
    EXECUTORS,
    Executor,
    ExecutorError,
    RunFailed,
    RunsInterrupted,
    cpus_needed,
    open_executor,
)
from emu.knobs import Int
from emu.spec import CheckedRun, RunSpec


def add_executor_options(parser: argparse.ArgumentParser, what: str,
                         jobs_default: str) -> None:
    """--executor, --jobs and --ray-address; ``what`` names the batch's runs in help,
    ``jobs_default`` says what the command runs at a time without --jobs."""
    parser.add_argument("--executor", choices=tuple(EXECUTORS), default="local",
                        help=f"where {what} run: local (job processes on this machine, "
                             "--jobs at a time) or ray (Ray tasks, on a local Ray or the "
                             "cluster at --ray-address; pip install -e '.[ray]') "
                             "(default: local)")
    parser.add_argument("--jobs", type=Int(1).parse, metavar="N",
                        help=f"with --executor local: {what} at a time, one process each "
                             f"(default: {jobs_default}; at most the number of cores)")
    parser.add_argument("--ray-address", metavar="ADDR",
                        help="with --executor ray: the Ray cluster's address (HOST:PORT of "
                             "its head node, or auto; default: start a local Ray for the "
                             "batch and shut it down after)")


# --jobs' default for batches whose results do not depend on how many runs go at once.
FILL_CORES = ("as many as keep the cores busy: one run per core on rank threads, one per "
              "--dp cores on rank processes")


def jobs_filling_cores(specs: Sequence[RunSpec]) -> int:
    """How many of ``specs``' runs at a time keep this machine's cores busy without
    sharing one, each run holding the CPUs ``cpus_needed`` says (as on Ray). At least
    one, at most one per run."""
    busy = max(map(cpus_needed, specs))
    return max(1, min(len(specs), (os.cpu_count() or 1) // busy))


def check_executor_flags(args) -> None:
    """The executor flags on their own, before any input is read."""
    if args.executor != "ray" and args.ray_address is not None:
        raise UsageError("--ray-address: only with --executor ray")
    if args.executor == "ray" and args.jobs is not None:
        raise UsageError("--jobs: only with --executor local (Ray runs as many runs at "
                         "once as the cluster's CPUs hold)")
    cores = os.cpu_count() or 1
    if args.jobs is not None and args.jobs > cores:
        raise UsageError(f"--jobs {args.jobs}: more than the {cores} cores of this "
                         "machine (each job is a busy process of its own)")


@contextlib.contextmanager
def batch_executor(args, specs: Sequence[RunSpec], default_jobs: int = 1):
    """The executor of the flags, checked against ``specs`` and entered for the length of
    the block; its refusals are UsageErrors. A local one runs ``--jobs`` runs at a time,
    ``default_jobs`` without it."""
    executor = open_executor(args.executor, jobs=args.jobs or default_jobs,
                             address=args.ray_address)
    try:
        executor.check(specs)
        executor.__enter__()
    except ExecutorError as exc:
        raise UsageError(str(exc)) from None
    try:
        yield executor
    finally:
        executor.__exit__(None, None, None)


def describe_executor(args, executor: Executor, spec: RunSpec) -> str:
    """How the status line names where runs like ``spec`` go."""
    if args.executor == "local":
        return f"{executor.slots(spec)} job(s) at a time"
    return f"on Ray ({args.ray_address or 'a local Ray'})"


def run_batch(args, executor: Executor, runs: Sequence[CheckedRun], names: Sequence[str],
              what: str, layout: str) -> list[dict]:
    """Every run of the batch under one progress display (without a terminal, also a
    line per finished run); returns the metrics in the order of ``runs``. ``names`` says
    each run in messages, ``what`` the batch ("the sweep"), ``layout`` where a run's
    files are ("runs/<name>/" under the output directory). A failed run is
    ClusterFailed, SIGINT or SIGTERM RunInterrupted, each naming what finished."""
    show = show_for(args)
    finished = []
    specs = [checked.spec for checked in runs]

    with Progress([Path(s.out_dir) for s in specs], specs[0].dp_size,
                  len(specs[0].trace), args.command, show) as progress:
        def on_done(index: int) -> None:
            progress.run_done()
            finished.append(index)
            if show is not Show.BAR:
                note(args, f"{args.command}: {len(finished)}/{len(specs)} runs done: "
                           f"{names[index]}")

        try:
            return executor.run(runs, on_done)
        except RunFailed as exc:
            report = Path(specs[exc.index].out_dir) / "error.txt"
            raise ClusterFailed(
                f"run {names[exc.index]} failed: {exc.error}; report in {report}. Every "
                f"other run was stopped; {len(finished)} of {len(specs)} runs finished"
            ) from None
        except RunsInterrupted as exc:
            raise RunInterrupted(
                f"interrupted by {exc.signal_name}; {what} is partial: {exc.finished} of "
                f"{exc.total} runs finished (metrics.json in {layout}), the runs "
                "under way were stopped (run.json: interrupted); no table or plots were "
                "written", 128 + signal.Signals[exc.signal_name].value) from None
