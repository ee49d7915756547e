"""Each xdist worker keeps to its share of the cores (tests/conftest.py), and what it
starts inherits that share."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import core_share


@pytest.mark.parametrize("cores, index, count, share", [
    ([0, 1], 0, 2, [0]),
    ([0, 1], 1, 2, [1]),
    ([0, 1, 2, 3, 4, 5, 6, 7], 1, 2, [1, 3, 5, 7]),
    ([2, 3, 5], 0, 2, [2, 5]),
    ([0, 1], 2, 3, [0]),  # more workers than cores: one core, shared
    ([4], 1, 2, [4]),
])
def test_core_share(cores, index, count, share):
    assert core_share(cores, index, count) == share


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="Linux only")
def test_a_process_the_worker_starts_runs_on_the_workers_share(request):
    """The share is taken from the cores the pytest process that started the worker may
    use (the worker's parent); without xdist nothing is changed."""
    allowed = sorted(os.sched_getaffinity(os.getppid()))
    worker = getattr(request.config, "workerinput", None)
    expected = (core_share(allowed, int(worker["workerid"].removeprefix("gw")),
                           worker["workercount"]) if worker else allowed)
    child = subprocess.run(
        [sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
        capture_output=True, text=True, check=True)
    assert child.stdout.strip() == str(expected)
