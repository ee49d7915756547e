"""Signals to `dyntra-emu run` (issue 12): SIGTERM is handled like Ctrl-C (every rank
stopped, one message, error.txt, run.json "interrupted", no temporary directory left);
ranks ignore Ctrl-C from their first moments and die with a launcher that is killed
while they still import torch.

CPU ranks are forks of the launcher's fork server and start in milliseconds; the two
start-up tests therefore run the CLI with spawned ranks (`SPAWN`, the start method of
NPU ranks), whose start-up lasts seconds (`import torch`): the window they test."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from emu.metrics import PartialRunError, compute_metrics, load_run

pytestmark = pytest.mark.integration

# `python -m emu` with spawned CPU ranks (emu.cluster.rank_start.START_METHOD).
SPAWN = ["-c", "import sys, emu.cluster.rank_start as l; l.START_METHOD['cpu'] = 'spawn'; "
               "from emu.cli.main import main; sys.exit(main())"]


def _long_trace(clikit, tmp_path: Path) -> Path:
    """Requests that would decode for a very long time: the run is stopped, never ends."""
    return clikit.write_trace(tmp_path / "long.jsonl", [
        {"request_id": f"r{i}", "arrival_s": 0.01 * i, "prompt_tokens": 64 + 40 * i,
         "output_tokens": 100_000} for i in range(6)])


def _start(clikit, trace: Path, out: Path, tmp: Path,
           entry=("-m", "emu"), flags=()) -> subprocess.Popen:
    """The CLI in its own session (as a terminal's foreground job) with a private TMPDIR,
    so its temporary directories can be counted."""
    tmp.mkdir(exist_ok=True)
    command = [sys.executable, *entry, "run", "--workload", str(trace), *clikit.SMALL,
               "--num-gpu-blocks", "8192", "--out", str(out), *flags]
    return subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, "TMPDIR": str(tmp)})


def _ranks(proc: subprocess.Popen) -> list[psutil.Process]:
    """The launcher's rank processes: its spawned children, or the children of its fork
    server."""
    out = []
    for child in psutil.Process(proc.pid).children():
        try:
            cmdline = " ".join(child.cmdline())
            if "spawn_main" in cmdline:
                out.append(child)
            elif "multiprocessing.forkserver" in cmdline:
                out.extend(child.children())
        except psutil.NoSuchProcess:
            pass
    return out


def _begun(records: Path) -> bool:
    """Whether a rank began the records of ``records`` (a table's directory): its open
    part got its magic number (this module is also run as a script: no tests.held_logs)."""
    with contextlib.suppress(OSError):
        return any(part.stat().st_size > 0 for part in records.iterdir())
    return False


def _wait(condition, proc, what: str, timeout: float = 120):
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        assert proc.poll() is None, (what, proc.communicate())
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _launch_files(tmp: Path, launcher_pid: int) -> list[Path]:
    """The launcher's scratch files: in /dev/shm on Linux, else a directory in TMPDIR."""
    return [*tmp.glob("dyntra-emu-launch-*"),
            *Path("/dev/shm").glob(f"dyntra-emu-launch-{launcher_pid}-*")]


def _importing_torch(process: psutil.Process) -> bool:
    """The rank has mapped torch's libraries: it is inside `import torch`, which takes
    seconds, and (new code) past emu.cluster.rank_boot."""
    try:
        return "/torch/lib/" in Path(f"/proc/{process.pid}/maps").read_text()
    except OSError:
        return False


def _finish(proc: subprocess.Popen, ranks: list[psutil.Process]) -> tuple[str, str]:
    try:
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    gone, alive = psutil.wait_procs(ranks, timeout=30)
    for p in alive:
        p.kill()
    assert alive == [], "ranks outlived the launcher"
    return stdout, stderr


def test_sigterm_mid_run_stops_every_rank_reports_and_cleans_up(tmp_path, clikit):
    out, tmp = tmp_path / "out", tmp_path / "tmp"
    proc = _start(clikit, _long_trace(clikit, tmp_path), out, tmp)
    # Both ranks wrote a part of their step records (a batch of steps) before the signal.
    _wait(lambda: all(any((out / f"rank{r}.steps").glob("part-*.parquet")) for r in (0, 1)),
          proc, "a part of each rank's step records")
    ranks = _ranks(proc)
    assert len(ranks) == 2
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = _finish(proc, ranks)

    assert proc.returncode == 143, stderr
    assert "dyntra-emu run: interrupted by SIGTERM; every rank was stopped." in stderr
    assert "Traceback" not in stderr
    report = (out / "error.txt").read_text()
    assert report.startswith("interrupted by SIGTERM: every rank was stopped")
    for rank in (0, 1):  # where each rank was: its last collective and its stack
        assert f"--- rank {rank} ---" in report
    assert "last entered collective" in report and "emu/impl/kit/engine.py" in report
    assert _launch_files(tmp, proc.pid) == []
    assert json.loads((out / "run.json").read_text())["state"] == "interrupted"
    with pytest.raises(PartialRunError, match="interrupted"):
        load_run(out)
    metrics = compute_metrics(load_run(out, allow_partial=True))
    assert metrics["run_state"] == "interrupted"
    assert metrics["steps"] > 0
    # Nothing finished, but the requests in flight are there.
    assert metrics["requests_finished"] == 0
    assert metrics["requests_total"] == metrics["requests_unfinished"] == 6


def test_sigterm_stops_a_thread_transport_run_and_reports_every_rank(tmp_path, clikit):
    """The same with the ranks as threads of the CLI's process: every rank stopped and
    reported, the run marked partial, no temporary directory left."""
    out, tmp = tmp_path / "out", tmp_path / "tmp"
    proc = _start(clikit, _long_trace(clikit, tmp_path), out, tmp,
                  flags=("--transport", "thread"))
    log = out / "rank1.steps"
    _wait(lambda: _begun(log), proc, "rank 1's step records")
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = _finish(proc, [])

    assert proc.returncode == 143, stderr
    assert ("dyntra-emu run: interrupted by SIGTERM; every rank was stopped. "
            f"{out} holds a partial run (run.json: interrupted)") in stderr
    assert "Traceback" not in stderr
    report = (out / "error.txt").read_text()
    assert report.startswith("interrupted by SIGTERM: every rank was stopped")
    for rank in (0, 1):
        assert f"--- rank {rank} ---" in report
    assert report.count("stopped by the launcher; Python stack:") == 2
    assert "last entered collective" in report and "emu/impl/kit/engine.py" in report
    assert list(tmp.iterdir()) == []
    assert json.loads((out / "run.json").read_text())["state"] == "interrupted"
    assert compute_metrics(load_run(out, allow_partial=True))["steps"] > 0


def test_sigterm_stops_a_sweep_and_says_what_is_partial(tmp_path, clikit):
    """A sweep stopped while its first run is under way: that run's job stops its
    cluster (run.json "interrupted"), the others never start, no table is written."""
    out = tmp_path / "sweep"
    command = [sys.executable, "-m", "emu", "sweep", "--workload",
               str(_long_trace(clikit, tmp_path)), *clikit.SMALL, "--num-gpu-blocks", "8192",
               "--jobs", "1", "--grid", "bubble_threshold=1,5", "--out", str(out)]
    proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    log = out / "runs" / "baseline" / "rank1.steps"
    _wait(lambda: _begun(log), proc, "the baseline's step records")
    jobs = psutil.Process(proc.pid).children(recursive=True)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = _finish(proc, jobs)

    assert proc.returncode == 143, stderr
    assert ("dyntra-emu sweep: interrupted by SIGTERM; the sweep is partial: 0 of 3 runs "
            "finished") in stderr
    assert "Traceback" not in stderr
    assert json.loads((out / "runs" / "baseline" / "run.json").read_text())["state"] == \
        "interrupted"
    assert not (out / "runs" / "p1" / "run.json").exists()
    assert not (out / "sweep.json").exists()


def test_sigterm_stops_a_split_run_and_stitches_nothing(tmp_path, clikit):
    """`run --split 2` stopped while its windows run: each window's job stops its
    cluster (run.json "interrupted"), as a sweep's runs stop; no stitched file."""
    out = tmp_path / "split"
    trace = clikit.write_trace(tmp_path / "long.jsonl", [
        {"request_id": f"r{i}", "arrival_s": 0.01 * i, "prompt_tokens": 64 + 40 * i,
         "output_tokens": 100_000} for i in range(8)])
    proc = _start(clikit, trace, out, tmp_path / "tmp",
                  flags=("--split", "2", "--split-warmup", "0", "--jobs", "2"))
    for window in ("w0", "w1"):
        _wait(lambda w=window: _begun(out / "windows" / w / "rank1.steps"), proc,
              f"window {window}'s step records")
    jobs = psutil.Process(proc.pid).children(recursive=True)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = _finish(proc, jobs)

    assert proc.returncode == 143, stderr
    assert ("dyntra-emu run: interrupted by SIGTERM; the split is partial: 0 of 2 runs "
            "finished") in stderr
    assert "Traceback" not in stderr
    for window in ("w0", "w1"):
        assert json.loads((out / "windows" / window / "run.json").read_text())["state"] \
            == "interrupted"
    assert not any((out / name).exists() for name in ("metrics.json", "summary.md",
                                                      "load.png"))


def test_ctrl_c_during_startup_is_one_line_without_rank_tracebacks(tmp_path, clikit):
    """Ctrl-C in a terminal reaches every process of the job. The ranks, still importing
    torch, ignore it (no traceback, no rank failure); the launcher stops them."""
    out, tmp = tmp_path / "out", tmp_path / "tmp"
    proc = _start(clikit, _long_trace(clikit, tmp_path), out, tmp, entry=SPAWN)
    ranks = _wait(lambda: len(r := _ranks(proc)) == 2 and r, proc, "two rank processes")
    for rank in ranks:  # the terminal's SIGINT, as the ranks see it
        rank.send_signal(signal.SIGINT)
    time.sleep(1.0)  # long enough for a rank that does not ignore it to die of it
    assert not (out / "rank0.steps").exists()  # still starting
    proc.send_signal(signal.SIGINT)
    stdout, stderr = _finish(proc, ranks)

    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert lines[-1].startswith("dyntra-emu run: interrupted by SIGINT; every rank was "
                                "stopped."), stderr
    assert len(lines) == 2, stderr  # the start line and that one
    assert json.loads((out / "run.json").read_text())["state"] == "interrupted"
    assert _launch_files(tmp, proc.pid) == []


def _still_running(processes: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Those of `processes` still running (not gone, not a zombie) after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        alive = []
        for p in processes:
            try:
                if p.status() != psutil.STATUS_ZOMBIE:
                    alive.append(p)
            except psutil.NoSuchProcess:
                pass
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.05)


@pytest.mark.parametrize("ranks, tmpdir", [
    ("processes", "short"), ("processes", "long"), ("threads", "short")])
def test_sigkill_mid_run_leaves_no_process_and_no_temporary_file(tmp_path, clikit, ranks,
                                                                 tmpdir):
    """SIGKILL of the launcher mid-run. Rank processes die with it, its fork server and
    resource tracker exit, and nothing is left in TMPDIR or /dev/shm. The fork server's
    socket lives in a `pymp-*` directory that the killed launcher could not remove: the
    fork server removes it as it exits. With a TMPDIR too long for that socket the ranks
    are spawned and no such directory is made (one was, and left behind). Rank threads
    die with the process; their guard record has no name to leave behind."""
    out = tmp_path / "out"
    short = Path(tempfile.mkdtemp(prefix="dyntra-test-", dir="/tmp"))
    tmp = short if tmpdir == "short" else tmp_path / ("t" * 80)
    try:
        proc = _start(clikit, _long_trace(clikit, tmp_path), out, tmp,
                      flags=("--transport", "process" if ranks == "processes" else "thread"))
        log = out / "rank1.steps"
        _wait(lambda: _begun(log), proc, "rank 1's step records")
        helpers = psutil.Process(proc.pid).children()  # fork server, resource tracker
        started = _ranks(proc)
        assert len(started) == (2 if ranks == "processes" else 0)
        fork_server = any("forkserver" in " ".join(p.cmdline()) for p in helpers)
        assert fork_server == (ranks == "processes" and tmpdir == "short")
        if fork_server:  # its socket's directory, to be removed
            assert [p.name for p in tmp.iterdir() if p.name.startswith("pymp-")]
        proc.kill()
        proc.communicate()

        assert _still_running(started + helpers, timeout=30) == []
        assert sorted(p.name for p in tmp.iterdir()) == []
        assert _launch_files(tmp, proc.pid) == []
        assert json.loads((out / "run.json").read_text())["state"] == "running"
    finally:
        shutil.rmtree(short, ignore_errors=True)


_SUBREAPER_SCRIPT = textwrap.dedent("""
    import ctypes, json, os, signal, subprocess, sys, time
    import psutil
    sys.path.insert(0, {here!r})
    import pathlib
    from test_cli_signals import _importing_torch, _launch_files, _ranks
    ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: orphans come here
    launcher = subprocess.Popen({command!r}, stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                env={{**os.environ, "TMPDIR": {tmp!r}}})
    deadline = time.monotonic() + 120
    while True:
        ranks = _ranks(launcher)
        if len(ranks) == 2 and all(_importing_torch(r) for r in ranks):
            break
        assert launcher.poll() is None and time.monotonic() < deadline, "no ranks"
        time.sleep(0.01)
    started = [os.path.exists(os.path.join({out!r}, f"rank{{r}}.steps"))
               for r in (0, 1)]
    tracker = [c for c in psutil.Process(launcher.pid).children()
               if any("resource_tracker" in p for p in c.cmdline())]
    launcher.kill()
    launcher.wait()
    status = {{}}
    for rank in ranks:
        _, code = os.waitpid(rank.pid, 0)
        status[rank.pid] = (os.WTERMSIG(code) if os.WIFSIGNALED(code) else None,
                            os.WEXITSTATUS(code) if os.WIFEXITED(code) else None)
    for helper in tracker:  # it cleans up after the launcher, then exits
        os.waitpid(helper.pid, 0)
    left = [str(p) for p in _launch_files(pathlib.Path({tmp!r}), launcher.pid)]
    print(json.dumps({{"started": started, "status": list(status.values()), "left": left}}))
""")


def test_ranks_killed_while_importing_torch_die_with_the_launcher(tmp_path, clikit):
    """SIGKILL the launcher while its ranks are inside `import torch`: each rank is
    killed by its parent-death signal at once (SIGKILL), not left to notice it is an
    orphan seconds later, after the import (exit code 1); its scratch files go too."""
    out = tmp_path / "out"
    command = [sys.executable, *SPAWN, "run", "--workload",
               str(_long_trace(clikit, tmp_path)), *clikit.SMALL, "--num-gpu-blocks", "8192",
               "--out", str(out)]
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    script = _SUBREAPER_SCRIPT.format(here=str(Path(__file__).parent), command=command,
                                      out=str(out), tmp=str(tmp))
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=180, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["started"] == [False, False]  # they were still starting
    assert result["status"] == [[signal.SIGKILL, None]] * 2
    # Nothing left in /dev/shm: multiprocessing's resource tracker, which outlives the
    # launcher, removed its scratch files once the ranks were gone.
    assert result["left"] == []
    assert json.loads((out / "run.json").read_text())["state"] == "running"
    with pytest.raises(PartialRunError, match="'running'"):
        load_run(out)
