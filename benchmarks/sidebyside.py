"""What the side-by-side benchmark scripts share: where the repo and the vllm-ascend tree
are, the config they plan with, the machine line a table starts with, the alternating
order of a pair's runs, and the p50 / p99 table of per-step planner times.

A script in this folder imports it as ``sidebyside`` (its own folder is first on
``sys.path`` when run as ``python benchmarks/<script>.py``); importing it also puts the
repo root on ``sys.path``, so ``emu`` and ``dyntra_lb`` import from this checkout.
"""

from __future__ import annotations

import os
import pathlib
import platform
import statistics
import sys
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from emu.records.reader import event_lines, record_ranks, wall_records

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

TREE = os.environ.get("DYNTRA_VLLM_ASCEND") or str(REPO.parent / "shared" / "upstream" /
                                                   "vllm-ascend")
# DyntraLB planning on every step from the first: the most planner calls a run can make.
STATIC = {"scheduler_config": {"dyntra_lb_config": {
    "enabled": True, "mode": "static", "start_step": 0}}}


def machine_line(what: str) -> str:
    """The first line of a benchmark's output: machine, Python, load now, and ``what``."""
    return (f"machine: {platform.machine()}, {os.cpu_count()} cpus, Python "
            f"{platform.python_version()}, load average {os.getloadavg()[0]:.1f}; {what}")


def end_line() -> str:
    return f"load average at the end {os.getloadavg()[0]:.1f}"


def pairs(sides: Sequence[str], repeats: int, run: Callable[[int, str], dict]
          ) -> Iterable[dict[str, dict]]:
    """``repeats`` pairs of runs, ``run(pair, side)`` for every side, the order reversed
    on every other pair so that a change of machine load hits both sides alike."""
    for pair in range(repeats):
        order = sides if pair % 2 == 0 else sides[::-1]
        yield {side: run(pair, side) for side in order}


def planner_times(run_dir: pathlib.Path) -> np.ndarray:
    """``planner_s`` of every step where the planner ran, over every rank's wall table of
    the run in ``run_dir``."""
    return np.array([w["planner_s"] for rank in record_ranks(run_dir)
                     for w in wall_records(run_dir, rank) if w.get("planner_s")])


def event_logs(run_dir: pathlib.Path) -> list[bytes]:
    """Every rank's event log (``dyntra-emu events --rank r``), byte for byte."""
    return ["".join(line + "\n" for line in event_lines(run_dir, rank)).encode()
            for rank in record_ranks(run_dir)]


def print_planner_table(times: dict[str, list[np.ndarray]], slow: str, fast: str) -> None:
    """p50 / p99 in ms of each side's planner times (median over the pairs), and the
    ratio ``slow`` / ``fast``."""
    p50 = {s: statistics.median(np.percentile(t, 50) * 1e3 for t in runs)
           for s, runs in times.items()}
    p99 = {s: statistics.median(np.percentile(t, 99) * 1e3 for t in runs)
           for s, runs in times.items()}
    width = max(len(s) for s in times) + 2
    print(f"{'planner':<{width}} {'p50 ms':>8} {'p99 ms':>8}")
    for side in times:
        print(f"{side:<{width}} {p50[side]:>8.3f} {p99[side]:>8.3f}")
    print(f"ratio {slow} / {fast}: p50 {p50[slow] / p50[fast]:.2f}x, "
          f"p99 {p99[slow] / p99[fast]:.2f}x")
