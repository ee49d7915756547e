"""`--executor ray --ray-address` on a Ray cluster of two nodes on this machine: two
raylets of 2 CPUs each, started as Ray's own cluster test utilities start them
(``ray.cluster_utils.Cluster``), once for this module, with the setting a cluster for
dyntra-emu needs (docs/executors.md: a worker's fork servers are not killed with it).

- `sweep` of a 2 x 2 grid on rank processes gives what the session's local sweep gives
  (rows, metrics, event logs, plots; wall-clock fields aside), each run a task in a
  placement group of its ranks' CPUs, on one node;
- `ab --seeds 2` on the cluster gives what the session's local `ab --seeds 2` gives, with
  runs on both nodes. Both run on rank threads (a run is one Ray task of one CPU, so the
  four runs fill the two nodes at once): the same runs on rank processes took four times
  as long here (gloo's wake-ups on 2 cores), and rank processes on the cluster are
  what the sweep above runs;
- `tune` on rank threads runs four trials at a time, on both nodes; SIGTERM mid-study
  stops it (exit 143, every run under way stopped, the trials under way marked failed)
  and the same command resumes it with --trials more;
- `run --split 2` on the cluster (a window a task on rank threads) stitches what the
  same split on local jobs stitches, every request of the trace reported once;
- the cluster shut down, no worker's fork server left a ``pymp-*`` directory in its
  TMPDIR (tests/ray_tmpdir.py).

Nodes are told apart by their raylet: every process of a node descends from its raylet
(raylet, Ray worker, fork server, rank). Which node ran a run is the node of the Ray
worker whose pid its run.json records; where a run's ranks were is seen from the
processes that hold its rank step records open (a rank process, or the Ray worker running
a run's rank threads)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from emu.executors.ray_cluster import SYSTEM_CONFIG
from tests.held_logs import event_logs_held
from tests.ray_tmpdir import own_tmpdir, pymp_left
from tests.records import event_log
from tests.study_states import finished, study_states

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

NODE_CPUS = 2


class TwoNodes:
    """The cluster: its address and each node's raylet process."""

    def __init__(self, cluster, raylets: list[psutil.Process]):
        self.cluster = cluster
        self.address = cluster.address
        self.raylets = raylets


@pytest.fixture(scope="module")
def two_nodes():
    try:
        from ray._private import ray_constants
        from ray.cluster_utils import Cluster
    except ImportError:
        if os.environ.get("DYNTRA_RAY_REQUIRED") == "1":
            pytest.fail("Ray is required here (DYNTRA_RAY_REQUIRED=1): pip install -e '.[ray]'")
        pytest.skip("Ray not installed: pip install -e '.[ray]'")
    with pytest.MonkeyPatch.context() as monkeypatch, own_tmpdir(monkeypatch) as tmp:
        monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
        cluster = Cluster(initialize_head=True, connect=False, head_node_args={
            "num_cpus": NODE_CPUS, "include_dashboard": False,
            "_system_config": SYSTEM_CONFIG})
        try:
            cluster.add_node(num_cpus=NODE_CPUS)
            cluster.wait_for_nodes()
            raylet = ray_constants.PROCESS_TYPE_RAYLET
            raylets = [psutil.Process(n.all_processes[raylet][0].process.pid)
                       for n in (cluster.head_node, *cluster.worker_nodes)]
            yield TwoNodes(cluster, raylets)
        finally:
            cluster.shutdown()
        left = pymp_left(tmp)
        assert left == [], f"the workers' fork servers left {left} in their TMPDIR"


class Placements(threading.Thread):
    """While a command runs, sampled every 0.2 s: the node of every process under a
    raylet (``nodes_of``: a Ray worker lives as long as the command's job, so none is
    missed) and, for every run directory whose rank step records a process holds open,
    the nodes of those processes (``runs``: a run of a second or two can fall between two
    samples, so it may miss some runs)."""

    def __init__(self, nodes: TwoNodes):
        super().__init__(daemon=True)
        self.nodes = nodes
        self.runs: dict[str, set[int]] = {}
        self.nodes_of: dict[int, int] = {}
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.wait(0.2):
            processes = []
            for node, raylet in enumerate(self.nodes.raylets):
                with contextlib.suppress(psutil.Error):
                    for process in raylet.children(recursive=True):
                        self.nodes_of.setdefault(process.pid, node)
                        processes.append(process)
            for process, logs in event_logs_held(processes).items():
                node = self.nodes_of[process.pid]
                for log in logs:
                    # a Ray task's run directory: <scratch>/run/rank<r>.steps/
                    self.runs.setdefault(str(log.parent.parent), set()).add(node)

    def node_of_run(self, run_dir: Path) -> int | None:
        """The node whose process ran the cluster of ``run_dir`` (a Ray worker: its pid
        is in run.json), if it ran under a raylet."""
        return self.nodes_of.get(json.loads((run_dir / "run.json").read_text())["pid"])

    def __enter__(self) -> Placements:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        self.join()


def _without_wall(metrics: dict) -> dict:
    return {k: v for k, v in metrics.items() if k != "wall"}


def _same_runs(local: Path, ray: Path, names: list[str]) -> None:
    """Each run's metrics (wall-clock aside) and event logs are the same in both."""
    for name in names:
        a, b = local / name, ray / name
        assert (_without_wall(json.loads((a / "metrics.json").read_text()))
                == _without_wall(json.loads((b / "metrics.json").read_text()))), name
        logs = sorted(p.name for p in a.glob("rank*.steps"))
        assert logs and logs == sorted(p.name for p in b.glob("rank*.steps")), name
        for rank in range(len(logs)):
            assert event_log(a, rank) == event_log(b, rank), (name, rank)


def test_sweep_on_two_nodes_equals_local(two_nodes, sweep_2x2, cli, clikit, tmp_path):
    """The sweep of sweep_2x2 (run in a test process, the reference) again on the cluster:
    each run a task in a placement group of its two ranks' CPUs, a node's worth."""
    local, reference = sweep_2x2
    assert local.returncode == 0, local.stderr
    with Placements(two_nodes) as seen:
        ray = cli("sweep", "--workload", reference.parent / "sweep.jsonl",
                  *clikit.SWEEP_2X2, "--executor", "ray", "--ray-address", two_nodes.address,
                  "--out", "ray", timeout=600, process=True)
    assert ray.returncode == 0, ray.stderr
    assert f"on Ray ({two_nodes.address})" in ray.stderr

    sweeps = [json.loads((d / "sweep.json").read_text()) for d in (reference, tmp_path / "ray")]
    assert [r["name"] for r in sweeps[0]["rows"]] == ["baseline", "p01", "p02", "p03", "p04"]
    assert sweeps[0]["rows"] == sweeps[1]["rows"]
    assert ({k: v for k, v in sweeps[0].items() if k != "wall_s"}
            == {k: v for k, v in sweeps[1].items() if k != "wall_s"})
    assert any(r["pauses"] for r in sweeps[0]["rows"])  # DyntraLB did something
    for name in ("sweep.csv", "pareto.png", "kv_blocks.png"):
        assert (reference / name).read_bytes() == (tmp_path / "ray" / name).read_bytes()
    _same_runs(reference / "runs", tmp_path / "ray" / "runs",
               [r["name"] for r in sweeps[0]["rows"]])
    # Every run ran on the cluster; those seen under way (rank processes for a few seconds:
    # the sampler sees some) had their two ranks on one node.
    names = [r["name"] for r in sweeps[0]["rows"]]
    assert None not in [seen.node_of_run(tmp_path / "ray" / "runs" / n) for n in names]
    assert seen.runs and all(len(n) == 1 for n in seen.runs.values()), seen.runs


def test_ab_seeds_on_two_nodes_equals_local(two_nodes, ab_over_seeds, clikit, tmp_path):
    local, reference = ab_over_seeds
    assert local.returncode == 0, local.stderr
    with Placements(two_nodes) as seen:
        ray = subprocess.run(
            [sys.executable, "-m", "emu", *clikit.AB_OVER_SEEDS_AB, "--executor", "ray",
             "--ray-address", two_nodes.address, "--out", str(tmp_path / "ray")],
            cwd=tmp_path, capture_output=True, text=True, timeout=800,
            stdin=subprocess.DEVNULL)
    assert ray.returncode == 0, ray.stderr
    assert local.stdout == ray.stdout.replace(str(tmp_path / "ray"), str(reference))
    for seed in (3, 4):
        for side in ("a", "b"):
            a = json.loads((reference / f"seed{seed}" / side / "metrics.json").read_text())
            b = json.loads((tmp_path / "ray" / f"seed{seed}" / side / "metrics.json")
                           .read_text())
            assert {k: v for k, v in a.items() if k != "wall"} == \
                {k: v for k, v in b.items() if k != "wall"}
    # Every run ran on the cluster, and both nodes ran runs.
    nodes = [seen.node_of_run(tmp_path / "ray" / f"seed{seed}" / side)
             for seed in (3, 4) for side in ("a", "b")]
    assert set(nodes) == {0, 1}, (nodes, seen.nodes_of)


def test_run_split_on_two_nodes_equals_local(two_nodes, cli, clikit, tmp_path):
    """Ten requests cut into 2 windows of 5 with a 0.02 s warm-up: window 1 replays 2 of
    window 0's requests first, window 0 two of window 1's last (its cool-down)."""
    trace = clikit.write_trace(tmp_path / "tiny.jsonl", clikit.tiny_requests())
    split = ["run", "--workload", str(trace), *clikit.SMALL, "--transport", "thread",
             "--split", "2", "--split-warmup", "0.02", "--quiet"]
    local = cli(*split, "--jobs", "2", "--out", tmp_path / "local")
    assert local.returncode == 0, local.stderr
    ray = subprocess.run([sys.executable, "-m", "emu", *split, "--executor", "ray",
                          "--ray-address", two_nodes.address, "--out", str(tmp_path / "ray")],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300,
                         stdin=subprocess.DEVNULL)
    assert ray.returncode == 0, ray.stderr
    metrics = {name: json.loads((tmp_path / name / "metrics.json").read_text())
               for name in ("local", "ray")}
    requests = clikit.tiny_requests()
    for name, stitched in metrics.items():
        assert stitched["requests_total"] == stitched["requests_finished"] == len(requests)
        assert stitched["output_tokens"] == sum(r["output_tokens"] for r in requests)
        windows = stitched["split"]["per_window"]
        assert [(w["requests"], w["warmup_requests"], w["cooldown_requests"])
                for w in windows] == [(5, 0, 2), (5, 2, 0)], name
        for window in windows:  # each window's run replayed its warm-up or cool-down too
            run = json.loads((tmp_path / name / "windows" / f"w{window['window']}" /
                              "metrics.json").read_text())
            assert run["requests_total"] == 7, (name, window)
    assert {k: v for k, v in metrics["local"].items() if k != "wall"} == \
        {k: v for k, v in metrics["ray"].items() if k != "wall"}
    assert local.stdout == ray.stdout.replace(str(tmp_path / "ray"), str(tmp_path / "local"))


def test_tune_on_two_nodes_stopped_by_sigterm_resumes(two_nodes, clikit, tmp_path):
    trace = clikit.write_trace(tmp_path / "tiny.jsonl", clikit.tiny_requests())
    out = tmp_path / "study"
    storage = f"sqlite:///{out / 'study.db'}"
    command = [sys.executable, "-m", "emu", "tune", "--workload", str(trace), *clikit.SMALL,
               "--transport", "thread", "--knobs", "mode,start_step,bubble_threshold",
               "--executor", "ray", "--ray-address", two_nodes.address, "--min-gain", "0",
               "--out", str(out)]  # --min-gain 0: the test is about the study, not gains
    with Placements(two_nodes) as seen:
        proc = subprocess.Popen([*command, "--trials", "40"], cwd=tmp_path,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            deadline = time.monotonic() + 600
            counts: dict[str, int] = {}
            # Until trials finished, and the runs done so far ran on both nodes.
            while finished(counts) < 2 or {0, 1} - {
                    seen.node_of_run(p.parent) for p in out.glob("runs/*/*/run.json")}:
                assert proc.poll() is None, proc.communicate()
                assert time.monotonic() < deadline, (counts, seen.nodes_of)
                time.sleep(0.5)
                if (out / "study.db").exists():
                    counts = study_states(storage)
            proc.send_signal(signal.SIGTERM)
            stdout, stderr = proc.communicate(timeout=240)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert proc.returncode == 143, stderr
    assert "dyntra-emu tune: interrupted by SIGTERM" in stderr
    assert "run the same command again to resume it" in stderr
    assert "Traceback" not in stderr
    stopped = study_states(storage)
    assert "RUNNING" not in stopped, stopped
    done = finished(stopped)
    # Whatever was under way was stopped: no rank is left writing an event log.
    time.sleep(1.0)
    processes = [p for r in two_nodes.raylets for p in r.children(recursive=True)]
    assert event_logs_held(processes) == {}
    states = [json.loads(p.read_text())["state"] for p in (out / "runs").glob("*/*/run.json")]
    assert set(states) <= {"complete", "interrupted"}, states

    resumed = subprocess.run([*command, "--trials", "2"], cwd=tmp_path, capture_output=True,
                             text=True, timeout=600, stdin=subprocess.DEVNULL)
    assert resumed.returncode == 0, resumed.stderr
    after = study_states(storage)
    assert finished(after) == done + 2, (stopped, after)
    assert f"{2 * NODE_CPUS} trial(s) at a time" in resumed.stderr
    assert Path(out / "recommended.json").exists()
