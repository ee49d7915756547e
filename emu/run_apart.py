"""``run_apart(spec)``: ``emu.run.run(spec)`` in a fresh process of its own.

Called by ``dyntra-emu ab --vllm-ascend-a A --vllm-ascend-b B`` for every run whose ranks
are threads: rank threads import their vllm-ascend tree into the process that hosts them,
and a tree's patches replace vLLM's classes on import, so one process holds one tree
(``emu.impl.vllm_ascend.rank_state``). A run of tree B must never find tree A imported,
so each run gets a process that has imported nothing yet (``spawn``), runs the spec as
``run`` does (writing the same files and metrics.json) and hands back its result.

What goes wrong in that process comes back as it happened: a failed cluster as its
``ClusterError``, an interrupted one as its ``Interrupted`` (each rank's report
included), anything else as it was raised. SIGTERM to this process (``timeout``, a CI
runner) reaches the run as SIGTERM, so it stops its ranks and records itself as
interrupted before this process goes on; Ctrl-C reaches both processes from the
terminal. The run's process dies with this one (Linux's parent-death signal).

``start_job`` and ``stop_jobs`` are that fresh process on its own, which the local
executor's jobs (``emu.executors.local``) are too: started by ``spawn``, tied to this
process by the parent-death signal (a batch killed with SIGKILL leaves no run going on),
its outcome sent back through a pipe.
"""

from __future__ import annotations

import multiprocessing
import os
import time
import traceback

from emu.run import RunResult, run
from emu.spec import RunSpec

# How long an interrupted run may take to stop its ranks and record itself.
STOP_GRACE_S = 60.0


def start_job(target, args: tuple, name: str):
    """Start ``target(*args, conn)`` in a fresh process (``spawn``) that dies with this
    one; ``conn`` is the job's end of a pipe for its outcome. Returns (the process, this
    end of the pipe)."""
    context = multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe(duplex=False)
    job = context.Process(target=_job_main, args=(target, args, theirs, os.getpid()),
                          name=name)
    job.start()
    theirs.close()
    return job, ours


def stop_jobs(jobs, grace_s: float) -> None:
    """SIGTERM the jobs together (a run in one stops its ranks and records itself as
    interrupted), SIGKILL those still alive ``grace_s`` later; all joined."""
    for job in jobs:
        if job.is_alive():
            job.terminate()
    end = time.monotonic() + grace_s
    for job in jobs:
        job.join(max(0.0, end - time.monotonic()))
    for job in jobs:
        if job.is_alive():
            job.kill()
        job.join()


def _job_main(target, args: tuple, conn, parent_pid: int) -> None:
    from emu.cluster.rank_boot import die_with_parent

    die_with_parent(parent_pid)
    target(*args, conn)


def run_apart(spec: RunSpec) -> RunResult:
    """Run ``spec`` in a new process (``spawn``) and return its result; raises what the
    run raised there (``ClusterError``, ``Interrupted``, ``ValueError`` ...)."""
    job, receive = start_job(_job, (spec,), f"dyntra-emu run {spec.out_dir}")
    try:
        outcome = _receive(receive, job)
    except BaseException as exc:  # SIGINT / SIGTERM here: the run stops, then reports
        stop_jobs([job], STOP_GRACE_S)
        reported = receive.recv() if receive.poll() else None
        if isinstance(reported, KeyboardInterrupt):
            raise reported from None  # emu.cluster.supervision.Interrupted
        raise exc
    finally:
        receive.close()
    job.join()
    if isinstance(outcome, BaseException):
        raise outcome
    return outcome


def _receive(receive, job):
    try:
        return receive.recv()
    except EOFError:  # the process ended without a word: killed, or died in C code
        job.join()
        from emu.cluster.supervision import ClusterError

        raise ClusterError(None, f"the process running the cluster (pid {job.pid}) ended "
                                 f"with exit code {job.exitcode} before reporting", {}) from None


def _job(spec: RunSpec, send) -> None:
    """The run's process: the run, and its result or exception sent back."""
    try:
        outcome = run(spec)
    except BaseException as exc:  # reported to the launching process, never printed here
        outcome = exc
    try:
        send.send(outcome)
    except Exception:  # an exception that does not pickle: its text
        send.send(RuntimeError("".join(traceback.format_exception(outcome))))
    finally:
        send.close()
