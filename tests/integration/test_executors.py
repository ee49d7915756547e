"""The executors of a batch of runs (``emu.executors``) on real runs: a run whose rank is
killed stops the batch the same way on job processes and on a local Ray — the
failure names the run and the rank, its report comes back to its out_dir, the other run
(under way, endless) is stopped and says so in its run.json, and no process the batch
started outlives it (the local Ray started for it included).

The failing run is on the process transport (its one rank a real process, in a
placement group on Ray), the endless one on rank threads. Once both runs are under way
(each has written a step to its event log), the test kills the failing run's rank with
SIGKILL, as the kernel's OOM killer would: the rank is the process holding that run's
event log open. A third run, endless on rank threads, finds no slot (two jobs; a Ray of
two CPUs, one held by the placement group, one by the first run): it must never begin.

And a local job dies with its batch when the batch's process is killed with SIGKILL;
a job's ranks, forks of the batch's fork server, die with their job killed so; a job
stopped in its first moments stops as an interrupted run, not killed at the end of the
grace."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from emu.executors import RunFailed, open_executor
from emu.faults import FaultPlan
from emu.spec import RunSpec, check
from emu.workload import TraceRequest
from tests.held_logs import event_logs_held, holds_a_step
from tests.ray_tmpdir import pymp_left

pytestmark = pytest.mark.integration


def endless_trace() -> list[TraceRequest]:
    """Ten million output tokens per request: hours of steps, even on rank threads."""
    return [TraceRequest(f"r{i}", 0.01 * i, 64 + 40 * i, 10_000_000) for i in range(4)]


def spec(out_dir, *, dp_size: int, transport: str, faults=None) -> RunSpec:
    out_dir.mkdir()
    return RunSpec(trace=endless_trace(), dp_size=dp_size, out_dir=out_dir,
                   max_num_seqs=4, block_size=1024, num_gpu_blocks=20_000, device="cpu",
                   transport=transport, run_timeout_s=240.0, max_steps=100_000_000,
                   faults=None if faults is None else FaultPlan.of(faults))


class Descendants:
    """Every process below this one seen while the block runs (sampled), and, with
    ``ray``, the Ray placement groups that were created while Ray is up. A sampler that
    stopped on an error fails the block, rather than leaving ``seen`` short."""

    def __init__(self, *, ray: bool):
        self.seen: set[psutil.Process] = set()
        self.groups: dict[str, dict] = {}
        self._ray = ray
        self._error: BaseException | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> Descendants:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        self._thread.join()
        if self._error is not None:
            raise AssertionError("the process sampler stopped") from self._error

    def _sample(self) -> None:
        """From the block's start, every 50 ms: from a warm fork server, a batch's jobs
        and ranks can start, be killed and be stopped within a fraction of a second."""
        try:
            while True:
                self._sample_once()
                if self._done.wait(0.05):
                    return
        except BaseException as error:  # noqa: BLE001 - reported by __exit__
            self._error = error

    def _sample_once(self) -> None:
        self.seen.update(psutil.Process().children(recursive=True))
        if self._ray:
            ray = sys.modules.get("ray")
            if ray is not None and ray.is_initialized():
                from ray.util import placement_group_table

                with contextlib.suppress(Exception):  # Ray shutting down
                    self.groups.update({k: v for k, v in placement_group_table().items()
                                        if v["state"] == "CREATED"})


class RankKiller(threading.Thread):
    """Kills, with SIGKILL, the rank of the batch's run of one rank once both runs have
    written a step to their event logs. The logs are found through the processes that
    hold them open (on Ray a run writes into a directory of its worker's): the rank is
    the process holding a ``rank0`` log and no ``rank1`` log; the run of two ranks on
    threads holds both in one process."""

    def __init__(self, timeout_s: float = 120):
        super().__init__(daemon=True)
        self._deadline = time.monotonic() + timeout_s
        self.victim: psutil.Process | None = None
        self.most_runs = 0  # the most runs seen under way at once (their logs held open)
        self.problem = ""

    def run(self) -> None:
        logs = {}
        while time.monotonic() < self._deadline:
            time.sleep(0.1)
            logs = event_logs_held(psutil.Process().children(recursive=True))
            ranks = [process for process, paths in logs.items()
                     if [path.name for path in paths] == ["rank0.steps"]]
            held = [path for paths in logs.values() for path in paths]
            self.most_runs = max(self.most_runs, len({path.parent for path in held}))
            if len(ranks) == 1 and len(held) >= 3 and all(map(holds_a_step, held)):
                ranks[0].kill()
                self.victim = ranks[0]
                return
        self.problem = f"not both runs under way: event logs held {logs}"


def _helper_of_this_process(process: psutil.Process) -> bool:
    """multiprocessing's helpers that serve this process and live as long as it does: its
    resource tracker (started for the local executor's stop event) and a fork server of
    jobs or ranks (``emu.cluster.rank_start``), which later batches reuse. What they fork
    (the jobs, the ranks) is counted."""
    try:
        cmdline = " ".join(process.cmdline())
        return process.ppid() == psutil.Process().pid and (
            "multiprocessing.resource_tracker" in cmdline
            or "multiprocessing.forkserver" in cmdline)
    except psutil.NoSuchProcess:
        return False


@pytest.mark.timeout(600)
@pytest.mark.parametrize("executor", ["local", "ray"])
def test_a_killed_rank_stops_the_batch_and_every_run(executor, tmp_path, request,
                                                      monkeypatch):
    if executor == "ray":
        request.getfixturevalue("ray_installed")
        monkeypatch.setattr("emu.executors.ray_cluster.local_cpus", lambda: 2)
        worker_tmp = request.getfixturevalue("worker_tmp")
    before = set(psutil.Process().children(recursive=True))
    killed, endless, queued = tmp_path / "killed", tmp_path / "endless", tmp_path / "queued"
    specs = [spec(endless, dp_size=2, transport="thread"),
             spec(killed, dp_size=1, transport="process"),
             spec(queued, dp_size=2, transport="thread")]
    done = []
    with Descendants(ray=executor == "ray") as descendants:
        killer = RankKiller()
        batch = open_executor(executor, jobs=2)
        batch.check(specs)
        with batch:
            killer.start()
            with pytest.raises(RunFailed) as failed:
                batch.run([check(s) for s in specs], done.append)
        killer.join()
    assert killer.victim is not None, killer.problem
    assert failed.value.index == 1
    assert failed.value.error == "rank 0 failed: killed by signal SIGKILL"
    assert done == []
    assert "rank 0 failed: killed by signal SIGKILL" in (killed / "error.txt").read_text()
    assert json.loads((killed / "run.json").read_text())["state"] == "failed"
    assert json.loads((endless / "run.json").read_text())["state"] == "interrupted"
    assert holds_a_step(endless / "rank1.steps")
    assert killer.most_runs == 2, f"{killer.most_runs} runs under way at once"
    assert list(queued.iterdir()) == []  # the third run never began
    started = {p for p in descendants.seen - before if not _helper_of_this_process(p)}
    assert started, ("the batch started no process", before, descendants.seen)
    _, alive = psutil.wait_procs(started, timeout=30)
    assert alive == [], [p.cmdline() for p in alive]
    if executor == "ray":
        import ray

        assert not ray.is_initialized()
        # The process-transport run held its rank's CPU in a placement group on one node.
        assert [(g["strategy"], list(g["bundles"].values())) for g in
                descendants.groups.values()] == [("STRICT_PACK", [{"CPU": 1.0}])]
        # Each worker's fork server removed its socket's directory as it exited.
        assert pymp_left(worker_tmp) == []


# A batch in a process of its own, run to be killed: one endless run on rank threads.
_BATCH = """
import sys
from pathlib import Path
from emu.executors import open_executor
from emu.spec import check
from tests.integration.test_executors import spec

with open_executor("local", jobs=1) as batch:
    batch.run([check(spec(Path(sys.argv[1]) / "endless", dp_size=2, transport="thread"))],
              lambda index: None)
"""


def test_a_local_job_dies_with_the_batch_killed_by_sigkill(tmp_path):
    # SIGKILL leaves the batch no moment to stop its jobs; a job used to go on with its
    # run, reparented to init, until the run ended. The job is the process writing the
    # run's event logs (its ranks are threads), a fork of the batch's fork server.
    root = Path(__file__).resolve().parents[2]
    batch = subprocess.Popen([sys.executable, "-c", _BATCH, str(tmp_path)], cwd=root)
    try:
        deadline = time.monotonic() + 120
        jobs: list[psutil.Process] = []
        while not jobs:
            assert batch.poll() is None, "the batch ended before its run started"
            assert time.monotonic() < deadline, "no job process ran the run"
            descendants = psutil.Process(batch.pid).children(recursive=True)
            held = event_logs_held(descendants)
            jobs = [p for p, logs in held.items() if any(holds_a_step(log) for log in logs)]
            time.sleep(0.1)
        batch.kill()
        batch.wait()
        # the job, and its fork server with it
        _, alive = psutil.wait_procs(descendants, timeout=30)
    finally:
        batch.kill()
        batch.wait()
    for p in alive:
        p.kill()
    assert alive == [], "the job or its fork server outlived the batch killed by SIGKILL"


def test_a_jobs_ranks_come_from_the_batchs_fork_server_and_die_with_the_job(
        tmp_path, no_leftover_processes):
    """A local job's ranks are forks of the fork server the job itself came from (no
    server of the job's own, which would import torch and the engine again), so their
    parent outlives the job; killed with SIGKILL, the job still takes its ranks along
    while the batch's process and that server go on."""
    from emu.cluster.rank_start import stop_processes
    from emu.executors.local import _run_job
    from emu.run_apart import start_job

    out = tmp_path / "run"
    job, conn = start_job(_run_job, check(spec(out, dp_size=2, transport="process")),
                          "the job")
    try:
        deadline = time.monotonic() + 120
        ranks: list[psutil.Process] = []
        while len(ranks) < 2:
            assert job.is_alive(), "the job ended before its ranks ran"
            assert time.monotonic() < deadline, "the job's ranks never ran"
            held = event_logs_held(psutil.Process().children(recursive=True))
            ranks = [p for p, logs in held.items() if logs[0].parent == out
                     and all(map(holds_a_step, logs))]
            time.sleep(0.1)
        server = psutil.Process(job.pid).parent()
        assert {rank.ppid() for rank in ranks} == {server.pid}
        job.kill()
        job.join()
        _, alive = psutil.wait_procs(ranks, timeout=10)
        assert alive == [], "a rank outlived its job killed by SIGKILL"
        assert server.is_running()
    finally:
        stop_processes([job], 5.0)
        conn.close()


def test_a_job_stopped_in_its_first_moments_stops_as_an_interrupted_run(
        tmp_path, no_leftover_processes):
    """A forked job ignores SIGTERM, as its fork server does, until its launch catches it:
    stopped at once after it starts (a batch stopped as a run begins), the job used to
    miss the signal and run on until it was killed at the end of the grace, its run
    recorded as neither interrupted nor anything else."""
    from emu.cluster.rank_start import stop_processes
    from emu.cluster.supervision import Interrupted
    from emu.run_apart import _job, start_job

    out = tmp_path / "run"
    reported = None
    job, conn = start_job(_job, check(spec(out, dp_size=2, transport="thread")), "the job")
    try:
        stop_processes([job], 60.0)
        with contextlib.suppress(EOFError):  # a job killed reported nothing
            reported = conn.recv()
    finally:
        conn.close()
    assert job.exitcode == 0, "the job was killed at the end of the grace"
    assert isinstance(reported, Interrupted), reported
    assert json.loads((out / "run.json").read_text())["state"] == "interrupted"


def test_a_job_whose_batch_stopped_listening_ends_quietly(tmp_path, no_leftover_processes):
    """A run that ends just as its batch was stopped finds the batch's end of the pipe
    closed: the job exits cleanly (no BrokenPipeError traceback on the command's stderr,
    as `tune` stopped by SIGINT once printed) and its run is complete on disk."""
    from emu.cluster.rank_start import stop_processes
    from emu.executors.local import _run_job
    from emu.run_apart import start_job

    out = tmp_path / "run"
    out.mkdir()
    short = RunSpec(trace=[TraceRequest("r0", 0.0, 64, 8)], dp_size=2, out_dir=out,
                    device="cpu", transport="thread")
    job, conn = start_job(_run_job, check(short), "the job")
    conn.close()  # the batch stopped listening before the run ended
    try:
        job.join(120)
        assert job.exitcode == 0, f"the job ended with {job.exitcode}"
        assert json.loads((out / "run.json").read_text())["state"] == "complete"
    finally:
        stop_processes([job], 5.0)
