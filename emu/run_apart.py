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
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import traceback

from emu.run import RunResult, run
from emu.spec import RunSpec

# How long an interrupted run may take to stop its ranks and record itself.
STOP_GRACE_S = 60.0


def run_apart(spec: RunSpec) -> RunResult:
    """Run ``spec`` in a new process (``spawn``) and return its result; raises what the
    run raised there (``ClusterError``, ``Interrupted``, ``ValueError`` ...)."""
    context = multiprocessing.get_context("spawn")
    receive, send = context.Pipe(duplex=False)
    job = context.Process(target=_job, args=(spec, send, os.getpid()),
                          name=f"dyntra-emu run {spec.out_dir}")
    job.start()
    send.close()
    try:
        outcome = _receive(receive, job)
    except BaseException as exc:  # SIGINT / SIGTERM here: the run stops, then reports
        if job.is_alive():
            os.kill(job.pid, signal.SIGTERM)
        job.join(STOP_GRACE_S)
        if job.is_alive():
            job.kill()
        job.join()
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


def _job(spec: RunSpec, send, parent_pid: int) -> None:
    """The run's process: the run, and its result or exception sent back."""
    from emu.cluster.rank_boot import die_with_parent

    die_with_parent(parent_pid)
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
