"""`--transport thread` through the real CLI: `run` gives the event logs, rank logs and
metrics (wall-clock section aside) of the default process transport; `ab` accepts it;
torchrun refuses it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.records import event_log

pytestmark = pytest.mark.integration


def test_run_with_threads_matches_processes(cli, clikit, tmp_path, tiny_trace):
    config = json.dumps({"scheduler_config": {"dyntra_lb_config": {
        "enabled": True, "mode": "static", "start_step": 0, "enable_diagnostics": True}}})
    for transport in ("process", "thread"):
        proc = cli("run", "--workload", tiny_trace, *clikit.SMALL, "--additional-config",
                   config, "--transport", transport, "--quiet", "--out", transport)
        assert proc.returncode == 0, proc.stderr
    for rank in range(2):
        a, b = event_log(tmp_path / "process", rank), event_log(tmp_path / "thread", rank)
        assert a and a == b, f"rank {rank}'s records"
        name = f"rank{rank}.log"
        a = (tmp_path / "process" / name).read_bytes()
        assert a and a == (tmp_path / "thread" / name).read_bytes(), name
    metrics = [json.loads((tmp_path / t / "metrics.json").read_text())
               for t in ("process", "thread")]
    assert metrics[0].pop("wall") != metrics[1].pop("wall")  # measured, so never equal
    assert metrics[0] == metrics[1]
    assert metrics[1]["requests_finished"] == 10


def test_ab_with_threads(cli, clikit, tiny_trace, tmp_path):
    proc = cli("ab", "--workload", tiny_trace, *clikit.SMALL, "--transport", "thread",
               "--quiet", "--out", "ab")
    assert proc.returncode == 0, proc.stderr
    for run in ("a", "b"):
        assert json.loads((tmp_path / "ab" / run / "metrics.json").read_text())[
            "requests_finished"] == 10


def test_thread_transport_is_refused_under_torchrun(tmp_path, tiny_trace, clikit):
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}
    proc = subprocess.run([sys.executable, "-m", "emu", "run", "--workload", str(tiny_trace),
                           "--transport", "thread", "--out", "x"], cwd=tmp_path,
                          capture_output=True, text=True, env=env, timeout=120,
                          stdin=subprocess.DEVNULL)
    clikit.assert_user_error(proc, "--transport thread: under torchrun every rank is its own "
                                   "process")
