"""Pure parts of the executors (``emu.executors``): a Ray task's files written back into
the run's directory (and nothing outside it), the signal a stopped batch names, and the
open_executor registry. The executors on real runs: tests/integration/test_executors.py,
tests/cli/test_cli_ray.py and tests/cli/test_cli_ray_cluster.py."""

from __future__ import annotations

import os
import signal
import zlib

import pytest

from emu.executors import EXECUTORS, open_executor
from emu.executors.base import SignalsSeen
from emu.executors.local import LocalExecutor
from emu.executors.ray_cluster import RayExecutor
from emu.executors.ray_task import unpack


def test_a_tasks_files_land_in_the_run_directory(tmp_path):
    files = {"run.json": b'{"state": "complete"}\n',
             "rank0.steps/part-00000.parquet": b"x" * 5000, "rank0.steps/_complete": b""}
    unpack({name: zlib.compress(data) for name, data in files.items()}, tmp_path)
    assert {p.relative_to(tmp_path).as_posix(): p.read_bytes()
            for p in tmp_path.rglob("*") if p.is_file()} == files


@pytest.mark.parametrize("name", ["../escape", "sub/../file", "a/b/file", "sub/", "/file",
                                  "..", ""])
def test_a_file_name_with_a_path_is_refused(tmp_path, name):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    with pytest.raises(ValueError, match="a Ray task sent back a file named"):
        unpack({name: zlib.compress(b"data")}, run_dir)
    assert list(tmp_path.rglob("*")) == [run_dir]


def test_the_signal_that_stopped_a_batch_is_named_even_as_a_bare_keyboard_interrupt():
    def terminated(signum, frame):
        raise KeyboardInterrupt  # as a library that swallows the handler's own type

    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        with SignalsSeen() as seen, pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGTERM)
            signal.sigtimedwait([], 0)  # let the handler run
        assert seen.name == "SIGTERM"
        assert signal.getsignal(signal.SIGTERM) is terminated  # put back
        with SignalsSeen() as unseen:
            pass
        assert unseen.name == "SIGINT"  # a KeyboardInterrupt without a signal
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_open_executor_makes_each_by_name_without_starting_it():
    assert set(EXECUTORS) == {"local", "ray"}
    local = open_executor("local", jobs=3)
    assert isinstance(local, LocalExecutor) and local.jobs == 3
    ray = open_executor("ray", address="10.0.0.1:6379")
    assert isinstance(ray, RayExecutor) and ray.address == "10.0.0.1:6379"


@pytest.mark.parametrize("transport,dp,runs,cores,jobs", [
    ("thread", 8, 20, 2, 2),     # one busy process per run on rank threads
    ("thread", 8, 3, 16, 3),     # never more jobs than runs
    ("process", 2, 20, 8, 4),    # a run on rank processes keeps dp_size cores busy
    ("process", 8, 20, 2, 1),    # a run larger than the machine: one at a time
    ("thread", 2, 5, None, 1),   # cores unknown
])
def test_the_default_jobs_fill_the_cores(monkeypatch, transport, dp, runs, cores, jobs):
    from emu.cli.batch import jobs_filling_cores
    from emu.spec import RunSpec

    monkeypatch.setattr(os, "cpu_count", lambda: cores)
    spec = RunSpec(trace=[], dp_size=dp, out_dir="unused", transport=transport)
    assert jobs_filling_cores([spec] * runs) == jobs
