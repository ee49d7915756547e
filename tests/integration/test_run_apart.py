"""``emu.run_apart.run_apart``: a run in a fresh process of its own gives the run, its
failure as the run's own ``ClusterError``, and stops on SIGTERM as a run does (every rank
and the run's process gone, the run recorded as interrupted)."""

from __future__ import annotations

import dataclasses
import json
import pickle
import signal
import subprocess
import sys
import time

import psutil
import pytest

from emu.cluster.supervision import ClusterError
from emu.faults import FaultPlan
from emu.run import run
from emu.run_apart import run_apart
from emu.spec import check
from tests.integration.conftest import spec

pytestmark = pytest.mark.integration


def test_a_run_apart_is_the_same_run(tmp_path, no_leftover_processes):
    here = run(dataclasses.replace(spec("static", 2, tmp_path / "here"), transport="thread"))
    apart = run_apart(check(dataclasses.replace(spec("static", 2, tmp_path / "apart"),
                                                transport="thread")))
    for rank in range(2):
        assert apart.event_log(rank) == here.event_log(rank)
    written = json.loads((tmp_path / "apart" / "metrics.json").read_text())
    assert written == apart.metrics
    assert {k: v for k, v in apart.metrics.items() if k != "wall"} == \
        {k: v for k, v in here.metrics.items() if k != "wall"}
    assert sum(r.num_plans for r in apart.ranks) > 0


def test_a_failed_run_apart_raises_the_runs_cluster_error(tmp_path, no_leftover_processes):
    failing = dataclasses.replace(spec("static", 2, tmp_path / "killed"), transport="thread",
                                  faults=FaultPlan.of("kill:rank=1,step=3"))
    with pytest.raises(ClusterError) as caught:
        run_apart(check(failing))
    assert caught.value.rank == 1
    assert "killed by fault" in caught.value.message
    status = json.loads((tmp_path / "killed" / "run.json").read_text())
    assert status["state"] == "failed"


SCRIPT = """\
import pickle, signal, sys
from emu.cli.errors import raise_terminated
from emu.cluster.supervision import Interrupted
from emu.run_apart import run_apart
from emu.spec import check

if __name__ == "__main__":
    signal.signal(signal.SIGTERM, raise_terminated)  # as dyntra-emu's main does
    with open(sys.argv[1], "rb") as f:
        spec = pickle.load(f)
    try:
        run_apart(check(spec))
    except Interrupted as exc:
        print("interrupted by", exc.signal_name, flush=True)
        sys.exit(3)
    print("finished", flush=True)
"""


def test_sigterm_stops_the_run_apart_its_ranks_and_its_process(tmp_path):
    """SIGTERM to the process that called run_apart (``timeout``, a CI runner) reaches the
    run: it stops its ranks, records itself as interrupted and reports back; nothing of
    it is left."""
    out = tmp_path / "stopped"
    # Rank 0 sleeps a minute of wall time before step 5's lockstep collective: the run is
    # still under way whenever the signal comes.
    slow = dataclasses.replace(spec("static", 2, out), faults=FaultPlan.of(
        "delay:rank=0,site=engine.lockstep,step=5,seconds=60"), collective_timeout_s=300.0)
    (tmp_path / "spec.pickle").write_bytes(pickle.dumps(slow))
    (tmp_path / "apart.py").write_text(SCRIPT)
    proc = subprocess.Popen([sys.executable, str(tmp_path / "apart.py"),
                             str(tmp_path / "spec.pickle")], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 180
        # Wait until both ranks run (the run's process and its rank processes exist).
        while not (out / "rank1.steps").exists() or not (
                out / "rank0.steps").exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the ranks never started"
            time.sleep(0.2)
        descendants = psutil.Process(proc.pid).children(recursive=True)
        assert descendants  # the run's process, its ranks
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 3, (stdout, stderr)
    assert "interrupted by SIGTERM" in stdout
    assert json.loads((out / "run.json").read_text())["state"] == "interrupted"
    _, alive = psutil.wait_procs(descendants, timeout=30)
    assert alive == []
