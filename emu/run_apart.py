"""``run_apart(checked)``: ``emu.run.run_checked(checked)`` in a process of its own; and
``run_here_or_apart``, the one place that chooses between the two. Each takes the
checked run (``emu.spec.check``), checked once by its caller.

Called by ``dyntra-emu ab --vllm-ascend-a A --vllm-ascend-b B`` for every run whose ranks
are threads: rank threads import their vllm-ascend tree into the process that hosts them,
and a tree's patches replace vLLM's classes on import, so one process holds one tree
(``emu.impl.vllm_ascend.rank_state``). A run of tree B must never find tree A imported,
so each run gets a process of its own, runs the spec as ``run_checked`` does (writing the same
files and metrics.json) and hands back its result.

What goes wrong in that process comes back as it happened: a failed cluster as its
``ClusterError``, an interrupted one as its ``Interrupted`` (each rank's report
included), anything else as it was raised. SIGTERM to this process (``timeout``, a CI
runner) reaches the run as SIGTERM, so it stops its ranks and records itself as
interrupted before this process goes on; Ctrl-C reaches both processes from the
terminal. The run's process dies with this one (Linux's parent-death signal).

``start_job`` is that process on its own (``emu.cluster.rank_start.stop_processes``
stops it), which the local executor's jobs (``emu.executors.local``) are too: tied to
this process by the parent-death signal (a batch killed with SIGKILL leaves no run going
on), its outcome sent back through a pipe. A job is a fork of the fork server its run's
ranks come from, which has imported what the run needs and has run nothing
(``emu.cluster.rank_start``: one server per implementation and tree), so it starts at
once, where a fresh interpreter would import torch and the kit, or vLLM and a tree, all
over again (benchmarks/RESULTS.md, "Start-up and teardown costs"); nothing of one run
reaches the next. The job's ranks are forks of the same server, not of a server of the
job's own (``emu.cluster.rank_start.use_parent_server``). The job imports its own side
(this module, the target's) as it starts, at once: what they need is loaded. A run that
may touch an NPU gets a spawned interpreter instead, as its ranks would.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import signal
import traceback
from multiprocessing import resource_tracker

from emu.cluster.rank_start import rank_starter, stop_processes
from emu.metrics import load_run
from emu.run import RunResult, run_checked
from emu.spec import CheckedRun, RunSpec

# How long an interrupted run may take to stop its ranks and record itself.
STOP_GRACE_S = 60.0


def start_job(target, checked: CheckedRun, name: str):
    """Start ``target(checked, conn)`` in a process of its own (see the module docstring)
    that dies with this one; ``conn`` is the job's end of a pipe for its outcome.
    Returns (the process, this end of the pipe)."""
    resource_tracker.ensure_running()  # starting it unblocks SIGINT: before the block
    # A fork server started now blocks SIGINT for good (a Ctrl-C must not end it in the
    # middle of its imports); a job unblocks it (_job_main).
    preload = checked.implementation.preload()
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        starter = rank_starter(_device_kind(checked.spec), preload)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    ours, theirs = starter.context.Pipe(duplex=False)
    job = starter.context.Process(
        target=_job_main, args=(target, checked, theirs, starter.parent_pid,
                                dict(os.environ), preload, starter.shared_server()),
        name=name)
    with starter.starting():
        job.start()
    theirs.close()
    return job, ours


def _device_kind(spec: RunSpec) -> str:
    """"cpu" (forked) unless the run may use an NPU: a device runtime does not survive a
    fork, and a tree imported by the server may have loaded it."""
    if spec.device == "cpu" or importlib.util.find_spec("torch_npu") is None:
        return "cpu"
    return "npu"


def _job_main(target, checked: CheckedRun, conn, parent_pid: int, environ: dict[str, str],
              preload, server: dict | None) -> None:
    from emu.cluster.rank_boot import die_with_parent, forked_by_fork_server, leave_fork_server
    from emu.cluster.rank_start import use_parent_server

    die_with_parent(parent_pid)
    if forked_by_fork_server():
        leave_fork_server(environ)
    # Outside its launch a job ignores SIGTERM, as its fork server does (a forked job
    # ignores it until this line anyway): the launch catches it and stops the run
    # (emu.cluster.launch_scope.StopSignals), and stop_processes sends it until the launch
    # has it. A SIGTERM after the launch must not kill the job before it reports.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if server is not None:  # the run's ranks are forks of the server this job came from
        use_parent_server(preload, server)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    target(checked, conn)


def run_here_or_apart(checked: CheckedRun, *, apart: bool) -> RunResult:
    """``emu.run.run_checked(checked)``: in this process, or in a process of its own when
    ``apart`` (``run_apart``). A command's run (``emu.cli.running``) and a batch's
    (``emu.executors``) choose here."""
    return run_apart(checked) if apart else run_checked(checked)


def run_apart(checked: CheckedRun) -> RunResult:
    """Run ``checked`` in a process of its own and return its result; raises what the run
    raised there (``ClusterError``, ``Interrupted`` ...)."""
    job, receive = start_job(_job, checked, f"dyntra-emu run {checked.spec.out_dir}")
    try:
        outcome = _receive(receive, job)
    except BaseException as exc:  # SIGINT / SIGTERM here: the run stops, then reports
        stop_processes([job], STOP_GRACE_S)
        reported = receive.recv() if receive.poll() else None
        if isinstance(reported, KeyboardInterrupt):
            raise reported from None  # emu.cluster.supervision.Interrupted
        raise exc
    finally:
        receive.close()
    job.join()
    if isinstance(outcome, BaseException):
        raise outcome
    # The run's records come back by reading its logs here, cheaper than pickling them
    # through the pipe (benchmarks/RESULTS.md, "Start-up and teardown costs").
    return dataclasses.replace(outcome, loaded=load_run(outcome.out_dir))


def _receive(receive, job):
    try:
        return receive.recv()
    except EOFError:  # the process ended without a word: killed, or died in C code
        job.join()
        from emu.cluster.supervision import ClusterError

        raise ClusterError(None, f"the process running the cluster (pid {job.pid}) ended "
                                 f"with exit code {job.exitcode} before reporting", {}) from None


def _job(checked: CheckedRun, send) -> None:
    """The run's process: the run, and its result or exception sent back."""
    try:
        outcome = dataclasses.replace(run_checked(checked), loaded=None)  # run_apart reads it there
    except BaseException as exc:  # reported to the launching process, never printed here
        outcome = exc
    try:
        send.send(outcome)
    except Exception:  # an exception that does not pickle: its text
        send.send(RuntimeError("".join(traceback.format_exception(outcome))))
    finally:
        send.close()
