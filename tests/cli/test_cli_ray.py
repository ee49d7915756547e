"""`--executor ray` through the real console script, on a local Ray that the command
starts and shuts down: SIGINT mid-sweep stops every run and leaves no process or scratch
directory, and bad executor flags are one line with exit 2 and nothing written. What a
batch on Ray gives against the same batch on local jobs (`sweep`, `ab --seeds`) is
tests/cli/test_cli_ray_cluster.py's, on a cluster of two nodes started once for them.
Every command that starts a Ray leaves nothing in its TMPDIR: no ``pymp-*`` directory
of a worker's fork server (tests/ray_tmpdir.py).

Ray is heavy on two cores (its GCS, raylet and agents start with every command: about
8.5 s of CPU here), so only these start one; `tests/integration/test_executors.py` has
the failure path."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from tests.held_logs import event_logs_held, holds_a_step
from tests.ray_tmpdir import pymp_left

pytestmark = pytest.mark.integration


def _open_events_log(processes) -> Path | None:
    """A rank event log a Ray task is writing, once it holds a step."""
    return next((path for paths in event_logs_held(processes).values() for path in paths
                 if path.name == "rank1.steps" and holds_a_step(path)), None)


def _ignore_sigint() -> None:
    """Start the command as a script's background job starts (`dyntra-emu sweep ... &`):
    with SIGINT ignored. It must catch SIGINT all the same (pytest run in the background
    passes the same on to every command a test starts)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.timeout(600)
def test_sigint_stops_a_ray_sweep_and_leaves_nothing(clikit, tmp_path, ray_installed,
                                                     worker_tmp):
    # Ten million output tokens per request: the runs would last hours.
    trace = clikit.write_trace(tmp_path / "endless.jsonl", [
        {"request_id": f"r{i}", "arrival_s": 0.01 * i, "prompt_tokens": 64 + 40 * i,
         "output_tokens": 10_000_000} for i in range(6)])
    out = tmp_path / "sweep"
    proc = subprocess.Popen(  # faulthandler: SIGABRT prints where a stuck command is
        [sys.executable, "-X", "faulthandler", "-m", "emu", "sweep", "--workload", str(trace),
         *clikit.SMALL,
         "--block-size", "1024", "--num-gpu-blocks", "20000", "--executor", "ray",
         "--grid", "bubble_threshold=1,5",
         "--out", str(out)],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True, preexec_fn=_ignore_sigint)
    seen: set[psutil.Process] = set()
    deadline = time.monotonic() + 300
    log = None
    try:
        while log is None:  # a run under way on a Ray worker
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no run got under way"
            seen.update(psutil.Process(proc.pid).children(recursive=True))
            log = _open_events_log(seen)
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        try:
            stdout, stderr = proc.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGABRT)
            stderr = proc.communicate()[1]
            with contextlib.suppress(ProcessLookupError):  # Ray's agents, in its group
                os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail("the sweep did not stop within 240 s of SIGINT; its stderr, with "
                        f"its threads' stacks at the end:\n{stderr}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, stderr
    assert "on Ray (a local Ray)" in stderr
    assert ("dyntra-emu sweep: interrupted by SIGINT; the sweep is partial: 0 of 3 runs "
            "finished") in stderr
    assert "Traceback" not in stderr
    states = {d.name: json.loads((d / "run.json").read_text())["state"]
              for d in (out / "runs").iterdir() if (d / "run.json").exists()}
    assert states and set(states.values()) == {"interrupted"}, states
    for name in states:  # the partial runs came back, with each rank's report
        assert "interrupted by SIGTERM: every rank was stopped" in (
            out / "runs" / name / "error.txt").read_text()
    assert not (out / "sweep.json").exists()
    _, alive = psutil.wait_procs(seen, timeout=30)
    assert alive == [], [p.cmdline() for p in alive]
    assert not log.parent.parent.exists()  # the task's scratch directory
    assert pymp_left(worker_tmp) == []


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("args,fragment", [
    (["--ray-address", "{unreachable}"],
     "--ray-address 127.0.0.1:{port}: no Ray cluster reachable there (Connection refused)"),
    (["--dp", str((os.cpu_count() or 1) + 1)],
     f"--executor ray: a run of --dp {(os.cpu_count() or 1) + 1} on the process transport "
     f"needs {(os.cpu_count() or 1) + 1} CPUs on one node (its ranks meet on 127.0.0.1), but "
     f"the largest node of the local Ray has {os.cpu_count() or 1}"),
])
def test_ray_refuses_what_it_cannot_run(cli, clikit, tmp_path, ray_installed, monkeypatch,
                                        args, fragment):
    """Refused before any Ray starts: a local Ray would make its session directory under
    RAY_TMPDIR (a short path: Ray's sockets live there)."""
    ray_tmp = Path(tempfile.mkdtemp(prefix="ray-"))
    ray_tmp.rmdir()
    monkeypatch.setenv("RAY_TMPDIR", str(ray_tmp))
    port = _free_port()
    args = [a.replace("{unreachable}", f"127.0.0.1:{port}") for a in args]
    proc = cli("ab", "--workload", "recipe:pr12292,n=2", "--seeds", "2", "--block-size",
               "2048", "--device", "cpu", "--dp", "2", *args, "--executor", "ray",
               "--out", "never", timeout=300)
    clikit.assert_user_error(proc, fragment.replace("{port}", str(port)))
    assert [line for line in proc.stderr.splitlines() if "dyntra-emu" in line] == [
        proc.stderr.strip().splitlines()[-1]]
    assert not (tmp_path / "never").exists()
    started = ray_tmp.exists()
    shutil.rmtree(ray_tmp, ignore_errors=True)
    assert not started, "a Ray was started"


def test_executor_ray_without_ray_names_the_install(clikit, tmp_path, tiny_trace):
    """Ray missing (an import that fails, in a fresh interpreter): one line naming the
    extra to install, exit 2, nothing written. Needs no Ray."""
    code = ("import sys; sys.modules['ray'] = None; from emu.cli.main import main; "
            "sys.exit(main())")
    proc = subprocess.run(
        [sys.executable, "-c", code, "sweep", "--workload", str(tiny_trace), *clikit.SMALL,
         "--grid", "mode=static", "--executor", "ray", "--out", "never"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    clikit.assert_user_error(proc, "--executor ray: Ray is not installed; install it with "
                                   "pip install -e '.[ray]'")
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not (tmp_path / "never").exists()


@pytest.mark.parametrize("command,args,fragment", [
    ("sweep", ["--grid", "mode=static", "--ray-address", "10.0.0.1:6379"],
     "--ray-address: only with --executor ray"),
    ("sweep", ["--grid", "mode=static", "--executor", "ray", "--jobs", "2"],
     "--jobs: only with --executor local"),
    ("ab", ["--executor", "ray"], "--executor ray: only with --seeds N"),
    ("ab", ["--jobs", "2"], "--jobs: only with --seeds N"),
])
def test_executor_flags_that_do_not_apply(cli, clikit, tmp_path, tiny_trace, command, args,
                                          fragment):
    """Refused before Ray is looked for: no Ray needed."""
    proc = cli(command, "--workload", tiny_trace, *clikit.SMALL, *args, "--out", "never")
    clikit.assert_user_error(proc, fragment)
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not (tmp_path / "never").exists()
