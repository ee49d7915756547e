"""Shared pieces of the engine integration tests: small dedicated traces, the DyntraLB
configs, and ``shared_run`` — one real cluster run per name and pytest session, reused
by every test (and every xdist worker) that asks for it.

Every run is a real cluster: ``dp_size`` rank processes joined by real gloo groups.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import pathlib

import psutil
import pytest

from emu.rank.context import RankSummary
from emu.run import RunResult, run_cluster
from emu.spec import RunSpec
from emu.workload import TraceRequest

BLOCK_SIZE = 16
NUM_GPU_BLOCKS = 1024

DP_GROUP_SITES = ("engine.dp_sync", "dyntra_lb.flag", "dyntra_lb.allgather")


def lb_config(**dyntra_lb) -> dict:
    return {"scheduler_config": {"dyntra_lb_config": {"enabled": True, **dyntra_lb}}}


STATIC_CONFIG = lb_config(mode="static", start_step=0, bubble_threshold=1.0,
                          enable_diagnostics=True)
DYNAMIC_MAX_STEP = 4
LONG_REQ_BLOCK_THRESHOLD = 20  # blocks; > 320 prompt tokens at BLOCK_SIZE 16
DYNAMIC_CONFIG = lb_config(mode="dynamic", start_step=0,
                           long_req_block_threshold=LONG_REQ_BLOCK_THRESHOLD,
                           dynamic_max_step=DYNAMIC_MAX_STEP)

SECOND_BURST_S = 30.0


def static_trace(dp_size: int) -> list[TraceRequest]:
    """Two bursts separated by a long idle gap (two waves). Each rank gets six pinned
    requests; even ranks mostly big prompts, odd ranks mostly small ones, more requests
    than ``max_num_seqs`` so that every rank has admission candidates: the planner pauses
    and admits on both sides."""
    big = [600, 700, 50, 60, 650, 40]
    small = [40, 50, 600, 45, 55, 700]
    trace = []
    for burst, t0 in enumerate((0.0, SECOND_BURST_S)):
        for i in range(6):
            for rank in range(dp_size):
                prompts = big if rank % 2 == 0 else small
                trace.append(TraceRequest(
                    f"b{burst}-r{rank}-{i}", t0 + 0.05 * i, prompts[(i + burst) % 6],
                    15 + (7 * i + 5 * rank) % 30, rank=rank))
    return trace


# Dynamic trace: short requests all along; "edge" has exactly the threshold (does not
# arm); long1 activates, long2 arrives while active (keep-alive), long3 re-activates
# after the deactivation.
LONG_ARRIVALS = {"edge": 0.5, "long1": 1.0, "long2": 1.05, "long3": 2.5}


def dynamic_trace(dp_size: int) -> list[TraceRequest]:
    trace = [
        TraceRequest(f"short-{i:03d}", round(0.05 * i, 3), 64 + (37 * i) % 236,
                     20 + (11 * i) % 21)
        for i in range(80)
    ]
    trace += [
        TraceRequest("edge", LONG_ARRIVALS["edge"], LONG_REQ_BLOCK_THRESHOLD * BLOCK_SIZE, 20,
                     rank=0),
        TraceRequest("long1", LONG_ARRIVALS["long1"], 400, 30, rank=1),
        TraceRequest("long2", LONG_ARRIVALS["long2"], 500, 30, rank=0),
        TraceRequest("long3", LONG_ARRIVALS["long3"], 360, 30, rank=dp_size - 1),
    ]
    trace.sort(key=lambda r: r.arrival_s)  # stable: ties keep the order above
    return trace


def spec(name: str, dp_size: int, out_dir: pathlib.Path) -> RunSpec:
    """The named runs the tests share."""
    common = dict(dp_size=dp_size, out_dir=out_dir, block_size=BLOCK_SIZE,
                  num_gpu_blocks=NUM_GPU_BLOCKS, device="cpu", max_steps=20_000,
                  collective_timeout_s=60.0, run_timeout_s=240.0, strict=True)
    if name in ("static", "static-again"):
        return RunSpec(trace=static_trace(dp_size), additional_config=STATIC_CONFIG,
                       max_num_seqs=2, **common)
    if name == "dynamic":
        return RunSpec(trace=dynamic_trace(dp_size), additional_config=DYNAMIC_CONFIG,
                       max_num_seqs=4, **common)
    if name == "disabled":
        # Keys other than "enabled" must not matter when DyntraLB is off.
        return RunSpec(trace=dynamic_trace(dp_size),
                       additional_config=lb_config(enabled=False, mode="static",
                                                   start_step=0),
                       max_num_seqs=4, **common)
    if name == "plain":
        return RunSpec(trace=dynamic_trace(dp_size), additional_config=None,
                       max_num_seqs=4, **common)
    raise KeyError(name)


def _shared_root(tmp_path_factory) -> pathlib.Path:
    base = tmp_path_factory.getbasetemp()
    # Under pytest-xdist every worker has its own basetemp below a common parent.
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def shared_runs(tmp_path_factory, subdir: str, make_spec):
    """``get(name, dp_size) -> RunResult`` over ``make_spec(name, dp_size, out_dir)``:
    each named cluster runs once per session; later calls (from any xdist worker) reuse
    the files of the first."""
    root = _shared_root(tmp_path_factory) / subdir
    root.mkdir(parents=True, exist_ok=True)

    def get(name: str, dp_size: int) -> RunResult:
        out_dir = root / f"{name}-dp{dp_size}"
        with open(root / f"{name}-dp{dp_size}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            done = out_dir / "summaries.json"
            if not done.exists():
                result = run_cluster(make_spec(name, dp_size, out_dir))
                done.write_text(json.dumps([dataclasses.asdict(s) for s in result.ranks]))
            summaries = [RankSummary(**s) for s in json.loads(done.read_text())]
            ranks = range(dp_size)
            return RunResult(out_dir=out_dir, ranks=summaries,
                             logs=[out_dir / f"rank{r}.log" for r in ranks])

    return get


@pytest.fixture(scope="session")
def shared_run(tmp_path_factory):
    """``shared_run(name, dp_size) -> RunResult``: the named kit runs of ``spec``."""
    return shared_runs(tmp_path_factory, "engine-clusters", spec)


# ---------------------------------------------------------------- log helpers


class EngineTestKit:
    """The constants and event-log helpers the engine tests share (the ``kit``
    fixture), so test modules need no imports from this conftest."""

    BLOCK_SIZE = BLOCK_SIZE
    NUM_GPU_BLOCKS = NUM_GPU_BLOCKS
    DYNAMIC_MAX_STEP = DYNAMIC_MAX_STEP
    LONG_ARRIVALS = LONG_ARRIVALS
    SECOND_BURST_S = SECOND_BURST_S
    static_trace = staticmethod(static_trace)

    @staticmethod
    def steps(result: RunResult, rank: int) -> list[dict]:
        return [e for e in result.events(rank) if e["kind"] == "step"]

    @staticmethod
    def requests(result: RunResult, rank: int) -> list[dict]:
        return [e for e in result.events(rank) if e["kind"] == "request"]

    @staticmethod
    def dp_collectives(step_records: list[dict]) -> list[tuple]:
        """(iter, site, op, shape, dtype) of every DP-group collective, in issue order."""
        return [
            (s["iter"], c["site"], c["op"], tuple(c["shape"]), c["dtype"])
            for s in step_records
            for c in s["collectives"]
            if c["site"] in DP_GROUP_SITES
        ]

    @staticmethod
    def sites(record: dict) -> list[str]:
        return [c["site"] for c in record["collectives"]]


@pytest.fixture(scope="session")
def kit() -> type[EngineTestKit]:
    return EngineTestKit


def _children() -> set[int]:
    """Live descendants of this test process, without multiprocessing's helpers that
    live as long as this process: the resource tracker and the launcher's fork servers
    (a direct child, or a fork of one: ``emu.cluster.rank_start``; the ranks they fork
    are counted)."""
    from emu.cluster.rank_start import server_pids

    me = psutil.Process()
    servers = server_pids()
    pids = set()
    for child in me.children(recursive=True):
        try:
            if child.status() == psutil.STATUS_ZOMBIE or child.pid in servers:
                continue
            cmdline = " ".join(child.cmdline())
            if "resource_tracker" in cmdline:
                continue
            if "multiprocessing.forkserver" in cmdline and child.ppid() == me.pid:
                continue
        except psutil.NoSuchProcess:
            continue
        pids.add(child.pid)
    return pids


@pytest.fixture
def no_leftover_processes():
    """Fails the test if it leaves a child process (a rank) running."""
    before = _children()
    yield
    assert _children() - before == set()
