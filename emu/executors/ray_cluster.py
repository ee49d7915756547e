"""The ``ray`` executor: a batch's runs as Ray tasks, on a local Ray started for the
batch (shut down when it ends) or on the Ray cluster at ``--ray-address``.

Resources: a run on the process transport needs its ``dp_size`` ranks running at once,
and its ranks meet on 127.0.0.1, so it reserves ``dp_size`` bundles of one CPU in a
STRICT_PACK placement group (all on one node) and its task runs in the first bundle; a
thread-transport run is one process and takes one CPU. A run larger than every node of
the cluster is refused before any starts (``check``): before a local Ray starts, whose
one node gets this machine's CPUs, or once the cluster at an address is joined.

Each task (``emu.executors.ray_task.run_task``) runs in a temporary directory of its
worker's node and sends the run's files back; the driver writes them into the run's
out_dir, so the results, sweep.json and plots are those of a local batch. Stopping (a
failed run, SIGINT, SIGTERM) goes through the batch's ``StopBoard``: queued tasks are
cancelled, the runs under way stop as a terminated local job does and send back their
partial files, and a task still running after ``STOP_GRACE_S`` is killed.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
from collections.abc import Callable, Sequence
from pathlib import Path

from emu.executors.base import (
    ExecutorError,
    RunFailed,
    RunsInterrupted,
    SignalsSeen,
    cpus_needed,
)
from emu.executors.ray_task import StopBoard, run_task, unpack
from emu.spec import CheckedRun, RunSpec

INSTALL_HINT = "pip install -e '.[ray]'"
# How long the runs under way get to stop their ranks and send their files back; a run
# stops within the launcher's echo grace and the collective timeout.
STOP_GRACE_S = 90.0
# How long the driver waits for a TCP connection to --ray-address before calling it
# unreachable (ray.init itself retries for minutes).
CONNECT_TIMEOUT_S = 5.0
# The local Ray's settings. By default a Ray worker that exits kills its child
# processes with SIGKILL, and its raylet then kills what is left of the worker's process
# group. A worker's children here are its fork servers (emu.run_apart), which exit by
# themselves once their worker is gone and remove their socket and its pymp-* directory
# as they go (emu.cluster.rank_preload); killed first, they left that empty directory in
# the worker's TMPDIR, one per worker. Their jobs and ranks die with their parents
# anyway (the parent-death signal). A cluster at --ray-address has its own settings
# (docs/executors.md).
SYSTEM_CONFIG = {"kill_child_processes_on_worker_exit": False,
                 "process_group_cleanup_enabled": False}


def local_cpus() -> int:
    """The CPUs of the one node of a local Ray started for a batch: this machine's."""
    return os.cpu_count() or 1


class RayExecutor:
    """Ray tasks on a local or remote Ray cluster (see the module docstring)."""

    def __init__(self, address: str | None):
        self.address = address
        self._ray = None
        self._largest: RunSpec | None = None  # the checked run needing the most CPUs

    # ----------------------------------------------------------------- the cluster

    def check(self, specs: Sequence[RunSpec]) -> None:
        self._largest = max(specs, key=cpus_needed)
        if self.address is None:
            self._fits([local_cpus()])

    def _fits(self, node_cpus: list) -> None:
        """The largest run needs no more CPUs than the largest of ``node_cpus`` has."""
        need, most = cpus_needed(self._largest), int(max(node_cpus, default=0))
        if need > most:
            where = ("the local Ray" if self.address is None
                     else f"the Ray cluster at {self.address}")
            raise ExecutorError(
                f"--executor ray: a run of --dp {self._largest.dp_size} on the process "
                f"transport needs {need} CPUs on one node (its ranks meet on 127.0.0.1), "
                f"but the largest node of {where} has {most}")

    def __enter__(self) -> RayExecutor:
        try:
            import ray
        except ImportError:
            raise ExecutorError(f"--executor ray: Ray is not installed; install it with "
                                f"{INSTALL_HINT}") from None
        if self.address is not None:
            _check_reachable(self.address)
        # ray.init installs its own SIGTERM handler (exit at once); the command's stays.
        sigterm = signal.getsignal(signal.SIGTERM)
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        try:
            if self.address is None:
                ray.init(address="local", num_cpus=local_cpus(),
                         include_dashboard=False, logging_level=logging.WARNING,
                         log_to_driver=False, _system_config=SYSTEM_CONFIG)
            else:
                ray.init(address=self.address, logging_level=logging.WARNING,
                         log_to_driver=False)
        except Exception as exc:
            ray.shutdown()
            where = "a local Ray" if self.address is None else f"--ray-address {self.address}"
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ExecutorError(f"--executor ray: cannot start or join {where}: {first}") \
                from None
        except BaseException:  # Ctrl-C while Ray starts: stop what started
            ray.shutdown()
            raise
        finally:
            if sigterm is not None:
                signal.signal(signal.SIGTERM, sigterm)
        self._ray = ray
        if self.address is not None and self._largest is not None:
            try:
                self._fits([n.get("Resources", {}).get("CPU", 0) for n in ray.nodes()
                            if n.get("Alive")])
            except ExecutorError:
                self.__exit__()
                raise
        return self

    def __exit__(self, *exc) -> None:
        if self._ray is not None:
            self._ray.shutdown()  # stops a local Ray we started; else disconnects
            self._ray = None

    def slots(self, spec: RunSpec) -> int:
        need = cpus_needed(spec)
        return max(1, sum(int(n.get("Resources", {}).get("CPU", 0)) // need
                          for n in self._ray.nodes() if n.get("Alive")))

    # ----------------------------------------------------------------- the runs

    def run(self, runs: Sequence[CheckedRun], on_done: Callable[[int], None]) -> list[dict]:
        ray = self._ray
        board = ray.remote(num_cpus=0)(StopBoard).remote()
        task = ray.remote(max_retries=0)(run_task)
        groups: dict[int, object] = {}
        tasks: dict[object, int] = {}
        specs = [checked.spec for checked in runs]
        for index, (checked, spec) in enumerate(zip(runs, specs, strict=True)):
            options = {"num_cpus": 1}
            if spec.transport == "process":
                groups[index] = self._placement_group(spec.dp_size)
                options["scheduling_strategy"] = self._in_group(groups[index])
            tasks[task.options(**options).remote(index, checked, board)] = index
        results: dict[int, dict] = {}
        pending = list(tasks)
        with SignalsSeen() as signals:
            try:
                while pending:
                    ready, pending = ray.wait(pending, num_returns=1, timeout=0.5)
                    for ref in ready:
                        index = tasks[ref]
                        outcome = self._outcome(ref, index, specs[index])
                        if "error" in outcome:  # its group outlives the stop (_stop)
                            raise RunFailed(index, outcome["error"])
                        self._release(groups.pop(index, None))
                        results[index] = outcome
                        on_done(index)
            except BaseException as exc:  # a failed run, SIGINT, SIGTERM
                self._stop(board, pending, tasks, specs)
                if not isinstance(exc, KeyboardInterrupt):
                    raise
                raise RunsInterrupted(len(results), len(specs), signals.name) from exc
            finally:
                for group in groups.values():
                    self._release(group)
                ray.kill(board)
        return [results[i] for i in range(len(specs))]

    def _outcome(self, ref, index: int, spec: RunSpec) -> dict:
        """Run ``index``'s outcome, its files written into its out_dir; a worker that
        died is a failed run."""
        ray = self._ray
        try:
            outcome = ray.get(ref)
        except (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError) as exc:
            return {"error": f"the Ray worker running it died: {type(exc).__name__}"}
        unpack(outcome.pop("files", {}), Path(spec.out_dir))
        return outcome

    def _stop(self, board, pending: list, tasks: dict, specs: Sequence[RunSpec]) -> None:
        """Stop the batch: cancel what has not begun, let the runs under way stop and send
        their partial files back, kill what is still running after STOP_GRACE_S. Called
        while a failed run's placement group is still held: released earlier, its CPUs
        would start a queued run before the board refuses it."""
        ray = self._ray
        try:
            began = set(ray.get(board.stop.remote(), timeout=STOP_GRACE_S))
        except ray.exceptions.RayError:  # Ray no longer answers: treat every task as begun
            began = {tasks[ref] for ref in pending}
        running = [ref for ref in pending if tasks[ref] in began]
        for ref in pending:
            if tasks[ref] not in began:
                ray.cancel(ref, force=False)
        ready, late = ray.wait(running, num_returns=len(running), timeout=STOP_GRACE_S) \
            if running else ([], [])
        for ref in ready:
            try:
                self._outcome(ref, tasks[ref], specs[tasks[ref]])
            except ray.exceptions.RayError:
                pass  # it failed while stopping; the batch is stopped either way
        for ref in late:
            ray.cancel(ref, force=True)

    def _placement_group(self, bundles: int):
        from ray.util.placement_group import placement_group

        return placement_group([{"CPU": 1}] * bundles, strategy="STRICT_PACK")

    def _in_group(self, group):
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        return PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=0)

    def _release(self, group) -> None:
        if group is not None:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(group)


def _check_reachable(address: str) -> None:
    """A ``HOST:PORT`` address (optionally ``ray://``) must accept a TCP connection
    within CONNECT_TIMEOUT_S; other forms (``auto``) are left to ray.init."""
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise ExecutorError(f"--ray-address {address}: no Ray cluster reachable there "
                            f"({reason})") from None
